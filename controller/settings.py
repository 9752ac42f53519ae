"""The controller's own settings: one definition, read from command-line options (see
``controller.main``) with environment-variable fallbacks, shared by the entry point and
the Ryu app (which Ryu instantiates itself, so it cannot take constructor arguments)."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

from topologies.spec import Topology


@dataclass
class Settings:
    token: str | None = field(default_factory=lambda: os.environ.get("MODELCAST_TOKEN") or None)
    # host address -> its own token (--host-tokens FILE): see controller.auth
    host_tokens: dict[str, str] = field(default_factory=dict)
    # who may join by IGMP (--igmp-allow); None: the default of controller.igmp.IgmpPolicy
    igmp_allow: tuple[ipaddress.IPv4Network, ...] | None = None
    state_file: Path | None = field(default_factory=lambda: Path(p) if (
        p := os.environ.get("MODELCAST_STATE_FILE")) else None)
    algorithm: str = field(default_factory=lambda: os.environ.get("MODELCAST_ALGORITHM", "spt"))
    udp_port: int = 5500
    barrier_timeout_s: float = 5.0  # a switch that does not confirm a phase by then: error
    # a host silent this long is probed, and forgotten if it does not answer (controller.hosts)
    host_timeout_s: int = 300
    # discovery frames the controller sends per second at most when it probes the ports
    # again (each port about every 0.9 s where that rate allows): a round over all of
    # them takes ports / rate s, and a link that stops carrying them while its ports stay
    # up is dropped after about six rounds. Ryu's own pause of 0.05 s between two frames
    # made a round over fat-tree:34's 49,130 ports 41 minutes
    lldp_rate: int = 1000
    flap_damping: int = 3  # a link down this many times within 60 s is held out of new trees for a while (0: never)
    audit_interval_s: float = 5.0  # each switch's tables re-read and repaired this often (at most 2% of the time per switch); 0: never
    # fast-failover groups and detours pre-installed for tree links (controller.protect)
    protection: bool = True
    # a detour ends in one flow per link, with Open vSwitch's Nicira actions (move, load,
    # resubmit); False: one per group and link, plain OpenFlow 1.3 (other switches)
    nicira: bool = True
    # several instances (controller.election): the state in etcd instead of state_file
    store_url: str | None = field(default_factory=lambda: os.environ.get("MODELCAST_STORE") or None)
    store_prefix: str | None = None  # default: the URL's path, else /modelcast/
    lease_ttl_s: int = 2  # a killed leader is replaced this long after its last keepalive
    advertise_url: str | None = None  # this instance's REST URL for the others (forwarding)
    # the REST server's connections at most (--rest-connections): a held GET keeps one, so
    # at most 3/4 of them are held (controller.service.Changes); the open-file limit is
    # raised to fit (controller.main)
    rest_connections: int = 4096
    # a REST connection idle between requests, or stalled inside one, this long is closed,
    # and so is one whose request has not arrived whole this long after its first byte
    rest_idle_s: float = 30.0
    # REST connections from one client address at once at most (one more: 503); a model
    # server keeps one per model it serves
    rest_per_client: int = 256
    # frames each switch may send us per second at most (an OpenFlow meter on every flow
    # that punts to the controller; bursts of twice that pass): a host flooding new source
    # addresses then costs the controller this much, not all its time; 0: no meter
    punt_rate: int = 500
    # frames one host port may send us per second before it is quarantined for 60 s: its
    # frames to the controller then pass a meter of their own at this rate, so one host's
    # flood does not take its switch's punt budget from the others (controller.punt); 0: off
    punt_port_rate: int = 100
    # --trace FILE / MODELCAST_TRACE: every plan message, barrier reply, PortStatus and
    # audit with its wall-clock time, appended (controller.tracing)
    trace_file: Path | None = field(default_factory=lambda: Path(p) if (
        p := os.environ.get("MODELCAST_TRACE")) else None)
    # --fabric SPEC: the fabric's cabling (a topology of topologies.spec with the real dpids
    # and ports); only its links are believed from discovery (controller.linkgate)
    fabric: Topology | None = None
    # etcd over TLS (the CA of etcd's certificate; a client certificate and its key) and as
    # an etcd user (--etcd-user, --etcd-password-file): controller.store.EtcdSecurity
    etcd_ca: str | None = None
    etcd_cert: str | None = None
    etcd_key: str | None = None
    etcd_user: str | None = None
    etcd_password: str | None = None
    # --cluster-secret-file (env MODELCAST_CLUSTER_SECRET_FILE): the secret the instances
    # share (controller.cluster): leader records signed, forwarded requests authenticated,
    # session keys sealed in the store; required with --store
    cluster_secret: bytes | None = None
    # --peers URL[,URL]: a follower forwards only to a leader at one of these (empty: any signed)
    peers: tuple[str, ...] = ()
    # what one host token may hold at once (controller.policy.Quotas); beyond: 429
    quota_offers: int = 256
    quota_groups: int = 1024
    quota_receivers: int = 65536
    # a group unchanged this long is deleted, unless pinned or offered (0: never)
    group_idle_s: float = 86400.0


    @property
    def held_max(self) -> int:
        """GETs held at once at most: the rest of the connections stay for other calls."""
        return max(1, self.rest_connections * 3 // 4)


current = Settings()
