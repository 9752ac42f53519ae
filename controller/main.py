"""``modelcast-controller``: Ryu's manager with the modelcast app, LLDP link discovery and
the eventlet compatibility shim loaded first.

Our options are parsed here; everything else (``--ofp-tcp-listen-port``, ``--wsapi-port``,
``--verbose``, ...) is passed through to ryu-manager unchanged.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import resource
import signal
import socket
import sys
from pathlib import Path
from urllib.parse import urlsplit

from controller import settings
from controller.auth import CredentialsError, load_host_tokens
from controller.cluster import SecretError, read_secret
from controller.igmp import parse_allow
from controller.store import parse_store_url
from controller.trees import ALGORITHMS
from topologies.spec import TopologyError
from topologies.spec import parse as parse_topology


def parse(argv: list[str]) -> tuple[settings.Settings, list[str]]:
    ap = argparse.ArgumentParser(
        prog="modelcast-controller", add_help=False,
        description="OpenFlow 1.3 multicast controller for model distribution "
                    "(other options are ryu-manager's: --ofp-tcp-listen-port, --wsapi-host, "
                    "--wsapi-port, --verbose, ...)")
    ap.add_argument("-h", "--help", action="store_true")
    ap.add_argument("--token", help="the REST admin bearer token (env MODELCAST_TOKEN; prefer "
                    "--token-file: a command line is visible to every local user); required "
                    "unless REST listens on loopback only")
    ap.add_argument("--token-file", type=Path, metavar="PATH",
                    help="read the REST admin token from PATH (its first line)")
    ap.add_argument("--host-tokens", type=Path, metavar="FILE",
                    help='per-host tokens, a JSON object {"10.0.0.3": "<token>", ...}: a host token '
                    "joins and leaves only its own address and sees only its own groups' keys")
    ap.add_argument("--igmp-allow", metavar="CIDR[,CIDR]|any|none",
                    help="hosts whose IGMP reports join and leave groups (default: the hosts in "
                    "--host-tokens when given, else any host); a report counts only from the port "
                    "and MAC its host was learned at")
    ap.add_argument("--state-file", type=Path, help="where groups and topology are saved "
                    "(env MODELCAST_STATE_FILE); restored at start")
    ap.add_argument("--algorithm", help=f"tree algorithm: {' or '.join(ALGORITHMS)} (default spt)")
    ap.add_argument("--udp-port", type=int, help="UDP port announced for new groups (default 5500)")
    ap.add_argument("--host-timeout", type=int, default=os.environ.get("MODELCAST_HOST_TIMEOUT"),
                    help="seconds a host may stay silent before it is probed, and forgotten "
                    "if it does not answer 3 probes in 3 s (env MODELCAST_HOST_TIMEOUT; default 300)")
    ap.add_argument("--lldp-rate", type=int, metavar="FPS",
                    help="discovery frames per second at most when every port is probed again "
                    "(default 1000): a round over all ports takes ports/FPS s (at least 0.9 s), "
                    "and a link that stops carrying them while its ports stay up is dropped after "
                    "about six rounds")
    ap.add_argument("--flap-damping", type=int, metavar="N",
                    help="a link that goes down N times within 60 s is held out of new trees and detours "
                    "for 30 s, doubled at each further hold (0 disables; default 3)")
    ap.add_argument("--audit-interval", type=float, help="seconds between audits of each switch's "
                    "tables (what was deleted or changed by hand is put back; 0 disables; default 5)")
    ap.add_argument("--no-protection", action="store_true",
                    help="do not pre-install fast-failover groups and detours for tree links "
                    "(a failed link then waits for the controller's reroute)")
    ap.add_argument("--no-nicira", action="store_true",
                    help="switches without Open vSwitch's Nicira actions (move, load, resubmit): end "
                    "each detour with one flow per group and link instead of one per link "
                    "(plain OpenFlow 1.3; a third more messages per new tree). Without it the "
                    "controller switches over by itself when a switch is not Open vSwitch (its "
                    "OFPMP_DESC) or refuses a Nicira action")
    ap.add_argument("--fabric", metavar="SPEC",
                    help="the fabric's cabling: a topology (file:PATH.yaml|.json, or a family such as "
                    "leaf-spine:2,4,2) with the switches' real dpids and port numbers; a saved "
                    "GET /v1/topology is one. Only its links "
                    "are believed from discovery frames, so hosts relaying those frames between them "
                    "cannot make a link (without it, a link between two ports where hosts are "
                    "attached is refused, and other links are believed); its hosts (each with ip "
                    "and mac) are known from the start and never moved or forgotten")
    ap.add_argument("--trace", type=Path, metavar="FILE",
                    help="append every plan message, barrier reply, port change and audit with "
                    "its wall-clock time to FILE (env MODELCAST_TRACE; a debugging aid)")
    ap.add_argument("--store", metavar="etcd://HOST:PORT[,HOST:PORT]",
                    help="keep the state in etcd instead of --state-file and run as one of several "
                    "instances: one is elected leader, the others follow (env MODELCAST_STORE)")
    ap.add_argument("--store-prefix", metavar="PREFIX", help="etcd key prefix (default /modelcast/)")
    ap.add_argument("--lease-ttl", type=int, metavar="S", help="seconds of the leader's etcd lease: "
                    "a dead leader is replaced after about this long (default 2; etcd's minimum)")
    ap.add_argument("--rest-connections", type=int, metavar="N",
                    help="REST connections served at once (default 4096): host agents waiting for a "
                    "transfer each keep one, at most 3/4 of them; the open-file limit is raised to fit")
    ap.add_argument("--rest-idle", type=float, metavar="S",
                    help="seconds a REST connection may stay idle between requests, or stalled inside "
                    "one, or take to send one request from its first byte, before it is closed "
                    "(default 30)")
    ap.add_argument("--rest-per-client", type=int, metavar="N",
                    help="REST connections one client address may hold at once (default 256: a model "
                    "server keeps one per model); one more is answered 503")
    ap.add_argument("--punt-rate", type=int, metavar="PPS",
                    help="frames each switch may send the controller per second (learning, IGMP, "
                    "unknown destinations), enforced by an OpenFlow meter on the switch: a host "
                    "flooding new addresses cannot take the controller's time (default 500, bursts "
                    "of twice that; 0: unmetered)")
    ap.add_argument("--punt-port-rate", type=int, metavar="PPS",
                    help="frames one host port may send the controller per second before it is "
                    "quarantined for 60 s: its frames to the controller then pass a meter of their "
                    "own at this rate, so one flooding host cannot crowd out the others on its "
                    "switch (default 100; 0: off; needs --punt-rate)")
    ap.add_argument("--cluster-secret-file", type=Path, metavar="FILE",
                    help="the secret several instances share, at least 32 bytes (env "
                    "MODELCAST_CLUSTER_SECRET_FILE; e.g. head -c 32 /dev/urandom | base64 > FILE): "
                    "leader records in etcd are signed with it, forwarded requests carry a "
                    "credential made with it instead of the caller's token, and session keys are "
                    "sealed with it in the store; required with --store")
    ap.add_argument("--peers", metavar="URL[,URL]",
                    help="the instances' REST URLs (their --advertise-url): a follower forwards "
                    "mutations only to a leader at one of these (default: any leader whose record "
                    "is signed with the cluster secret)")
    ap.add_argument("--etcd-ca", metavar="FILE", help="talk to etcd over TLS, checking its "
                    "certificate against this CA")
    ap.add_argument("--etcd-cert", metavar="FILE", help="the client certificate for etcd "
                    "(etcd --client-cert-auth); with --etcd-key")
    ap.add_argument("--etcd-key", metavar="FILE", help="the client certificate's private key")
    ap.add_argument("--etcd-user", metavar="NAME", help="authenticate to etcd as this user "
                    "(etcd auth enabled; its role granted read and write on the prefix only)")
    ap.add_argument("--etcd-password-file", type=Path, metavar="FILE",
                    help="the etcd user's password (the file's first line)")
    ap.add_argument("--quota-offers", type=int, metavar="N",
                    help="offers one host token may hold at once (default 256; more: 429)")
    ap.add_argument("--quota-groups", type=int, metavar="N",
                    help="groups one host token may have created and not deleted (default 1024)")
    ap.add_argument("--quota-receivers", type=int, metavar="N",
                    help="receiver entries one host token may hold: the receivers of the groups it "
                    "created and its own memberships (default 65536)")
    ap.add_argument("--group-idle", type=float, metavar="S",
                    help="delete a group unchanged (no create, join, leave, rekey) for S seconds "
                    "unless it is pinned or a server offers its model (default 86400; 0: never)")
    ap.add_argument("--advertise-url", metavar="URL", help="this instance's REST URL as the others "
                    "reach it (mutations sent to a follower are forwarded to the leader's); "
                    "default http://WSAPI_HOST:WSAPI_PORT")
    ours, rest = ap.parse_known_args(argv)
    if ours.help:
        ap.print_help()
        raise SystemExit(0)
    conf = settings.Settings()
    if ours.token is not None and ours.token_file is not None:
        ap.error("--token and --token-file exclude each other")
    if ours.token is not None:
        conf.token = ours.token or None
    if ours.token_file is not None:
        conf.token = _first_line(ap, ours.token_file, "--token-file")
    if ours.store is not None:
        conf.store_url = ours.store or None
    for option, field in (("state_file", "state_file"), ("algorithm", "algorithm"), ("udp_port", "udp_port"),
                          ("host_timeout", "host_timeout_s"), ("audit_interval", "audit_interval_s"),
                          ("store_prefix", "store_prefix"), ("lease_ttl", "lease_ttl_s"),
                          ("advertise_url", "advertise_url"), ("trace", "trace_file"),
                          ("rest_connections", "rest_connections"), ("rest_idle", "rest_idle_s"),
                          ("rest_per_client", "rest_per_client"), ("punt_rate", "punt_rate"),
                          ("punt_port_rate", "punt_port_rate"), ("etcd_ca", "etcd_ca"),
                          ("etcd_cert", "etcd_cert"), ("etcd_key", "etcd_key"), ("etcd_user", "etcd_user"),
                          ("quota_offers", "quota_offers"), ("quota_groups", "quota_groups"),
                          ("quota_receivers", "quota_receivers"), ("group_idle", "group_idle_s"),
                          ("flap_damping", "flap_damping"), ("lldp_rate", "lldp_rate")):
        if getattr(ours, option) is not None:  # given on the command line: overrides the env
            setattr(conf, field, getattr(ours, option))
    if ours.no_protection:
        conf.protection = False
    if ours.no_nicira:
        conf.nicira = False
    if conf.store_url is not None:
        try:
            parse_store_url(conf.store_url, conf.store_prefix)
        except ValueError as exc:
            ap.error(f"--store: {exc}")
        if conf.state_file is not None:
            ap.error("--store and --state-file exclude each other: the state lives in one place")
    if not 1 <= conf.lease_ttl_s <= 60:
        ap.error(f"--lease-ttl must be 1..60 s, not {conf.lease_ttl_s}")
    _cluster_options(ap, ours, conf)
    if ours.igmp_allow is not None:
        try:
            conf.igmp_allow = parse_allow(ours.igmp_allow)
        except ValueError as exc:
            ap.error(f"--igmp-allow: {exc}")
    if ours.host_tokens is not None:
        try:
            conf.host_tokens = load_host_tokens(ours.host_tokens, conf.token)
        except CredentialsError as exc:
            ap.error(str(exc))
    if conf.algorithm not in ALGORITHMS:
        ap.error(f"--algorithm must be one of {', '.join(ALGORITHMS)}, not {conf.algorithm!r}")
    if not 1 <= conf.udp_port <= 65535:
        ap.error(f"--udp-port must be 1..65535, not {conf.udp_port}")
    if not 1 <= conf.host_timeout_s <= 65535:  # an OpenFlow idle timeout is 16 bits
        ap.error(f"--host-timeout must be 1..65535 s, not {conf.host_timeout_s}")
    if not 1 <= conf.lldp_rate <= 100_000:
        ap.error(f"--lldp-rate must be 1..100000 frames/s, not {conf.lldp_rate}")
    if not 0 <= conf.flap_damping <= 100:
        ap.error(f"--flap-damping must be 0..100 downs, not {conf.flap_damping}")
    if not conf.audit_interval_s >= 0:
        ap.error(f"--audit-interval must be >= 0 s, not {conf.audit_interval_s}")
    if not 16 <= conf.rest_connections <= 1 << 20:
        ap.error(f"--rest-connections must be 16..{1 << 20}, not {conf.rest_connections}")
    if not 1 <= conf.rest_per_client <= 1 << 20:
        ap.error(f"--rest-per-client must be 1..{1 << 20}, not {conf.rest_per_client}")
    if not 0 <= conf.punt_rate <= 1 << 24:
        ap.error(f"--punt-rate must be 0..{1 << 24} frames/s, not {conf.punt_rate}")
    if not 0 <= conf.punt_port_rate <= 1 << 24:
        ap.error(f"--punt-port-rate must be 0..{1 << 24} frames/s, not {conf.punt_port_rate}")
    if not 0.5 <= conf.rest_idle_s <= 3600:
        ap.error(f"--rest-idle must be 0.5..3600 s, not {conf.rest_idle_s:g}")
    if ours.fabric is not None:
        try:
            conf.fabric = parse_topology(ours.fabric, invent=False)
        except TopologyError as exc:
            ap.error(f"--fabric: {exc}")
        if not conf.fabric.links:
            ap.error(f"--fabric: {ours.fabric} has no links between switches")
    if conf.trace_file is not None:
        try:
            with open(conf.trace_file, "a"):
                pass
        except OSError as exc:
            ap.error(f"--trace: cannot write {conf.trace_file}: {exc.strerror}")
    for name, value in (("--quota-offers", conf.quota_offers), ("--quota-groups", conf.quota_groups),
                        ("--quota-receivers", conf.quota_receivers)):
        if not 0 <= value <= 1 << 24:
            ap.error(f"{name} must be 0..{1 << 24}, not {value}")
    if not 0 <= conf.group_idle_s <= 10 * 365 * 86400:
        ap.error(f"--group-idle must be 0 (never) or a number of seconds, not {conf.group_idle_s:g}")
    if conf.state_file is not None:
        parent = conf.state_file.expanduser().resolve().parent
        try:  # (e.g. /var/lib/modelcast on a first start: private, it will hold session keys)
            parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            ap.error(f"--state-file: cannot create directory {parent}: {exc.strerror}")
        if not parent.is_dir():
            ap.error(f"--state-file: {parent} is not a directory")
    return conf, rest


def _first_line(ap: argparse.ArgumentParser, path: Path, option: str) -> str:
    """A token or password from a file: its first line, without surrounding spaces."""
    try:
        text = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        ap.error(f"{option}: cannot read {path}: {getattr(exc, 'strerror', None) or exc}")
    value = text[0].strip() if text else ""
    if not value:
        ap.error(f"{option}: {path} is empty")
    return value


def _cluster_options(ap: argparse.ArgumentParser, ours: argparse.Namespace, conf: settings.Settings) -> None:
    """The shared secret, the peers and etcd's TLS and user: checked at start, one line each."""
    secret_file = ours.cluster_secret_file or (Path(p) if (p := os.environ.get("MODELCAST_CLUSTER_SECRET_FILE"))
                                               else None)
    if secret_file is not None:
        try:
            conf.cluster_secret = read_secret(secret_file)
        except SecretError as exc:
            ap.error(f"--cluster-secret-file: {exc}")
    if conf.store_url is not None and conf.cluster_secret is None:
        ap.error("--store needs --cluster-secret-file (the secret the instances share: it signs the "
                 "leader record, authenticates forwarded requests and seals session keys in etcd)")
    if ours.peers is not None:
        conf.peers = tuple(u.strip().rstrip("/") for u in ours.peers.split(",") if u.strip())
        for url in conf.peers:
            if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
                ap.error(f"--peers: {url!r} is not an http(s)://HOST:PORT URL")
    if ours.etcd_password_file is not None:
        conf.etcd_password = _first_line(ap, ours.etcd_password_file, "--etcd-password-file")
    if (conf.etcd_cert is None) != (conf.etcd_key is None):
        ap.error("--etcd-cert and --etcd-key go together (a client certificate and its key)")
    if (conf.etcd_user is None) != (conf.etcd_password is None):
        ap.error("--etcd-user and --etcd-password-file go together")
    for option, path in (("--etcd-ca", conf.etcd_ca), ("--etcd-cert", conf.etcd_cert), ("--etcd-key", conf.etcd_key)):
        if path is not None and not os.access(path, os.R_OK):
            ap.error(f"{option}: cannot read {path}")


