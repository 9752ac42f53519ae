"""Every metric of the controller, declared in one place on an injected registry
(faucet_metrics' pattern), and the per-switch table-use collector read at each scrape."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter as PCounter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily


class Metrics:
    """Every metric of the controller, declared in one place on an injected registry
    (faucet_metrics' pattern) so tests read values from their own registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.groups = Gauge("modelcast_groups", "Multicast groups defined",
                            registry=registry)
        self.receivers = Gauge("modelcast_receivers", "Group receivers by delivery state",
                               ["state"], registry=registry)
        self.installs = PCounter("modelcast_installs", "Plans sent to the switches",
                                 registry=registry)
        self.reroutes = PCounter("modelcast_reroutes",
                                 "Plans moving trees off failed links or switches",
                                 registry=registry)
        self.openflow_errors = PCounter("modelcast_openflow_errors",
                                        "OpenFlow errors switches answered to our plans",
                                        registry=registry)
        self.events = PCounter("modelcast_events", "Events recorded by kind (controller.events: "
                               "failover, reroute, damped, refused, ...)", ["kind"], registry=registry)
        self.rest_requests = PCounter("modelcast_rest_requests", "REST requests served",
                                      ["method", "status"], registry=registry)
        self.audits = PCounter("modelcast_audits",
                               "Switch table audits by result: clean, repaired (the switch had "
                               "drifted from the intended state), void (overtaken by a change)",
                               ["result"], registry=registry)
        self.held_requests = Gauge("modelcast_rest_held_requests",
                                   "GETs held until their group changes (Prefer: wait), now", registry=registry)
        self.holds_refused = Gauge("modelcast_rest_holds_refused",
                                   "GETs answered at once since start because the most that are held at once were held",
                                   registry=registry)
        # (set by the app from its REST server, controller.webserver)
        self.rest_connections = Gauge("modelcast_rest_connections", "REST connections being served, now",
                                      registry=registry)
        self.rest_connections_refused = Gauge(
            "modelcast_rest_connections_refused",
            "REST connections answered 503 since start: their client held the most one client may",
            registry=registry)
        self.lldp_refused = Gauge(  # (set by the app from controller.lldpauth)
            "modelcast_lldp_refused",
            "Discovery (LLDP) frames refused since start: our format without a valid, fresh "
            "signature (a host forging links?)", registry=registry)
        self.links_refused = PCounter(
            "modelcast_links_refused",
            "Discovered links not believed, by why: not pinned (not a link of --fabric), host "
            "ports (hosts attached at both ends: hosts relaying discovery frames?)",
            ["why"], registry=registry)
        self.punt_quarantines = Gauge(  # (set by the app from controller.punt)
            "modelcast_punt_quarantines",
            "Host ports quarantined since start: more than --punt-port-rate frames to the "
            "controller in one second (a host flooding new addresses or discovery frames?)",
            registry=registry)
        self.install_seconds = Histogram(
            "modelcast_install_seconds", "Time from sending a plan to its last barrier reply",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry)


class SwitchEntries:
    """``modelcast_switch_entries{dpid, kind}``: the multicast entries each connected switch
    holds for us (``groups`` and the ``sg_flows`` pointing at them: one each per tree;
    protection's ``ff_groups`` and ``detour_flows``), so table use can be watched per switch. Collected on scrape from the core's belief, which the
    audits keep equal to the switches."""

    def __init__(self, service: Any) -> None:
        self.service = service  # its core is replaced when a follower reloads the state

    def collect(self) -> Any:
        fam = GaugeMetricFamily("modelcast_switch_entries",
                                "Multicast entries of ours per connected switch",
                                labels=["dpid", "kind"])
        core = self.service.core
        for dpid in sorted(core.installed):
            for kind, n in core.entries_at(dpid).items():
                fam.add_metric([str(dpid), kind], n)
        yield fam
