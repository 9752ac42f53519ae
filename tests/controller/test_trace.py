"""``GET /v1/groups/{id}/trace`` (issue 43): each receiver's hops from the source with
the switches' live counters, read from the simulated fabric as from OVS, and why a
receiver's packets cannot arrive when they cannot."""

from __future__ import annotations

from typing import Any

from ryu.ofproto import ofproto_v1_3_parser as parser

import topologies as T
from controller import ofmsgs
from controller.counters import Counters
from tests.support.controller_env import R1, R2, S, TOKEN, Api, fabric_counters, make_env, valid


def packets(trace: dict[str, Any]) -> dict[str, list[tuple[int | None, ...]]]:
    return {r["ip"]: [tuple((h["counters"][k] or {}).get("packets") for k in ("flow", "group", "bucket"))
                      for h in r["hops"]] for r in trace["receivers"]}


def test_every_hop_to_every_receiver_counts_each_packet_sent():
    env = make_env(token=TOKEN)
    api = Api(env, counters=fabric_counters(env))
    g = api.json("POST", "/v1/groups", {"model": "m", "source": S, "receivers": [R1, R2]}, 201)
    before = packets(valid("Trace", api.json("GET", f"/v1/groups/{g['id']}/trace")))
    for _ in range(5):
        env.delivered(g["id"])
    got = valid("Trace", api.json("GET", f"/v1/groups/{g['id']}/trace"))
    after = packets(got)
    assert sorted(after) == sorted([R1, R2])
    for ip, hops in after.items():
        assert [tuple(a - b for a, b in zip(h, hb)) for h, hb in zip(hops, before[ip])] == [(5, 5, 5)] * len(hops)
    tree = env.core.groups[g["id"]].tree
    for r in got["receivers"]:
        assert r["state"] == "installed" and r["why"] is None
        hops = r["hops"]
        # from the source's switch to the receiver's, along the tree, each hop's ports the tree's
        assert hops[0]["dpid"] == env.core.view.hosts[S].dpid == tree.root
        assert hops[-1]["dpid"] == env.core.view.hosts[r["ip"]].dpid and hops[-1]["next"] == r["ip"]
        assert hops[-1]["out_port"] == env.core.view.hosts[r["ip"]].port
        for a, b in zip(hops, hops[1:]):
            assert tree.parent[b["dpid"]] == a["dpid"] and a["next"] == b["dpid"]
            assert a["out_port"] == env.core.view.link_port(a["dpid"], b["dpid"])
        assert all(h["in_port"] == tree.entries[h["dpid"]].in_port and h["held"] and h["port_up"]
                   and h["group_id"] == g["id"] for h in hops)
    one = api.json("GET", f"/v1/groups/{g['id']}/trace?receiver={R2}")
    assert [r["ip"] for r in one["receivers"]] == [R2]


def test_the_count_stops_rising_at_the_hop_whose_switch_lost_the_group():
    """The group of one transit switch is deleted behind the controller's back (and with
    it, as OpenFlow 1.3 does, the (S,G) flow using it): the hops before it count on, it
    has no counters left, and every hop after it stops rising."""
    topo = T.linear(4, 1)
    env = make_env(topo, token=TOKEN)
    api = Api(env, counters=fabric_counters(env))
    ips = [h.ip for h in topo.hosts]
    g = api.json("POST", "/v1/groups", {"model": "m", "source": ips[0], "receivers": [ips[3]]}, 201)
    path = [h["dpid"] for h in api.json("GET", f"/v1/groups/{g['id']}/trace")["receivers"][0]["hops"]]
    assert len(path) == 4
    env.fabric.apply(path[2], ofmsgs.group_delete(path[2], g["id"]))
    before = packets(api.json("GET", f"/v1/groups/{g['id']}/trace"))[ips[3]]
    for _ in range(4):
        env.delivered(g["id"])
    after = packets(api.json("GET", f"/v1/groups/{g['id']}/trace"))[ips[3]]
    rise = [tuple(None if a is None else a - b for a, b in zip(h, hb)) for h, hb in zip(after, before)]
    assert rise == [(4, 4, 4), (4, 4, 4), (None, None, None), (0, 0, 0)], rise


