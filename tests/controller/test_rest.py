"""The REST API through a real Ryu ``WSGIApplication`` without a server (ryu's
test_ofctl_rest pattern: ``Request.blank(...).get_response(app)``), over a Service whose
plans land on the simulated fabric: tests assert where packets arrive."""

from __future__ import annotations

import ast
import json
import logging
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from webob import Request

import controller.rest as rest
from controller import ofmsgs
from controller.auth import Credentials
from tests.support.controller_env import R1, R2, R3, S, TOKEN, Api, Env, make_env, valid


@pytest.fixture
def env() -> Env:
    return make_env(token=TOKEN)


@pytest.fixture
def api(env: Env) -> Api:
    return Api(env)


def create(api: Api, status: int = 201, **body: Any) -> dict:
    body.setdefault("model", "llama-70b")
    body.setdefault("source", S)
    return api.json("POST", "/v1/groups", body, status)


# ---------------------------------------------------------------------- groups


def test_create_and_idempotent_create(api):
    resp = api.call("POST", "/v1/groups", {"model": "llama-70b", "source": S, "receivers": [R1]})
    assert resp.status_code == 201 and resp.headers["Location"].endswith("/v1/groups/1")
    g = valid("Group", resp.json)
    assert g["id"] == 1 and g["state"] == "installed" and g["receivers"] == {R1: "installed"}
    assert re.fullmatch(r"232\.\d+\.\d+\.\d+", g["address"]) and re.fullmatch("[0-9a-f]{64}", g["key"])
    assert g["tree"]["switches"] and g["tree"]["in_ports"]["3"] == 3  # source port on leaf 3
    again = create(api, 200, receivers=[R2])
    assert again == g  # the existing group, unchanged
    assert api.json("POST", "/v1/groups", {"model": "llama-70b", "source": S,
                                           "algorithm": "steiner"}, 409)["error"]
    steiner = valid("Group", create(api, model="other", algorithm="steiner", receivers=[R1, R2]))
    assert steiner["algorithm"] == "steiner" and steiner["id"] == 2


def test_a_get_waits_for_the_group_to_change(api):
    """``If-None-Match`` with the last answer's ETag and ``Prefer: wait=N``: the GET is
    held until the group changes (here: a receiver joins from another client), then
    answers the new group with a new ETag; unchanged, it answers 304 (at once without a
    wait); a group deleted meanwhile is a 404."""
    g = create(api, receivers=[R1])
    first = api.call("GET", f"/v1/groups/{g['id']}")
    tag = first.headers["ETag"]
    assert first.status_code == 200 and first.json == g and re.fullmatch(r'"[0-9a-f]{24}"', tag)
    same = api.call("GET", f"/v1/groups/{g['id']}", headers={"If-None-Match": tag})
    assert same.status_code == 304 and same.headers["ETag"] == tag and not same.body
    held = api.call("GET", f"/v1/groups/{g['id']}", headers={"If-None-Match": tag, "Prefer": "wait=0.2"})
    assert held.status_code == 304  # nothing changed in the wait
    assert api.call("GET", f"/v1/groups/{g['id']}", headers={"If-None-Match": '"other"'}).status_code == 200

    def held_while(method: str, path: str, tag: str) -> Any:
        """A GET held on ``tag`` while another client sends ``method path`` 0.3 s in."""
        other = threading.Timer(0.3, lambda: api.call(method, path))
        other.start()
        try:
            return api.call("GET", f"/v1/groups/{g['id']}", headers={"If-None-Match": tag, "Prefer": "wait=10"})
        finally:
            other.join()

    changed = held_while("PUT", f"/v1/groups/{g['id']}/receivers/{R2}", tag)
    assert changed.status_code == 200 and changed.headers["ETag"] != tag
    # the install notifies too (its receivers are pending until confirmed): the held GET
    # may answer that first change, and the client asks again with the new ETag, once per
    # change, until the join is installed (a few rounds at most: every answer changed)
    for _ in range(5):
        receivers = valid("Group", changed.json)["receivers"]
        if receivers == {R1: "installed", R2: "installed"}:
            break
        assert set(receivers) == {R1, R2} and set(receivers.values()) <= {"pending", "installed"}
        changed = api.call("GET", f"/v1/groups/{g['id']}",
                           headers={"If-None-Match": changed.headers["ETag"], "Prefer": "wait=10"})
        assert changed.status_code == 200  # (a 304: the join never got installed)
    assert receivers == {R1: "installed", R2: "installed"}
    gone = held_while("DELETE", f"/v1/groups/{g['id']}", changed.headers["ETag"])
    assert gone.status_code == 404 and "no group" in gone.json["error"]


