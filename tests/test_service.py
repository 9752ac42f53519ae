"""Service (group lifecycle, install state, persistence, metrics, auth) driven without
WSGI: plans go to the simulated fabric through a test installer, synchronous or deferred."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from controller import ofmsgs
from controller.core import MulticastCore, Plan
from controller.errors import Conflict, InvalidAddress, ReceiverIsSource, UnknownGroup
from controller.service import Service, StateFileError, Unauthorized
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
    open_service.check_auth(None)
    svc = make_env(token="s3cret").service
    svc.check_auth("Bearer s3cret")
    svc.check_auth("bearer s3cret")
    for bad in (None, "", "Bearer", "Bearer s3cre", "Bearer s3cret2", "Basic s3cret", "s3cret"):
        with pytest.raises(Unauthorized):
            svc.check_auth(bad)


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
    assert json.loads(state.read_text())["version"] == 1
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
    for old in (a, b):
        new = svc.get_group(old["id"])
        assert {k: new[k] for k in keys} == {k: old[k] for k in keys}
    g = core.group(a["id"])
    tr = fabric.trace(g.source, g.address)
    assert dict(tr.delivered) == {R1: 1, R3: 1}
    c, _ = svc.create_group({"model": "c", "source": S})
    assert c["id"] == 3  # ids continue after the restored ones


def test_failed_save_keeps_the_old_file(tmp_path, monkeypatch, caplog):
    state = tmp_path / "state.json"
    env = make_env(state_path=state)
    env.service.create_group({"model": "a", "source": S, "receivers": [R1]})
    before = state.read_bytes()

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    assert env.service.save() is False
    g, _ = env.service.create_group({"model": "b", "source": S})  # the change stands
    assert g["id"] == 2 and "No space left" in caplog.text
    assert state.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["state.json"]


@pytest.mark.parametrize("content, words", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "does not hold a modelcast state"),
    (b'{"version": 1, "groups": [], "topology": []}', "does not hold a modelcast state"),
    (b'{"version": 99, "groups": []}', "version 99"),
    (b"\xff\xfe\x00", "cannot read"),
])
def test_corrupt_state_file_is_one_clear_error(tmp_path, content, words):
    state = tmp_path / "state.json"
    state.write_bytes(content)
    svc = make_env(state_path=state).service
    with pytest.raises(StateFileError, match=words) as info:
        svc.load()
    assert str(state) in str(info.value) and "\n" not in str(info.value)
    assert state.read_bytes() == content  # left for the operator to inspect


def test_bad_items_in_state_file_are_reported_not_fatal(tmp_path):
    state = tmp_path / "state.json"
    env = make_env()
    topology = env.core.to_dict()["topology"]
    topology["hosts"].append(["999.1.1.1", "00:00:00:00:00:99", 1, 9])
    state.write_text(json.dumps({
        "version": 1, "topology": topology,
        "groups": [{"id": 4, "model": "ok", "source": S, "address": "232.1.2.3", "port": 5500,
                    "receivers": [R1], "key": "ab" * 32},
                   {"id": 5, "model": "nokey", "source": S, "address": "232.1.2.4", "port": 5500},
                   {"id": "x", "model": "bad", "key": "cd" * 32}, 7]}))
    svc, fabric, problems = restart(env, state)
    assert len(problems) == 4, problems
    assert sum(p.startswith("topology:") for p in problems) == 1
    assert not any("ab" * 32 in p or "cd" * 32 in p for p in problems)  # keys are never logged
    assert svc.get_group(4)["key"] == "ab" * 32
    assert len(svc.get_group(5)["key"]) == 64
    for dpid in env.topo.switches:
        svc.apply(svc.core.switch_enter(dpid), "switch")
    g = svc.core.group(4)
    assert dict(fabric.trace(g.source, g.address).delivered) == {R1: 1}
    assert svc.get_group(4)["state"] == "installed"


def test_missing_state_file_is_a_fresh_start(tmp_path):
    svc = make_env(state_path=tmp_path / "none" / "state.json").service
    assert svc.load() == []
    svc.create_group({"model": "m", "source": S})
    assert (tmp_path / "none" / "state.json").exists()
