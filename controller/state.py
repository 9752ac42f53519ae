"""The controller's saved state as separate objects, and the checks every loaded entry
passes before it is restored.

A state is a set of objects, each saved under its own key, so a change writes only what
it changed (``controller.store``: one etcd key each, or one record each in the state
file's log): ``meta`` (format version and the next ids, which are never reused),
``topology`` (the last known switches, links and hosts), ``group/<id>``, ``offer/<id>``,
``acl/<id>`` and ``declared/<ip>``. ``Service.state()`` is the same content as one dict
(``version``, ``groups``, ``offers``, ...), which is also the format of the single-snapshot
state files of earlier versions (key ``snapshot``), still read.

Every entry is checked on its own (``clean``): the OpenAPI schema a REST body of the same
kind must match (``controller.schema``: the same maxima), then what the core needs (ids and
ports in range, a receiver not its group's source, no duplicates). A bad entry is dropped
with one line naming it (never its session key); the rest is restored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from controller.addressing import check_model, check_ssm
from controller.errors import CoreError
from controller.plan import MAX_GID
from controller.schema import SchemaError, check, loads
from controller.topoview import check_unicast
from controller.trees import ALGORITHMS

STATE_VERSION = 1
META, TOPOLOGY, SNAPSHOT = "meta", "topology", "snapshot"
GROUP, OFFER, RULE, DECLARED = "group/", "offer/", "acl/", "declared/"
KINDS = {GROUP: "groups", OFFER: "offers", RULE: "acl", DECLARED: "declared_hosts"}
ID_KINDS = {"groups": "group", "offers": "offer", "acl": "rule"}
MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
MAX_DPID = (1 << 64) - 1
MAX_PORT = 0xFFFFFF00  # OFPP_MAX
MAX_ID = MAX_GID  # offers and ACL rules share the groups' id range
KEY = re.compile(r"^(meta|topology|snapshot|(group|offer|acl)/[1-9][0-9]{0,9}|declared/[0-9.]{7,15})$")


def encode(obj: Any) -> bytes:
    """Compact JSON (json's C encoder; an indented dump runs in Python, ~4x slower)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def valid_key(key: str) -> bool:
    return KEY.match(key) is not None


# -- checks of single entries: each raises ValueError saying what is wrong ------------------
def integer(v: Any, lo: int, hi: int, what: str = "") -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ValueError(f"{what} is {v!r:.60}, not an integer in {lo}..{hi}".lstrip())
    return v


def _dpid(v: Any) -> None:
    integer(v, 1, MAX_DPID)


def _items(v: Any, n: int, what: str = "") -> list[Any]:
    if not isinstance(v, list) or len(v) != n:
        raise ValueError(f"{what} is {v!r:.60}, not a list of {n}".lstrip())
    return v


def _listed(v: Any, what: str) -> list[Any]:
    if not isinstance(v, list):
        raise ValueError(f"{what} is {type(v).__name__}, not a list")
    return v


def _schema(name: str, instance: Any) -> None:
    """The REST body's schema, in a ValueError's words."""
    try:
        check(name, instance)
    except SchemaError as exc:
        raise ValueError(str(exc)) from None


def _core(func: Callable[..., str], *args: Any) -> str:
    try:
        return func(*args)
    except CoreError as exc:
        raise ValueError(str(exc)) from None


def check_host(host: Any) -> None:
    """[ip, mac, dpid, port]: a learned or declared host (schema ``HostDeclare``)."""
    ip, mac, dpid, port = _items(host, 4)
    if not isinstance(ip, str):
        raise ValueError(f"address is {ip!r:.60}, not a string")
    _core(check_unicast, ip, "host")
    if not isinstance(mac, str) or not MAC.match(mac.lower()):
        raise ValueError(f"MAC {mac!r:.60} is not a MAC address")
    integer(dpid, 1, MAX_DPID, "dpid")
    integer(port, 1, MAX_PORT, "port")
    _schema("HostDeclare", {"ip": ip, "mac": mac, "dpid": dpid, "port": port})


def check_link(link: Any) -> None:
    a, ap, b, bp = _items(link, 4)
    for v, hi, what in ((a, MAX_DPID, "dpid"), (ap, MAX_PORT, "port"), (b, MAX_DPID, "dpid"),
                        (bp, MAX_PORT, "port")):
        integer(v, 1, hi, what)


def check_drain(drain: Any) -> None:
    """[a, b] a drained link (its two switches), [a] a drained switch."""
    if not isinstance(drain, list) or len(drain) not in (1, 2):
        raise ValueError(f"is {drain!r:.60}, not [dpid] or [dpid, dpid]")
    for v in drain:
        integer(v, 1, MAX_DPID, "dpid")


def _valid_transfer(t: Any) -> bool:
    """An announced transfer as saved: {} or the ``Rekey`` schema with a session."""
    if t == {}:
        return True
    if not isinstance(t, dict) or "session" not in t:
        return False
    try:
        check("Rekey", t)
    except SchemaError:
        return False
    return True


def check_group_fields(model: Any, source: Any, receivers: Any) -> tuple[str, str, list[str]]:
    """What a group's creation and a loaded group both need of model, source and
    receivers: the model a printable name, addresses of hosts, no receiver twice and none
    its group's source. Raises CoreError (REST: 400)."""
    model, source = check_model(model), check_unicast(source, "source")
    if not isinstance(receivers, list):
        raise CoreError("receivers must be a list of IPv4 addresses")
    for r in receivers:
        if not isinstance(r, str):
            raise CoreError(f"receiver {r!r:.60} is not a string")
        if check_unicast(r, "receiver") == source:
            raise CoreError(f"receiver {r} is the group's source")
    if len(set(receivers)) != len(receivers):  # here, not uniqueItems: that is O(n^2)
        raise CoreError("receivers must not name an address twice")
    return model, source, receivers


def check_group(d: Any) -> None:
    """A saved group: the ``GroupCreate`` schema over what a create names, then what only
    a saved group has (id, port, tree shape, key, announced transfer, owner, pin, time)."""
    if not isinstance(d, dict):
        raise ValueError(f"is {type(d).__name__}, not an object")
    for name in ("model", "source", "address"):
        if not isinstance(d.get(name), str):
            raise ValueError(f"{name} is {d.get(name)!r:.60}, not a string")
    _schema("GroupCreate", {k: d[k] for k in ("model", "source", "receivers", "algorithm", "address")
                            if k in d})
    _core(lambda: check_group_fields(d["model"], d["source"], d.get("receivers", []))[0])
    _core(check_ssm, d["address"])
    integer(d.get("port"), 1, 65535, "port")
    if d.get("algorithm", ALGORITHMS[0]) not in ALGORITHMS:
        raise ValueError(f"algorithm {d['algorithm']!r:.60} is not one of {', '.join(ALGORITHMS)}")
    for j, edge in enumerate(_listed(d.get("tree", []), "tree")):
        for v in _items(edge, 2, f"tree[{j}]"):
            integer(v, 1, MAX_DPID, f"tree[{j}] dpid")
    if not isinstance(d.get("key", ""), str):
        raise ValueError("key is not a string")
    if not _valid_transfer(d.get("transfer", {})):
        raise ValueError("transfer is not {session: 16 hex digits[, file_digest: 64 hex digits]}")
    owner = d.get("owner")
    if owner is not None and (not isinstance(owner, str) or _core(check_unicast, owner, "owner") != owner):
        raise ValueError(f"owner {owner!r:.60} is not a host address")
    if not isinstance(d.get("pinned", False), bool):
        raise ValueError("pinned is not true or false")
    active = d.get("active", 0)
    if not isinstance(active, (int, float)) or isinstance(active, bool) or not 0 <= active < 1e12:
        raise ValueError(f"active is {active!r:.60}, not a time")


OFFER_FIELDS = ("model", "source", "name", "size", "files", "hf")


def offer_fields(body: Any) -> dict[str, Any]:
    """An offer's fields as REST takes them and as they are saved: the ``OfferCreate``
    schema (its maxima too), then a printable model and a host's address; ``hf`` (a
    Hugging Face snapshot's commit, refs and LFS files) only when given, so an offer
    without it is saved as before. Raises SchemaError or CoreError (REST: 400)."""
    check("OfferCreate", body)
    fields = {"model": check_model(body["model"]), "source": check_unicast(body["source"], "source"),
              "name": body.get("name", ""), "size": body.get("size", 0), "files": body.get("files", 0)}
    if "hf" in body:
        hf = body["hf"]
        fields["hf"] = {"commit": hf["commit"], "refs": sorted(set(hf.get("refs", []))),
                        "lfs": sorted(set(hf.get("lfs", [])))}
    return fields


def check_offer(o: Any) -> None:
    if not isinstance(o, dict):
        raise ValueError(f"is {type(o).__name__}, not an object")
    try:
        offer_fields({k: o[k] for k in OFFER_FIELDS if k in o})
    except SchemaError as exc:
        raise ValueError(str(exc)) from None
    except CoreError as exc:
        raise ValueError(str(exc)) from None


def check_rule(r: Any) -> None:
    """A saved ACL rule: the ``AclRule`` schema, and addresses that parse."""
    from controller.policy import Rule

    if not isinstance(r, dict):
        raise ValueError(f"is {type(r).__name__}, not an object")
    _schema("AclRule", {k: v for k, v in r.items() if k != "id"})
    Rule.from_dict(r)  # (ValueError: not an address or network)


# -- a loaded state -------------------------------------------------------------------------
@dataclass
class Loaded:
    """A state's content as ``Service.state()`` has it, every entry checked; ``problems``:
    one line per entry dropped; ``dropped``: their object keys (a leader deletes them);
    ``legacy``: read from one snapshot (written again as objects)."""

    data: dict[str, Any]
    problems: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    legacy: bool = False
    # kind (group, offer, rule) -> the highest valid id of any entry, dropped ones too:
    # ids are never given again
    highest: dict[str, int] = field(default_factory=dict)


class Unusable(ValueError):
    """The state as a whole cannot be used (not JSON, not a state, another version)."""


def _check_version(meta: Any, what: str) -> None:
    if not isinstance(meta, dict):
        raise Unusable(f"{what} does not hold a modelcast state object")
    if meta.get("version") != STATE_VERSION:
        raise Unusable(f"{what} has version {meta.get('version')!r}; this controller reads "
                       f"version {STATE_VERSION}")


def from_snapshot(raw: bytes) -> Loaded:
    """One JSON state (the format of earlier versions' state files and etcd key): every
    entry checked, named by its place in the lists. Unusable when it is no state."""
    try:
        data = loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise Unusable(f"cannot be read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise Unusable(f"is not valid JSON ({exc}); fix it or move it aside to start empty") from None
    except (ValueError, RecursionError) as exc:
        raise Unusable(f"is not valid JSON ({str(exc)[:100]}); fix it or move it aside to start empty") from None
    if not isinstance(data, dict) or not isinstance(data.get("groups", []), list) \
            or not isinstance(data.get("topology", {}), dict):
        raise Unusable("does not hold a modelcast state object")
    _check_version(data, "it")
    return clean(data, legacy=True)


def from_objects(objects: dict[str, bytes]) -> Loaded:
    """Objects saved one by one (``controller.store``): each decoded and checked alone; a
    legacy ``snapshot`` is read only when nothing else was saved (then migrated)."""
    if set(objects) <= {SNAPSHOT}:
        return from_snapshot(objects[SNAPSHOT]) if objects else clean({"version": STATE_VERSION})
    problems, dropped = [], []
    data: dict[str, Any] = {"version": STATE_VERSION, "groups": [], "offers": [], "acl": [],
                            "declared_hosts": []}
    places: dict[str, list[str]] = {kind: [] for kind in KINDS.values()}
    if META in objects:
        try:
            meta = loads(objects[META])
        except (ValueError, RecursionError):
            raise Unusable("its meta object is not JSON") from None
        _check_version(meta, "it")
        data["next"] = meta.get("next", {})
    for key in sorted(objects):
        if key in (META, SNAPSHOT):
            if key == SNAPSHOT:
                dropped.append(key)  # (superseded by the objects)
            continue
        try:
            value = loads(objects[key])
        except (ValueError, RecursionError, UnicodeDecodeError) as exc:
            problems.append(f"{key}: not JSON ({str(exc)[:80]}); dropped")
            dropped.append(key)
            continue
        if key == TOPOLOGY:
            data["topology"] = value if isinstance(value, dict) else {}
            continue
        prefix = key[:key.index("/") + 1] if "/" in key else ""
        if prefix not in KINDS or not valid_key(key):
            problems.append(f"{key[:80]!r} is no state object; dropped")
            dropped.append(key)
            continue
        data[KINDS[prefix]].append(value)
        places[KINDS[prefix]].append(key)
    loaded = clean(data, places)
    loaded.problems[:0] = problems
    loaded.dropped += dropped
    return loaded


def clean(data: dict[str, Any], places: dict[str, list[str]] | None = None,
          legacy: bool = False) -> Loaded:
    """``data`` with every entry that fails its check dropped (one problem line each).
    ``places``: the object key of each entry (else its index in its list names it). One
    linear pass, before anything is restored."""
    out = Loaded({"version": STATE_VERSION}, legacy=legacy)

    def place(kind: str, i: int) -> str:
        return places[kind][i] if places is not None and kind in places else f"{kind}[{i}]"

    def keep(kind: str, entries: list[Any], check_one: Callable[[Any], None],
             name: Callable[[Any], str | None] | None = None) -> list[Any]:
        """The entries that pass ``check_one``; ``name``: an entry's name once its id is
        valid (entries with ids must have a valid one, and each id once)."""
        kept, seen = [], set()
        for i, entry in enumerate(entries):
            where = place(kind, i)
            ident = name(entry) if name is not None else None
            if ident is not None and kind in ID_KINDS:
                n = int(ident.rsplit(" ", 1)[1])
                out.highest[ID_KINDS[kind]] = max(out.highest.get(ID_KINDS[kind], 0), n)
            try:
                if name is not None and ident is None and kind != "declared_hosts":
                    if not isinstance(entry, dict):
                        raise ValueError(f"is {type(entry).__name__}, not an object")
                    raise ValueError(f"id is {entry.get('id')!r:.60}, not an integer in 1..{MAX_ID}")
                check_one(entry)
                if ident is not None and ident in seen:
                    raise ValueError("saved twice (the second is dropped)")
                if places is not None and kind in places and not _placed(where, entry, kind):
                    raise ValueError(f"is saved under {where}")
            except ValueError as exc:
                said = f"{ident}: {exc}" if ident else f"{where} {exc}"
                out.problems.append(said if said.endswith("dropped)") else f"{said}; dropped")
                if places is not None:  # (the object to delete, or to write again without it)
                    out.dropped.append(where if kind in places else TOPOLOGY)
                continue
            seen.add(ident)
            kept.append(entry)
        return kept

    topo = data.get("topology", {}) if isinstance(data.get("topology", {}), dict) else {}
    out.data["topology"] = {
        "switches": keep("topology.switches", _as_list(topo.get("switches", []), out, "topology.switches"),
                         _dpid),
        "links": keep("topology.links", _as_list(topo.get("links", []), out, "topology.links"), check_link),
        "hosts": keep("topology.hosts", _as_list(topo.get("hosts", []), out, "topology.hosts"), check_host),
        "drains": keep("topology.drains", _as_list(topo.get("drains", []), out, "topology.drains"), check_drain)}
    for kind, check_one, prefix in (("groups", check_group, "group"), ("offers", check_offer, "offer"),
                                    ("acl", check_rule, "acl rule")):
        out.data[kind] = keep(kind, _as_list(data.get(kind, []), out, kind), check_one,
                              lambda e, p=prefix: _ident(e, p))
    out.data["declared_hosts"] = keep(
        "declared_hosts", _as_list(data.get("declared_hosts", []), out, "declared_hosts"), check_host,
        lambda h: f"declared host {h[0]}" if places is not None and isinstance(h, list) and h
        and isinstance(h[0], str) else None)
    nxt = data.get("next", {})
    out.data["next"] = {k: v for k, v in (nxt.items() if isinstance(nxt, dict) else ())
                        if k in ("group", "offer", "rule") and isinstance(v, int)
                        and not isinstance(v, bool) and 1 <= v <= MAX_ID + 1}
    return out


def _as_list(v: Any, out: Loaded, what: str) -> list[Any]:
    if isinstance(v, list):
        return v
    out.problems.append(f"{what} is {type(v).__name__}, not a list; dropped")
    return []


def _ident(entry: Any, prefix: str) -> str | None:
    """``group 4``: an entry named by its id, once the id is one."""
    if not isinstance(entry, dict):
        return None
    try:
        return f"{prefix} {integer(entry.get('id'), 1, MAX_ID, 'id')}"
    except ValueError:
        return None


def _placed(key: str, entry: Any, kind: str) -> bool:
    """An object holds the entry its key names (``group/4`` holds group 4)."""
    if kind == "declared_hosts":
        return isinstance(entry, list) and bool(entry) and key == f"{DECLARED}{entry[0]}"
    prefix = {"groups": GROUP, "offers": OFFER, "acl": RULE}.get(kind)
    return prefix is None or key == f"{prefix}{entry.get('id')}"


def check_state(data: dict[str, Any]) -> None:
    """Raise ValueError with the first problem of a whole state (``Service.state()``),
    for callers that want all or nothing."""
    loaded = clean(data)
    if loaded.problems:
        raise ValueError(loaded.problems[0])
