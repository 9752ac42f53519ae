"""etcd is not a back door (issue 46, finding 2): several instances over the in-memory
etcd (``tests.support.fake_etcd``), each a real ``Service`` and ``Ha``, the leader's REST
API served on loopback. Asserted: a leader key planted in etcd without the cluster
secret's signature receives no forwarded request and no token; a follower forwards with
its instance credential, never the caller's ``Authorization``; the leader acts only on a
valid, fresh, unreplayed credential; session keys are sealed in the store; ``--peers``
limits where a follower forwards."""

from __future__ import annotations

import json
import threading
from typing import Any, Iterator
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
from webob import Request

from controller import ha as ha_module
from controller.cluster import CREDENTIAL, Cluster
from controller.election import Election
from controller.ha import Ha
from controller import rest
from controller.rest import FORWARDED, ApiError
from tests.support.controller_env import R1, S, TOKEN, Api, Env, make_env
from tests.support.fake_etcd import FakeEtcd

SECRET = b"k" * 32
TTL = 2


class Recorder:
    """A WSGI server on loopback that records every request's headers and passes it to
    ``app`` (the leader's REST API), or answers 200 itself (a planted "leader")."""

    def __init__(self, app: Any = None) -> None:
        self.seen: list[dict[str, str]] = []
        self.app = app

        def wsgi(environ: dict[str, Any], start: Any) -> Any:
            self.seen.append({k[5:].replace("_", "-").title(): v for k, v in environ.items()
                              if k.startswith("HTTP_")})
            if self.app is not None:
                return self.app(environ, start)
            start("200 OK", [("Content-Type", "application/json")])
            return [b"{}"]

        class Quiet(WSGIRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

        self.server = make_server("127.0.0.1", 0, wsgi, handler_class=Quiet)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorders() -> Iterator[list[Recorder]]:
    made: list[Recorder] = []
    yield made
    for r in made:
        r.close()


class Node:
    """One instance: a service (admin token ``TOKEN``), its etcd client, election and Ha."""

    def __init__(self, name: str, etcd: FakeEtcd, url: str, secret: bytes = SECRET,
                 peers: tuple[str, ...] = ()) -> None:
        self.env: Env = make_env(token=TOKEN)
        self.store = etcd.client(name, set())
        self.env.service.store = self.store
        self.election = Election(self.store, name, url, ttl=TTL)
        self.ha = Ha(self.env.service, self.store, self.election, lambda: None, takeover_s=0.0,
                     cluster=Cluster(secret, peers))
        self.dpids = sorted(self.env.topo.switches)

    def step(self, now: float) -> None:
        self.ha.step(self.election.step(now), now, self.dpids)


@pytest.fixture(autouse=True)
def campaigning(monkeypatch) -> None:
    monkeypatch.setattr(ha_module, "_CAMPAIGNING", [])


def mutation(body: dict[str, Any] | None = None) -> Any:
    """A group create as a client sends it to a follower, with the admin's token."""
    return Request.blank("/v1/groups", method="POST", body=json.dumps(body or {"model": "m", "source": S}).encode(),
                         headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})


def test_a_planted_unsigned_leader_key_receives_no_forwarded_request_and_no_token(recorders):
    """The first review's attack: someone who can write etcd names their own URL as the
    leader; a follower forwarded the admin's token to it."""
    planted = Recorder()
    recorders.append(planted)
    etcd = FakeEtcd(min_ttl=TTL)
    etcd.leases[999] = 1e9  # a lease that never runs out, and the key on it
    etcd.revision += 1
    etcd.key = (json.dumps({"id": "evil", "url": planted.url}).encode(), etcd.revision, 999)
    b = Node("b", etcd, "http://b:8080")
    b.step(0.1)
    with pytest.raises(ApiError) as refused:
        b.ha.forward(mutation(), 0.1)
    assert refused.value.status == 503
    assert planted.seen == []
    assert b.ha.cluster()["leader"] is None  # (health shows no leader, not the planted URL)


