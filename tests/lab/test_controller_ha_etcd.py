"""Three real ``modelcast-controller`` processes on a real single-node etcd (Debian's
``etcd-server``), no switches: the election, REST forwarding from followers, the
followers' mirrored state, fenced writes, a SIGKILLed leader, the host agent's client
configured with every instance, and etcd restarted under them. (The same on OVS, with
a transfer and a stream running: ``tests/lab/test_controller_ha.py``.)"""

from __future__ import annotations

import secrets
import signal
import time

import pytest

from controller import store as store_module
from controller.store import EtcdStore, StoreError, parse_store_url
from hostagent.control import ControllerClient
from lab import etcd as lab_etcd
from lab.controller import Controller
from lab.sh import free_port
from tests.support.controller_lab import health, leader_of, wait_for
from tests.support.lab import skip_or_fail

pytestmark = pytest.mark.lab  # real etcd and controller processes

FAILOVER_BOUND_S = 5.0  # lease TTL 2 s + etcd's expiry check + one election step; target 3 s


@pytest.fixture
def cluster(tmp_path):
    why = lab_etcd.available()
    if why:
        skip_or_fail(why)
    etcd = lab_etcd.Etcd(tmp_path)
    etcd.start()
    secret = tmp_path / "cluster-secret"
    secret.write_text(secrets.token_urlsafe(32))
    ctls = [Controller(tmp_path, store=etcd.store_url, name=f"c{i}",
                       args=["--cluster-secret-file", str(secret)]) for i in range(3)]
    try:
        for c in ctls:
            c.start()
        yield etcd, ctls
    finally:
        for c in ctls:
            c.stop()
        etcd.stop()


def test_election_forwarding_failover_and_etcd_restart(cluster):
    etcd, ctls = cluster
    lead = leader_of(ctls)
    followers = [c for c in ctls if c is not lead]
    gen = health(lead)["generation"]
    for c in followers:
        h = health(c)
        assert h["role"] == "follower" and h["leader"] == lead.url and h["generation"] == gen

    # a mutation on a follower is served by the leader; every instance then reads it
    r = followers[0].api("POST", "/v1/groups", json={"model": "m", "source": "10.0.0.1",
                                                     "receivers": ["10.0.0.2"]})
    assert r.status_code == 201, r.text
    assert r.headers["Location"] == f"{followers[0].url}/v1/groups/{r.json()['id']}"  # not the leader
    gid, key = r.json()["id"], r.json()["key"]
    assert wait_for(lambda: all(c.api("GET", f"/v1/groups/{gid}").status_code == 200 for c in ctls), 3)
    assert followers[1].api("GET", f"/v1/groups/{gid}").json()["key"] == key  # (admin token)
    assert followers[1].api("GET", f"/v1/groups/{gid}", headers={"Authorization": ""}).json().get("key") is None
    bad = followers[1].api("PUT", f"/v1/groups/{gid}/receivers/10.0.0.3",
                           headers={"Authorization": "Bearer wrong"})
    assert bad.status_code == 401  # the leader's answer, passed back as is

    # SIGKILL the leader: the client configured with all three keeps working
    client = ControllerClient(",".join(c.url for c in [lead, *followers]), token=lead.token,
                              failover_s=10)
    t0 = time.monotonic()
    lead.stop(signal.SIGKILL)
    joined = client.join(gid, "10.0.0.4")
    failover = time.monotonic() - t0
    assert "10.0.0.4" in joined["receivers"]
    assert failover <= FAILOVER_BOUND_S, failover
    new = leader_of(ctls)
    assert new in followers and health(new)["generation"] > gen
    # the old leader's fenced writes are refused by etcd
    stale = EtcdStore(parse_store_url(etcd.store_url))
    stale.fence = gen
    with pytest.raises(StoreError, match="no longer ours"):
        stale.save({"meta": b"{}"})
    other = next(c for c in followers if c is not new)
    assert wait_for(lambda: "10.0.0.4" in other.api("GET", f"/v1/groups/{gid}").json()["receivers"], 3)

    # etcd restarted for longer than the lease TTL: reads go on, then a leader serves again
    gen2 = health(new)["generation"]
    etcd.stop()
    time.sleep(3.0)
    assert all(c.api("GET", f"/v1/groups/{gid}").status_code == 200 for c in followers)
    etcd.start()  # (returns once it answers /health)
    t1 = time.monotonic()
    joined = client.join(gid, "10.0.0.5")
    back = time.monotonic() - t1
    assert "10.0.0.5" in joined["receivers"]
    after = leader_of(ctls)
    gen3 = health(after)["generation"]
    assert gen3 >= gen2
    assert wait_for(lambda: all("10.0.0.5" in c.api("GET", f"/v1/groups/{gid}").json()["receivers"]
                                for c in followers), 5)
    # a leader stopped with SIGTERM resigns: the next one leads at once, not after the TTL
    t2 = time.monotonic()
    after.stop(signal.SIGTERM)
    joined = client.join(gid, "10.0.0.6")
    handover = time.monotonic() - t2
    assert "10.0.0.6" in joined["receivers"]
    assert handover < 1.5, handover
    print(f"\nSIGTERM: handed over in {handover:.2f} s")
    print(f"\nleader SIGKILLed: the agent's client was served again after {failover:.2f} s; "
          f"etcd down 3 s: served {back:.2f} s after etcd was back (leader "
          f"{'kept' if after is new else 'changed'}, generation {gen2} -> {gen3})")


def test_the_store_uses_the_first_endpoint_that_answers(tmp_path, monkeypatch):
    why = lab_etcd.available()
    if why:
        skip_or_fail(why)
    etcd = lab_etcd.Etcd(tmp_path)
    etcd.start()
    try:
        dead = free_port()
        store = EtcdStore(parse_store_url(f"etcd://127.0.0.1:{dead},{etcd.endpoint}/lab-a"))
        assert store.load() is None and store.revision() == 0  # a fresh start
        lease, ttl = store.grant(2)
        assert ttl >= 2
        holder, generation, holder_lease = store.campaign(b'{"id": "x"}', lease)
        assert holder == b'{"id": "x"}' and holder_lease == lease and generation > 0
        store.fence = generation
        store.save({"group/1": b'{"id": 1}', "meta": b'{"version": 1}'})
        assert store.load() == {"group/1": b'{"id": 1}', "meta": b'{"version": 1}'}
        assert store.revision() > generation
        # one key per object: a change writes what it changed; a deletion removes its key
        big = {f"offer/{i}": b'{"id": %d}' % i for i in range(1, 301)}  # (3 transactions of <= 128)
        store.save({**big, "meta": b'{"version": 1}'})
        store.save({"group/1": None, "meta": b'{"version": 1}'})
        monkeypatch.setattr(store_module, "PAGE", 100)  # (read in pages, at one revision)
        got = store.load()
        assert "group/1" not in got and len(got) == 301 and got["offer/300"] == b'{"id": 300}'
        other = EtcdStore(parse_store_url(f"etcd://{etcd.endpoint}/lab-b"))  # another prefix
        assert other.load() is None
        store.resign(lease)  # the leader key goes with the lease: the fence no longer holds
        with pytest.raises(StoreError, match="no longer ours"):
            store.save({"meta": b"{}"})
    finally:
        etcd.stop()