def loopback(host: str | None) -> bool:
    """REST reachable from this machine only: without a token, nothing else is allowed."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "0.0.0.0").is_loopback
    except ValueError:  # a name: it may resolve to anything
        return False


def _on_sigterm(signum: int, frame: object) -> None:
    """One of several instances resigns before it exits (``controller.ha.request_stop``);
    otherwise SIGTERM does what it always did."""
    ha = sys.modules.get("controller.ha")
    if ha is not None and ha.request_stop():
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


OTHER_FILES = 512  # open files besides REST connections: switches, the state file, logs


def fit_open_files(conf: settings.Settings) -> str | None:
    """Raise the soft open-file limit to what ``rest_connections`` needs (up to the hard
    limit; many systems start processes at 1024); where the hard limit is lower, serve
    fewer connections. Returns what was done, for the start-up line (None: nothing)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = conf.rest_connections + OTHER_FILES
    if soft != resource.RLIM_INFINITY and soft < need:
        new = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft = new
        if soft >= need:
            return f"open-file limit raised to {soft}"
    if soft != resource.RLIM_INFINITY and soft < need:
        conf.rest_connections = max(16, soft - OTHER_FILES)
        return (f"open-file limit {soft} (hard): REST connections lowered to {conf.rest_connections}; "
                "raise the hard limit (ulimit -Hn) for more")
    return None


