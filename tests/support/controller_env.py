"""The one builder for tests that drive the controller without Ryu or sockets: a topology
becomes a ``MulticastCore`` over a ``TopologyView`` plus a ``FakeFabric`` wired the same
way (``core_and_fabric``), and optionally a ``Service`` whose plans land on that fabric
(``make_env``), and ``Api``: that service behind Ryu's real ``WSGIApplication``, called
without a server (ryu's test_ofctl_rest pattern). Core, service and REST tests share it
so they prove things on the same fabric, built the same way.

The default fabric is ``leaf_spine(2, 3, 2)``: spines 1, 2; leaves 3, 4, 5; hosts
10.0.0.1-2 on leaf 3 (ports 3, 4), 10.0.0.3-4 on leaf 4, 10.0.0.5-6 on leaf 5. Leaf port
i goes to spine i. ``S`` is a source on leaf 3; ``R1``-``R3`` are receivers on the
other leaves.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from ryu.app.wsgi import WSGIApplication
from webob import Request

import topologies as T
from controller import ofmsgs
from controller.core import MulticastCore, Plan
from controller.counters import Counters
from controller.reconnect import Reconnect
from controller.rest import RestApi, validator
from controller.service import Service
from controller.topoview import TopologyView
from lab.controller import Controller
from lab.fakeof import FakeFabric

S, R1, R2, R3 = "10.0.0.1", "10.0.0.3", "10.0.0.5", "10.0.0.6"


def default_topology() -> T.Topology:
    """The fabric the constants above describe (a fresh object: tests may mutate it)."""
    return T.leaf_spine(2, 3, 2)


def core_and_fabric(topo: T.Topology, *, unknown_hosts: tuple[str, ...] = (),
                    pipeline: bool = False, **core_options: Any) -> tuple[MulticastCore, FakeFabric]:
    """A core that knows ``topo`` (minus ``unknown_hosts``, which the controller has not
    learned yet) with every switch entered, and a fake fabric wired as ``topo`` that holds
    what the switches were sent on entering; with ``pipeline`` also what a connecting
    switch gets first (``Reconnect.features``: base flows and the known source table), so
    unicast frames and the first frame of an unknown source behave as on a real switch.
    ``core_options`` go to ``MulticastCore`` (``algorithm``, ``balance``, ``udp_port``)."""
    view = TopologyView.from_topology(topo)
    for ip in unknown_hosts:
        view.remove_host(ip)
    core_options.setdefault("flap_damping", 0)  # (tests fail links again and again; test_damping.py turns it on)
    core = MulticastCore(view, **core_options)
    fabric = FakeFabric(topo)
    for dpid in topo.switches:
        first = Reconnect(core).features(dpid) if pipeline else []
        errors = fabric.apply_all([(dpid, m) for m in first] + core.switch_enter(dpid).messages())
        assert not errors, errors
    return core, fabric


def assert_exact(core: MulticastCore, fabric: FakeFabric) -> None:
    """Every live switch holds exactly what the groups' current trees need, protection
    included, worked out here from the trees and the current detours (not from the core's
    counters): one ALL group and one (S,G) flow per tree crossing it, one FF group per
    protected port (and ingress variant), one transit flow per protected link whose
    detour crosses it, one rejoin flow per protected link at its far end (shared by its
    trees; with ``nicira`` off one per group whose parent link is protected instead) --
    and nothing else; no FF group on a switch without them (``no_ff``)."""
    from controller.protect import IN_PORT_BIT, ff_buckets, ff_port, is_ff, rejoin_actions, tag
    guards = set()
    want: dict[int, set] = {d: set() for d in fabric.switches}
    for g in core.groups.values():
        for dpid, e in (g.tree.entries.items() if g.tree else ()):
            want[dpid] |= {("group", g.gid), ("sg", g.gid, e.in_port)}
            ffs = list(e.ff)
            par = g.tree.parent[dpid]
            # (a switch without fast-failover groups protects none of its links)
            assert not (e.ff and dpid in core.no_ff), (dpid, g.gid, e)
            d = core.detours.get(par, core.view.nbr_ports[par][dpid]) if par not in (None, *core.no_ff) else None
            own = core.protection and d is not None and not core.nicira
            assert bool(e.rejoin) == own and (not own or e.rejoin[0] == d.arrival), (dpid, g.gid, e, d)
            if e.rejoin:
                hosts = tuple(sorted(p for d, p in g.tree.ends if d == dpid))  # (the version tag off for them)
                want[dpid].add(("rejoin", g.gid, e.rejoin[:2] + (ofmsgs.rejoin_actions(
                    e.rejoin[2], g.address, g.gid, hosts),)))
                ffs += [a[1] for a in e.rejoin[2] if a[0] == "group" and is_ff(a[1])]
            for f in ffs:
                d = core.detours.get(dpid, ff_port(f))
                want[dpid].add(("ff", f, ff_buckets(ff_port(f), d, bool(f & IN_PORT_BIT),
                                                    tag(dpid, ff_port(f)))))
                guards.add((dpid, ff_port(f)))
    for p, port in guards:
        d = core.detours.get(p, port)
        for x, i, o in d.transit:
            want[x].add(("transit", i, tag(p, port), (("output", o),)))
        if core.nicira:
            far_port = core.view.port_link[(p, port)].port_of(d.rejoin)
            want[d.rejoin].add(("link rejoin", d.arrival, tag(p, port), rejoin_actions(far_port, ofmsgs.TABLE)))
    for dpid, sw in fabric.switches.items():
        if not sw.up or dpid not in core.installed:
            continue
        have = set()
        for gid, grp in sw.groups.items():
            if is_ff(gid):
                have.add(("ff", gid, tuple((b.watch_port, b.actions) for b in grp.buckets)))
            else:
                have.add(("group", gid))
        for f in sw.flows:
            if f.priority == ofmsgs.PRIO_SG:
                have.add(("sg", f.cookie & ~ofmsgs.COOKIE_MASK, f.match["in_port"]))
            elif f.priority == ofmsgs.PRIO_REJOIN and f.cookie == ofmsgs.COOKIE_DETOUR:
                have.add(("link rejoin", f.match["in_port"], f.match["eth_dst"], f.instructions[0][1]))
            elif f.priority == ofmsgs.PRIO_DETOUR:
                acts = f.instructions[0][1]
                if f.cookie == ofmsgs.COOKIE_DETOUR:
                    have.add(("transit", f.match["in_port"], f.match["eth_dst"], acts))
                else:
                    have.add(("rejoin", f.cookie & ~ofmsgs.COOKIE_MASK,
                              (f.match["in_port"], f.match["eth_dst"], acts)))
        assert have == want[dpid], (dpid, sorted(have - want[dpid], key=repr),
                                    sorted(want[dpid] - have, key=repr))


class FabricInstaller:
    """Applies each plan to the fake fabric and confirms it: at once, or (``deferred``)
    only when the test calls ``flush()`` -- the barrier replies arriving later."""

    def __init__(self, fabric: FakeFabric, deferred: bool = False) -> None:
        self.fabric = fabric
        self.deferred = deferred
        self.pending: list[tuple[Plan, Callable[[list[str]], None]]] = []
        self.plans: list[Plan] = []

    def install(self, plan: Plan, done: Callable[[list[str]], None]) -> None:
        """The ``Installer`` protocol: apply (or queue) ``plan``, then confirm it."""
        self.plans.append(plan)
        if self.deferred:
            self.pending.append((plan, done))
        else:
            done([str(e) for e in self.fabric.apply_all(plan)])

    def flush(self) -> None:
        """Deliver the queued plans and their confirmations, in order."""
        while self.pending:
            plan, done = self.pending.pop(0)
            done([str(e) for e in self.fabric.apply_all(plan)])


class Clock:
    """A monotonic clock the test moves by hand (``clock.now += 0.25``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Env:
    """A service with everything behind it, so a test can look at any layer."""

    topo: T.Topology
    core: MulticastCore
    fabric: FakeFabric
    installer: FabricInstaller
    service: Service
    registry: CollectorRegistry
    clock: Clock
    ips: list[str] = field(default_factory=list)

    def metric(self, name: str, **labels: str) -> float | None:
        """One sample of the service's own registry."""
        return self.registry.get_sample_value(name, labels)

    def delivered(self, gid: int) -> dict[str, int]:
        """Copies of group ``gid`` each host gets when its source sends one packet
        (asserting the trace has no loop)."""
        g = self.core.group(gid)
        tr = self.fabric.trace(g.source, g.address)
        assert not tr.loops, tr.log
        return dict(tr.delivered)

    def ours(self, gid: int) -> list[tuple[int, Any]]:
        """Flows and group entries of group ``gid`` left on any switch."""
        left: list[tuple[int, Any]] = []
        for dpid, sw in self.fabric.switches.items():
            left += [(dpid, f) for f in sw.flows if f.cookie == ofmsgs.cookie(gid)]
            left += [(dpid, "group") for g in sw.groups if g == gid]
        return left


def make_env(topo: T.Topology | None = None, *, token: str | None = None,
             host_tokens: dict[str, str] | None = None,
             state_path: Path | None = None, deferred: bool = False,
             unknown_hosts: tuple[str, ...] = (), pipeline: bool = False,
             **core_options: Any) -> Env:
    """A service over ``core_and_fabric(topo)`` (default: ``default_topology()``) with
    its own metrics registry and a hand-moved clock; plans go to the fabric through a
    ``FabricInstaller`` (``deferred``: confirmed only on ``env.installer.flush()``)."""
    topo = topo or default_topology()
    core, fabric = core_and_fabric(topo, unknown_hosts=unknown_hosts, pipeline=pipeline,
                                   **core_options)
    installer = FabricInstaller(fabric, deferred)
    registry = CollectorRegistry()
    clock = Clock()
    service = Service(core, installer, state_path, token, registry, clock, host_tokens)
    return Env(topo, core, fabric, installer, service, registry, clock, [h.ip for h in topo.hosts])


def valid(schema: str, data: Any) -> Any:
    """``data`` after asserting it matches the OpenAPI document's ``schema``."""
    errors = list(validator(schema).iter_errors(data))
    assert not errors, [e.message for e in errors]
    return data


def fabric_counters(env: Env, answering: set[int] | None = None) -> Counters:
    """Counters whose requests the fake switches answer at once (``answering``: only
    these switches are connected)."""
    counters: Counters

    def send(dpid: int, msg: Any) -> bool:
        if answering is not None and dpid not in answering:
            return False
        msg.serialize()  # (as Ryu does before sending: the request must be well formed)
        for part in env.fabric.request(dpid, msg):
            part.xid = msg.xid
            counters.reply(dpid, part)
        return True

    counters = Counters(send, ttl_s=0.0)
    return counters


TOKEN = "t0ken-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Api:
    """A WSGI app with RestApi registered as the Ryu app does, and a JSON client."""

    def __init__(self, env: Env, **data: Any) -> None:
        self.env = env
        self.app = WSGIApplication()
        self.app.register(RestApi, {"service": env.service, **data})

    def call(self, method: str, path: str, body: Any = None, headers: dict | None = None,
             auth: bool = True, raw: bytes | None = None,
             content_type: str | None = "application/json"):
        """One request; a body goes with ``content_type`` (``None``: no Content-Type)."""
        h = dict(AUTH if auth else {})
        h.update(headers or {})
        if raw is None and body is not None:
            raw = json.dumps(body).encode()
        if raw is not None and content_type is not None:
            h.setdefault("Content-Type", content_type)
        resp = Request.blank(path, method=method, body=raw or b"", headers=h).get_response(self.app)
        if resp.status_code not in (204, 304) and not (path == "/metrics" and resp.status_code == 200):
            assert resp.content_type == "application/json", (path, resp.status, resp.body)
        return resp

    def json(self, method: str, path: str, body: Any = None, status: int = 200, **kw: Any) -> Any:
        resp = self.call(method, path, body, **kw)
        assert resp.status_code == status, (method, path, resp.status, resp.body)
        data = resp.json
        if status >= 400:
            assert set(data) == {"error", "detail"} and isinstance(data["error"], str), data
            assert "Traceback" not in resp.text
        return data


@contextlib.contextmanager
def real_controller(workdir: Path, token: str, args: Sequence[str] = ()) -> Iterator[Controller]:
    """A real ``modelcast-controller`` subprocess (no switch connected; ``args``: more
    options) that knows ``default_topology()`` from its state file: creates and joins
    name hosts it knows, so requests reach the core and not only the validator."""
    ctl = Controller(workdir, token=token, args=args)
    core, _ = core_and_fabric(default_topology())
    ctl.state.write_text(json.dumps(core.to_dict()), encoding="utf-8")
    ctl.start()
    try:
        yield ctl
    finally:
        ctl.stop()
