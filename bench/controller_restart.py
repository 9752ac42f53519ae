"""Controller start-up and restart benchmark (not a test): a fabric discovered from
nothing, and a fabric holding every group's trees reconciled by a restarted controller.

    python -m bench.controller_restart --topology fat-tree:34 --groups 1000 --receivers 256 --json

Start-up (``discover``): every switch connects, every link is discovered from both ends
(signed LLDP), every host is learned; the controller's CPU time until its view is the
whole fabric, next to the time Ryu's discovery takes to probe every port once more.

Restart: the fabric is the simulated one (``lab.fakeof``: every message applied to a switch's
tables, stats requests answered from them). Before the restart the switches are connected
and every group is built and installed, as ``bench.controller`` builds them; the saved
state goes through JSON as ``controller.persist`` stores it. Then a fresh core restores it
(``restore_s``: the topology and every tree computed again) and each switch reconnects
through the controller's own state machine (``controller.reconnect``): its features
messages, a flow-stats and a group-desc request, the replies fed back, and the plan that
fixes the differences. ``reconcile_s`` is the controller's side of that (the requests, the
replies' reading and the plan), not the simulated switches' work; a healthy fabric needs
no tree change, so ``plan_messages`` should be 0, and ``fabric_unchanged`` says the switches'
tables are what they were. Times are also given as ratios to the reference of
``bench.controller`` (plain networkx shortest-path trees from the groups' sources) timed
in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from typing import Any

from bench.controller import command, reference_s, workload
from bench.machine import machine
from controller import ofmsgs
from controller.core import MulticastCore, tune_gc
from controller.hosts import HostDiscovery
from controller.lldpauth import LldpSigner, reprobe_pause
from controller.reconnect import Reconnect
from controller.settings import Settings
from controller.topoview import TopologyView
from lab.fakeof import FakeFabric
from topologies import parse


def installed(topology: str, groups: int, receivers: int, seed: int) -> tuple[MulticastCore, FakeFabric, int]:
    """A controller and its fabric after every switch connected and every group was built
    and installed; the messages that took."""
    topo = parse(topology)
    core = MulticastCore(TopologyView.from_topology(topo))
    fabric = FakeFabric(topo)
    session = Reconnect(core)
    sent = 0
    for dpid in topo.switches:
        msgs = [(dpid, m) for m in session.features(dpid)] + list(core.switch_enter(dpid))
        sent += len(msgs)
        _applied(fabric, msgs)
    for model, src, rcv in workload(topo, groups, receivers, seed):
        plan = core.create_group(model, src, rcv)[1]
        sent += len(plan)
        _applied(fabric, plan)
    return core, fabric, sent


def _applied(fabric: FakeFabric, msgs: Any) -> None:
    errors = [e for e in fabric.apply_all(msgs)
              if not ofmsgs.benign_error(e.type, e.code, e.meter_id)]  # (as the app does)
    if errors:
        raise SystemExit(f"error: the simulated fabric refused {len(errors)} messages, e.g. {errors[0]}")


def restart(core: MulticastCore, fabric: FakeFabric, before: tuple | None = None) -> dict[str, Any]:
    """Restart ``core`` from its saved state and reconnect every switch of ``fabric``;
    ``fabric_unchanged``: its tables are then ``before`` (default: as they are now)."""
    saved = json.loads(json.dumps(core.to_dict()))
    before = fabric.snapshot() if before is None else before
    wall, cpu = time.perf_counter, time.process_time
    t0, c0 = wall(), cpu()
    fresh = MulticastCore()
    problems = fresh.restore(saved)
    restore_wall, restore_cpu = wall() - t0, cpu() - c0
    if problems:
        raise SystemExit(f"error: restore: {problems[:3]}")
    session = Reconnect(fresh)
    count: Counter[str] = Counter()
    ctl_wall = ctl_cpu = 0.0
    for dpid in sorted(fabric.switches):
        t0, c0 = wall(), cpu()
        features = session.features(dpid)
        requests = session.start(dpid)
        ctl_wall, ctl_cpu = ctl_wall + wall() - t0, ctl_cpu + cpu() - c0
        _applied(fabric, [(dpid, m) for m in features])
        replies = [r for req in requests for r in fabric.request(dpid, req)]
        ports = list(fabric.ports(dpid).values())
        done = None
        t0, c0 = wall(), cpu()
        for reply in replies:
            done = session.on_reply(dpid, reply, ports) or done
        ctl_wall, ctl_cpu = ctl_wall + wall() - t0, ctl_cpu + cpu() - c0
        if done is None:
            raise SystemExit(f"error: switch {dpid} did not answer both requests")
        count["features_messages"] += len(features)
        count["requests"] += len(requests)
        count["reply_parts"] += len(replies)
        count["plan_messages"] += len(done.plan)
        _applied(fabric, done.plan)
    return {"restore_s": round(restore_wall, 3), "restore_cpu_s": round(restore_cpu, 3),
            "reconcile_s": round(ctl_wall, 3), "reconcile_cpu_s": round(ctl_cpu, 3),
            **count, "fabric_unchanged": fabric.snapshot() == before, "groups_restored": len(fresh.groups)}


def discover(topology: str) -> dict[str, Any]:
    """Start-up from nothing: every switch connects (its features messages and base
    entries), every link is discovered from both ends as Ryu reports it (a signed LLDP
    frame made and checked, ``controller.lldpauth``, then the link added and its
    source-table entries), then every host is learned from its first frame
    (``controller.hosts``). The controller's CPU time per step until its view is the
    whole fabric; the re-probing's pace comes on top (``lldp_round_s``)."""
    topo = parse(topology)
    core = MulticastCore(TopologyView())
    session, hosts = Reconnect(core), HostDiscovery(core)
    signer = LldpSigner(os.urandom(32))
    sent: Counter[str] = Counter()
    cpu = time.process_time
    c0 = cpu()
    for dpid in topo.switches:
        sent["switch_messages"] += len(session.features(dpid)) + len(core.switch_enter(dpid))
    c1 = cpu()
    now = time.monotonic()
    for k in topo.links:
        for a, ap, b, bp in ((k.a, k.a_port, k.b, k.b_port), (k.b, k.b_port, k.a, k.a_port)):
            frame = signer.frame(a, ap, b"\x02\0\0\0\0\1", now)  # sent out of a:ap, in at b:bp
            if signer.parse(frame, now) != (a, ap):
                raise SystemExit(f"error: LLDP frame of {a}:{ap} not accepted")
            sent["link_messages"] += len(core.link_add(a, ap, b, bp)) + len(hosts.link_up(a, ap, b, bp))
    c2 = cpu()
    for h in topo.hosts:
        acts = hosts.seen(h.ip, h.mac, h.dpid, h.port)
        sent["host_messages"] += len(acts.plan) + len(acts.msgs)
    c3 = cpu()
    view = core.view
    if len(view.links) != len(topo.links) or len(view.hosts) != len(topo.hosts):
        raise SystemExit(f"error: the view has {len(view.links)} links and {len(view.hosts)} hosts")
    ports = 2 * len(topo.links) + len(topo.hosts)
    return {"discovery_cpu_s": round(c3 - c0, 3), "switches_cpu_s": round(c1 - c0, 3),
            "links_cpu_s": round(c2 - c1, 3), "hosts_cpu_s": round(c3 - c2, 3), **sent,
            "lldp_frames": 2 * len(topo.links), "switch_ports": ports,
            # Ryu probes a new port at once, then each port again one by one with a pause
            # between frames: a round over every port takes this long, with the pause the
            # controller sets (--lldp-rate's default) and with Ryu's own
            "lldp_round_s": _lldp_round(ports, reprobe_pause(Settings().lldp_rate)),
            "ryu_stock_lldp_round_s": _lldp_round(ports, _ryu_lldp()[0])}


