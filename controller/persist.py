"""The service's persistence (a part of ``controller.service.Service``): the state as
objects (``controller.state``), written as they change, and restored entry by entry.

Every change marks the objects it touched (``touch``); ``save`` encodes only those and
hands them to the store, so one change costs the bytes of that change whatever the size
of the state (``tests/controller/test_state.py``). What is restored passes the same checks
as a REST body of its kind; an entry that fails is dropped with one logged line, the rest
is restored, and a leader deletes the dropped objects at its next save.
"""

from __future__ import annotations

import logging
import re
import secrets
import socket
from pathlib import Path
from typing import Any

from controller.cluster import Cluster
from controller.core import MulticastCore
from controller.state import (DECLARED, GROUP, META, OFFER, RULE, SNAPSHOT, STATE_VERSION, TOPOLOGY,
                              Loaded, Unusable, clean, encode, from_objects)
from controller.store import Store, write_state
from controller.topoview import check_unicast

log = logging.getLogger("modelcast.service")
_HEX_KEY = re.compile(r"[0-9a-f]{64}")


class StateFileError(Exception):
    """The state exists but cannot be used at all (not JSON, not a state, another
    version). The controller must not start over it: saving would overwrite the groups and
    keys. (A bad entry in it is no such error: it is dropped, and the rest restored.)"""


