"""Where the controller keeps its state: a ``Store`` holds the state's objects
(``controller.state``: ``meta``, ``topology``, ``group/<id>``, ...), each saved under its
own key, so a change costs what it changed, not the whole state. In a local file for one
instance (``FileStore``: a log of records, compacted) or in etcd for several (``EtcdStore``,
``--store etcd://HOST:PORT[,HOST:PORT]``: one key per object).

The etcd adapter is thin on purpose: every decision (who leads, which role each switch
gets) lives in ``controller.election``; this module only turns calls into etcd's HTTP
gateway requests (``etcd3gw``: plain HTTP, so it runs inside Ryu's eventlet loop, where
gRPC clients deadlock), over TLS with a client certificate and with etcd's own users when
configured (``EtcdSecurity``). Writes are fenced: an etcd store that serves an election
writes only while this instance's leader key is still the one it won (a transaction
comparing the key's create revision), so a deposed leader that has not noticed yet cannot
overwrite its successor's state.
"""

from __future__ import annotations

import base64
import logging
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol
from urllib.parse import urlsplit

from controller import settings

log = logging.getLogger("modelcast.store")

DEFAULT_PREFIX = "/modelcast/"
API_PATH = "/v3/"  # etcd 3.4+ serves its gateway here (3.3: /v3beta, older: /v3alpha)
SNAPSHOT = "snapshot"  # (controller.state's key for a single-snapshot state of earlier versions)


class StoreError(OSError):
    """The store could not be read or written (unreachable, refused, fenced off). An
    ``OSError`` so callers treat it as the disk-full case of the file store: the change
    that the switches already got stands, and the next save retries."""


class Store(Protocol):
    """The state's objects, each under its own key."""

    name: str  # for log lines and errors: a path or an etcd URL and prefix
    problems: list[str]  # what the last load could not read (torn or bad records)

    def load(self) -> dict[str, bytes] | None:
        """Every object (key -> its JSON), or None when nothing was saved yet."""
        ...

    def save(self, changes: dict[str, bytes | None]) -> None:
        """Write these objects (None: delete it), durably; raise OSError when refused."""
        ...


# -- the state file -----------------------------------------------------------------------
HEADER = b"modelcast-state 1\n"
COMPACT_MIN = 64 << 10  # the log is rewritten whole once its dead records pass this and its live ones


class Append(bytes):
    """Bytes a writer appends to the file (durably) instead of replacing it with them.
    The app's writer runs ``write_state`` in a native thread; it passes the payload on
    as it is, so the kind of write travels with the bytes."""


def write_state(path: Path, payload: bytes) -> None:
    """What a ``FileStore`` asks its writer to do: replace the file atomically, or append
    an ``Append`` durably."""
    if isinstance(payload, Append):
        append_durable(path, payload)
    else:
        write_atomic(path, payload)


class FileStore:
    """The state file (one instance): a header line, then one record per change,
    ``KEY<TAB>JSON`` (an empty JSON: deleted), appended and fsync'd. Loading keeps the
    last record of each key; a torn or bad record is skipped and reported. The file is
    rewritten whole (atomically) when its dead records outweigh its live ones, so it
    stays within about twice the state. A state file of earlier versions (one JSON
    snapshot) is read as ``snapshot`` and rewritten in this format at the first save."""

    def __init__(self, path: Path, writer: Callable[[Path, bytes], None] | None = None) -> None:
        self.path = Path(path)
        self.name = str(self.path)
        self.writer = writer or write_state
        self.live: dict[str, bytes] = {}  # key -> its last record's value
        self.live_bytes = 0
        self.dead_bytes = 0
        self.rewrite = True  # the next save rewrites the file (fresh, legacy, torn, a failed write)
        self.problems: list[str] = []

    def load(self) -> dict[str, bytes] | None:
        self.problems = []
        self.live, self.live_bytes, self.dead_bytes, self.rewrite = {}, 0, 0, True
        if not self.path.exists():
            return None
        raw = self.path.read_bytes()
        if not raw.startswith(HEADER):
            return {SNAPSHOT: raw}  # (controller.state tells whether it is a state at all)
        body = raw[len(HEADER):]
        lines = body.split(b"\n")
        torn = lines.pop()  # b"" when the file ends with a newline
        for n, line in enumerate(lines, start=2):
            key, tab, value = line.partition(b"\t")
            try:
                name = key.decode("ascii")
            except UnicodeDecodeError:
                name = ""
            if not tab or not name or not name.isprintable():
                self.problems.append(f"line {n} is not a record ({line[:40]!r}); skipped")
                continue
            old = self.live.pop(name, None)
            if old is not None:
                self.dead_bytes += len(name) + len(old) + 2
                self.live_bytes -= len(name) + len(old) + 2
            if value:
                self.live[name] = value
                self.live_bytes += len(name) + len(value) + 2
            else:
                self.dead_bytes += len(name) + 2
        if torn:
            self.problems.append(f"its last record (line {len(lines) + 2}) is incomplete (a crash "
                                 "while it was written); skipped")
        self.rewrite = bool(self.problems)  # (appending after a torn line would glue two)
        return dict(self.live)

    def save(self, changes: dict[str, bytes | None]) -> None:
        if not changes and not self.rewrite:
            return
        records = b"".join(_record(k, v) for k, v in changes.items())
        if self.rewrite or self.dead_bytes + len(records) > max(COMPACT_MIN, self.live_bytes):
            live = dict(self.live)
            for k, v in changes.items():
                if v is None:
                    live.pop(k, None)
                else:
                    live[k] = v
            self.writer(self.path, HEADER + b"".join(_record(k, v) for k, v in sorted(live.items())))
            self.live, self.rewrite, self.dead_bytes = live, False, 0
            self.live_bytes = sum(len(k) + len(v) + 2 for k, v in live.items())
            return
        try:
            self.writer(self.path, Append(records))
        except BaseException:
            self.rewrite = True  # whatever reached the file, the next save replaces it whole
            raise
        for k, v in changes.items():
            old = self.live.pop(k, None)
            if old is not None:
                self.live_bytes -= len(k) + len(old) + 2
                self.dead_bytes += len(k) + len(old) + 2
            if v is None:
                self.dead_bytes += len(k) + 2
            else:
                self.live[k] = v
                self.live_bytes += len(k) + len(v) + 2


