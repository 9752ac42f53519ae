"""The event history (issue 43): what an operator reads to learn what happened --
``GET /v1/events``, its Server-Sent Events stream, and the events the controller's parts
record as they act (joins, installs with their time, reroutes with their why, fast-failover
switch-overs, flapping links damped, refusals)."""

from __future__ import annotations

import json
import threading

import pytest
from webob import Request

import topologies as T
from controller import topochange
from controller.events import MAX_LISTED, EventLog
from tests.support.controller_env import AUTH, R1, R2, S, TOKEN, Api, make_env, valid
from tests.support.fabric_checks import apply


def kinds(events: list[dict]) -> list[str]:
    return [e["kind"] for e in events]


# ---------------------------------------------------------------------- the ring


def test_ids_are_monotonic_the_ring_is_bounded_and_a_reader_learns_what_it_missed():
    log = EventLog(size=3, clock=lambda: 5.0)
    for i in range(5):
        log.emit("join", group=1, receiver=f"10.0.0.{i}")
    assert [e["id"] for e in log.since(0)] == [3, 4, 5]  # (1 and 2 dropped)
    assert log.first == 3 and log.last == 5
    assert [e["receiver"] for e in log.since(3)] == ["10.0.0.3", "10.0.0.4"]
    assert log.since(5) == [] and log.since(99) == []
    assert log.since(0, limit=2)[-1]["id"] == 4
    with pytest.raises(ValueError, match="unknown event kind"):
        log.emit("exploded")


def test_a_group_filter_keeps_events_naming_it_and_those_naming_too_many_to_list():
    log = EventLog()
    log.emit("join", group=1, receiver="10.0.0.1")
    log.emit("join", group=2, receiver="10.0.0.2")
    log.emit("reroute", groups=[2, 3], why="port down")
    big = log.emit("reroute", groups=range(1000, 1000 + MAX_LISTED + 5), why="switch lost")
    assert big["group_count"] == MAX_LISTED + 5 and len(big["groups"]) == MAX_LISTED
    assert [e["id"] for e in log.since(0, group=2)] == [2, 3, 4]
    assert [e["id"] for e in log.since(0, group=1)] == [1, 4]  # (4 may concern it)
    assert [e["id"] for e in log.since(0, group=1000)] == [4]


def test_a_waiting_reader_wakes_at_the_next_event():
    log = EventLog()
    assert not log.wait(0, 0.01)
    woke = []
    t = threading.Thread(target=lambda: woke.append(log.wait(0, 5.0)))
    t.start()
    log.emit("switch_connected", dpid=1)
    t.join(2.0)
    assert woke == [True]


# ------------------------------------------------------------ what the parts record


def test_a_group_s_life_is_told_joins_installs_with_their_time_and_leaves():
    env = make_env(token=TOKEN)
    svc = env.service
    g, _ = svc.create_group({"model": "m", "source": S, "receivers": [R1]})
    env.clock.now += 0.25
    svc.join(g["id"], R2)
    svc.leave(g["id"], R1)
    svc.delete_group(g["id"])
    events = svc.events.since(0)
    assert kinds(events) == ["group_created", "installed", "join", "installed", "leave",
                             "installed", "group_deleted", "installed"]
    created, installed = events[0], events[1]
    assert created["group"] == g["id"] and created["receivers"] == [R1] and created["source"] == S
    assert installed["groups"] == [g["id"]] and installed["reason"] == "create"
    assert installed["receivers"] == {str(g["id"]): {R1: 0.0}} and installed["messages"] > 0
    assert events[2]["receiver"] == R2 and events[2]["by"] == "admin"
    assert events[3]["receivers"] == {str(g["id"]): {R2: 0.0}}
    assert "receivers" not in events[5] and events[6]["group"] == g["id"]
    # joining again is no new event (idempotent), nor is leaving what one never joined
    g2, _ = svc.create_group({"model": "n", "source": S, "receivers": [R1]})
    last = svc.events.last
    svc.join(g2["id"], R1)
    svc.leave(g2["id"], R2)
    assert not {"join", "leave"} & set(kinds(svc.events.since(last)))


def test_a_failed_install_is_an_event_with_the_switches_errors():
    env = make_env(token=TOKEN)
    svc = env.service
    real = env.installer.install
    env.installer.install = lambda plan, done: done(["switch 0x1: OpenFlow error type 6 code 0"])
    svc.create_group({"model": "m", "source": S, "receivers": [R1]})
    env.installer.install = real
    failed = svc.events.since(0)[-1]
    assert failed["kind"] == "install_failed" and failed["errors"] == ["switch 0x1: OpenFlow error type 6 code 0"]


