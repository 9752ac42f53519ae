"""Where the controller keeps its state: a ``Store`` holds one snapshot (the bytes of
``Service.state()``), in a local file for one instance or in etcd for several
(``--store etcd://HOST:PORT[,HOST:PORT]``).

The etcd adapter is thin on purpose: every decision (who leads, which role each switch
gets) lives in ``controller.election``; this module only turns calls into etcd's HTTP
gateway requests (``etcd3gw``: plain HTTP, so it runs inside Ryu's eventlet loop, where
gRPC clients deadlock). Writes of the snapshot are fenced: an etcd store that serves an
election puts the snapshot only while this instance's leader key is still the one it won
(a transaction comparing the key's create revision), so a deposed leader that has not
noticed yet cannot overwrite its successor's state.
"""

from __future__ import annotations

import base64
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol
from urllib.parse import urlsplit

DEFAULT_PREFIX = "/modelcast/"
API_PATH = "/v3/"  # etcd 3.4+ serves its gateway here (3.3: /v3beta, older: /v3alpha)


class StoreError(OSError):
    """The store could not be read or written (unreachable, refused, fenced off). An
    ``OSError`` so callers treat it as the disk-full case of the file store: the change
    that the switches already got stands, and the next save retries."""


class Store(Protocol):
    """One snapshot of the controller's state."""

    name: str  # for log lines and errors: a path or an etcd URL and key

    def load(self) -> bytes | None:
        """The snapshot, or None when there is none yet (a fresh start)."""
        ...

    def save(self, payload: bytes) -> None:
        """Replace the snapshot, atomically and durably; raise OSError when refused."""
        ...


class FileStore:
    """The state file (the default, one instance): atomic replace, fsync'd."""

    def __init__(self, path: Path, writer: Callable[[Path, bytes], None] | None = None) -> None:
        self.path = Path(path)
        self.name = str(self.path)
        self.writer = writer or write_atomic

    def load(self) -> bytes | None:
        if not self.path.exists():
            return None
        return self.path.read_bytes()

    def save(self, payload: bytes) -> None:
        self.writer(self.path, payload)


