"""Prometheus exposition of an endpoint's ``Stats`` (``--metrics-port``).

A collector reads the live counters at scrape time instead of mirroring every increment
into prometheus_client objects, so the hot path pays nothing for metrics.

The port is served by ``MetricsServer``, bounded whoever connects: at most
``MAX_CONNECTIONS`` connections are served at once (one more is closed at once, unread),
each waits at most ``IDLE_S`` for the next bytes and is cut ``CONNECTION_S`` after it was
accepted, whatever it sends; one request per connection, its headers within
``http.server``'s limits. (prometheus_client's own server started a thread per connection
with no limit and no timeout.)
"""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from socketserver import ThreadingMixIn
from typing import Any, Callable, Iterator, Optional, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from .common import Stats

MAX_CONNECTIONS = 8  # a scraper uses one; more only while some are slow
IDLE_S = 5.0  # between a connection's bytes
CONNECTION_S = 10.0  # a connection's whole life


class StatsCollector(Collector):
    """Counters for datagrams, bytes, NACKs, repairs and drops by reason, plus progress."""

    def __init__(self, role: str, stats: Callable[[], Stats], progress: Callable[[], tuple[int, int]]) -> None:
        self._role = role
        self._stats = stats
        self._progress = progress

    def collect(self) -> Iterator:
        s = self._stats()
        labels = ["role", "direction"]
        dg = CounterMetricFamily("modelcast_datagrams", "Datagrams handled", labels=labels)
        dg.add_metric([self._role, "in"], s.datagrams_in)
        dg.add_metric([self._role, "out"], s.datagrams_out)
        yield dg
        by = CounterMetricFamily("modelcast_bytes", "Datagram bytes handled", labels=labels)
        by.add_metric([self._role, "in"], s.bytes_in)
        by.add_metric([self._role, "out"], s.bytes_out)
        yield by
        nk = CounterMetricFamily("modelcast_nacks", "NACK datagrams", labels=labels)
        nk.add_metric([self._role, "in"], s.nacks_received)
        nk.add_metric([self._role, "out"], s.nacks_sent)
        yield nk
        rp = CounterMetricFamily("modelcast_repairs", "Repair datagrams", labels=["role", "kind"])
        rp.add_metric([self._role, "unicast"], s.repairs_unicast)
        rp.add_metric([self._role, "multicast"], s.repairs_multicast)
        rp.add_metric([self._role, "received"], s.repairs_received)
        yield rp
        rb = CounterMetricFamily("modelcast_repair_bytes", "Repair bytes sent", labels=["role", "kind"])
        rb.add_metric([self._role, "unicast"], s.repair_bytes_unicast)
        rb.add_metric([self._role, "multicast"], s.repair_bytes_multicast)
        yield rb
        dr = CounterMetricFamily("modelcast_drops", "Datagrams dropped, by reason", labels=["role", "reason"])
        for reason, count in sorted(s.drops.items()):
            dr.add_metric([self._role, str(reason)], count)
        yield dr
        done, total = self._progress()
        pg = GaugeMetricFamily("modelcast_progress_bytes", "File bytes done / total", labels=["role", "kind"])
        pg.add_metric([self._role, "done"], done)
        pg.add_metric([self._role, "total"], total)
        yield pg


def serve(
    role: str,
    stats: Callable[[], Stats],
    progress: Callable[[], tuple[int, int]],
    port: int,
    addr: str = "127.0.0.1",
) -> Optional[object]:
    """Start the exporter on ``addr:port`` in a daemon thread; returns the server
    (``shutdown`` and ``server_close`` free the port)."""
    registry = CollectorRegistry()
    registry.register(StatsCollector(role, stats, progress))
    return MetricsServer.start(registry, port, addr)


class ServeCollector(Collector):
    """``modelcast serve``: per model, rounds, receivers per round, bytes sent and bytes
    per receiver (against the model's size: what unicast would send to each)."""

    def __init__(self, models: Sequence[Any]) -> None:
        self._models = models  # hostagent.serve.Model: content_id, name, stats

    def collect(self) -> Iterator:
        labels = ["model", "name"]
        rounds = CounterMetricFamily("modelcast_serve_rounds", "Rounds (send sessions) run", labels=labels)
        receivers = CounterMetricFamily("modelcast_serve_receivers", "Receivers that verified the model",
                                        labels=labels)
        per_round = GaugeMetricFamily("modelcast_serve_receivers_per_round",
                                      "Receivers that verified, mean per round", labels=labels)
        sent = CounterMetricFamily("modelcast_serve_bytes_sent", "Datagram bytes sent, all rounds", labels=labels)
        per_rx = GaugeMetricFamily("modelcast_serve_bytes_per_receiver",
                                   "Bytes sent per verified receiver (unicast: the model's size)", labels=labels)
        size = GaugeMetricFamily("modelcast_serve_model_bytes", "The model's size", labels=labels)
        for m in self._models:
            key, st = [m.content_id, m.name], m.stats
            rounds.add_metric(key, st.rounds)
            receivers.add_metric(key, st.receivers)
            per_round.add_metric(key, st.receivers / st.rounds if st.rounds else 0.0)
            sent.add_metric(key, st.bytes_sent)
            per_rx.add_metric(key, st.bytes_per_receiver)
            size.add_metric(key, st.size)
        yield from (rounds, receivers, per_round, sent, per_rx, size)


def serve_models(models: Sequence[Any], port: int, addr: str = "127.0.0.1") -> Any:
    """The ``modelcast serve`` exporter on ``addr:port`` (a daemon thread); the server."""
    registry = CollectorRegistry()
    registry.register(ServeCollector(models))
    return MetricsServer.start(registry, port, addr)


class _Scrape(BaseHTTPRequestHandler):
    """``GET /metrics`` (or ``/``): the registry in the format the scraper accepts."""

    server: "MetricsServer"

    def setup(self) -> None:
        self.timeout = self.server.idle_s  # (StreamRequestHandler: the connection's socket timeout)
        super().setup()

    def do_GET(self) -> None:
        if self.path.split("?")[0] not in ("/", "/metrics"):
            self.send_error(404)
            return
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        body = encoder(self.server.registry)
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class MetricsServer(ThreadingMixIn, HTTPServer):
    """The metrics port, bounded (module docstring): ``refused`` counts connections closed
    because every slot was taken, ``cut`` those closed at ``CONNECTION_S``."""

    daemon_threads = True

    def __init__(self, addr: tuple[str, int], registry: CollectorRegistry) -> None:
        self.registry = registry
        self.connection_s = CONNECTION_S
        self.idle_s = IDLE_S
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._open: dict[socket.socket, float] = {}  # connection -> when accepted
        self._lock = threading.Lock()
        self.refused = 0
        self.cut = 0
        super().__init__(addr, _Scrape)

    @classmethod
    def start(cls, registry: CollectorRegistry, port: int, addr: str = "127.0.0.1") -> "MetricsServer":
        """Serve ``registry`` on ``addr:port`` from a daemon thread."""
        server = cls((addr, port), registry)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="modelcast-metrics",
                         daemon=True).start()
        return server

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        request.settimeout(self.idle_s)
        with self._lock:
            self._open[request] = time.monotonic()
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._open.pop(request, None)
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away, or was cut, mid-request: nothing to report."""

    def service_actions(self) -> None:
        """Between accepts (every poll): cut connections past their time, whatever they
        are doing (a client trickling bytes resets ``idle_s`` but not this)."""
        now = time.monotonic()
        with self._lock:
            late = [c for c, since in self._open.items() if now - since > self.connection_s]
            for connection in late:
                del self._open[connection]
        for connection in late:
            self.cut += 1
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
