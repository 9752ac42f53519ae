"""The one rule for tests that need a lab, or anything else the machine may lack (a
built C extension, an optional module): skip off CI with the reason, fail under CI=true
(CI installs everything, so there a missing piece is a broken install, not a reason to
pass quietly)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator, NoReturn

import pytest

from lab.bridge import BridgeLab
from lab.sh import LabError, unavailable


def skip_or_fail(reason: str, what: str = "lab") -> NoReturn:
    """Skip off CI, fail under CI=true. ``what`` names the missing piece in the message."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} unavailable under CI=true: {reason}")
    pytest.skip(f"{what} unavailable: {reason}")


def need_module(name: str) -> ModuleType:
    """``pytest.importorskip`` under the rule above: the imported module, else a skip off
    CI and a failure under CI=true (the test extra installs every module tests import)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        skip_or_fail(f"cannot import {name} ({exc}); pip install -e '.[test]'", what="module")


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


def bench_json(module: str, out: Path, result: str, *args: str, timeout: float) -> dict[str, Any]:
    """Run ``python -m MODULE ... --out OUT`` (a benchmark at smoke size), require exit 0
    (its output's tail in the failure), and return the JSON file ``result`` it wrote."""
    proc = subprocess.run([sys.executable, "-m", module, *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / result).read_text())
