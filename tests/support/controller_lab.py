"""The one way controller lab tests get a fabric: ``modelcast-controller`` plus an Open
vSwitch lab of a topology, torn down (lab by name, controller by PID) even on failure:
also when the start fails half-way, and the controller also when the lab's teardown
raises."""

from __future__ import annotations

import re
import subprocess
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence

import topologies as T
from controller import ofmsgs
from controller.protect import is_ff
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
    with ExitStack() as teardown:  # runs every stop, in reverse order, whichever of them raises
        ctl = Controller(work, args=args)
        teardown.callback(ctl.stop)  # (before start: a controller that never got healthy is stopped too)
        ctl.start()
        lab = Lab(topo, controller=ctl.of_target)
        teardown.callback(lab.stop)
        lab.start()
        if prepare is not None:
            prepare(lab)
        ctl.wait_topology(switches=len(topo.switches), links=len(topo.links))
        yield lab, ctl


def group_from_h1(lab: Lab, ctl: Controller, topo: T.Topology, model: str,
                  receivers: Sequence[str]) -> dict:
    """Every host learned (from its own traffic: a ping to h1), then a group from h1 to
    ``receivers`` (host names) created and installed: the group as REST answers it."""
    for h in topo.hosts[1:]:
        assert lab.ping(h.name, "h1", count=1, wait=2), ctl.log_text()
    ip = {h.name: h.ip for h in topo.hosts}
    r = ctl.api("POST", "/v1/groups", json={"model": model, "source": ip["h1"],
                                            "receivers": [ip[h] for h in receivers]})
    assert r.status_code == 201, r.text
    return ctl.wait_group(r.json()["id"], lambda g: g["state"] == "installed")


def wait_for(pred: Callable[[], bool], timeout: float, step: float = 0.05) -> bool:
    """Poll ``pred`` until it holds or ``timeout`` s pass; its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


def health(c: Controller) -> dict:
    """An instance's ``GET /v1/health`` (role, leader, generation); {} from a dead one."""
    try:
        return c.api("GET", "/v1/health", timeout=2).json()
    except Exception:
        return {}


def leader_of(instances: Sequence[Controller], timeout: float = 15) -> Controller:
    """The one live instance that says it leads, once exactly one does."""
    alive = [c for c in instances if c.proc is not None]
    assert wait_for(lambda: sum(health(c).get("role") == "leader" for c in alive) == 1, timeout), \
        [health(c) for c in alive]
    return next(c for c in alive if health(c).get("role") == "leader")


def ofctl(lab: Lab, dpid: int, *args: str) -> str:
    return subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", *args, lab.bridge(dpid)],
                          capture_output=True, text=True, check=True).stdout


def held(lab: Lab, dpid: int) -> tuple[set[int], int, int, int]:
    """(ALL group ids, number of (S,G) flows, FF groups, detour flows) a bridge holds."""
    groups = {int(x) for x in re.findall(r"group_id=(\d+)", ofctl(lab, dpid, "dump-groups"))}
    flows = ofctl(lab, dpid, "dump-flows")
    ff = {x for x in groups if is_ff(x)}
    return (groups - ff, len(re.findall(rf"priority={ofmsgs.PRIO_SG}\b", flows)), len(ff),
            len(re.findall(rf"priority=({ofmsgs.PRIO_DETOUR}|{ofmsgs.PRIO_REJOIN})\b", flows)))