def test_list_filter_and_get(api):
    a = create(api, receivers=[R1])
    b = create(api, model="mistral", source=R1)
    c = create(api, model="mistral", source=S)
    assert [g["id"] for g in valid("GroupList", api.json("GET", "/v1/groups"))] == [1, 2, 3]
    assert [g["id"] for g in api.json("GET", "/v1/groups?model=mistral")] == [b["id"], c["id"]]
    assert [g["id"] for g in api.json("GET", f"/v1/groups?source={S}")] == [a["id"], c["id"]]
    assert [g["id"] for g in api.json("GET", f"/v1/groups?model=mistral&source={R1}")] == [b["id"]]
    assert api.json("GET", "/v1/groups?model=none") == []
    assert api.json("GET", "/v1/groups?source=10.0.0.300", status=400)["error"]
    assert api.json("GET", "/v1/groups?modle=x", status=400)["detail"] == {"unknown": ["modle"]}
    anonymous = api.json("GET", "/v1/groups/2", auth=False)
    assert "key" not in anonymous and anonymous == {k: v for k, v in b.items() if k != "key"}
    assert api.json("GET", "/v1/groups/2") == b  # the admin token sees the key
    assert "no group" in api.json("GET", "/v1/groups/99", status=404)["error"]
    for bad in ("abc", "0", "-1", "1.5", "99999999999"):
        assert api.json("GET", f"/v1/groups/{bad}", status=400)["error"]


def test_join_and_leave_change_delivery(api, env):
    g = create(api, receivers=[R1])
    src, addr = g["source"], g["address"]
    assert dict(env.fabric.trace(src, addr).delivered) == {R1: 1}
    g = valid("Group", api.json("PUT", f"/v1/groups/{g['id']}/receivers/{R2}"))
    assert g["receivers"] == {R1: "installed", R2: "installed"} and g["state"] == "installed"
    tr = env.fabric.trace(src, addr)
    assert dict(tr.delivered) == {R1: 1, R2: 1} and not tr.loops
    assert api.json("PUT", f"/v1/groups/{g['id']}/receivers/{R2}") == g  # idempotent
    g = api.json("DELETE", f"/v1/groups/{g['id']}/receivers/{R1}")
    assert g["receivers"] == {R2: "installed"}
    assert dict(env.fabric.trace(src, addr).delivered) == {R2: 1}
    g = api.json("DELETE", f"/v1/groups/{g['id']}/receivers/{R2}")
    assert g["receivers"] == {} and g["state"] == "idle" and g["tree"]["switches"] == []
    assert dict(env.fabric.trace(src, addr).delivered) == {}


def test_delete_group_waits_and_removes_everything(api, env):
    g = create(api, receivers=[R1, R2, R3])
    assert env.ours(g["id"])
    resp = api.call("DELETE", f"/v1/groups/{g['id']}")
    assert resp.status_code == 204 and resp.body == b""
    assert env.ours(g["id"]) == []
    assert dict(env.fabric.trace(S, g["address"]).delivered) == {}
    api.json("GET", f"/v1/groups/{g['id']}", status=404)
    api.json("DELETE", f"/v1/groups/{g['id']}", status=404)


def test_delete_answers_504_when_the_barrier_does_not_come():
    env = make_env(token=TOKEN, deferred=True)
    api = Api(env, barrier_timeout=0.05)
    g = create(api, receivers=[R1])
    env.installer.flush()
    err = api.json("DELETE", f"/v1/groups/{g['id']}", status=504)
    assert "did not confirm" in err["error"] and err["detail"]["id"] == g["id"]
    env.installer.flush()  # the barrier arrives late: the group is gone all the same
    assert env.ours(g["id"]) == []
    api.json("GET", f"/v1/groups/{g['id']}", status=404)


def test_delete_waits_for_a_barrier_confirmed_by_another_green_thread():
    """As in the Ryu app: the installer's done runs later in another green thread
    (the barrier reply), and the DELETE handler's green thread waits for it."""
    from ryu.lib import hub

    env = make_env(token=TOKEN)
    api = Api(env, barrier_timeout=5)
    g = create(api, receivers=[R1, R2])
    order = []

    class GreenInstaller:
        def install(self, plan, done):
            def later():
                hub.sleep(0.02)
                order.append("barrier")
                done([str(e) for e in env.fabric.apply_all(plan)])
            hub.spawn(later)

    env.service.installer = GreenInstaller()
    resp = api.call("DELETE", f"/v1/groups/{g['id']}")
    order.append("response")
    assert resp.status_code == 204 and order == ["barrier", "response"]
    assert env.ours(g["id"]) == []


