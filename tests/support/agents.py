"""Shared helpers for the host-agent tests: protocol payloads and configs, the verdict
every simulated transfer must reach, the CLI as a subprocess, loopback multicast, and a
fake controller. Test files are made with ``lab.models.make_model``; free ports come
from ``lab.sh.free_port``."""

from __future__ import annotations

import json
import random
import secrets
import socket
import struct
import subprocess
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional

import blake3

from hostagent.events import FileComplete, TransferFinished
from hostagent.sender import Sender, SenderConfig
from lab.netsim import Sim
from lab.sh import free_port
from tests.support.lab import skip_or_fail

REPO = Path(__file__).resolve().parent.parent.parent
KIB = 1024
LOOPBACK = "127.0.0.1"
IP_ADD_SOURCE_MEMBERSHIP = 39  # Linux


# --------------------------------------------------------------------------- protocol


def payload(size: int, seed: int = 1) -> bytes:
    """Incompressible in-memory file contents, the same for the same seed."""
    return random.Random(seed).randbytes(size)


def file_id(path: object, chunk_size: int) -> str:
    """The content id ``modelcast send`` prints for a single file at ``chunk_size``."""
    from hostagent import tree
    from hostagent.net import FileSource
    from hostagent.sender import file_digests

    source = FileSource(str(path))
    try:
        digests, whole = file_digests(source, chunk_size)
        return tree.content_id(b"", source.size, chunk_size, whole, digests)
    finally:
        source.close()


def sender_config(**overrides: object) -> SenderConfig:
    """Small chunks and a modest rate: many chunks and repair rounds in little virtual time."""
    base: dict = dict(chunk_size=4 * KIB, payload_size=1024, rate_bps=20e6)
    base.update(overrides)
    return SenderConfig(**base)


def stream_out(sender: Sender, step: float = 0.001, limit: float = 600.0) -> float:
    """Drain the whole first pass (nobody listening); returns the virtual time it ended.
    A stream still running after ``limit`` virtual seconds fails the test (not a hang)."""
    now = 0.0
    while sender.stream_position < sender.layout.total_seq:
        assert now < limit, f"the stream stalled at {sender.stream_position}/{sender.layout.total_seq}"
        now += step
        sender.datagrams_to_send(now)
    return now


def assert_all_verified(sim: Sim, data: bytes) -> None:
    """Every receiver holds exactly ``data``, verified by digest, and the sender saw
    them all complete."""
    digest = blake3.blake3(data).digest()
    for rec in sim.receivers:
        assert rec.receiver is not None and rec.receiver.complete, rec.addr
        assert bytes(rec.sink.data) == data
        assert FileComplete(digest) in rec.events
    finished = [e for e in sim.sender_events if isinstance(e, TransferFinished)]
    assert len(finished) == 1 and finished[0].ok
    assert len(finished[0].completed) == len(sim.receivers)


# --------------------------------------------------------------------------- real sockets


def cli_argv(*args: str) -> list[str]:
    """The argv of ``modelcast ARGS`` with this venv's Python (also inside a lab host)."""
    return [sys.executable, "-m", "hostagent.cli", *args]


def cli(*args: str, env: Optional[dict] = None) -> subprocess.Popen:
    """``modelcast ARGS`` as a subprocess, output captured as text."""
    return subprocess.Popen(cli_argv(*args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)


def _loopback_multicast_works(group: str, port: int) -> bool:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx, \
                socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            rx.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            rx.bind((group, port))
            mreq = struct.pack("4s4s4s", *(socket.inet_aton(a) for a in (group, LOOPBACK, LOOPBACK)))
            rx.setsockopt(socket.IPPROTO_IP, IP_ADD_SOURCE_MEMBERSHIP, mreq)
            rx.settimeout(1.0)
            tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(LOOPBACK))
            tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 0)
            tx.bind((LOOPBACK, 0))
            tx.sendto(b"probe", (group, port))
            return rx.recvfrom(16)[0] == b"probe"
    except OSError:
        return False


def loopback_group(address: Optional[str] = None) -> tuple[str, int]:
    """A multicast group (``address`` or a random 239.255.x.y) on a free UDP port, or a
    skip where source-specific multicast on the loopback interface does not work."""
    group = address or f"239.255.{random.randint(1, 254)}.{random.randint(1, 254)}"
    port = free_port(socket.SOCK_DGRAM)
    if not _loopback_multicast_works(group, port):
        skip_or_fail("multicast on the loopback interface is not available here")
    return group, port


# --------------------------------------------------------------------------- controller