def write_atomic(path: Path, payload: bytes) -> None:
    """Replace ``path`` atomically and durably: a crash leaves the old file or the new
    one (temp file in the same directory, fsync, rename, fsync of the directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)  # it holds the groups' session keys
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


@dataclass(frozen=True)
class EtcdUrl:
    endpoints: tuple[tuple[str, int], ...]
    prefix: str = DEFAULT_PREFIX


def parse_store_url(text: str, prefix: str | None = None) -> EtcdUrl:
    """``etcd://HOST:PORT[,HOST:PORT...][/PREFIX]`` (prefix default ``/modelcast/``, or
    ``prefix`` when given). Raises ValueError with the reason."""
    if not text.startswith("etcd://"):
        raise ValueError(f"{text!r} is not an etcd://HOST:PORT[,HOST:PORT] URL")
    rest = text[len("etcd://"):]
    hosts, _, path = rest.partition("/")
    endpoints = []
    for item in hosts.split(","):
        parts = urlsplit(f"//{item}")
        try:
            port = parts.port or 2379
        except ValueError:
            raise ValueError(f"{item!r}: bad port") from None
        if not parts.hostname:
            raise ValueError(f"{item!r}: no host")
        endpoints.append((parts.hostname, port))
    chosen = prefix if prefix is not None else (f"/{path}" if path else DEFAULT_PREFIX)
    if not chosen.endswith("/"):
        chosen += "/"
    if not chosen.startswith("/"):
        chosen = "/" + chosen
    return EtcdUrl(tuple(endpoints), chosen)


def _b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


class EtcdStore:
    """The snapshot under ``PREFIX + "state"`` and the election's leader key
    ``PREFIX + "leader"`` in etcd, through its HTTP gateway; each call tries the
    endpoints in turn (the first that answers serves it). Implements ``Store`` and
    ``controller.election.ElectionStore``."""

    def __init__(self, url: EtcdUrl, timeout: float = 1.0, fenced: bool = True) -> None:
        import etcd3gw  # only an etcd deployment needs it

        self.url = url
        self.name = "etcd://" + ",".join(f"{h}:{p}" for h, p in url.endpoints) + url.prefix + "state"
        self.key = url.prefix + "state"
        self.leader_key = url.prefix + "leader"
        self._clients = [etcd3gw.client(host=h, port=p, timeout=timeout, api_path=API_PATH)
                         for h, p in url.endpoints]
        # fenced: the snapshot is written only while ``fence``, the create revision of the
        # leader key this instance won, is still the key's (None: not the leader, no write)
        self.fenced = fenced
        self.fence: int | None = None
        # saves land in the order they were encoded (green under eventlet's patching)
        self._lock = threading.Lock()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One gateway call on the first endpoint that answers; StoreError otherwise."""
        from etcd3gw import exceptions

        errors = []
        for i, c in enumerate(self._clients):
            try:
                out = c.post(c.get_url(path), json=body)
            except exceptions.Etcd3Exception as exc:
                errors.append(f"{c.host}:{c.port}: {type(exc).__name__} {str(exc)[:200]}")
                continue
            if i:  # prefer the one that answered next time
                self._clients.insert(0, self._clients.pop(i))
            return out
        raise StoreError(f"etcd unavailable ({'; '.join(errors)})")

    # -- Store -------------------------------------------------------------------------
    def load(self) -> bytes | None:
        kvs = self._post("/kv/range", {"key": _b64(self.key)}).get("kvs") or []
        return base64.b64decode(kvs[0].get("value", "")) if kvs else None

    def revision(self) -> int:
        """The snapshot's mod revision (0: none): followers reload when it moves."""
        kvs = self._post("/kv/range", {"key": _b64(self.key), "keys_only": True}).get("kvs") or []
        return int(kvs[0].get("mod_revision", 0)) if kvs else 0

    def save(self, payload: bytes) -> None:
        with self._lock:
            self._save(payload)

    def _save(self, payload: bytes) -> None:
        put = {"request_put": {"key": _b64(self.key), "value": _b64(payload)}}
        if not self.fenced:
            self._post("/kv/put", put["request_put"])
            return
        if self.fence is None:
            raise StoreError("not written: this instance is not the leader")
        out = self._post("/kv/txn", {
            "compare": [{"key": _b64(self.leader_key), "target": "CREATE", "result": "EQUAL",
                         "create_revision": str(self.fence)}],
            "success": [put], "failure": []})
        if not out.get("succeeded"):
            raise StoreError(f"not written: {self.leader_key} is no longer ours (a new leader "
                             f"was elected)")

    # -- ElectionStore -----------------------------------------------------------------
    def grant(self, ttl: int) -> tuple[int, int]:
        out = self._post("/lease/grant", {"TTL": ttl, "ID": 0})
        return int(out["ID"]), int(out.get("TTL", ttl))

    def keepalive(self, lease: int) -> int:
        out = self._post("/lease/keepalive", {"ID": lease})
        return int((out.get("result") or {}).get("TTL", -1))

    def campaign(self, value: bytes, lease: int) -> tuple[bytes | None, int, int]:
        """Create the leader key with ``value`` on ``lease`` unless it exists; answer
        (holder's value, its create revision, its lease) after the attempt."""
        key = _b64(self.leader_key)
        out = self._post("/kv/txn", {
            "compare": [{"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": [{"request_put": {"key": key, "value": _b64(value), "lease": str(lease)}}],
            "failure": [{"request_range": {"key": key}}]})
        if out.get("succeeded"):
            return value, int(out["header"]["revision"]), lease
        kvs = []
        for r in out.get("responses", []):
            kvs += (r.get("response_range") or {}).get("kvs") or []
        if not kvs:  # it expired between compare and read: next step campaigns again
            return None, 0, 0
        kv = kvs[0]
        return (base64.b64decode(kv.get("value", "")), int(kv.get("create_revision", 0)),
                int(kv.get("lease", 0)))

    def resign(self, lease: int) -> None:
        self._post("/kv/lease/revoke", {"ID": lease})
