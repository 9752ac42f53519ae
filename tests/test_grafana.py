"""The Grafana dashboard (``deploy/grafana/modelcast.json``): every panel's query names
only metrics the code exports, read from the code's own registries (the controller's
``Metrics`` and ``SwitchEntries`` on a service, the agents' ``StatsCollector`` and
``ServeCollector``), with the labels they carry, and the panels the issue asks for are there."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterable

import pytest
from prometheus_client import CollectorRegistry

from hostagent.common import Stats
from hostagent.metrics import ServeCollector, StatsCollector
from hostagent.serve import ServeStats
from tests.support.controller_env import make_env

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "modelcast.json"
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
            "gauge": ("",), "summary": ("", "_count", "_sum", "_created"), "info": ("_info",), "unknown": ("",)}
ANY_LABEL = {"instance", "job"}  # what Prometheus adds to every scraped series
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}


def exported(registries: Iterable[CollectorRegistry]) -> dict[str, set[str] | None]:
    """Every series name the registries export -> its label names (None: not known, no
    sample yet)."""
    names: dict[str, set[str] | None] = {}
    for registry in registries:
        for family in registry.collect():
            labels = {k for s in family.samples for k in s.labels} if family.samples else None
            for suffix in SUFFIXES[family.type]:
                names[family.name + suffix] = None if labels is None else labels | ({"le"} if suffix == "_bucket"
                                                                                   else set())
    return names


@pytest.fixture(scope="module")
def metrics() -> dict[str, set[str] | None]:
    controller = make_env().registry  # Metrics and SwitchEntries, as a running controller has them
    agent = CollectorRegistry()
    agent.register(StatsCollector("receiver", Stats, lambda: (0, 0)))
    model = SimpleNamespace(content_id="blake3:" + "00" * 32, name="m", stats=ServeStats())
    agent.register(ServeCollector([model]))
    return exported([controller, agent])


def queries() -> list[tuple[str, str]]:
    panels = json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]
    return [(p["title"], t["expr"]) for p in panels for t in p["targets"]]


def metric_names(expr: str) -> set[str]:
    """The series a PromQL expression reads: identifiers not followed by "(" (functions)
    and not inside {...} or by (...) label lists."""
    bare = re.sub(r"\{[^}]*\}", "", re.sub(r"\b(by|without)\s*\([^)]*\)", "", expr))
    bare = re.sub(r"\[[^\]]*\]", "", bare)
    return {m.group(1) for m in re.finditer(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", bare)
            if m.group(1) not in PROMQL_WORDS and not m.group(1).isdigit()}


def test_every_panel_query_names_a_metric_the_code_exports(metrics):
    found = queries()
    assert found, "no panel queries"
    for title, expr in found:
        names = metric_names(expr)
        assert names, (title, expr)
        unknown = sorted(names - set(metrics))
        assert not unknown, f"{title}: {expr} reads {unknown}, which no registry exports"


def test_every_label_a_query_uses_is_one_its_metrics_carry(metrics):
    for title, expr in queries():
        names = metric_names(expr)
        for name, selector in re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", expr):
            used = set(re.findall(r"([a-zA-Z_]\w*)\s*=~?", selector))
            if metrics.get(name) is not None:
                assert used <= metrics[name] | ANY_LABEL, f"{title}: {name} has no label {sorted(used - metrics[name])}"
        for group in re.findall(r"\bby\s*\(([^)]*)\)", expr):
            by = {w.strip() for w in group.split(",")}
            for name in names:
                if metrics.get(name) is not None:
                    assert by <= metrics[name] | ANY_LABEL, f"{title}: {name} has no label {sorted(by - metrics[name])}"


def test_the_panels_the_issue_asks_for_are_there():
    wanted = {
        "modelcast_groups": "groups", "modelcast_receivers": "receivers by state",
        "modelcast_install_seconds_bucket": "install latency", "modelcast_reroutes_total": "reroutes",
        "modelcast_switch_entries": "fast-failover", "modelcast_progress_bytes": "transfer goodput",
        "modelcast_repairs_total": "repairs", "modelcast_serve_rounds_total": "rounds served",
        "modelcast_serve_bytes_per_receiver": "bytes per receiver",
    }
    read = set().union(*(metric_names(expr) for _, expr in queries()))
    assert not set(wanted) - read, [wanted[m] for m in sorted(set(wanted) - read)]
    dash: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and all(p.get("datasource") for p in dash["panels"])
    assert {v["name"] for v in dash["templating"]["list"]} >= {"datasource"}


def test_the_query_reader_finds_the_series_and_only_them():
    assert metric_names('histogram_quantile(0.99, sum by (le) (rate(a_bucket{x="1"}[5m])))') == {"a_bucket"}
    assert metric_names("max by (name) (b / c)") == {"b", "c"}
    assert metric_names('sum without (role) (rate(d_total{kind=~"x|y"}[1m])) * 8') == {"d_total"}