class FakeController:
    """Just enough of /v1/groups: one group per (model, source) at ``address``:``port``;
    it reports ``pending`` for the first ``pending_polls`` reads, then ``installed`` (or
    ``stuck_state``), or refuses everything with ``reject`` = (status, error). With
    ``token``, the key is shown only to requests that carry it (as the controller shows
    it only to a covering token). Listens on ``host`` (default loopback)."""

    ADDRESS = "239.255.77.1"

    def __init__(self, port: int, pending_polls: int = 2, stuck_state: Optional[str] = None,
                 reject: Optional[tuple[int, str]] = None, token: Optional[str] = None,
                 host: str = LOOPBACK, address: Optional[str] = None) -> None:
        self.token = token
        self.address = address or self.ADDRESS
        self.calls: list[tuple[str, str, Optional[dict], Optional[str]]] = []
        self.groups: dict[int, dict] = {}
        self.offers: dict[int, dict] = {}  # /v1/offers, as modelcast serve and fetch use it
        self.pending_polls = pending_polls
        self.stuck_state = stuck_state
        self.reject = reject
        self.mc_port = port
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def _reply(self, code: int, obj: Optional[dict]) -> None:
                body = json.dumps(obj).encode() if obj is not None else b""
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                with fake.lock:
                    auth = self.headers.get("Authorization")
                    fake.calls.append((self.command, self.path, body, auth))
                    code, obj = fake.route(self.command, self.path, body)
                    if fake.token is not None and auth != f"Bearer {fake.token}" and isinstance(obj, dict):
                        obj = {k: v for k, v in obj.items() if k != "key"}
                self._reply(code, obj)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeController":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _view(self, g: dict) -> dict:
        state = self.stuck_state or ("pending" if g["reads"] < self.pending_polls else "installed")
        return {**{k: v for k, v in g.items() if k != "reads"}, "state": state,
                "receivers": {ip: ("installed" if state == "installed" else "pending") for ip in g["receivers"]}}

    def route(self, method: str, path: str, body: Optional[dict]) -> tuple[int, Optional[dict]]:
        if self.reject is not None:
            return self.reject[0], {"error": self.reject[1], "detail": {"path": path}}
        path, _, query = path.partition("?")
        parts = path.strip("/").split("/")
        if parts[:2] == ["v1", "offers"]:
            return self._offers(method, parts, body, query)
        if method == "GET" and parts == ["v1", "groups"]:  # ?model= and ?source= filter, as the real one's
            wanted = dict(urllib.parse.parse_qsl(query))
            return 200, [self._view(g) for g in self.groups.values()  # type: ignore[return-value]
                         if all(g[k] == v for k, v in wanted.items() if k in ("model", "source"))]
        if method == "POST" and parts == ["v1", "groups"]:
            for g in self.groups.values():
                if (g["model"], g["source"]) == (body["model"], body["source"]):
                    return 200, self._view(g)
            gid = len(self.groups) + 1
            self.groups[gid] = g = {
                "id": gid, "model": body["model"], "source": body["source"], "address": self.address,
                "port": self.mc_port, "receivers": list(body.get("receivers") or []), "tree": {},
                "errors": [], "key": "ab" * 32, "reads": 0,
            }
            return 201, self._view(g)
        if len(parts) >= 3 and parts[:2] == ["v1", "groups"] and parts[2].isdigit() and int(parts[2]) in self.groups:
            g = self.groups[int(parts[2])]
            if method == "GET" and len(parts) == 3:
                g["reads"] += 1
                return 200, self._view(g)
            if method == "DELETE" and len(parts) == 3:
                del self.groups[int(parts[2])]
                return 204, None
            if method == "POST" and len(parts) == 4 and parts[3] == "rekey":
                g["key"] = secrets.token_hex(32)  # a fresh key every time
                for name in ("session", "file_digest"):
                    if (body or {}).get("session"):
                        g[name] = (body or {}).get(name)
                    else:
                        g.pop(name, None)
                return 200, self._view(g)
            if len(parts) == 5 and parts[3] == "receivers":
                if method == "PUT":
                    if parts[4] not in g["receivers"]:
                        g["receivers"].append(parts[4])
                    return 200, self._view(g)
                if method == "DELETE":
                    if parts[4] in g["receivers"]:
                        g["receivers"].remove(parts[4])
                    return 200, self._view(g)
        return 404, {"error": f"no such resource {path}", "detail": None}

    def _offers(self, method: str, parts: list[str], body: Optional[dict], query: str) -> tuple[int, Optional[dict]]:
        """POST/GET /v1/offers (?model=), DELETE /v1/offers/{id}; ``group`` as the real one."""
        def view(oid: int) -> dict:
            o = self.offers[oid]
            gid = next((g["id"] for g in self.groups.values() if (g["model"], g["source"]) == (o["model"], o["source"])),
                       None)
            return {"id": oid, **o, "group": gid}

        if method == "POST" and len(parts) == 2:
            body = dict(body or {})
            for oid, o in self.offers.items():
                if (o["model"], o["source"]) == (body["model"], body["source"]):
                    o.update(body)
                    return 200, view(oid)
            oid = max(self.offers, default=0) + 1
            self.offers[oid] = body
            return 201, view(oid)
        if method == "GET" and len(parts) == 2:
            model = dict(urllib.parse.parse_qsl(query)).get("model")
            return 200, [view(oid) for oid, o in sorted(self.offers.items())  # type: ignore[return-value]
                         if model is None or o["model"] == model]
        if method == "DELETE" and len(parts) == 3 and parts[2].isdigit() and int(parts[2]) in self.offers:
            del self.offers[int(parts[2])]
            return 204, None
        return 404, {"error": "no such offer", "detail": None}