def _lldp_round(ports: int, pause: float) -> float:
    """Seconds a re-probe round over ``ports`` takes (each port at most every Ryu's
    period per port)."""
    return round(max(ports * pause, _ryu_lldp()[1]), 1)


def _ryu_lldp() -> tuple[float, float]:
    """Ryu's own pause between two re-probes (also where ``lldpauth.install`` ran in this
    process) and its period per port (``ryu.topology.switches``)."""
    import controller.compat  # noqa: F401  (before Ryu's apps are imported)
    from controller import lldpauth
    from ryu.topology import switches

    pause = lldpauth.RYU_PAUSE if lldpauth.RYU_PAUSE is not None else switches.Switches.LLDP_SEND_GUARD
    return pause, switches.Switches.LLDP_SEND_PERIOD_PER_PORT


def run(args: argparse.Namespace) -> dict[str, Any]:
    tune_gc()  # as the controller does
    found = discover(args.topology)
    core, fabric, sent = installed(args.topology, args.groups, args.receivers, args.seed)
    topo = fabric.topology
    graph = topo.graph()
    sources = [g.source for g in core.groups.values()]
    ref_s = reference_s(graph, sources)
    out = restart(core, fabric)
    ref_cpu_s = reference_s(graph, sources, time.process_time)
    return {"topology": topo.name, "switches": len(topo.switches), "hosts": len(topo.hosts),
            "groups": args.groups, "receivers": args.receivers, "machine": machine(),
            **found, "discovery_vs_reference_cpu": round(found["discovery_cpu_s"] / ref_cpu_s, 2),
            "install_messages": sent, **out, "reference_trees_s": round(ref_s, 4),
            "restore_vs_reference_cpu": round(out["restore_cpu_s"] / ref_cpu_s, 2),
            "reconcile_vs_reference_cpu": round(out["reconcile_cpu_s"] / ref_cpu_s, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.controller_restart", description=__doc__.split("\n")[0])
    ap.add_argument("--topology", default="fat-tree:16", help="family:args, e.g. fat-tree:34")
    ap.add_argument("--groups", type=int, default=1000)
    ap.add_argument("--receivers", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    return command(ap, run, argv)


if __name__ == "__main__":
    sys.exit(main())