class Persisted:
    """State objects, saving and restoring, over the service's fields (``core``, ``keys``,
    ``transfers``, ``offers``, ``declared``, ``acl``, ``owners``, ``pinned``, ``active``,
    ``next_ids``)."""

    store: Store | None
    core: MulticastCore
    cluster: Cluster | None
    dirty: set[str]
    _dirty: bool
    _next_save: float
    save_interval_s: float

    # -- what each object holds ------------------------------------------------------------
    def touch(self, *keys: str) -> None:
        """These objects changed: the next save writes them (and only them)."""
        self.dirty.update(keys)

    def _object(self, key: str) -> Any | None:
        """The object saved under ``key`` now (None: deleted)."""
        if key == META:
            return {"version": STATE_VERSION, "next": dict(self.next_ids)}
        if key == TOPOLOGY:
            v = self.core.view  # (as core.to_dict, without visiting every group)
            return {"switches": sorted(v.switches),
                    "links": [[k.a, k.a_port, k.b, k.b_port] for k in sorted(v.links)],
                    "hosts": [[h.ip, h.mac, h.dpid, h.port] for h in v.hosts.values()],
                    "drains": self.core.drains()}
        kind, _, name = key.partition("/")
        if kind + "/" == DECLARED:
            place = self.declared.get(name)
            return [name, *place] if place is not None else None
        if not name.isdigit():
            return None  # (an object that was no state object: deleted)
        if kind + "/" == GROUP:
            return self._group_object(int(name))
        if kind + "/" == OFFER:
            offer = self.offers.get(int(name))
            return {"id": int(name), **offer} if offer is not None else None
        if kind + "/" == RULE:
            rule = self.acl.rules.get(int(name))
            return rule.to_dict() if rule is not None else None
        return None  # (SNAPSHOT: superseded, deleted)

    def _group_object(self, gid: int) -> dict[str, Any] | None:
        g = self.core.groups.get(gid)
        if g is None:
            return None
        d = g.to_dict()
        key = self.keys.get(gid, "")
        d["key"] = self.cluster.seal(key, gid) if self.cluster is not None and key else key
        if gid in self.transfers:
            d["transfer"] = dict(self.transfers[gid])
        if gid in self.owners:
            d["owner"] = self.owners[gid]
        if gid in self.pinned:
            d["pinned"] = True
        if gid in self.active:
            d["active"] = round(self.active[gid], 3)
        return d

    def state(self) -> dict[str, Any]:
        """The whole state as one dict (what a state file of earlier versions held):
        ``core.to_dict()`` with each group's key (sealed with the cluster secret when
        there is one), announced transfer, owner, pin and time of its last change, the
        offers, declared hosts, ACL rules and the next ids."""
        data: dict[str, Any] = {"version": STATE_VERSION, "topology": self._object(TOPOLOGY),
                                "groups": [self._group_object(gid) for gid in sorted(self.core.groups)],
                                "next": dict(self.next_ids)}
        if self.offers:
            data["offers"] = [{"id": oid, **o} for oid, o in sorted(self.offers.items())]
        if self.declared:  # (as topology.hosts: [ip, mac, dpid, port])
            data["declared_hosts"] = [self._object(DECLARED + ip) for ip in sorted(self.declared, key=_ip_key)]
        if self.acl.rules:
            data["acl"] = [r.to_dict() for _, r in sorted(self.acl.rules.items())]
        return data

    # -- saving ------------------------------------------------------------------------
    def save(self) -> bool:
        """Write the objects changed since the last save now (a REST change: its caller
        is answered after the store holds it), with ``meta`` (the next ids; its etcd
        revision tells followers the state moved). Encoding runs here; the write through
        the store (the app's file writer runs it in a native thread, off the hub). Returns
        False, after logging the reason, when the store refuses: the change the switches
        already received stands and the next save retries it."""
        self._dirty = False
        pending, self.dirty = self.dirty, set()
        if self.store is None or not pending:
            return True
        changes = {k: (None if (obj := self._object(k)) is None else encode(obj))
                   for k in sorted(pending | {META})}
        try:
            self.store.save(changes)
        except OSError as exc:
            log.error("cannot save state to %s: %s", self.store.name, exc)
            self.dirty |= pending
            self._dirty = True  # flush_state retries
            return False
        return True

    def save_soon(self) -> None:
        """Note a change the network taught us (a host learned or forgotten, a link): it
        is written by the next ``flush_state`` that is due, so a burst of packet-ins costs
        one encoding, not one per new address. Losing the last second of it in a crash
        only means re-learning: switches and hosts report it again."""
        self.touch(TOPOLOGY)
        self._dirty = True

    @staticmethod
    def _write(path: Path, payload: bytes) -> None:
        """What the app's writer runs in a native thread: the file replaced atomically,
        or a log record appended durably (``controller.store.write_state``)."""
        write_state(path, payload)

    # -- restoring -----------------------------------------------------------------------
    def load(self) -> list[str]:
        """Restore groups (with their keys), offers, rules and the last known topology
        from the store. Call once at start, before switches connect: nothing is sent until
        they do. Returns one line per entry that was dropped; nothing saved is a fresh
        start. Raises StateFileError, one clear sentence, when the state as a whole cannot
        be used (the caller should stop rather than overwrite it)."""
        if self.store is None:
            return []
        try:
            objects = self.store.load()
        except OSError as exc:
            raise StateFileError(f"cannot read state {self.store.name}: {exc}") from None
        if objects is None:
            return []
        loaded = self._loaded(objects)
        problems = self._restore(loaded)  # (into the core the app's helpers hold: no rebuild)
        self._rewrite(loaded, leading=True)
        return problems

    def _loaded(self, objects: dict[str, bytes] | None) -> Loaded:
        name = self.store.name if self.store is not None else "state"
        try:
            loaded = from_objects(objects or {})
        except Unusable as exc:
            raise StateFileError(f"state {name} {exc}") from None
        loaded.problems[:0] = list(getattr(self.store, "problems", []) or [])
        return loaded

    def reload(self, data: dict[str, Any]) -> list[str]:
        """Replace everything with ``data``, a whole state (``state()``); nothing is sent."""
        if data.get("version") != STATE_VERSION:
            raise StateFileError(f"state version {data.get('version')!r}; this controller "
                                 f"reads version {STATE_VERSION}")
        return self._reload(clean(data), leading=False)

    def reload_store(self) -> list[str]:
        """A new leader: everything from the store (its predecessor's last state); it then
        rewrites what needs it (dropped entries, a single-snapshot state)."""
        assert self.store is not None
        return self._reload(self._loaded(self.store.load()), leading=True)

    def mirror(self, objects: dict[str, bytes] | None) -> list[str]:
        """A follower's view: its leader's last saved state, with every known switch
        believed to hold its share of the trees (the leader installs them; a follower
        never writes), so reads on any instance answer what the leader would."""
        problems = self._reload(self._loaded(objects), leading=False)
        for dpid in sorted(self.core.view.switches):
            self.core.switch_enter(dpid)  # the plan is the leader's to send: dropped
        return problems

    def _reload(self, loaded: Loaded, leading: bool) -> list[str]:
        """The core rebuilt with the same settings from ``loaded``; ``leading``: this
        instance writes the store, so what was dropped is deleted there and a legacy
        snapshot is written again as objects."""
        old = self.core
        self.core = MulticastCore(algorithm=old.algorithm, udp_port=old.udp_port,
                                  balance=old.balance, protection=old.protection, nicira=old.nicira,
                                  flap_damping=old.damping.flaps)
        self.core.no_ff.update(old.no_ff)  # (what the switches said of themselves still holds)
        self.core.events = old.events  # (the history goes on: its ids never restart)
        for table in (self.keys, self.transfers, self.offers, self.offer_index, self.declared,
                      self._errors, self.acl.rules, self.owners, self.active, self._joined):
            table.clear()  # (in place: discovery holds ``declared``)
        self.pinned.clear()
        self.dirty = set()
        problems = self._restore(loaded)
        self._rewrite(loaded, leading)
        return problems

    def _rewrite(self, loaded: Loaded, leading: bool) -> None:
        """After a restore: a leader deletes what was dropped and writes a single-snapshot
        state again as objects (at the next flush); a follower never writes."""
        if not leading:
            self.dirty = set()
            return
        rewrite = set(loaded.dropped)
        if loaded.legacy:
            rewrite |= self._all_keys() | {SNAPSHOT}
        if rewrite:
            self.touch(*rewrite)
            self._dirty = True

    def _all_keys(self) -> set[str]:
        return ({META, TOPOLOGY} | {f"{GROUP}{g}" for g in self.core.groups}
                | {f"{OFFER}{o}" for o in self.offers} | {f"{RULE}{r}" for r in self.acl.rules}
                | {f"{DECLARED}{ip}" for ip in self.declared})

    def _restore(self, loaded: Loaded) -> list[str]:
        from controller.policy import Rule

        name = self.store.name if self.store is not None else "state"
        data, problems = loaded.data, list(loaded.problems)
        groups = data["groups"]
        # keys stay out of restore(): its problem lines quote the group and get logged
        private = ("key", "transfer", "owner", "pinned", "active")
        try:
            problems += self.core.restore(dict(data, groups=[
                {k: v for k, v in d.items() if k not in private} for d in groups]))
        except Exception as exc:  # the checks missed something: still one line, no traceback
            log.debug("restoring %s failed", name, exc_info=True)
            raise StateFileError(f"state {name} cannot be restored ({type(exc).__name__}: "
                                 f"{exc}); fix it or move it aside to start empty") from None
        now = self.wall()
        for d in groups:
            gid = d["id"]
            if gid not in self.core.groups:
                continue
            key, problem = self._saved_key(gid, d.get("key"))
            self.keys[gid] = key
            if problem:
                problems.append(f"group {gid}: {problem}; issued a new one")
            elif d.get("transfer"):  # (an announced transfer belonged to the key)
                self.transfers[gid] = dict(d["transfer"])
            if d.get("owner"):
                self.owners[gid] = d["owner"]
            if d.get("pinned"):
                self.pinned.add(gid)
            self.active[gid] = float(d.get("active") or now)
        for ip, mac, dpid, port in data["declared_hosts"]:
            self.declared[check_unicast(ip)] = (mac.lower(), dpid, port)
        for o in data["offers"]:
            if (o["model"].strip(), o["source"]) in self.offer_index:
                problems.append(f"offer {o['id']}: {o['source']} offers {o['model']!r:.80} twice; dropped")
                continue
            self.offers[o["id"]] = {"model": o["model"].strip(), "source": o["source"],
                                    "name": o.get("name", ""), "size": o.get("size", 0),
                                    "files": o.get("files", 0), **({"hf": o["hf"]} if "hf" in o else {})}
            self.offer_index[(o["model"].strip(), o["source"])] = o["id"]
        for r in data["acl"]:
            self.acl.rules[r["id"]] = Rule.from_dict(r)
        nxt = data["next"]  # (never an id given before: dropped entries' ids count too)
        self.next_ids = {kind: max(nxt.get(kind, 1), loaded.highest.get(kind, 0) + 1)
                         for kind in ("group", "offer", "rule")}
        view = self.core.view
        for k in sorted(view.links):
            if not self.gate.allowed(k):  # saved before --fabric was given (or changed)
                self.core.link_remove(k.a, k.a_port, k.b, k.b_port)  # (nothing is connected yet)
                problems.append(f"link {k.a:#x}:{k.a_port} <-> {k.b:#x}:{k.b_port} is not a link of "
                                "the pinned fabric (--fabric): not restored")
        for p in problems:
            log.warning("state %s: %s", name, p)
        log.info("restored %d groups, %d offers, %d switches, %d links, %d hosts from %s",
                 len(self.core.groups), len(self.offers), len(view.switches), len(view.links),
                 len(view.hosts), name)
        return problems

    def _saved_key(self, gid: int, saved: Any) -> tuple[str, str | None]:
        """The group's session key as saved (sealed with the cluster secret, or hex), or
        a new one and why."""
        if isinstance(saved, str) and _HEX_KEY.fullmatch(saved):
            if self.cluster is not None:
                self.touch(f"{GROUP}{gid}")  # (sealed at the next save)
            return saved, None
        if isinstance(saved, str) and saved.startswith("aesgcm:"):
            if self.cluster is None:
                return secrets.token_hex(32), "its session key is sealed and no cluster secret is given"
            try:
                return self.cluster.unseal(saved, gid), None
            except ValueError as exc:
                return secrets.token_hex(32), f"its sealed session key {exc}"
        return secrets.token_hex(32), "no valid session key saved"


def _ip_key(ip: str) -> bytes:
    """Numeric order of canonical IPv4 strings (every address the core holds is one)."""
    return socket.inet_aton(ip)