def test_receiver_states_pending_then_installed():
    env = make_env(token=TOKEN, deferred=True)
    api = Api(env)
    g = create(api, receivers=[R1, R2])
    assert g["state"] == "pending" and g["receivers"] == {R1: "pending", R2: "pending"}
    assert api.json("GET", f"/v1/groups/{g['id']}")["state"] == "pending"
    env.installer.flush()
    g = api.json("GET", f"/v1/groups/{g['id']}")
    assert g["state"] == "installed" and g["receivers"] == {R1: "installed", R2: "installed"}
    g = api.json("PUT", f"/v1/groups/{g['id']}/receivers/{R3}")
    assert g["state"] == "pending" and set(g["receivers"].values()) == {"pending"}
    env.installer.flush()
    assert set(api.json("GET", f"/v1/groups/{g['id']}")["receivers"].values()) == {"installed"}


def test_openflow_error_shows_as_error_state(api, env):
    env.fabric.apply(3, ofmsgs.group_add(3, 1, 3, frozenset({4})))  # id 1 taken on leaf 3
    g = valid("Group", create(api, receivers=[R1]))
    assert g["state"] == "error" and g["receivers"] == {R1: "pending"}
    assert any("OFPGMFC_GROUP_EXISTS" in e for e in g["errors"])
    text = api.call("GET", "/metrics").text
    assert re.search(r"^modelcast_openflow_errors_total [1-9]", text, re.M)


# ---------------------------------------------------------------------- hosts, topology


def test_declare_host_then_receive():
    env = make_env(token=TOKEN, unknown_hosts=(R3,))
    api = Api(env)
    g = create(api, receivers=[R1])
    # not seen yet: the receiver waits, pending, until the host is found (or declared)
    joined = api.json("PUT", f"/v1/groups/{g['id']}/receivers/{R3}")
    assert joined["receivers"][R3] == "pending" and joined["state"] == "pending"
    host = {"ip": R3, "mac": "00:00:00:00:00:06", "dpid": 5, "port": 4}
    assert valid("Host", api.json("POST", "/v1/hosts", host, 201)) == host
    assert api.json("POST", "/v1/hosts", host, 201) == host  # the same declaration again
    api.json("PUT", f"/v1/groups/{g['id']}/receivers/{R3}")
    assert dict(env.fabric.trace(S, g["address"]).delivered) == {R1: 1, R3: 1}
    # an address already at another place, or a link port: conflicts
    assert "already known" in api.json("POST", "/v1/hosts", dict(host, dpid=4), 409)["error"]
    assert "link" in api.json("POST", "/v1/hosts", dict(host, ip="10.0.0.50", port=1), 409)["error"]
    # forgetting the host makes it pending (looked for again); it can be declared elsewhere
    assert api.call("DELETE", f"/v1/hosts/{R3}").status_code == 204
    assert api.json("GET", f"/v1/groups/{g['id']}")["receivers"][R3] == "pending"
    api.json("DELETE", f"/v1/hosts/{R3}", status=404)
    api.json("POST", "/v1/hosts", dict(host, dpid=4, port=9), 201)
    assert api.json("GET", "/v1/groups/1")["receivers"][R3] == "installed"


def test_topology_and_health(api, env):
    topo = valid("Topology", api.json("GET", "/v1/topology", auth=False))
    assert topo["switches"] == [1, 2, 3, 4, 5] and len(topo["links"]) == 6
    assert all(link["up"] for link in topo["links"])
    assert [h["ip"] for h in topo["hosts"]] == env.ips
    env.service.apply(env.core.port_down(3, 1), "reroute")
    down = [l for l in api.json("GET", "/v1/topology")["links"] if not l["up"]]
    assert down == [{"a": 1, "a_port": 1, "b": 3, "b_port": 1, "up": False}]
    create(api)
    h = valid("Health", api.json("GET", "/v1/health", auth=False))
    assert h["status"] == "ok" and h["switches"] == 5 and h["groups"] == 1
    assert h["protection"] == {"on": True, "detour_ends": "per-link", "unprotected_switches": []}
    # a switch without fast-failover groups, then one that is not Open vSwitch (controller.app)
    env.service.apply(env.core.set_fast_failover(2, False), "fast-failover")
    env.service.apply(env.core.set_nicira(False), "plain-openflow")
    h = valid("Health", api.json("GET", "/v1/health", auth=False))
    assert h["protection"] == {"on": True, "detour_ends": "per-group", "unprotected_switches": [2]}


# ---------------------------------------------------------------------- errors