def test_a_port_down_tells_the_failover_the_reroute_and_why_and_a_flapping_link_is_damped():
    """ring:6, its link s1-s2 on the tree: each down is a port_down, a fast-failover
    switch-over of the group crossing it and a reroute saying which port; the third
    down within 60 s also damps the link, and its release is told too."""
    topo = T.ring(6, 1)
    env = make_env(topo, token=TOKEN, flap_damping=3)
    core, fabric, svc = env.core, env.fabric, env.service
    ip = {h.name: h.ip for h in topo.hosts}
    g, _ = svc.create_group({"model": "m", "source": ip["h1"], "receivers": [ip["h2"]]})
    k = next(x for x in topo.links if {x.a, x.b} == {1, 2})
    for i in range(3):
        last = svc.events.last
        fabric.set_link(k.a, k.b, False)
        apply(fabric, topochange.port(core, k.a, k.a_port, True))
        fabric.set_link(k.a, k.b, True)
        apply(fabric, topochange.port(core, k.a, k.a_port, False))
        told = svc.events.since(last)
        down = next(e for e in told if e["kind"] == "port_down")
        assert down["dpid"] == k.a and down["port"] == k.a_port
        assert sorted(map(tuple, down["link"])) == sorted([(k.a, k.a_port), (k.b, k.b_port)])
        if i == 0:  # (later trees avoid it or it is held: only the first crosses it)
            assert [e["groups"] for e in told if e["kind"] == "failover"] == [[g["id"]]]
            reroute = next(e for e in told if e["kind"] == "reroute")
            assert reroute["groups"] == [g["id"]] and reroute["why"] == f"port {k.a:#x}:{k.a_port} down"
    # a PortStatus that changes nothing (the port up and reported up again) is no event
    last = svc.events.last
    apply(fabric, topochange.port(core, k.a, k.a_port, False))
    assert svc.events.since(last) == []
    damped = [e for e in svc.events.since(0) if e["kind"] == "damped"]
    assert len(damped) == 1 and damped[0]["switches"] == [1, 2] and damped[0]["hold_s"] == 30.0
    until = core.damping.held[frozenset((1, 2))]
    svc.apply(core.release_damped(until), "flap hold ended")
    assert kinds(svc.events.since(svc.events.last - 1))[-1] in ("undamped", "installed")
    assert any(e["kind"] == "undamped" and e["switches"] == [1, 2] for e in svc.events.since(0))
    # Prometheus counts them by kind (the dashboard's switch-over panel)
    told = kinds(svc.events.since(0))
    assert {k: env.metric("modelcast_events_total", kind=k) for k in ("failover", "damped", "port_down")} == \
        {"failover": told.count("failover"), "damped": 1, "port_down": 3}


def test_a_switch_lost_and_a_link_lost_are_told_with_their_reroutes():
    env = make_env(token=TOKEN)
    core, svc = env.core, env.service
    g, _ = svc.create_group({"model": "m", "source": S, "receivers": [R1, R2]})
    tree = core.groups[g["id"]].tree
    root = tree.root
    child = next(c for c, p in tree.parent.items() if p == root)
    link = core.view.port_link[(root, core.view.link_port(root, child))]
    last = svc.events.last
    apply(env.fabric, topochange.link_down(core, _NoDiscovery(), link.a, link.a_port, link.b, link.b_port).plan)
    told = svc.events.since(last)
    assert kinds(told)[:2] == ["link_down", "reroute"] and told[1]["groups"] == [g["id"]]
    assert "lost" in told[1]["why"]
    last = svc.events.last
    topochange.switch_left(core, child)
    told = svc.events.since(last)
    assert (told[0]["kind"], told[0]["dpid"]) == ("switch_lost", child)


class _NoDiscovery:
    def link_down(self, *_: object) -> list:
        return []


# ---------------------------------------------------------------------- REST


