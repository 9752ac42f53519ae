"""Leader election among controller instances over an etcd lease, as a small state
machine: ``Election.step(now)`` makes the store calls that are due and returns a
``Status`` (who leads, with which generation); ``role_for(status)`` says which OpenFlow
role this instance asks every switch for. No Ryu, no sockets: tests drive it with a fake
store and a hand-stepped clock (``tests/controller/test_election.py``).

How it stays safe:

* Each instance holds a lease (TTL ``ttl`` s) and keeps it alive every ``ttl / 4`` s.
  The leader is whoever created the leader key (bound to its lease) first; the key
  vanishes with the lease, so a killed leader is replaced ``ttl`` s after its last
  keepalive.
* The generation is the leader key's create revision in etcd: every election creates
  the key anew, so it only grows. The leader sends ``OFPRoleRequest(MASTER,
  generation)``, the others ``SLAVE`` with the leader's generation; a switch refuses a
  role request older than the newest it saw (``OFPRRFC_STALE``) and demotes the old
  master when the new one asks: two masters never write to a switch at once.
* With a ``signer`` (the cluster secret, ``controller.cluster``) each instance signs its
  leader record, and a record without a valid signature is no leader: a key planted in
  etcd by someone who can write it is neither followed nor sent anything.
* A leader that cannot renew its lease stops acting as leader when the lease may have
  expired (the time it sent its last successful keepalive plus the TTL granted), before
  anyone else can have won: it then asks the switches for SLAVE with its own generation,
  which they accept, and the data plane stays exactly as it is.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger("modelcast.election")

LEADER, FOLLOWER, UNKNOWN = "leader", "follower", "unknown"
MASTER, SLAVE = "master", "slave"


class ElectionStore(Protocol):
    """What the election needs from etcd (``controller.store.EtcdStore``); every call
    may raise OSError (etcd unreachable)."""

    def grant(self, ttl: int) -> tuple[int, int]:
        """A new lease: (id, TTL granted; etcd may round a small TTL up)."""
        ...

    def keepalive(self, lease: int) -> int:
        """Renew; the remaining TTL, <= 0 when the lease has already expired."""
        ...

    def campaign(self, value: bytes, lease: int) -> tuple[bytes | None, int, int]:
        """Create the leader key with ``value`` on ``lease`` unless it exists; return
        (holder's value, the key's create revision, the holder's lease); (None, 0, 0)
        when there is no key."""
        ...

    def resign(self, lease: int) -> None:
        """Revoke the lease (its leader key goes with it)."""
        ...


class Signer(Protocol):
    """The cluster secret's signature of leader records (``controller.cluster.Cluster``)."""

    def sign(self, record: bytes) -> str:
        ...

    def verify(self, record: bytes, signature: str) -> bool:
        ...


@dataclass(frozen=True)
class Leader:
    ident: str  # the instance's id (unique per process)
    url: str  # its REST base URL: followers forward mutations there
    generation: int  # the leader key's create revision: the OpenFlow generation_id

    def _record(self) -> bytes:
        return json.dumps({"id": self.ident, "url": self.url}, sort_keys=True, separators=(",", ":")).encode()

    def encode(self, signer: Signer | None = None) -> bytes:
        d = {"id": self.ident, "url": self.url}
        if signer is not None:
            d["sig"] = signer.sign(self._record())
        return json.dumps(d).encode()

    @staticmethod
    def decode(value: bytes, generation: int, signer: Signer | None = None) -> "Leader | None":
        """The record's leader; None when a ``signer`` is given and the record is not
        signed with it (a key an instance of this cluster did not write)."""
        try:
            d = json.loads(value)
            leader = Leader(str(d["id"]), str(d.get("url", "")), generation)
            sig = d.get("sig", "")
        except (ValueError, KeyError, TypeError, RecursionError):
            if signer is not None:
                return None
            return Leader("?", "", generation)  # someone else's value: still a leader
        if signer is not None and not signer.verify(leader._record(), str(sig)):
            return None
        return leader


@dataclass(frozen=True)
class Status:
    """The outcome of a step. ``role``: LEADER (this instance may write to switches and
    the store), FOLLOWER (another instance leads: ``leader``), UNKNOWN (no usable answer
    from etcd, or nobody leads yet). ``generation``: the newest generation this instance
    knows (0: none), the one its role requests carry."""

    role: str
    leader: Leader | None = None
    generation: int = 0


def role_for(status: Status) -> tuple[str, int] | None:
    """The role request every switch gets from this instance: (MASTER|SLAVE,
    generation_id), or None while no generation is known (a SLAVE request with a
    generation older than the switch's would be refused as stale; the switch keeps the
    instance EQUAL meanwhile, and this instance sends nothing)."""
    if status.role == LEADER:
        return MASTER, status.generation
    if status.generation:
        return SLAVE, status.generation
    return None


class Election:
    """One instance's campaign. Call ``step(now)`` often (every ~0.1-0.2 s); it returns
    the current ``Status``. ``resign()`` on a clean shutdown hands over at once."""

    def __init__(self, store: ElectionStore, ident: str, url: str, ttl: int = 2,
                 signer: Signer | None = None) -> None:
        self.store = store
        self.me = Leader(ident, url, 0)
        # signs this instance's record and checks the holder's (controller.ha sets the
        # cluster's when the app did not pass one)
        self.signer = signer
        self._next_unsigned_warning = float("-inf")
        self.ttl = ttl
        self.lease: int | None = None
        self._lease_valid_until = float("-inf")  # local bound: the lease may be gone after
        self._granted_ttl = ttl
        self._next_keepalive = float("-inf")
        self.status = Status(UNKNOWN)
        self._failing_since: float | None = None  # etcd has not answered since
        self._next_complaint = float("-inf")

    @property
    def is_leader(self) -> bool:
        return self.status.role == LEADER

    def step(self, now: float) -> Status:
        try:
            self._step(now)
            self._failing_since = None
        except OSError as exc:
            if self._failing_since is None or now >= self._next_complaint:
                log.warning("etcd: %s", exc)
                self._next_complaint = now + 5.0
            if self._failing_since is None:
                self._failing_since = now
            self._unreachable(now)
        return self.status

    def _step(self, now: float) -> None:
        if self.lease is None:
            lease, granted = self.store.grant(self.ttl)
            self.lease, self._granted_ttl = lease, granted
            self._lease_valid_until = now + granted
            self._next_keepalive = now + granted / 4
        elif now >= self._next_keepalive or now >= self._lease_valid_until:
            # (past the local bound the lease may still live: etcd restores leases over
            # a restart, so the leader keeps its key and generation if it renews in time)
            left = self.store.keepalive(self.lease)
            if left <= 0:  # expired at etcd (e.g. it was down longer than the TTL)
                self.lease = None
                self._lease_valid_until = float("-inf")
                self._set(Status(UNKNOWN, None, self.status.generation))
                return
            self._lease_valid_until = now + left
            self._next_keepalive = now + self._granted_ttl / 4
        holder, generation, holder_lease = self.store.campaign(self.me.encode(self.signer), self.lease)
        if holder is None:  # the key expired between compare and read
            self._set(Status(UNKNOWN, None, self.status.generation))
            return
        leader = Leader.decode(holder, generation, self.signer)
        if leader is None:  # not written by an instance holding the cluster secret
            if now >= self._next_unsigned_warning:
                self._next_unsigned_warning = now + 10.0
                log.error("the leader key in etcd (revision %d) is not signed with the cluster "
                          "secret: no instance of ours wrote it; nobody is followed or sent "
                          "mutations until it goes (whoever can write etcd can plant it)", generation)
            self._set(Status(UNKNOWN, None, self.status.generation))
            return
        if holder_lease == self.lease and leader.ident == self.me.ident:
            self._set(Status(LEADER, leader, generation))
        elif leader.ident == self.me.ident:  # our own key on a lease we gave up: free it
            self.store.resign(holder_lease)
            self._set(Status(UNKNOWN, None, max(generation, self.status.generation)))
        else:
            self._set(Status(FOLLOWER, leader, max(generation, self.status.generation)))

    def _unreachable(self, now: float) -> None:
        """No answer from etcd: a leader stays leader while its lease surely lives, so a
        short etcd restart changes nothing; then it steps down (never two leaders)."""
        if now < self._lease_valid_until:  # (a follower, too, still knows who leads)
            return
        self._set(Status(UNKNOWN, None, self.status.generation))

    def _set(self, status: Status) -> None:
        if status != self.status:
            log.info("election: %s%s (generation %d)", status.role,
                     f", leader {status.leader.ident} at {status.leader.url}"
                     if status.leader and status.role != LEADER else "", status.generation)
        self.status = status

    def resign(self) -> None:
        """Give up the lease now (a clean stop): the others need not wait for its TTL."""
        if self.lease is not None:
            try:
                self.store.resign(self.lease)
            except OSError as exc:
                log.warning("etcd: resign: %s", exc)
        self.lease = None
        self._lease_valid_until = float("-inf")
        self.status = Status(UNKNOWN, None, self.status.generation)
