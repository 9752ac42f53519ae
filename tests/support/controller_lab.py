"""The one way controller lab tests get a fabric: ``modelcast-controller`` plus an Open
vSwitch lab of a topology, torn down (lab by name, controller by PID) even on failure."""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence

import topologies as T
from lab.controller import Controller
from lab.ovs import Lab
from tests.support.lab import need_lab


@contextmanager
def controller_lab(topo: T.Topology, work: Path,
                   prepare: Callable[[Lab], None] | None = None,
                   args: Sequence[str] = ()) -> Iterator[tuple[Lab, Controller]]:
    """A started controller (with more options ``args``) and lab, the controller seeing
    every switch and link. ``prepare`` runs on the built lab before that wait (e.g. to
    fill ARP caches)."""
    need_lab()
    ctl = Controller(work, args=args)
    ctl.start()
    lab = Lab(topo, controller=ctl.of_target)
    try:
        lab.start()
        if prepare is not None:
            prepare(lab)
        ctl.wait_topology(switches=len(topo.switches), links=len(topo.links))
        yield lab, ctl
    finally:
        lab.stop()
        ctl.stop()


def wait_for(pred: Callable[[], bool], timeout: float, step: float = 0.05) -> bool:
    """Poll ``pred`` until it holds or ``timeout`` s pass; its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()