def _record(key: str, value: bytes | None) -> bytes:
    if "\t" in key or "\n" in key or (value is not None and b"\n" in value):
        raise ValueError(f"state record {key!r} cannot be written as one line")
    return key.encode("ascii") + b"\t" + (value or b"") + b"\n"


def write_atomic(path: Path, payload: bytes) -> None:
    """Replace ``path`` atomically and durably: a crash leaves the old file or the new
    one (temp file in the same directory, fsync, rename, fsync of the directory)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
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
    _fsync_dir(path.parent)


def append_durable(path: Path, payload: bytes) -> None:
    """Append ``payload`` and fsync; on a failure the file is cut back to where it was,
    so a half-written record never stays (the caller retries the whole save)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        size = os.fstat(fd).st_size
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException:
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable."""
    try:
        dfd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


# -- etcd -----------------------------------------------------------------------------------
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


@dataclass(frozen=True)
class EtcdSecurity:
    """How the controller proves itself to etcd and checks etcd: TLS with ``ca`` (the CA
    that signed etcd's certificate), a client certificate (``cert`` and ``key``: etcd
    started with ``--client-cert-auth``), and/or an etcd user (``user``, ``password``:
    etcd with auth enabled, the user's role granted read and write on the prefix only)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    user: str | None = None
    password: str | None = None

    @property
    def tls(self) -> bool:
        return bool(self.ca or self.cert)

    @staticmethod
    def from_settings(conf: settings.Settings) -> "EtcdSecurity":
        return EtcdSecurity(conf.etcd_ca, conf.etcd_cert, conf.etcd_key, conf.etcd_user, conf.etcd_password)


def _b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def _prefix_end(key: str) -> str:
    """The range end covering every key that starts with ``key``."""
    raw = key.encode()
    return _b64(raw[:-1] + bytes([raw[-1] + 1]))


MAX_TXN_OPS = 128  # etcd's default --max-txn-ops
MAX_TXN_BYTES = 1 << 20  # below etcd's default --max-request-bytes (1.5 MiB)
PAGE = 1000  # keys per range request when loading


class EtcdStore:
    """The state's objects under ``PREFIX + "state/"`` (a state of earlier versions: the
    one key ``PREFIX + "state"``) and the election's leader key ``PREFIX + "leader"`` in
    etcd, through its HTTP gateway; each call tries the endpoints in turn (the first that
    answers serves it). Implements ``Store`` and ``controller.election.ElectionStore``.
    ``security``: TLS and etcd user (None: the ``--etcd-*`` options of
    ``controller.settings.current``)."""

    def __init__(self, url: EtcdUrl, timeout: float = 1.0, fenced: bool = True,
                 security: EtcdSecurity | None = None) -> None:
        import etcd3gw  # only an etcd deployment needs it

        self.url = url
        self.security = security if security is not None else EtcdSecurity.from_settings(settings.current)
        scheme = "etcds" if self.security.tls else "etcd"
        self.name = f"{scheme}://" + ",".join(f"{h}:{p}" for h, p in url.endpoints) + url.prefix
        self.key = url.prefix + "state"  # (the single snapshot of earlier versions)
        self.objects = url.prefix + "state/"
        self.leader_key = url.prefix + "leader"
        self._clients = [etcd3gw.client(host=h, port=p, timeout=timeout, api_path=API_PATH,
                                        protocol="https" if self.security.tls else "http",
                                        session=self._session())
                         for h, p in url.endpoints]
        # fenced: the state is written only while ``fence``, the create revision of the
        # leader key this instance won, is still the key's (None: not the leader, no write)
        self.fenced = fenced
        self.fence: int | None = None
        self.problems: list[str] = []
        # saves land in the order they were encoded (green under eventlet's patching)
        self._lock = threading.Lock()

    def _session(self) -> Any:
        """An HTTP session with exactly our CA and client certificate: not the environment's
        (requests lets ``REQUESTS_CA_BUNDLE`` replace a session's CA, and would send etcd's
        traffic through a proxy named in the environment)."""
        import requests

        session = requests.Session()
        session.trust_env = False
        if self.security.ca:
            session.verify = self.security.ca
        if self.security.cert:
            session.cert = (self.security.cert, self.security.key)
        return session

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One gateway call on the first endpoint that answers; StoreError otherwise."""
        from etcd3gw import exceptions

        errors = []
        for i, c in enumerate(self._clients):
            try:
                out = self._call(c, path, body)
            except exceptions.Etcd3Exception as exc:
                errors.append(f"{c.host}:{c.port}: {type(exc).__name__} {_reason(exc)}")
                continue
            if i:  # prefer the one that answered next time
                self._clients.insert(0, self._clients.pop(i))
            return out
        raise StoreError(f"etcd unavailable ({'; '.join(errors)})")

    def _call(self, client: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One request; with an etcd user, authenticated first and again when etcd says
        the token is no longer valid (it expires after etcd's --auth-token-ttl)."""
        from etcd3gw import exceptions

        if self.security.user and "Authorization" not in client.session.headers:
            self._authenticate(client)
        try:
            return client.post(client.get_url(path), json=body)
        except exceptions.Etcd3Exception as exc:
            if not self.security.user or "token" not in _reason(exc).lower():
                raise
        self._authenticate(client)
        return client.post(client.get_url(path), json=body)

    def _authenticate(self, client: Any) -> None:
        client.session.headers.pop("Authorization", None)
        out = client.post(client.get_url("/auth/authenticate"),
                          json={"name": self.security.user, "password": self.security.password or ""})
        client.session.headers["Authorization"] = str(out.get("token", ""))

    # -- Store -------------------------------------------------------------------------
    def load(self) -> dict[str, bytes] | None:
        """Every object, read at one revision (page by page: a big state is more than
        one response)."""
        self.problems = []
        found: dict[str, bytes] = {}
        start, end, revision = _b64(self.key), _prefix_end(self.key), None
        while True:
            body: dict[str, Any] = {"key": start, "range_end": end, "limit": PAGE}
            if revision is not None:
                body["revision"] = revision
            out = self._post("/kv/range", body)
            revision = revision or out.get("header", {}).get("revision")
            kvs = out.get("kvs") or []
            for kv in kvs:
                key = base64.b64decode(kv["key"]).decode("utf-8", "replace")
                value = base64.b64decode(kv.get("value", ""))
                if key == self.key:
                    found[SNAPSHOT] = value
                elif key.startswith(self.objects):
                    found[key[len(self.objects):]] = value
            if not out.get("more") or not kvs:
                break
            start = _b64(base64.b64decode(kvs[-1]["key"]) + b"\0")
        return found or None

    def revision(self) -> int:
        """The state's revision (0: none): every save writes ``meta`` last, so its mod
        revision moves with every change; followers reload when it does."""
        for key in (self.objects + "meta", self.key):
            kvs = self._post("/kv/range", {"key": _b64(key), "keys_only": True}).get("kvs") or []
            if kvs:
                return int(kvs[0].get("mod_revision", 0))
        return 0

    def save(self, changes: dict[str, bytes | None]) -> None:
        with self._lock:
            self._save(changes)

    def _save(self, changes: dict[str, bytes | None]) -> None:
        """Puts and deletes in as few transactions as etcd's limits allow, ``meta`` in
        the last one; each transaction fenced by the leader key."""
        ops = []
        for k in sorted(changes, key=lambda k: k == "meta"):
            v = changes[k]
            key = _b64(self.key if k == SNAPSHOT else self.objects + k)
            ops.append({"request_delete_range": {"key": key}} if v is None
                       else {"request_put": {"key": key, "value": _b64(v)}})
        batch: list[dict[str, Any]] = []
        size = 0
        for op in ops:
            n = len(str(op))
            if batch and (len(batch) >= MAX_TXN_OPS or size + n > MAX_TXN_BYTES):
                self._txn(batch)
                batch, size = [], 0
            batch.append(op)
            size += n
        if batch:
            self._txn(batch)

    def _txn(self, ops: list[dict[str, Any]]) -> None:
        if not self.fenced:
            self._post("/kv/txn", {"compare": [], "success": ops, "failure": []})
            return
        if self.fence is None:
            raise StoreError("not written: this instance is not the leader")
        out = self._post("/kv/txn", {
            "compare": [{"key": _b64(self.leader_key), "target": "CREATE", "result": "EQUAL",
                         "create_revision": str(self.fence)}],
            "success": ops, "failure": []})
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


def _reason(exc: BaseException) -> str:
    """etcd3gw's exception text: (response text, reason), at most 200 characters."""
    return " ".join(str(a) for a in getattr(exc, "args", ()))[:200] or type(exc).__name__