def test_malformed_json(api):
    err = api.json("POST", "/v1/groups", raw=b'{"model": "m", ', status=400)
    assert err["error"] == "request body is not valid JSON" and err["detail"]["line"] == 1
    assert api.json("POST", "/v1/groups", raw=b"", status=400)["error"].startswith("request body is empty")
    assert api.json("POST", "/v1/groups", raw=b"\xff\xfe", status=400)["error"]
    assert api.json("POST", "/v1/hosts", raw=b"[1,", status=400)["error"]


@pytest.mark.parametrize("body, path, words", [
    ({"source": S}, "/", "'model' is a required property"),
    ({"model": "m", "source": S, "colour": "blue"}, "/", "Additional properties"),
    ({"model": 7, "source": S}, "/model", "is not of type 'string'"),
    ({"model": "", "source": S}, "/model", "should be non-empty"),
    ({"model": "m", "source": S, "receivers": R1}, "/receivers", "is not of type 'array'"),
    ({"model": "m", "source": S, "receivers": ["10.0.0.1000"]}, "/receivers/0", "is not a 'ipv4'"),
    ({"model": "m", "source": S, "algorithm": "fastest"}, "/algorithm", "is not one of"),
    ({"model": "m", "source": "h1"}, "/source", "is not a 'ipv4'"),
    ([{"model": "m"}], "/", "is not of type 'object'"),
])
def test_schema_violations(api, body, path, words):
    err = api.json("POST", "/v1/groups", body, 400)
    assert err["detail"]["path"] == path and words in err["detail"]["message"], err
    assert "GroupCreate" in err["error"]


@pytest.mark.parametrize("body, path", [
    ({"ip": R1, "mac": "00:00:00:00:00:01", "dpid": 3}, "/"),
    ({"ip": R1, "mac": "zz", "dpid": 3, "port": 3}, "/mac"),
    ({"ip": R1, "mac": "00:00:00:00:00:01", "dpid": "3", "port": 3}, "/dpid"),
    ({"ip": R1, "mac": "00:00:00:00:00:01", "dpid": 3, "port": 0}, "/port"),
])
def test_host_schema_violations(api, body, path):
    assert api.json("POST", "/v1/hosts", body, 400)["detail"]["path"] == path


def test_bad_addresses(api):
    g = create(api, receivers=[R1])
    for bad in ("10.0.0.999", "232.1.1.1", "0.0.0.0", "not-an-ip"):
        err = api.json("PUT", f"/v1/groups/{g['id']}/receivers/{bad}", status=400)
        assert "receiver address" in err["error"]
        api.json("DELETE", f"/v1/groups/{g['id']}/receivers/{bad}", status=400)
    assert "source address" in create(api, 400, model="x", source="224.0.0.5")["error"]
    assert "source" in create(api, 400, model="x", source=S, receivers=[S])["error"]
    api.json("PUT", f"/v1/groups/abc/receivers/{R1}", status=400)


def test_unsupported_media_type(api, env):
    resp = api.call("POST", "/v1/groups", {"model": "m", "source": S}, content_type="text/plain")
    assert resp.status_code == 415 and "application/json" in resp.json["error"]
    for ctype in ("text/plain", "application/xml", "multipart/form-data; boundary=x"):
        err = api.json("POST", "/v1/groups", raw=b"model=m&source=10.0.0.1", status=415,
                       content_type=ctype)
        assert err["error"] == f"request body must be application/json, not {ctype.split(';')[0]}"
    assert env.core.groups == {}


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded",
                                          "application/json; charset=utf-8",
                                          "application/merge-patch+json"])
def test_a_json_body_is_json_without_a_json_content_type(api, env, content_type):
    """``curl -d '{...}'`` without ``-H 'Content-Type: application/json'`` sends
    application/x-www-form-urlencoded (other clients send no type): the README's curl
    examples rely on such a body being read as the JSON it is."""
    g = api.json("POST", "/v1/groups", {"model": "m", "source": S, "receivers": [R1]}, 201,
                 content_type=content_type)
    assert g["receivers"] == {R1: "installed"} and env.delivered(g["id"]) == {R1: 1}
    host = {"ip": "10.0.0.50", "mac": "00:00:00:00:00:50", "dpid": 5, "port": 9}
    assert api.json("POST", "/v1/hosts", host, 201, content_type=content_type) == host
    # a body that is not JSON is still a 400 naming the problem, and changes nothing
    err = api.json("POST", "/v1/groups", raw=b"model=x&source=10.0.0.2", status=400,
                   content_type=content_type)
    assert err["error"] == "request body is not valid JSON" and err["detail"]["column"] == 1
    assert "is not of type 'object'" in api.json("POST", "/v1/groups", raw=b'"m"', status=400,
                                                 content_type=content_type)["error"]
    assert [listed["id"] for listed in api.json("GET", "/v1/groups")] == [g["id"]]


