"""Service (group lifecycle, install state, persistence, metrics, auth) driven without
WSGI: plans go to the simulated fabric through a test installer, synchronous or deferred."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from controller import ofmsgs
from controller.auth import ADMIN, Forbidden, Principal, Unauthorized
from controller.core import MulticastCore, Plan
from controller.errors import Conflict, InvalidAddress, ReceiverIsSource, UnknownGroup
from controller.protect import is_ff
from controller.service import Service, StateFileError
from controller.topoview import TopologyView
from lab.fakeof import FakeFabric
from tests.support.controller_env import R1, R2, R3, S, Env, FabricInstaller, make_env

# ---------------------------------------------------------------------- groups


def test_create_is_idempotent_and_keys_are_per_group():
    env = make_env()
    g, created = env.service.create_group({"model": "llama", "source": S, "receivers": [R1]})
    assert created and g["id"] == 1 and g["state"] == "installed"
    assert g["receivers"] == {R1: "installed"}
    assert len(g["key"]) == 64 and int(g["key"], 16) >= 0
    again, created = env.service.create_group({"model": "llama", "source": S, "receivers": [R2]})
    assert not created and again == g  # unchanged: receivers join with join()
    other, created = env.service.create_group({"model": "llama", "source": "10.0.0.2"})
    assert created and other["address"] == g["address"] and other["key"] != g["key"]
    assert other["state"] == "idle" and other["receivers"] == {}
    with pytest.raises(Conflict):
        env.service.create_group({"model": "llama", "source": S, "algorithm": "steiner"})
    assert env.delivered(1) == {R1: 1}


def test_join_leave_and_delete_drive_the_fabric():
    env = make_env()
    g, _ = env.service.create_group({"model": "m", "source": S, "receivers": [R1]})
    gid = g["id"]
    assert env.service.join(gid, R2)["receivers"] == {R1: "installed", R2: "installed"}
    assert env.delivered(gid) == {R1: 1, R2: 1}
    assert env.service.leave(gid, R1)["receivers"] == {R2: "installed"}
    assert env.delivered(gid) == {R2: 1}
    with pytest.raises(ReceiverIsSource):
        env.service.join(gid, S)
    # a host not seen yet: accepted and pending (the controller looks for it)
    assert env.service.join(gid, "10.9.9.9")["receivers"] == {R2: "installed", "10.9.9.9": "pending"}
    assert env.service.leave(gid, "10.9.9.9")["receivers"] == {R2: "installed"}
    done = []
    env.service.delete_group(gid, done=lambda: done.append(True))
    assert done == [True]
    assert env.ours(gid) == []
    with pytest.raises(UnknownGroup):
        env.service.get_group(gid)


def test_receiver_states_follow_confirmation():
    env = make_env(deferred=True)
    g, _ = env.service.create_group({"model": "m", "source": S, "receivers": [R1, R2]})
    assert g["state"] == "pending" and set(g["receivers"].values()) == {"pending"}
    assert env.metric("modelcast_receivers", state="pending") == 2
    assert env.delivered(g["id"]) == {}  # nothing on the switches yet
    env.clock.now += 0.25
    env.installer.flush()
    g = env.service.get_group(g["id"])
    assert g["state"] == "installed" and set(g["receivers"].values()) == {"installed"}
    assert env.metric("modelcast_receivers", state="installed") == 2
    tree = env.core.group(g["id"]).tree
    for dpid in env.topo.switches:  # one group and one (S,G) flow on each tree switch
        n = 1 if dpid in tree.entries else 0
        assert env.metric("modelcast_switch_entries", dpid=str(dpid), kind="groups") == n
        assert env.metric("modelcast_switch_entries", dpid=str(dpid), kind="sg_flows") == n
        sw = env.fabric.switches[dpid]  # protection: what the switch really holds
        assert env.metric("modelcast_switch_entries", dpid=str(dpid), kind="ff_groups") == \
            sum(1 for gid in sw.groups if is_ff(gid))
        assert env.metric("modelcast_switch_entries", dpid=str(dpid), kind="detour_flows") == \
            sum(1 for f in sw.flows if f.priority in (ofmsgs.PRIO_DETOUR, ofmsgs.PRIO_REJOIN))
    assert sum(env.metric("modelcast_switch_entries", dpid=str(d), kind="ff_groups")
               for d in env.topo.switches) > 0  # this tree has protected links
    assert env.metric("modelcast_install_seconds_count") == 1
    assert env.metric("modelcast_install_seconds_sum") == pytest.approx(0.25)
    # a deferred delete confirms only with the barrier
    done = []
    env.service.delete_group(g["id"], done=lambda: done.append(True))
    assert done == []
    env.installer.flush()
    assert done == [True] and env.ours(g["id"]) == []


def test_openflow_errors_put_the_group_in_error_state():
    env = make_env()
    # switch 3 already holds a group with the id the controller will use
    env.fabric.apply(3, ofmsgs.group_add(3, 1, 3, frozenset({4})))
    g, _ = env.service.create_group({"model": "m", "source": S, "receivers": [R1]})
    assert g["state"] == "error"
    assert g["receivers"] == {R1: "pending"}
    assert any("OFPGMFC_GROUP_EXISTS" in e for e in g["errors"]), g["errors"]
    assert env.metric("modelcast_openflow_errors_total") == len(g["errors"])


def test_unreachable_receiver_and_reroute_metrics():
    env = make_env()
    g, _ = env.service.create_group({"model": "m", "source": S, "receivers": [R1, R2]})
    env.fabric.set_switch(5, False)
    env.service.apply(env.core.switch_leave(5), "reroute")
    g = env.service.get_group(g["id"])
    assert g["receivers"] == {R1: "installed", R2: "unreachable"}
    assert env.metric("modelcast_receivers", state="unreachable") == 1
    env.fabric.set_switch(1, False)  # the spine the tree uses: a real reroute
    env.service.apply(env.core.switch_leave(1), "reroute")
    assert env.metric("modelcast_reroutes_total") == 2
    assert env.metric("modelcast_installs_total") == 3
    assert env.delivered(g["id"]) == {R1: 1}


def test_apply_empty_plan_and_double_confirmation():
    env = make_env()
    seen = []
    env.service.apply(Plan(), "noop", done=seen.append)
    assert seen == [[]] and env.metric("modelcast_installs_total") == 0

    class Twice:
        def install(self, plan, done):
            done([])
            done(["late duplicate"])

    env.service.installer = Twice()
    g, _ = env.service.create_group({"model": "m", "source": S, "receivers": [R1]})
    assert g["state"] == "installed" and g["errors"] == []


def test_declare_host_rules():
    env = make_env(unknown_hosts=(R3,))
    h = env.service.declare_host(R3, "00:00:00:00:00:06", 5, 4)
    assert h == {"ip": R3, "mac": "00:00:00:00:00:06", "dpid": 5, "port": 4}
    assert env.service.declare_host(R3, "00:00:00:00:00:06", 5, 4) == h  # same place again
    with pytest.raises(Conflict):
        env.service.declare_host(R3, "00:00:00:00:00:06", 4, 4)
    with pytest.raises(Conflict):  # a link port
        env.service.declare_host("10.0.0.77", "00:00:00:00:00:77", 5, 1)
    with pytest.raises(InvalidAddress):
        env.service.declare_host("10.0.0.77", "not-a-mac", 5, 9)
    g, _ = env.service.create_group({"model": "m", "source": S, "receivers": [R3]})
    assert env.delivered(g["id"]) == {R3: 1}


def test_auth():
    open_service = make_env().service
    assert open_service.authenticate(None, mutating=True) is None  # nothing configured: open
    svc = make_env(token="s3cret", host_tokens={R1: "r1-token-0123456789"}).service
    assert svc.authenticate("Bearer s3cret") == ADMIN
    assert svc.authenticate("bearer s3cret", mutating=True) == ADMIN
    assert svc.authenticate("Bearer r1-token-0123456789") == Principal(ip=R1)
    assert svc.authenticate(None) is None  # an anonymous read
    with pytest.raises(Unauthorized):
        svc.authenticate(None, mutating=True)
    for bad in ("", "Bearer", "Bearer s3cre", "Bearer s3cret2", "Basic s3cret", "s3cret",
                "Bearer r1-token-012345678"):
        with pytest.raises(Unauthorized):
            svc.authenticate(bad or None, mutating=True)


def test_keys_only_for_the_admin_source_and_receivers():
    svc = make_env(token="s3cret").service
    g, _ = svc.create_group({"model": "m", "source": S, "receivers": [R1]}, ADMIN)
    assert "key" not in svc.get_group(g["id"], None)
    assert svc.get_group(g["id"], Principal(ip=S))["key"] == g["key"]
    assert svc.get_group(g["id"], Principal(ip=R1))["key"] == g["key"]
    assert "key" not in svc.get_group(g["id"], Principal(ip=R2))
    assert svc.join(g["id"], R2, Principal(ip=R2))["key"] == g["key"]
    with pytest.raises(Forbidden):
        svc.join(g["id"], R3, Principal(ip=R2))


def test_health_and_topology():
    env = make_env()
    h = env.service.health()
    assert h["status"] == "ok" and h["switches"] == 5 and h["groups"] == 0
    env.clock.now += 12.5
    assert env.service.health()["uptime_s"] == 12.5
    env.service.apply(env.core.port_down(3, 1), "port")
    topo = env.service.topology()
    assert topo["switches"] == [1, 2, 3, 4, 5]
    assert {(l["a"], l["b"]): l["up"] for l in topo["links"]}[(1, 3)] is False
    assert sum(l["up"] for l in topo["links"]) == 5
    assert [h["ip"] for h in topo["hosts"]] == env.ips


# ---------------------------------------------------------------------- persistence


def restart(env: Env, state: Path) -> tuple[Service, FakeFabric, list[str]]:
    """A new controller process over the same state file and rebooted (empty) switches."""
    core = MulticastCore(TopologyView())
    fabric = FakeFabric(env.topo)
    svc = Service(core, FabricInstaller(fabric), state, registry=CollectorRegistry())
    return svc, fabric, svc.load()


def test_save_and_load_restore_groups_keys_and_hosts(tmp_path):
    state = tmp_path / "state.json"
    env = make_env(state_path=state, unknown_hosts=(R3,))
    env.service.declare_host(R3, "00:00:00:00:00:06", 5, 4)
    a, _ = env.service.create_group({"model": "a", "source": S, "receivers": [R1, R3]})
    b, _ = env.service.create_group({"model": "b", "source": R1, "receivers": [R2],
                                     "algorithm": "steiner"})
    b = env.service.rekey(b["id"], transfer={"session": "0123456789abcdef", "file_digest": "cd" * 32})
    assert state.read_bytes().startswith(b"modelcast-state 1\n")  # (a log of objects: controller.store)
    assert state.stat().st_mode & 0o777 == 0o600
    assert sorted(os.listdir(tmp_path)) == ["state.json"]

    svc, fabric, problems = restart(env, state)
    assert problems == []
    core = svc.core
    assert core.view.hosts[R3].dpid == 5 and len(core.view.links) == 6
    # trees are known at once, but nothing is on the (rebooted) switches yet
    assert svc.get_group(a["id"])["receivers"] == {R1: "pending", R3: "pending"}
    assert svc.get_group(a["id"])["state"] == "pending"
    for dpid in env.topo.switches:
        svc.apply(core.switch_enter(dpid), "switch")
    keys = ("id", "model", "source", "address", "port", "algorithm", "key", "receivers", "state")
    assert svc.get_group(b["id"])["session"] == "0123456789abcdef"  # the announced transfer too
    assert "session" not in svc.get_group(a["id"])
    for old in (a, b):
        new = svc.get_group(old["id"])
        assert {k: new[k] for k in keys} == {k: old[k] for k in keys}
    g = core.group(a["id"])
    tr = fabric.trace(g.source, g.address)
    assert dict(tr.delivered) == {R1: 1, R3: 1}
    c, _ = svc.create_group({"model": "c", "source": S})
    assert c["id"] == 3  # ids continue after the restored ones


def test_offers_survive_a_restart(tmp_path):
    """A restarted controller still tells fetchers who serves what (the offers are in
    the same state snapshot as the groups)."""
    state = tmp_path / "state.json"
    env = make_env(state_path=state)
    g, _ = env.service.create_group({"model": "blake3:" + "ab" * 32, "source": S})
    kept, _ = env.service.create_offer({"model": "blake3:" + "ab" * 32, "source": S, "name": "m", "size": 9})
    gone, _ = env.service.create_offer({"model": "x", "source": R1})
    env.service.delete_offer(gone["id"])
    svc, _, problems = restart(env, state)
    assert problems == [] and svc.list_offers() == [dict(kept, group=g["id"])]
    again, created = svc.create_offer({"model": "y", "source": R1})
    assert created and again["id"] == gone["id"] + 1  # (never an id given before)


def test_failed_save_keeps_the_old_file(tmp_path, monkeypatch, caplog):
    """A full disk: the change stands in memory (the switches have it), the file keeps
    exactly what it held (no half-written record), and the next save writes both."""
    state = tmp_path / "state.json"
    env = make_env(state_path=state)
    env.service.create_group({"model": "a", "source": S, "receivers": [R1]})
    before = state.read_bytes()
    fsync = os.fsync

    def boom(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", boom)
    g, _ = env.service.create_group({"model": "b", "source": S})  # its save fails; the change stands
    assert g["id"] == 2 and "No space left" in caplog.text
    assert state.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["state.json"]
    monkeypatch.setattr(os, "fsync", fsync)
    assert env.service.save()  # (the retry: the next flush_state, or the next change)
    svc, _, problems = restart(env, state)
    assert problems == [] and [g["model"] for g in svc.list_groups()] == ["a", "b"]


@pytest.mark.parametrize("content, words", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "does not hold a modelcast state"),
    (b'{"version": 1, "groups": [], "topology": []}', "does not hold a modelcast state"),
    (b'{"version": 99, "groups": []}', "version 99"),
    (b"\xff\xfe\x00", "cannot be read"),
    (b'{"version": 1, "groups": {"a": 1}}', "does not hold a modelcast state"),
])
def test_corrupt_state_file_is_one_clear_error(tmp_path, content, words):
    state = tmp_path / "state.json"
    state.write_bytes(content)
    svc = make_env(state_path=state).service
    with pytest.raises(StateFileError, match=words) as info:
        svc.load()
    assert str(state) in str(info.value) and "\n" not in str(info.value)
    assert state.read_bytes() == content  # left for the operator to inspect


def test_a_group_without_a_saved_key_gets_a_new_one(tmp_path):
    state = tmp_path / "state.json"
    env = make_env()
    state.write_text(json.dumps({
        "version": 1, "topology": env.core.to_dict()["topology"],
        "groups": [{"id": 4, "model": "ok", "source": S, "address": "232.1.2.3", "port": 5500,
                    "receivers": [R1], "key": "ab" * 32},
                   {"id": 5, "model": "nokey", "source": S, "address": "232.1.2.4", "port": 5500}]}))
    svc, fabric, problems = restart(env, state)
    assert problems == ["group 5: no valid session key saved; issued a new one"]
    assert svc.get_group(4)["key"] == "ab" * 32
    assert len(svc.get_group(5)["key"]) == 64
    for dpid in env.topo.switches:
        svc.apply(svc.core.switch_enter(dpid), "switch")
    g = svc.core.group(4)
    assert dict(fabric.trace(g.source, g.address).delivered) == {R1: 1}
    assert svc.get_group(4)["state"] == "installed"


GOOD_GROUP = {"id": 4, "model": "ok", "source": S, "address": "232.1.2.3", "port": 5500,
              "receivers": [R1], "tree": [[3, 1]], "key": "ab" * 32}


OTHER_GROUP = dict(GOOD_GROUP, id=9, model="other", address="232.1.2.9", key="cd" * 32)


@pytest.mark.parametrize("change, words", [
    ({"groups": [dict(GOOD_GROUP, receivers=[S])]}, "group 4: receiver 10.0.0.1 is the group's source"),
    ({"groups": [dict(GOOD_GROUP, receivers=[R1, R1])]}, "group 4: receivers must not name an address twice"),
    ({"groups": [dict(GOOD_GROUP, receivers=5)]}, "group 4: does not match the GroupCreate schema at /receivers"),
    ({"groups": [dict(GOOD_GROUP, receivers=[7])]}, "group 4: does not match the GroupCreate schema at /receivers/0"),
    ({"groups": [dict(GOOD_GROUP, id=1 << 40)]}, "groups[0] id is 1099511627776, not an integer"),
    ({"groups": [dict(GOOD_GROUP, id=0)]}, "groups[0] id is 0"),
    ({"groups": [dict(GOOD_GROUP, id="4")]}, "groups[0] id is '4'"),
    ({"groups": [dict(GOOD_GROUP, id=True)]}, "groups[0] id is True"),
    ({"groups": [OTHER_GROUP]}, "group 9: saved twice"),
    ({"groups": [dict(GOOD_GROUP, port=70000)]}, "group 4: port is 70000"),
    ({"groups": [dict(GOOD_GROUP, address="239.1.1.1")]}, "group 4: group address 239.1.1.1 is not in the SSM"),
    ({"groups": [dict(GOOD_GROUP, model=["x"])]}, "group 4: model is ['x'], not a string"),
    ({"groups": [dict(GOOD_GROUP, algorithm="ospf")]}, "group 4: does not match the GroupCreate schema at /algorithm"),
    ({"groups": [dict(GOOD_GROUP, tree=[[3, -1]])]}, "group 4: tree[0] dpid is -1"),
    ({"groups": [dict(GOOD_GROUP, tree=[[3]])]}, "group 4: tree[0] is [3], not a list of 2"),
    ({"groups": [dict(GOOD_GROUP, key=7)]}, "group 4: key is not a string"),
    ({"groups": [dict(GOOD_GROUP, transfer={"session": "zz"})]}, "group 4: transfer is not"),
    ({"groups": [dict(GOOD_GROUP, transfer={"file_digest": "ab" * 32})]}, "group 4: transfer is not"),
    ({"groups": [7]}, "groups[0] is int, not an object"),
    ({"topology": {"switches": [1 << 64]}}, "topology.switches[0] is 18446744073709551616"),
    ({"topology": {"links": [[1, 2, 3]]}}, "topology.links[0] is [1, 2, 3], not a list of 4"),
    ({"topology": {"links": [[1, 0, 3, 1]]}}, "topology.links[0] port is 0"),
    ({"topology": {"hosts": [["999.1.1.1", "00:00:00:00:00:99", 1, 9]]}}, "topology.hosts[0] host address"),
    ({"topology": {"hosts": [[S, "zz", 1, 9]]}}, "topology.hosts[0] MAC 'zz'"),
    ({"topology": {"hosts": [[S, "00:00:00:00:00:99", 1, "9"]]}}, "topology.hosts[0] port is '9'"),
    ({"topology": {"hosts": "x"}}, "topology.hosts is str, not a list"),
    ({"offers": [{"id": 0, "model": "m", "source": S}]}, "offers[0] id is 0"),
    ({"offers": [{"id": 1, "model": "m", "source": "232.1.1.1"}]}, "offer 1: source address"),
    ({"offers": [{"id": 1, "model": "m", "source": S, "size": -1}]}, "offer 1: does not match the OfferCreate schema at /size"),
    ({"offers": [{"id": 1, "model": 5, "source": S}]}, "offer 1: does not match the OfferCreate schema at /model"),
    ({"offers": [{"id": 1, "model": "m", "source": S}] * 2}, "offer 1: saved twice"),
])
def test_a_hostile_entry_is_dropped_with_one_clear_line(tmp_path, change, words):
    """Refusing the whole file would stop every restart: the bad entry alone is dropped,
    with one line naming it (never a key or a traceback); every other entry is restored,
    and the file is left as it was until the next save."""
    state = tmp_path / "state.json"
    data = dict({"version": 1, "topology": {}, "groups": [GOOD_GROUP]}, **change)
    data["groups"] = data["groups"] + [OTHER_GROUP]
    content = json.dumps(data)
    state.write_text(content)
    svc = make_env(state_path=state).service
    problems = svc.load()
    assert len(problems) == 1 and words in problems[0], problems
    assert "\n" not in problems[0] and "ab" * 32 not in problems[0] and "cd" * 32 not in problems[0]
    assert svc.get_group(9)["key"] == "cd" * 32
    assert state.read_text() == content


def test_missing_state_file_is_a_fresh_start(tmp_path):
    svc = make_env(state_path=tmp_path / "none" / "state.json").service
    assert svc.load() == []
    svc.create_group({"model": "m", "source": S})
    assert (tmp_path / "none" / "state.json").exists()


def test_saves_learned_from_the_network_are_debounced(tmp_path):
    """REST changes are written at once (the caller is answered after the file holds
    them); hosts learned from packet-ins are written by the timer, one write per burst."""
    state = tmp_path / "state.json"
    writes: list[bytes] = []
    env = make_env(state_path=state)
    svc = Service(env.core, env.installer, state, writer=lambda p, data: writes.append(data),
                  save_interval_s=1.0)
    svc.create_group({"model": "m", "source": S, "receivers": [R1]})
    assert len(writes) == 1 and b'"model":"m"' in writes[0] and b": " not in writes[0]  # compact
    for i in range(100):  # a burst of new hosts
        env.core.host_add(f"10.7.0.{i + 1}", f"00:00:00:07:00:{i:02x}", 3, 100 + i)
        svc.save_soon()
    assert len(writes) == 1  # nothing written from the packet-in path itself
    assert svc.flush_state(10.0) and len(writes) == 2 and b"10.7.0.100" in writes[1]
    svc.save_soon()
    assert svc.flush_state(10.5) and len(writes) == 2  # not due yet
    assert svc.flush_state(11.0) and len(writes) == 3
    assert svc.flush_state(20.0) and len(writes) == 3  # nothing pending: nothing written


def test_a_failed_debounced_save_is_retried(tmp_path):
    state = tmp_path / "state.json"
    env = make_env(state_path=state)
    calls = []

    def full_disk(path: Path, data: bytes) -> None:
        calls.append(data)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        Service._write(path, data)

    svc = Service(env.core, env.installer, state, writer=full_disk)
    svc.save_soon()
    assert not svc.flush_state(0.0) and not state.exists()
    assert svc.flush_state(1.0) and state.read_bytes().startswith(b"modelcast-state 1\n")


def test_held_requests_are_counted_exactly_from_many_threads():
    """``Changes.hold``: at most ``limit`` held at once, the rest refused and counted,
    and the count back at 0 afterwards, however the threads interleave (a lost update
    would leave a slot taken, or given twice, forever)."""
    import threading as th

    from controller.service import Changes

    changes = Changes(limit=5)
    inside, most, gate = [0], [0], th.Barrier(40)
    lock = th.Lock()

    def one() -> None:
        gate.wait()
        for _ in range(200):
            with changes.hold() as held:
                if held:
                    with lock:
                        inside[0] += 1
                        most[0] = max(most[0], inside[0])
                    with lock:
                        inside[0] -= 1

    threads = [th.Thread(target=one) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert changes.held == 0 and 1 <= most[0] <= 5
    assert changes.refused < 40 * 200


def test_a_reloaded_core_still_knows_which_switches_have_no_fast_failover() -> None:
    """A follower's mirror or a new leader's reload rebuilds the core; what switches said
    of themselves (no FF groups) must reach the new core's protection, or the next tree
    would send FF groups a switch refuses."""
    env = make_env()
    dpid = env.topo.host(S).dpid  # (the source's switch: every tree leaves it)
    env.service.apply(env.core.set_fast_failover(dpid, False), "fast-failover")
    env.service.reload(env.service.state())
    core = env.service.core
    assert dpid in core.no_ff and dpid in core.failover.no_ff
    g, _ = core.create_group("llama", S, [R1, R2, R3])
    assert g.tree is not None and dpid in g.tree.entries
    assert g.tree.entries[dpid].ff == ()  # no FF group at a switch without them
    with pytest.raises(AttributeError):
        core.no_ff = set()  # (the managers' state cannot be rebound from outside)


def test_a_drain_survives_a_restart_and_the_restored_trees_avoid_it(tmp_path):
    """Drains are saved with the topology: a restarted controller (or a new leader, which
    loads the same state) keeps the switch and the link held and computes no tree
    across them."""
    state = tmp_path / "state.json"
    env = make_env(state_path=state)
    g, _ = env.service.create_group({"model": "a", "source": S, "receivers": [R1, R2, R3]})
    env.service.drain(1, None, True)
    env.service.drain(2, 4, True)
    svc, _, problems = restart(env, state)
    assert problems == []
    assert [d["switches"] for d in svc.drains()] == [[2, 4], [1]]
    tree = svc.core.groups[g["id"]].tree
    assert 1 not in tree.parent and tree.parent.get(4) != 2 and tree.parent.get(2) != 4
    svc.drain(1, None, False)
    assert [d["switches"] for d in svc.drains()] == [[2, 4]]
