"""The one rule for tests that need a lab: skip off CI with the reason, fail under
CI=true (CI must prove the real thing)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

import pytest

from lab.bridge import BridgeLab
from lab.sh import LabError, unavailable


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


@contextmanager
def bridge_lab(hosts: int, mtu: int = 1500) -> Iterator[BridgeLab]:
    """A started kernel-bridge lab of ``hosts`` hosts (skip or fail if it cannot be
    built), torn down afterwards, and checked to leave nothing behind."""
    need_lab(ovs=False)
    lab = BridgeLab(hosts, mtu=mtu)
    try:
        lab.start()
    except LabError as exc:
        skip_or_fail(str(exc))
    try:
        yield lab
    finally:
        lab.stop()
        assert lab.leftovers() == [], "lab objects left behind"