def test_auth_required_for_mutating_calls(api, env):
    body = {"model": "m", "source": S, "receivers": [R1]}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        resp = api.call("POST", "/v1/groups", body, headers=headers, auth=False)
        assert resp.status_code == 401 and resp.headers["WWW-Authenticate"].startswith("Bearer")
        assert set(resp.json) == {"error", "detail"}
    assert env.core.groups == {}
    create(api, receivers=[R1])
    for method, path in (("PUT", f"/v1/groups/1/receivers/{R2}"), ("DELETE", f"/v1/groups/1/receivers/{R1}"),
                         ("DELETE", "/v1/groups/1"), ("POST", "/v1/hosts"), ("DELETE", f"/v1/hosts/{R1}")):
        assert api.call(method, path, auth=False).status_code == 401, (method, path)
    # auth is checked before anything else, so it reveals nothing about groups
    assert api.call("DELETE", "/v1/groups/77", auth=False).status_code == 401
    for path in ("/v1/groups", "/v1/groups/1", "/v1/topology", "/v1/health", "/metrics",
                 "/v1/openapi.json"):
        assert api.call("GET", path, auth=False).status_code == 200, path
        # a wrong token is refused on reads too: the client learns at once
        assert api.call("GET", path, auth=False, headers={"Authorization": "Bearer wrong"}
                        ).status_code == 401, path
    assert api.json("GET", "/v1/groups/1")["receivers"] == {R1: "installed"}


def test_no_session_key_without_a_token(api):
    """The key is the group's MAC secret: no unauthenticated answer carries it."""
    created = create(api, receivers=[R1])
    assert re.fullmatch("[0-9a-f]{64}", created["key"])
    assert "key" not in api.json("GET", "/v1/groups/1", auth=False)
    assert all("key" not in g for g in api.json("GET", "/v1/groups", auth=False))
    assert all("key" not in g for g in api.json("GET", f"/v1/groups?source={S}", auth=False))
    assert created["key"] not in api.call("GET", "/metrics", auth=False).text
    assert api.json("GET", "/v1/groups/1")["key"] == created["key"]
    joined = api.json("PUT", f"/v1/groups/1/receivers/{R2}")
    assert joined["key"] == created["key"]  # a receiver gets it in its own join


def test_no_token_means_open_but_keyless(env):
    """No credential configured (the entry point allows it on loopback only): anyone may
    change groups, and nobody is given a key, since nobody proved who they are."""
    env.service.credentials = Credentials(None)
    api = Api(env)
    resp = api.call("POST", "/v1/groups", {"model": "m", "source": S}, auth=False)
    assert resp.status_code == 201 and "key" not in resp.json
    assert "key" not in api.json("PUT", f"/v1/groups/1/receivers/{R1}", auth=False)
    assert api.call("GET", "/v1/groups/1", auth=False, headers={"Authorization": "Bearer x"}
                    ).status_code == 401


HOST_TOKENS = {S: "source-token-0123456789", R1: "r1-token-0123456789ab", R2: "r2-token-0123456789ab"}