def test_events_over_rest_since_and_group_and_bad_parameters_are_400():
    env = make_env(token=TOKEN)
    api = Api(env)
    a = api.json("POST", "/v1/groups", {"model": "a", "source": S, "receivers": [R1]}, 201)
    b = api.json("POST", "/v1/groups", {"model": "b", "source": S, "receivers": [R2]}, 201)
    got = valid("Events", api.json("GET", "/v1/events"))
    assert kinds(got["events"]) == ["group_created", "installed"] * 2 and got["last"] == 4
    assert got["missed"] is False and got["first"] == 1
    only_b = api.json("GET", f"/v1/events?group={b['id']}")["events"]
    assert {e.get("group", b["id"]) for e in only_b} == {b["id"]} and len(only_b) == 2
    assert api.json("GET", "/v1/events?since=4")["events"] == []
    assert api.json("GET", "/v1/events?since=2&limit=1")["events"][0]["id"] == 3
    for bad in ("since=-1", "since=x", "group=0", "limit=0", "limit=5000", "grup=1"):
        assert api.json("GET", f"/v1/events?{bad}", status=400)["error"]
    assert a["id"] != b["id"]


def test_a_refused_change_is_an_event_saying_why():
    env = make_env(token=TOKEN)
    api = Api(env)
    api.json("POST", "/v1/groups", {"model": "a", "source": S, "receivers": [R1]}, 201)
    api.json("POST", "/v1/groups", {"model": "a", "source": S, "algorithm": "steiner"}, 409)
    api.json("DELETE", "/v1/groups/1", auth=False, status=401)
    refused = [e for e in env.service.events.since(0) if e["kind"] == "refused"]
    assert [(e["method"], e["path"], e["status"]) for e in refused] == [
        ("POST", "/v1/groups", 409), ("DELETE", "/v1/groups/1", 401)]
    assert "already exists" in refused[0]["error"]


def test_the_stream_sends_each_event_once_in_order_and_resumes_after_last_event_id():
    env = make_env(token=TOKEN)
    api = Api(env)
    api.json("POST", "/v1/groups", {"model": "a", "source": S, "receivers": [R1]}, 201)
    resp = _stream(api, {})
    assert resp.status_code == 200 and resp.content_type == "text/event-stream"
    assert resp.headers["Cache-Control"] == "no-cache"
    it = iter(resp.app_iter)
    assert next(it).startswith(b": modelcast events\nretry: ")
    got = [_parse(next(it)) for _ in range(2)]
    assert [(e[0], e[1]) for e in got] == [(1, "group_created"), (2, "installed")]
    assert json.loads(got[0][2])["model"] == "a"
    env.service.join(1, R2)  # (the stream follows what happens next)
    assert [_parse(next(it))[1] for _ in range(2)] == ["join", "installed"]
    resp.app_iter.close()
    assert env.service.changes.held == 0  # (its held slot is given back)
    again = iter(_stream(api, {"Last-Event-ID": "3"}).app_iter)
    next(again)
    assert _parse(next(again))[:2] == (4, "installed")
    assert api.json("GET", "/v1/events/stream?since=abc", status=400)["error"]


def _stream(api: Api, headers: dict) -> object:
    req = Request.blank("/v1/events/stream", headers={**AUTH, **headers})
    resp = req.get_response(api.app)
    # each event leaves at once (eventlet's server would hold chunks until 4 KB)
    assert resp.status_code != 200 or req.environ["eventlet.minimum_write_chunk_size"] == 0
    return resp


def _parse(chunk: bytes) -> tuple[int, str, str]:
    lines = dict(line.split(": ", 1) for line in chunk.decode().strip().split("\n"))
    return int(lines["id"]), lines["event"], lines["data"]


def test_a_real_controller_sends_each_event_the_moment_it_happens(tmp_path):
    """Over HTTP from a real ``modelcast-controller``: the stream's first bytes come at
    once and a group created later arrives as its event within a second, not when 4 KB
    of events have piled up (the web view follows the controller by this stream)."""
    import time

    import requests

    from tests.support.controller_env import real_controller

    with real_controller(tmp_path, TOKEN) as ctl:
        with requests.get(f"{ctl.url}/v1/events/stream", headers={"Authorization": f"Bearer {TOKEN}"},
                          stream=True, timeout=5) as resp:
            assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
            lines = resp.iter_lines(chunk_size=1, decode_unicode=True)
            assert next(lines) == ": modelcast events"
            start = time.monotonic()
            r = ctl.api("POST", "/v1/groups", json={"model": "live", "source": S, "receivers": [R1]})
            assert r.status_code == 201, r.text
            got = []
            while not any(line.startswith("data: ") and '"group_created"' in line for line in got):
                got.append(next(lines))
            assert time.monotonic() - start < 1.0, got
