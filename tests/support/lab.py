"""The one rule for tests that need a lab: skip off CI with the reason, fail under
CI=true (CI must prove the real thing)."""

from __future__ import annotations

import os

import pytest

from lab.sh import unavailable


def skip_or_fail(reason: str) -> None:
    """Skip off CI, fail under CI=true."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"lab unavailable under CI=true: {reason}")
    pytest.skip(f"lab unavailable: {reason}")


def need_lab(ovs: bool = True) -> None:
    """Skip (or fail under CI) unless this process can build a lab: root, ``ip netns``
    and, with ``ovs``, a running Open vSwitch with the userspace datapath."""
    reason = unavailable(ovs)
    if reason:
        skip_or_fail(reason)
