"""An in-memory etcd for the election and HA tests: leases that expire at their TTL
after the last keepalive, a revision that grows with every write, the leader key bound to
a lease, the state's objects (one key each) fenced by the leader key's create revision (as
``controller.store.EtcdStore`` does). Time is ``now`` (stepped by hand) unless a
``clock`` is given (the in-process app tests run on real time)."""

from __future__ import annotations

from typing import Callable

from controller.store import StoreError


class FakeEtcd:
    """Leases that expire at their TTL after the last keepalive, a revision counter that
    grows with every write, one leader key bound to a lease. ``down``: every call fails;
    ``cut``: the instances (by lease owner name) whose calls fail (a partition)."""

    def __init__(self, min_ttl: int = 2, clock: Callable[[], float] | None = None) -> None:
        self._now = 0.0
        self.clock = clock
        self.kv: dict[str, tuple[bytes, int]] = {}  # state object key -> (value, mod revision)
        self.revision = 1
        self.min_ttl = min_ttl
        self.leases: dict[int, float] = {}  # id -> expiry
        self.key: tuple[bytes, int, int] | None = None  # value, create revision, lease
        self.down = False
        self._next_lease = 100

    @property
    def now(self) -> float:
        return self.clock() if self.clock is not None else self._now

    @now.setter
    def now(self, value: float) -> None:
        self._now = value

    def _expire(self) -> None:
        for lease, until in list(self.leases.items()):
            if self.now >= until:
                del self.leases[lease]
                if self.key is not None and self.key[2] == lease:
                    self.key = None
                    self.revision += 1

    def come_back(self, ttls: dict[int, int]) -> None:
        """Up again after a restart: like etcd, every lease restored with its full TTL."""
        self.down = False
        for lease in self.leases:
            self.leases[lease] = self.now + ttls.get(lease, self.min_ttl)

    def client(self, name: str, cut: set[str]) -> "FakeClient":
        return FakeClient(self, name, cut)


class FakeClient:
    """One instance's connection: ``controller.election.ElectionStore`` and
    ``controller.store.Store`` (with ``revision`` and ``fence``, as ``EtcdStore``)."""

    def __init__(self, etcd: FakeEtcd, name: str, cut: set[str]) -> None:
        self.etcd, self.name, self.cut = etcd, name, cut
        self.ttls: dict[int, int] = {}
        self.fence: int | None = None

    def _check(self) -> FakeEtcd:
        if self.etcd.down or self.name in self.cut:
            raise StoreError("etcd unavailable (connection refused)")
        self.etcd._expire()
        return self.etcd

    def grant(self, ttl: int) -> tuple[int, int]:
        e = self._check()
        e._next_lease += 1
        granted = max(ttl, e.min_ttl)
        e.leases[e._next_lease] = e.now + granted
        self.ttls[e._next_lease] = granted
        return e._next_lease, granted

    def keepalive(self, lease: int) -> int:
        e = self._check()
        if lease not in e.leases:
            return -1
        e.leases[lease] = e.now + self.ttls[lease]
        return self.ttls[lease]

    def campaign(self, value: bytes, lease: int) -> tuple[bytes | None, int, int]:
        e = self._check()
        if e.key is None and lease in e.leases:
            e.revision += 1
            e.key = (value, e.revision, lease)
        return e.key if e.key is not None else (None, 0, 0)

    def resign(self, lease: int) -> None:
        e = self._check()
        e.leases.pop(lease, None)
        if e.key is not None and e.key[2] == lease:
            e.key = None
            e.revision += 1


    # -- Store: the state's objects, one key each (as ``EtcdStore`` keeps them) --------------
    problems: list[str] = []

    def load(self) -> dict[str, bytes] | None:
        kv = self._check().kv
        return {k: v for k, (v, _) in kv.items()} or None

    def revision(self) -> int:
        got = self._check().kv.get("meta")
        return got[1] if got else 0

    def save(self, changes: dict[str, bytes | None]) -> None:
        e = self._check()
        if self.fence is None or e.key is None or e.key[1] != self.fence:
            raise StoreError("not written: the leader key is no longer ours")
        e.revision += 1
        for k in sorted(changes, key=lambda k: k == "meta"):  # (meta last, as EtcdStore)
            if changes[k] is None:
                e.kv.pop(k, None)
            else:
                e.kv[k] = (changes[k], e.revision)
