"""The REST server's connection limits (a shell: eventlet).

Ryu starts its WSGI server with eventlet's defaults: 1024 connections at most, none ever
closed for idling, and no limit per client. Each host agent waiting for a transfer keeps
one connection (a held GET), so ~1000 waiting agents, or as many idle connections from
anyone, left no connection for any other call, and one host could take them all.
``serve_rest`` replaces Ryu's ``serve_forever`` with the same server and our limits
(``controller.settings``: ``rest_connections``, ``rest_idle_s``, ``rest_per_client``).

eventlet's timeouts are per read: a client that sends one byte of its request every few
seconds (slowloris) kept its connection forever, ``rest_per_client`` of them per address.
A request must now arrive whole within ``rest_idle_s`` of its first byte
(``RequestClock``), and its connection is closed otherwise.

Every connection eventlet serves leaves a reference cycle (its ``HttpProtocol``, socket,
buffered files, request and response: ~70 objects, a few KB), which only the garbage
collector frees. The controller collects its older generations rarely
(``controller.core.tune_gc``), so a connection per agent call kept them for minutes: the
instance the agents ask first grew ~5 MB of RSS a minute. ``ClientPool`` collects the
young generations every ``COLLECT_EVERY`` closed connections instead.
"""

from __future__ import annotations

import gc
import json
import logging
import socket
import time
from collections import Counter
from typing import Any

import eventlet
import eventlet.wsgi
from eventlet.greenio import GreenSocket
from ryu.lib import hub

from controller import settings

log = logging.getLogger("modelcast.rest")

WARN_EVERY_S = 60.0  # a client refused again within this is not logged again
COLLECT_EVERY = 256  # closed connections between collections of their cycles (gc.collect(1))


class RequestClock:
    """How long a connection's next read may wait: the server's own timeout, but never
    past ``limit`` seconds after the first byte of the request being read. The clock
    starts at a request's first byte and stops when the server answers, so the time a
    client idles between requests (eventlet's keep-alive timeout) and the time a held GET
    waits for a change do not count."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.started: float | None = None  # monotonic time of the request's first byte

    def timeout(self, now: float, server_timeout: float | None) -> float | None:
        """The timeout for the next read; ``socket.timeout`` once the request is late."""
        if self.started is None:
            return server_timeout
        left = self.started + self.limit - now
        if left <= 0:
            raise socket.timeout(f"the request did not arrive within {self.limit:g} s of its first byte")
        return left if server_timeout is None else min(left, server_timeout)

    def received(self, now: float, n: int) -> None:
        if n and self.started is None:
            self.started = now

    def answered(self) -> None:
        self.started = None


class ClockedSocket(GreenSocket):
    """An accepted connection whose reads follow its ``RequestClock`` (set on accept by
    ``clock``); eventlet's server reads and writes it as any green socket."""

    clock: RequestClock
    server_timeout: float | None

    def settimeout(self, howlong: Any) -> None:
        self.server_timeout = howlong  # what eventlet asks for; each read may get less
        super().settimeout(howlong)

    def _before_read(self) -> None:
        super().settimeout(self.clock.timeout(time.monotonic(), self.server_timeout))

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self._before_read()
        data = super().recv(bufsize, flags)
        self.clock.received(time.monotonic(), len(data))
        return data

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self._before_read()
        n = super().recv_into(buffer, nbytes, flags)
        self.clock.received(time.monotonic(), n)
        return n

    def send(self, data: Any, flags: int = 0) -> int:
        self.clock.answered()
        return super().send(data, flags)

    def sendall(self, data: Any, flags: int = 0) -> None:
        self.clock.answered()
        return super().sendall(data, flags)


def clock(sock: Any, limit: float) -> None:
    """Make an accepted green socket a ``ClockedSocket`` with a ``limit``-second clock."""
    if isinstance(sock, GreenSocket) and not isinstance(sock, ClockedSocket):
        server_timeout = sock.gettimeout()
        sock.__class__ = ClockedSocket  # (eventlet's accept made it; its state stays)
        sock.clock = RequestClock(limit)
        sock.server_timeout = server_timeout


class ClientPool(eventlet.GreenPool):
    """The server's pool of connections, at most ``per_client`` of them from one address:
    one more is answered 503 (with ``Retry-After``) and closed instead of being served."""

    def __init__(self, size: int, per_client: int, request_s: float | None = None) -> None:
        super().__init__(size)
        self.per_client = per_client
        self.request_s = request_s  # a request must arrive within this of its first byte
        self.open: Counter[str] = Counter()  # client address -> connections being served
        self.refused = 0
        self._warned: dict[str, float] = {}
        self._to_collect = COLLECT_EVERY

    def spawn(self, function: Any, connection: Any, *args: Any) -> Any:
        """(eventlet's server calls this with [address, socket, state] per connection)"""
        client = str(connection[0][0]) if isinstance(connection[0], tuple) else str(connection[0])
        if self.open[client] >= self.per_client:
            self.refused += 1
            now = time.monotonic()
            if now - self._warned.get(client, float("-inf")) >= WARN_EVERY_S:
                self._warned[client] = now
                log.warning("REST: %s holds %d connections, the most one client may "
                            "(--rest-per-client); refusing more with 503", client, self.open[client])
            return super().spawn(self._refuse, connection)
        self.open[client] += 1
        if self.request_s is not None:
            clock(connection[1], self.request_s)
        thread = super().spawn(function, connection, *args)
        thread.link(self._closed, client)
        return thread

    def _closed(self, _thread: Any, client: str) -> None:
        self.open[client] -= 1
        if self.open[client] <= 0:
            del self.open[client]
        self._to_collect -= 1
        if self._to_collect <= 0:
            # (the served connections' cycles sit in the young generations: collecting
            # those alone is cheap, and bounds them to COLLECT_EVERY connections')
            self._to_collect = COLLECT_EVERY
            gc.collect(1)

    def _refuse(self, connection: Any) -> None:
        """A short 503 with a JSON error, after reading what the client sent (closing on
        unread data would reset the connection before the answer arrives)."""
        sock = connection[1]
        body = json.dumps({"error": f"too many connections from {connection[0][0]}: at most "
                                    f"{self.per_client} at once from one client"}).encode()
        try:
            sock.settimeout(0.5)
            sock.recv(65536)
            sock.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                         b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        except OSError:
            pass


POOL: ClientPool | None = None  # the running server's (metrics read it)


def serve_rest(server: Any) -> None:
    """Ryu's ``hub.WSGIServer.serve_forever`` with our limits: at most
    ``rest_connections`` connections, ``rest_per_client`` from one address, and a
    connection idle between requests, stalled inside one, or taking longer than
    ``rest_idle_s`` to send one request closed."""
    global POOL
    conf = settings.current
    POOL = ClientPool(conf.rest_connections, conf.rest_per_client, conf.rest_idle_s)
    server.logger = hub.LoggingWrapper()
    # (debug=False: no traceback in a 500's body, and no log line per idle connection closed)
    eventlet.wsgi.server(server.server, server.handle, server.logger, custom_pool=POOL,
                         keepalive=conf.rest_idle_s, socket_timeout=conf.rest_idle_s, debug=False)


def install() -> None:
    """Before Ryu's manager starts the server."""
    hub.WSGIServer.serve_forever = serve_rest