def test_why_a_receiver_waits_host_unknown_barriers_unreachable_and_a_down_port():
    env = make_env(token=TOKEN, unknown_hosts=(R2,), deferred=True)
    api = Api(env)
    g = api.json("POST", "/v1/groups", {"model": "m", "source": S, "receivers": [R1, R2]}, 201)
    trace = valid("Trace", api.json("GET", f"/v1/groups/{g['id']}/trace"))
    why = {r["ip"]: r["why"] for r in trace["receivers"]}
    assert trace["counters"] is False and all("counters" not in h for r in trace["receivers"] for h in r["hops"])
    assert why[R2].startswith(f"host {R2} not found yet") and not trace["receivers"][1]["hops"]
    assert why[R1] == "waiting for the switches to confirm the group's plan (barriers)"
    env.installer.flush()
    trace = api.json("GET", f"/v1/groups/{g['id']}/trace")
    assert [(r["ip"], r["state"], r["why"] is None) for r in trace["receivers"]] == [
        (R1, "installed", True), (R2, "pending", False)]
    # a port of the tree down, the controller not told yet: the hop says so, and the
    # receiver is on a fast-failover detour
    hops = trace["receivers"][0]["hops"]
    first = hops[0]
    env.core.view.ports_down.add((first["dpid"], first["out_port"]))
    trace = api.json("GET", f"/v1/groups/{g['id']}/trace?receiver={R1}")
    assert trace["receivers"][0]["hops"][0]["port_up"] is False
    assert trace["receivers"][0]["why"].startswith("on a fast-failover detour: switch")


def test_a_switch_that_does_not_answer_is_named_and_bad_requests_are_400_or_404():
    env = make_env(token=TOKEN)
    g, _ = env.service.create_group({"model": "m", "source": S, "receivers": [R1]})
    tree = env.core.groups[g["id"]].tree
    api = Api(env, counters=fabric_counters(env, answering={tree.root}))
    got = api.json("GET", f"/v1/groups/{g['id']}/trace")
    errors = {h["dpid"]: h["counters"].get("error") for h in got["receivers"][0]["hops"]}
    assert errors[tree.root] is None
    assert {d: e for d, e in errors.items() if d != tree.root} == {
        d: "not connected" for d in errors if d != tree.root}
    assert api.json("GET", f"/v1/groups/{g['id']}/trace?receiver={R2}", status=404)["error"] == \
        f"{R2} is not a receiver of group {g['id']}"
    for bad in ("receiver=nothing", "counters=maybe", "hop=1"):
        assert api.json("GET", f"/v1/groups/{g['id']}/trace?{bad}", status=400)["error"]
    assert api.json("GET", "/v1/groups/99/trace", status=404)["error"]


def test_a_reply_that_comes_too_late_is_dropped_never_passed_on():
    """A switch answers after the trace gave up: its flow-stats reply must not reach
    whoever else reads that switch's tables (an audit would take it for its own)."""
    env = make_env(token=TOKEN)
    g, _ = env.service.create_group({"model": "m", "source": S, "receivers": [R1]})
    sent: list = []
    counters = Counters(lambda dpid, msg: sent.append((dpid, msg)) or True, timeout_s=0.01)
    root = env.core.groups[g["id"]].tree.root
    got = counters.read(g["id"], [root])
    assert got[root].error == "no answer within 0.01 s" and len(sent) == 2
    for dpid, msg in sent:  # (now the switch answers)
        for part in env.fabric.request(dpid, msg):
            part.xid = msg.xid
            assert counters.reply(dpid, part) is True
    other = env.fabric.request(root, parser.OFPFlowStatsRequest(ofmsgs.datapath(root)))[-1]
    other.xid = 12345
    assert counters.reply(root, other) is False  # (someone else's read: passed on)
