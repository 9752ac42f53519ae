"""Prometheus exposition of an endpoint's ``Stats`` (``--metrics-port``).

A collector reads the live counters at scrape time instead of mirroring every increment
into prometheus_client objects, so the hot path pays nothing for metrics.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional, Sequence

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .common import Stats


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
    """Start the exporter on ``addr:port`` in a daemon thread; returns the server (or
    None on prometheus_client versions that do not return one)."""
    registry = CollectorRegistry()
    registry.register(StatsCollector(role, stats, progress))
    result = start_http_server(port, addr=addr, registry=registry)
    return result[0] if isinstance(result, tuple) else result


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
    result = start_http_server(port, addr=addr, registry=registry)
    return result[0] if isinstance(result, tuple) else result