def main(argv: list[str] | None = None) -> int:
    conf, rest = parse(list(sys.argv[1:] if argv is None else argv))
    settings.current = conf
    fitted = fit_open_files(conf)
    # Green the standard library before anything creates locks (logging does on import),
    # as ryu-manager would; otherwise eventlet warns about un-greened RLocks.
    import controller.compat  # noqa: F401  (must precede any import of ryu.app.wsgi)
    import eventlet

    eventlet.monkey_patch()
    from oslo_config import cfg as oslo_cfg
    from ryu import cfg
    from ryu.cmd import manager

    signal.signal(signal.SIGTERM, _on_sigterm)
    # (--noinstall-lldp-flow: the base flows carry discovery frames through a meter)
    args = ["--observe-links", "--noinstall-lldp-flow", *rest, "controller.app"]
    try:
        cfg.CONF(args=args, project="ryu", prog="modelcast-controller")
    except oslo_cfg.Error as exc:  # bad ryu option value: one line, non-zero
        print(f"modelcast-controller: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # argparse inside oslo.config already printed the reason
        return int(exc.code or 0) if isinstance(exc.code, int) else 2
    if not conf.token and not conf.host_tokens and not loopback(cfg.CONF.wsapi_host):
        print(f"modelcast-controller: refusing to serve REST on {cfg.CONF.wsapi_host or '0.0.0.0'} "
              "without a token: give --token (or MODELCAST_TOKEN), or --wsapi-host 127.0.0.1",
              file=sys.stderr)
        return 2
    if conf.advertise_url is None:
        host = cfg.CONF.wsapi_host
        host = socket.gethostname() if host in (None, "", "0.0.0.0", "::") else host
        conf.advertise_url = f"http://{host}:{cfg.CONF.wsapi_port}"
    print(f"modelcast-controller: OpenFlow on {cfg.CONF.ofp_listen_host or '0.0.0.0'}:"
          f"{cfg.CONF.ofp_tcp_listen_port}, REST on http://{cfg.CONF.wsapi_host}:"
          f"{cfg.CONF.wsapi_port}/v1, "
          + (f"store {conf.store_url}" if conf.store_url else f"state file {conf.state_file or '(none)'}")
          + f", {conf.rest_connections} REST connections" + (f" ({fitted})" if fitted else ""),
          flush=True)
    manager.main(args=args, prog="modelcast-controller")
    return 0


if __name__ == "__main__":
    sys.exit(main())