def test_a_follower_forwards_with_its_instance_credential_never_the_callers_token(recorders):
    etcd = FakeEtcd(min_ttl=TTL)
    leader_api: list[Api] = []
    server = Recorder(lambda env, start: leader_api[0].app(env, start))
    recorders.append(server)
    a = Node("a", etcd, server.url)
    leader_api.append(Api(a.env, forward=lambda req: a.ha.forward(req, 1.0)))
    b = Node("b", etcd, "http://b:8080")
    a.step(0.1)
    b.step(0.1)
    assert a.ha.leading and not b.ha.leading
    answer = Api(b.env, forward=lambda req: b.ha.forward(req, 1.0)).call(
        "POST", "/v1/groups", {"model": "m", "source": S, "receivers": [R1]})
    assert answer.status_code == 201, answer.body
    assert len(server.seen) == 1
    headers = server.seen[0]
    assert "Authorization" not in headers and TOKEN not in json.dumps(headers)
    assert headers[FORWARDED.title()] == "1" and CREDENTIAL.title() in headers
    group = a.env.service.get_group(answer.json["id"])
    assert set(group["receivers"]) == {R1}  # (pending: no switch is connected here)
    assert answer.json["key"] == group["key"]  # (the admin sees the key, as if it asked the leader)


def test_the_leader_acts_only_on_a_valid_fresh_credential_once(recorders):
    etcd = FakeEtcd(min_ttl=TTL)
    a = Node("a", etcd, "http://a:8080")
    a.step(0.1)
    api = Api(a.env, forward=lambda req: a.ha.forward(req, 1.0))
    body = json.dumps({"model": "m", "source": S}).encode()
    cluster = Cluster(SECRET)
    good = {FORWARDED: "1", **cluster.credential("POST", "/v1/groups", body, None)}
    good["X-Modelcast-Principal"] = "admin"  # (claims more than the credential was made for)
    assert api.call("POST", "/v1/groups", raw=body, auth=False, headers=good).status_code == 401
    for headers in ({FORWARDED: "1"},  # no credential at all
                    {FORWARDED: "1", **Cluster(b"z" * 32).credential("POST", "/v1/groups", body, None)},
                    {FORWARDED: "1", **cluster.credential("POST", "/v1/groups", b"{}", None)},  # other body
                    {FORWARDED: "1", **cluster.credential("POST", "/v1/groups", body, None, now=1.0)}):  # stale
        assert api.call("POST", "/v1/groups", raw=body, auth=False, headers=headers).status_code == 401
    from controller.auth import ADMIN
    ok = {FORWARDED: "1", **cluster.credential("POST", "/v1/groups", body, ADMIN)}
    assert api.call("POST", "/v1/groups", raw=body, auth=False, headers=ok).status_code == 201
    assert api.call("POST", "/v1/groups", raw=body, auth=False, headers=ok).status_code == 401  # a replay


def test_session_keys_are_sealed_in_the_store_and_open_only_with_the_secret():
    etcd = FakeEtcd(min_ttl=TTL)
    a, b = Node("a", etcd, "http://a:8080"), Node("b", etcd, "http://b:8080")
    a.step(0.1)
    b.step(0.1)
    g, _ = a.env.service.create_group({"model": "m", "source": S, "receivers": [R1]})
    key = a.env.service.get_group(g["id"])["key"]
    stored = b"".join(v for v, _ in etcd.kv.values())
    assert key.encode() not in stored and bytes.fromhex(key) not in stored
    assert b"aesgcm:" in stored
    b.step(0.7)  # the follower mirrors: the same key, opened with the shared secret
    assert b.env.service.get_group(g["id"])["key"] == key
    other = Node("c", etcd, "http://c:8080", secret=b"x" * 32)  # another secret cannot open it
    problems = other.env.service.mirror(etcd.client("c2", set()).load())
    assert any("cannot be opened" in p for p in problems)
    assert other.env.service.get_group(g["id"])["key"] != key