def as_host(ip: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {HOST_TOKENS[ip]}"}


@pytest.fixture
def hosts_api() -> Api:
    return Api(make_env(token=TOKEN, host_tokens=HOST_TOKENS))


def test_a_rekey_announces_the_transfer_and_a_bare_rekey_retires_it(hosts_api):
    """The source names the session (and file digest) its new key is for; a receiver's
    join answers the three together, anonymous readers see the session but no key, and
    a rekey without a body clears the announcement (the sender's last call)."""
    api = hosts_api
    g = api.json("POST", "/v1/groups", {"model": "m", "source": S}, 201, auth=False, headers=as_host(S))
    assert "session" not in g and "file_digest" not in g
    transfer = {"session": "00112233aabbccdd", "file_digest": "ef" * 32}
    announced = valid("Group", api.json("POST", f"/v1/groups/{g['id']}/rekey", transfer, auth=False,
                                        headers=as_host(S)))
    assert announced["key"] != g["key"] and {k: announced[k] for k in transfer} == transfer
    joined = api.json("PUT", f"/v1/groups/{g['id']}/receivers/{R1}", auth=False, headers=as_host(R1))
    assert (joined["key"], joined["session"], joined["file_digest"]) == (announced["key"], *transfer.values())
    anonymous = api.json("GET", f"/v1/groups/{g['id']}", auth=False)
    assert anonymous["session"] == transfer["session"] and "key" not in anonymous
    for bad in ({"session": "xyz"}, {"file_digest": "ef" * 32}, {"session": "00" * 8, "other": 1}):
        assert "Rekey schema" in api.json("POST", f"/v1/groups/{g['id']}/rekey", bad, 400)["error"]
    retired = valid("Group", api.json("POST", f"/v1/groups/{g['id']}/rekey"))
    assert "session" not in retired and retired["key"] != announced["key"]


def test_host_tokens_act_only_for_their_host(hosts_api):
    api = hosts_api
    # a receiver may look up (or create) its sender's group first: no key, it is no member
    early = api.json("POST", "/v1/groups", {"model": "m", "source": S}, 201, auth=False,
                     headers=as_host(R1))
    assert "key" not in early
    # the source creates-or-gets it and sees the key; a receiver gets it in its own join
    sent = api.json("POST", "/v1/groups", {"model": "m", "source": S}, 200, auth=False,
                    headers=as_host(S))
    joined = api.json("PUT", f"/v1/groups/1/receivers/{R1}", auth=False, headers=as_host(R1))
    assert joined["key"] == sent["key"] and re.fullmatch("[0-9a-f]{64}", sent["key"])
    assert api.json("GET", "/v1/groups/1", auth=False, headers=as_host(R1))["key"] == sent["key"]
    # a host that is not a member sees no key and cannot act for others
    assert "key" not in api.json("GET", "/v1/groups/1", auth=False, headers=as_host(R2))
    for method, path in (("PUT", f"/v1/groups/1/receivers/{R1}"), ("DELETE", f"/v1/groups/1/receivers/{R1}"),
                         ("DELETE", "/v1/groups/1"), ("POST", "/v1/groups/1/rekey"),
                         ("DELETE", f"/v1/hosts/{R1}")):
        err = api.json(method, path, status=403, auth=False, headers=as_host(R2))
        assert str(R2) in err["error"] or "admin" in err["error"], err
    err = api.json("POST", "/v1/groups", {"model": "x", "source": S, "receivers": [R1, R2]}, 403,
                   auth=False, headers=as_host(R2))
    assert "cannot add other receivers" in err["error"]
    assert api.json("POST", "/v1/hosts", {"ip": "10.0.0.50", "mac": "00:00:00:00:00:50", "dpid": 5,
                                          "port": 9}, 403, auth=False, headers=as_host(S))["error"]
    assert set(api.env.core.groups) == {1} and api.env.core.group(1).receivers == {R1}
    # leaving itself is allowed; the source deletes its own group
    assert api.json("DELETE", f"/v1/groups/1/receivers/{R1}", auth=False, headers=as_host(R1))
    assert api.call("DELETE", "/v1/groups/1", headers=as_host(S), auth=False).status_code == 204


def test_fresh_key_per_transfer(api):
    """Re-creating a deleted group, or a rekey, gives a new key; the old one is gone."""
    first = create(api, receivers=[R1])
    assert api.call("DELETE", f"/v1/groups/{first['id']}").status_code == 204
    second = create(api, receivers=[R1])
    assert second["key"] != first["key"] and second["id"] != first["id"]
    rekeyed = valid("Group", api.json("POST", f"/v1/groups/{second['id']}/rekey"))
    assert rekeyed["key"] not in (first["key"], second["key"]) and rekeyed["id"] == second["id"]
    assert api.json("PUT", f"/v1/groups/{second['id']}/receivers/{R1}")["key"] == rekeyed["key"]
    assert api.call("POST", f"/v1/groups/{second['id']}/rekey", auth=False).status_code == 401
    api.json("POST", "/v1/groups/99/rekey", status=404)


def test_duplicate_receivers_are_a_400(api, env):
    err = create(api, 400, receivers=[R1, R2, R1])
    assert "twice" in err["error"] and env.core.groups == {}


def test_unknown_route_and_wrong_method(api):
    for path in ("/v1/nope", "/v1/groups/1/members", "/v1/", "/v1/groups/1/receivers/"):
        assert "no such route" in api.json("GET", path, status=404)["error"], path
    resp = api.call("PATCH", "/v1/groups/1")
    assert resp.status_code == 405 and resp.headers["Allow"] == "GET, DELETE"
    assert resp.json["detail"] == {"allowed": ["GET", "DELETE"]}
    assert api.call("PUT", "/v1/groups").headers["Allow"] == "GET, POST"
    assert api.call("POST", "/metrics").headers["Allow"] == "GET"
    assert api.call("GET", "/v1/hosts").status_code == 405
    # outside /v1 and /metrics the path is not ours (other Ryu apps may route there):
    # Ryu's WSGIApplication answers its own plain 404
    assert Request.blank("/elsewhere").get_response(api.app).status_code == 404


def test_unexpected_exception_is_a_json_500(api, env, monkeypatch, caplog):
    def broken() -> dict:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(env.service, "topology", broken)
    with caplog.at_level(logging.ERROR, logger="modelcast.rest"):
        resp = api.call("GET", "/v1/topology")
    assert resp.status_code == 500 and resp.json == {
        "error": "internal error; the controller log has the details", "detail": None}
    assert "secret internals" not in resp.text and "secret internals" in caplog.text


# ---------------------------------------------------------------------- metrics and docs


def test_metrics(api, env):
    g = create(api, receivers=[R1, R2])
    api.json("GET", "/v1/groups/77", status=404)
    env.service.apply(env.core.port_down(4, 1), "reroute")
    resp = api.call("GET", "/metrics")
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    text = resp.text
    expect = {
        "modelcast_groups": 1,
        'modelcast_receivers{state="installed"}': 2,
        'modelcast_receivers{state="pending"}': 0,
        "modelcast_installs_total": 2,
        "modelcast_reroutes_total": 1,
        "modelcast_openflow_errors_total": 0,
        'modelcast_rest_requests_total{method="POST",status="201"}': 1,
        'modelcast_rest_requests_total{method="GET",status="404"}': 1,
        "modelcast_install_seconds_count": 2,
    }
    for name, value in expect.items():
        m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        assert m and float(m.group(1)) == value, (name, m and m.group(1))
    assert dict(env.fabric.trace(S, g["address"]).delivered) == {R1: 1, R2: 1}


def _routes_in_source() -> set[tuple[str, str]]:
    """(METHOD, path) from the @route(...) decorators in rest.py, read with ast."""
    tree = ast.parse(Path(rest.__file__).read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "route":
            path = ast.literal_eval(node.args[1])
            methods = next((ast.literal_eval(k.value) for k in node.keywords if k.arg == "methods"), None)
            for m in methods or ():  # routes without methods are the JSON 404/405 fallbacks
                out.add((m, path))
    return out


def test_openapi_documents_every_route(api):
    resp = api.call("GET", "/v1/openapi.json")
    doc = resp.json
    assert doc == json.loads(Path(rest.OPENAPI_PATH).read_text())
    assert doc["openapi"].startswith("3.1")
    documented = {(m.upper(), p) for p, ops in doc["paths"].items()
                  for m in ops if m in ("get", "put", "post", "delete", "patch")}
    in_code = _routes_in_source()
    assert in_code == set(rest.routes())
    assert len(in_code) == 31
    assert in_code == documented
    # every $ref resolves and every operation's error responses use the Error schema
    refs = re.findall(r'"\$ref": "#/components/(\w+)/(\w+)"', resp.text)
    for kind, name in refs:
        assert name in doc["components"][kind], (kind, name)
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if method == "parameters":
                continue
            assert op["responses"] and op["operationId"], (method, path)
            security = op.get("security")
            if method == "get":  # reads: anonymous, or a token (which then shows keys)
                assert security == [{}, {"bearer": []}], (method, path)
            else:
                assert security == [{"bearer": []}] and "403" in op["responses"], (method, path)


def test_create_with_an_explicit_ssm_address(api, env):
    g = create(api, model="uftp-run", receivers=[R1], address="232.9.9.9")
    assert g["address"] == "232.9.9.9"
    assert dict(env.fabric.trace(S, "232.9.9.9").delivered) == {R1: 1}
    assert "SSM" in create(api, 400, model="other", address="239.1.1.1")["error"]
    assert create(api, 409, model="other", address="232.9.9.9")["error"]
    assert create(api, 409, model="uftp-run", address="232.9.9.10")["error"]


# ---------------------------------------------------------------------- offers


def test_offers_say_who_serves_a_model_and_which_group(hosts_api):
    """What `modelcast fetch` relies on: the server's offer names its address and the
    group receivers join; only the server itself (or the admin) may offer or withdraw."""
    api = hosts_api
    model = "blake3:" + "ab" * 32
    body = {"model": model, "source": S, "name": "llama", "size": 1 << 20, "files": 3}
    assert "source" in api.json("POST", "/v1/offers", body, 403, auth=False, headers=as_host(R1))["error"]
    # a host offers only what the admin's ACL names it for
    assert "ACL" in api.json("POST", "/v1/offers", body, 403, auth=False, headers=as_host(S))["error"]
    api.json("POST", "/v1/acl", {"model": model, "offer": [S]}, 201)
    resp = api.call("POST", "/v1/offers", body, auth=False, headers=as_host(S))
    offer = valid("Offer", resp.json)
    assert resp.status_code == 201 and resp.headers["Location"].endswith(f"/v1/offers/{offer['id']}")
    assert offer["group"] is None and (offer["source"], offer["size"], offer["files"]) == (S, 1 << 20, 3)
    g = api.json("POST", "/v1/groups", {"model": model, "source": S}, 201, auth=False, headers=as_host(S))
    again = api.json("POST", "/v1/offers", dict(body, size=7), 200, auth=False, headers=as_host(S))
    assert again["id"] == offer["id"] and again["size"] == 7 and again["group"] == g["id"]
    other = api.json("POST", "/v1/offers", {"model": "blake3:" + "cd" * 32, "source": R2}, 201)
    assert [o["id"] for o in valid("OfferList", api.json("GET", f"/v1/offers?model={model}", auth=False))] \
        == [offer["id"]]
    assert [o["id"] for o in api.json("GET", f"/v1/offers?source={R2}", auth=False)] == [other["id"]]
    assert len(api.json("GET", "/v1/offers", auth=False)) == 2
    assert api.json("GET", f"/v1/offers/{offer['id']}", auth=False)["name"] == "llama"
    assert "unknown query parameter" in api.json("GET", "/v1/offers?mdl=x", status=400)["error"]
    for bad, where in (({"model": model}, "source"), ({"model": model, "source": S, "size": -1}, "/size"),
                       ({"model": model, "source": S, "extra": 1}, "extra")):
        assert where in api.json("POST", "/v1/offers", bad, 400)["error"]
    api.json("DELETE", f"/v1/offers/{offer['id']}", status=403, auth=False, headers=as_host(R2))
    assert api.call("DELETE", f"/v1/offers/{offer['id']}", auth=False, headers=as_host(S)).status_code == 204
    assert [o["id"] for o in api.json("GET", "/v1/offers", auth=False)] == [other["id"]]
    api.json("GET", f"/v1/offers/{offer['id']}", status=404)
    api.json("DELETE", f"/v1/offers/{offer['id']}", status=404)
    assert api.call("DELETE", f"/v1/offers/{other['id']}", auth=False).status_code == 401


def test_a_drained_spine_carries_no_tree_until_it_is_given_back():
    """PUT /v1/drains/switch/{dpid}: every tree leaves the spine with each receiver
    served once throughout (tests/controller/test_move.py follows packets in flight); the
    answer and GET /v1/drains say when nothing crosses it; DELETE gives it back. Errors
    are JSON: 400, 403, 404. (A restart keeps it: tests/controller/test_service.py.)"""
    env = make_env(token=TOKEN, host_tokens=HOST_TOKENS)
    api = Api(env)
    g = create(api, receivers=[R1, R2, R3])
    spine = next(d for d in g["tree"]["switches"] if d in (1, 2))
    got = valid("Drain", api.json("PUT", f"/v1/drains/switch/{spine}"))
    assert got == {"kind": "switch", "switches": [spine], "drained": True, "trees": 0, "clear": True}
    assert spine not in api.json("GET", f"/v1/groups/{g['id']}")["tree"]["switches"]
    assert env.delivered(g["id"]) == {R1: 1, R2: 1, R3: 1}
    assert not any(spine in link for link in env.fabric.trace(S, g["address"]).link_copies)
    assert api.json("GET", "/v1/drains") == [got]
    # a new tree avoids it too
    g2 = create(api, model="m2", receivers=[R1, R3])
    assert spine not in g2["tree"]["switches"]
    # errors
    assert api.call("PUT", "/v1/drains/switch/99").status_code == 404
    assert api.call("PUT", "/v1/drains/link/1/2").status_code == 404  # (two spines: no link)
    assert api.call("PUT", "/v1/drains/switch/0x1").status_code == 400
    assert api.call("PUT", f"/v1/drains/switch/{spine}", auth=False,
                    headers=as_host(S)).status_code == 403
    undone = api.json("DELETE", f"/v1/drains/switch/{spine}")
    assert undone["drained"] is False and api.json("GET", "/v1/drains") == []
    link = api.json("PUT", f"/v1/drains/link/{spine}/3")
    assert link["kind"] == "link" and link["switches"] == [spine, 3]
    assert api.json("DELETE", f"/v1/drains/link/3/{spine}")["drained"] is False