def test_with_peers_a_follower_forwards_only_to_a_listed_leader(recorders, monkeypatch):
    etcd = FakeEtcd(min_ttl=TTL)
    a = Node("a", etcd, "http://a:8080")
    b = Node("b", etcd, "http://b:8080", peers=("http://c:8080",))
    a.step(0.1)
    b.step(0.1)
    sent: list[str] = []
    monkeypatch.setattr(ha_module, "forward_to", lambda req, url, timeout, sign: sent.append(url) or "x")
    with pytest.raises(ApiError) as refused:
        b.ha.forward(mutation(), 0.1)
    assert refused.value.status == 503 and "--peers" in refused.value.message and sent == []
    c = Node("c", etcd, "http://c:8080", peers=("http://a:8080/",))
    c.step(0.1)
    assert c.ha.forward(mutation(), 0.1) == "x" and sent == ["http://a:8080"]


def test_a_forwarded_request_reaching_a_follower_is_a_503_not_a_401():
    """Two instances each believing the other leads (an election under way): the request
    is never forwarded twice, and the caller is told to retry, not that its token is bad."""
    from controller.auth import ADMIN

    etcd = FakeEtcd(min_ttl=TTL)
    a, b = Node("a", etcd, "http://a:8080"), Node("b", etcd, "http://b:8080")
    a.step(0.1)
    b.step(0.1)
    body = json.dumps({"model": "m", "source": S}).encode()
    headers = {FORWARDED: "1", **Cluster(SECRET).credential("PUT", f"/v1/groups/1/receivers/{R1}", body, ADMIN)}
    api = Api(b.env, forward=lambda req: b.ha.forward(req, 1.0))
    resp = api.call("PUT", f"/v1/groups/1/receivers/{R1}", raw=body, auth=False, headers=headers)
    assert resp.status_code == 503 and resp.headers["Retry-After"] == "1", resp.body


def test_a_follower_answers_with_the_leaders_event_history_without_the_callers_token(recorders, monkeypatch):
    """The leader acts (a group created there), so the history is its: a follower asked
    for events, or for the event stream, relays the leader's -- never with the caller's
    token, and never relaying a relayed request again."""
    monkeypatch.setattr(rest, "KEEPALIVE_S", 0.1)  # (the test server's one thread notices the close soon)
    etcd = FakeEtcd(min_ttl=TTL)
    leader_api: list[Api] = []
    server = Recorder(lambda env, start: leader_api[0].app(env, start))
    recorders.append(server)
    a = Node("a", etcd, server.url)
    leader_api.append(Api(a.env, leader=a.ha.leader_url))
    b = Node("b", etcd, "http://b:8080")
    a.step(0.1)
    b.step(0.1)
    assert a.ha.leader_url() is None and b.ha.leader_url() == server.url
    a.env.service.create_group({"model": "m", "source": S, "receivers": [R1]})
    follower = Api(b.env, leader=b.ha.leader_url)
    got = follower.json("GET", "/v1/events?since=0")
    assert [e["kind"] for e in got["events"]] == [e["kind"] for e in a.env.service.events.since(0)]
    assert "group_created" in [e["kind"] for e in got["events"]]
    assert "group_created" not in [e["kind"] for e in b.env.service.events.since(0)]
    assert all("Authorization" not in h and h[FORWARDED.title()] == "1" for h in server.seen)
    # the stream, relayed as the leader sends it (its first events; then the client closes)
    req = Request.blank("/v1/events/stream", headers={"Authorization": f"Bearer {TOKEN}"})
    resp = req.get_response(follower.app)
    assert resp.status_code == 200 and resp.content_type == "text/event-stream"
    body = b""
    chunks = iter(resp.app_iter)
    while b"event: group_created" not in body:
        body += next(chunks)
    resp.app_iter.close()
    assert b": modelcast events" in body and b.env.service.changes.held == 0
    # a relayed request is served where it lands (no loop between two instances that
    # each think the other leads)
    asked = len(server.seen)
    mine = follower.json("GET", "/v1/events?since=0", headers={FORWARDED: "1"})
    assert len(server.seen) == asked and "group_created" not in [e["kind"] for e in mine["events"]]
