"""``modelcast send`` / ``modelcast recv``: one transfer, one exit code.

Exit 0 means verified: for ``recv`` the whole-file digest matched (and the
``--on-complete`` hook, if any, exited 0); for ``send`` every expected receiver reported
COMPLETE with the right digest. Any failure is one line on stderr and exit 1 (2 for
usage errors, as argparse does). ``--json`` prints exactly one summary object on stdout.

The multicast group comes either from ``--group ADDR:PORT`` or from the controller
(``--controller URL``), which also supplies the session MAC key and installs the tree.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from typing import Any, Callable, Optional, Sequence

from . import wire
from .common import (
    ChunkCorrupt, Failed, FileComplete, ManifestReceived, ReceiverCompleted, ReceiverFailed,
    ReceiverJoined, Stats, StreamFinished, TransferFinished,
)
from .control import (
    ControllerClient, ControllerError, group_endpoint, local_ip_towards, session_key,
)
from .net import (
    FileSink, FileSource, parse_group, parse_ipv4, path_mtu, receiver_sockets, run, sender_socket,
)
from .receiver import Receiver, ReceiverConfig
from .sender import Sender, SenderConfig, build_manifest_pages


class CliError(Exception):
    """A problem the user can fix; printed as one line."""


def _key(path: Optional[str]) -> Optional[bytes]:
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            return wire.derive_key(handle.read().strip())
    except OSError as exc:
        raise CliError(f"cannot read key file {path}: {exc.strerror}") from None


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.json and not args.quiet:
        print(text, file=sys.stderr)


def _cpu_s() -> float:
    """CPU seconds this process has used (user + system): the cost side of goodput."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return round(u.ru_utime + u.ru_stime, 3)


def _peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


def _goodput(nbytes: int, seconds: float) -> float:
    return round(nbytes * 8 / seconds / 1e6, 1) if seconds > 0 else 0.0


# ----------------------------------------------------------------------------- progress


class Progress:
    """A rich progress bar on stderr when it is a terminal (and not --json/--quiet);
    otherwise nothing. Updated at most ~10 times a second from the I/O loop."""

    def __init__(self, args: argparse.Namespace, label: str) -> None:
        self._bar: Any = None
        self._task: Any = None
        self._next = 0.0
        self._label = label
        if args.json or args.quiet or not sys.stderr.isatty():
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn, DownloadColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self._bar = RichProgress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
            TimeRemainingColumn(), TextColumn("repairs {task.fields[repairs]}"), TextColumn("{task.fields[note]}"),
            console=Console(stderr=True), transient=False,
        )
        self._bar.start()

    def update(self, done: int, total: int, repairs: int, note: str = "", force: bool = False) -> None:
        if self._bar is None:
            return
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + 0.1
        if self._task is None:
            self._task = self._bar.add_task(self._label, total=total, repairs=0, note="")
        self._bar.update(self._task, completed=done, total=total, repairs=repairs, note=note)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _metrics(args: argparse.Namespace, role: str, stats: Callable[[], Stats], progress: Callable[[], tuple[int, int]]) -> None:
    if args.metrics_port is None:
        return
    from .metrics import serve

    try:
        serve(role, stats, progress, args.metrics_port, args.metrics_addr)
    except OSError as exc:
        raise CliError(f"cannot serve metrics on {args.metrics_addr}:{args.metrics_port}: {exc.strerror}") from None
    _say(args, f"metrics on http://{args.metrics_addr}:{args.metrics_port}/metrics")


def _client(args: argparse.Namespace) -> ControllerClient:
    return ControllerClient(args.controller, token=args.token, request_timeout=args.request_timeout)


# ----------------------------------------------------------------------------- send


def cmd_send(args: argparse.Namespace) -> int:
    if not os.path.isfile(args.path):
        raise CliError(f"no such file: {args.path}")
    _require_group_source(args)
    interface = parse_ipv4(args.interface)
    source = FileSource(args.path)
    try:
        return _send(args, source, interface)
    finally:
        source.close()


def _datagram_sizes(args: argparse.Namespace, interface: str) -> tuple[int, int]:
    """(payload bytes, max datagram): ``--payload-size`` or, by default, what fills one
    frame on the multicast route (the group is not known yet with a controller: any SSM
    address takes the same multicast route)."""
    probe = parse_group(args.group)[0] if args.group else "232.0.1.1"
    # Capped at a 9000-byte jumbo frame: loopback's 64 KiB "MTU" is no wire's.
    mtu = min(path_mtu(probe, 9, interface), 9000)
    max_datagram = mtu - 28  # IPv4 + UDP headers
    if args.payload_size is not None:
        return args.payload_size, max(max_datagram, args.payload_size + wire.DATA_HEADER_LEN + wire.MAC_LEN)
    return max_datagram - wire.DATA_HEADER_LEN - wire.MAC_LEN, max_datagram


def _send(args: argparse.Namespace, source: FileSource, interface: str) -> int:
    payload_size, max_datagram = _datagram_sizes(args, interface)
    config = SenderConfig(
        chunk_size=args.chunk_size, payload_size=payload_size, max_datagram=max_datagram,
        rate_bps=args.rate * 1e6, fec_k=args.fec_k, fec_overhead=args.fec_overhead,
        expected_receivers=args.receivers, key=_key(args.key_file),
        name=os.path.basename(args.path)[:100], linger_timeout=args.timeout,
        session_id=random.SystemRandom().getrandbits(64),
    )
    try:
        config.validate()
    except ValueError as exc:
        raise CliError(str(exc)) from None
    # Digest the file once up front: the manifest needs it, and it names the model.
    pages = build_manifest_pages(source, config, config.session_id)  # type: ignore[arg-type]
    file_digest = pages[0].file_digest
    group_info: Optional[dict] = None
    if args.controller:
        client = _client(args)
        src_ip = args.ip or (interface if interface != "0.0.0.0" else local_ip_towards(_url_host(args.controller)))
        src_ip = parse_ipv4(src_ip)
        model = args.model or file_digest.hex()
        group_info = client.create_group(model, src_ip, args.receiver_ip or None)
        group = group_endpoint(group_info)
        if config.key is None:
            config.key = session_key(group_info)
        _say(args, f"group {group_info.get('id')} for model {model[:24]}: {group[0]}:{group[1]}, "
                   f"waiting for installation{'' if args.receivers is None else f' and {args.receivers} receivers'}")
        group_info = client.wait_installed(group_info, args.receivers, args.wait_timeout, args.poll)
        if interface == "0.0.0.0":
            interface = src_ip  # the tree is rooted at this address: send from it
    else:
        group = parse_group(args.group)
    sock = sender_socket(interface, args.ttl)
    started = time.monotonic()
    sender = Sender(source, config, started, manifest=pages)
    result: dict = {}
    reasons: dict[int, str] = {}
    _say(args, f"sending {args.path} ({source.size} bytes) to {group[0]}:{group[1]} from "
               f"{sock.getsockname()[0]}:{sock.getsockname()[1]}")
    bar = Progress(args, "send")
    _metrics(args, "sender", lambda: sender.stats, lambda: (_sent_bytes(sender), source.size))

    timeline: dict[str, Any] = {"completed_s": []}

    def on_event(event: object) -> None:
        if isinstance(event, ReceiverJoined) and bar._bar is None:
            _say(args, f"receiver {event.receiver_id:016x} at {event.addr[0]} joined")
        elif isinstance(event, StreamFinished):
            timeline["stream_s"] = round(time.monotonic() - started, 3)
        elif isinstance(event, ReceiverCompleted):
            timeline["completed_s"].append(round(time.monotonic() - started, 3))
            _say(args, f"receiver {event.receiver_id:016x} at {event.addr[0]} verified")
        elif isinstance(event, ReceiverFailed):
            reasons[event.receiver_id] = event.reason
            _say(args, f"receiver {event.receiver_id:016x} failed: {event.reason}")
        elif isinstance(event, TransferFinished):
            result["finished"] = event

    def should_stop() -> bool:
        done = len(sender.completed)
        want = args.receivers if args.receivers is not None else len(sender.peers)
        bar.update(_sent_bytes(sender), source.size, sender.stats.repairs_unicast + sender.stats.repairs_multicast,
                   f"{done}/{want} verified")
        return "finished" in result

    try:
        loop = run(sender, sock, [sock], group, on_event, should_stop, gso=args.gso)
    finally:
        bar.close()
        sock.close()
    finished: TransferFinished = result["finished"]
    stats = sender.stats
    elapsed = time.monotonic() - started
    receivers = [
        {"id": f"{p.receiver_id:016x}", "addr": p.addr[0] if isinstance(p.addr, tuple) else str(p.addr),
         "ok": p.completed, "error": None if p.completed else reasons.get(p.receiver_id, "incomplete")}
        for p in sorted(sender.peers.values(), key=lambda p: p.receiver_id)
    ]
    summary = {
        "ok": finished.ok, "file": args.path, "bytes": source.size, "file_digest": sender.file_digest.hex(),
        "group": f"{group[0]}:{group[1]}", "group_id": group_info.get("id") if group_info else None,
        "seconds": round(elapsed, 3), "goodput_mbit": _goodput(source.size, elapsed),
        "datagrams_sent": stats.datagrams_out, "bytes_sent": stats.bytes_out,
        "repair_bytes": stats.repair_bytes, "repair_bytes_unicast": stats.repair_bytes_unicast,
        "repair_bytes_multicast": stats.repair_bytes_multicast, "nacks": stats.nacks_received,
        "rate_decreases": stats.rate_decreases, "receivers": receivers,
        "stream_s": timeline.get("stream_s"), "completed_s": timeline["completed_s"],
        "final_rate_mbit": round(sender.rate / 1e6, 1), "repairs_parity": stats.repairs_parity,
        "repairs_unicast": stats.repairs_unicast, "repairs_multicast": stats.repairs_multicast,
        "expected_receivers": args.receivers, "never_seen": finished.missing,
        "authenticated": config.key is not None, "gso": loop.gso, "gso_datagrams": loop.gso_datagrams, "send_buffer_drops": loop.send_drops,
        "dropped": dict(stats.drops), "peak_rss_mb": _peak_rss_mb(), "cpu_s": _cpu_s(),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        _say(args, f"{'done' if finished.ok else 'FAILED'}: {len(finished.completed)} verified, "
                   f"{len(finished.failed)} failed, {finished.missing} never seen, {elapsed:.1f}s, "
                   f"{summary['goodput_mbit']} Mbit/s, repair {stats.repair_bytes} bytes")
    if not finished.ok and not args.json:
        print(f"modelcast: error: {_send_failure(finished, args.receivers)}", file=sys.stderr)
    return 0 if finished.ok else 1


def _sent_bytes(sender: Sender) -> int:
    """First-pass progress in file bytes (the stream position)."""
    layout = sender.layout
    if layout.total_seq == 0:
        return 0
    return min(layout.file_size, layout.file_size * sender._next_seq // layout.total_seq)


def _send_failure(finished: TransferFinished, expected: Optional[int]) -> str:
    if expected is not None and len(finished.completed) < expected:
        return f"only {len(finished.completed)} of {expected} receivers verified the file"
    if finished.failed:
        return f"{len(finished.failed)} receivers failed"
    return "no receiver verified the file"


def _url_host(url: str) -> str:
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname
    if not host:
        raise CliError(f"no host in controller URL {url!r}")
    return host


def _require_group_source(args: argparse.Namespace) -> None:
    if args.controller and args.group:
        raise CliError("give either --group or --controller, not both")
    if not args.controller and not args.group:
        raise CliError("--group ADDR:PORT is required without --controller")


# ----------------------------------------------------------------------------- recv


def cmd_recv(args: argparse.Namespace) -> int:
    _require_group_source(args)
    source_ip = parse_ipv4(args.source)
    interface = parse_ipv4(args.interface)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir) or not os.access(out_dir, os.W_OK):
        raise CliError(f"cannot write output in {out_dir}")
    key = _key(args.key_file)
    joined: Optional[tuple[ControllerClient, int, str]] = None
    if args.controller:
        if not args.model:
            raise CliError("--model is required with --controller")
        client = _client(args)
        my_ip = parse_ipv4(args.ip or (interface if interface != "0.0.0.0" else local_ip_towards(source_ip)))
        info = client.create_group(args.model, source_ip)
        group = group_endpoint(info)
        info = client.join(int(info["id"]), my_ip)
        joined = (client, int(info["id"]), my_ip)
        try:
            if (info.get("receivers") or {}).get(my_ip) == "unreachable":
                raise CliError(f"controller cannot reach this host ({my_ip}) in group {info['id']}")
            if key is None:
                key = session_key(info)
            _say(args, f"joined group {info['id']} ({group[0]}:{group[1]}) as {my_ip}")
            return _recv(args, group, source_ip, interface, key)
        finally:
            try:
                client.leave(joined[1], joined[2])
            except ControllerError as exc:
                _say(args, f"warning: leaving group {joined[1]}: {exc}")
    return _recv(args, parse_group(args.group), source_ip, interface, key)


def _recv(args: argparse.Namespace, group: tuple[str, int], source_ip: str, interface: str, key: Optional[bytes]) -> int:
    try:
        sink = FileSink(args.out)
    except OSError as exc:
        raise CliError(f"cannot open {args.out}: {exc.strerror}") from None
    config = ReceiverConfig(key=key, idle_timeout=args.timeout)
    try:
        mc, uc = receiver_sockets(group[0], group[1], source_ip, interface)
    except BaseException:
        sink.close()
        raise
    receiver = Receiver(sink, config, time.monotonic(), state=sink.load_state())
    result: dict = {}
    bar = Progress(args, "recv")

    def progress() -> tuple[int, int]:
        layout = receiver.layout
        if layout is None or layout.total_seq == 0:
            return 0, layout.file_size if layout else 0
        return layout.file_size * receiver.have.count // layout.total_seq, layout.file_size

    _metrics(args, "receiver", lambda: receiver.stats, progress)

    def on_event(event: object) -> None:
        if isinstance(event, ManifestReceived):
            if bar._bar is None:
                _say(args, f"receiving {event.name or 'file'} ({event.file_size} bytes, "
                           f"{event.chunk_count} chunks, {event.resumed_chunks} already here)")
        elif isinstance(event, ChunkCorrupt):
            _say(args, f"chunk {event.chunk} failed its digest; re-requesting")
        elif isinstance(event, (FileComplete, Failed)):
            result["end"] = event
            result.setdefault("end_at", time.monotonic())

    def done() -> bool:
        if receiver.layout is not None:
            result.setdefault("first", time.monotonic())
            d, t = progress()
            bar.update(d, t, receiver.stats.repairs_received, f"nacks {receiver.stats.nacks_sent}")
        # After success, linger until the sender acknowledged our COMPLETE.
        return "end" in result and (isinstance(result["end"], Failed) or receiver.get_timer() is None)

    started = time.monotonic()
    try:
        loop = run(receiver, uc, [mc, uc], group, on_event, done, gro=not args.no_gro)
        end = result["end"]
        if isinstance(end, FileComplete) and receiver.manifest is not None:
            sink.finish(receiver.manifest.file_size)
    finally:
        bar.close()
        sink.close()
        mc.close()
        uc.close()
    ok = isinstance(end, FileComplete)
    stats = receiver.stats
    size = receiver.manifest.file_size if receiver.manifest else 0
    # Goodput from the first datagram of the file to verification (not our idle wait).
    elapsed = (result.get("end_at") or time.monotonic()) - result.get("first", started)
    hook = _run_hook(args, ok)
    summary = {
        "ok": ok and (hook is None or hook["exit_status"] == 0), "digest_ok": ok, "out": args.out,
        "bytes": size, "receiver_id": f"{receiver.receiver_id:016x}",
        "file_digest": end.file_digest.hex() if ok else None, "error": None if ok else end.reason,
        "group": f"{group[0]}:{group[1]}", "seconds": round(time.monotonic() - started, 3),
        "goodput_mbit": _goodput(size, elapsed) if ok else 0.0,
        "datagrams_received": stats.datagrams_in, "bytes_received": stats.bytes_in,
        "nacks": stats.nacks_sent,
        "repairs_received": stats.repairs_received, "duplicates": stats.duplicates,
        "resumed_chunks": receiver.resumed_chunks, "authenticated": key is not None,
        "verify_s": round(result["end_at"] - result.get("first", started), 3) if "end_at" in result else None,
        "nacks_suppressed": stats.nacks_suppressed, "parity_received": stats.parity_received,
        "fec_recovered": stats.fec_recovered, "nack_seqs": stats.nack_seqs_requested, "gro": loop.gro, "gro_batches": loop.gro_batches,
        "dropped": dict(stats.drops), "peak_rss_mb": _peak_rss_mb(), "cpu_s": _cpu_s(), "on_complete": hook,
    }
    if args.json:
        print(json.dumps(summary))
    elif ok:
        _say(args, f"verified {args.out} (blake3 {end.file_digest.hex()[:16]}...), "
                   f"{summary['goodput_mbit']} Mbit/s, {stats.nacks_sent} NACKs, {stats.repairs_received} repairs")
    else:
        print(f"modelcast: error: {end.reason}", file=sys.stderr)
    if hook is not None and hook["exit_status"] != 0 and not args.json:
        print(f"modelcast: error: --on-complete command exited {hook['exit_status']}", file=sys.stderr)
    return 0 if summary["ok"] else 1


def _run_hook(args: argparse.Namespace, ok: bool) -> Optional[dict]:
    """Run ``--on-complete CMD OUT`` after a verified transfer (e.g. load the model)."""
    if not args.on_complete or not ok:
        return None
    import shlex

    argv = shlex.split(args.on_complete) + [os.path.abspath(args.out)]
    started = time.monotonic()
    try:
        # The hook's stdout must not corrupt our single JSON line: send it to stderr.
        status = subprocess.run(argv, stdout=sys.stderr if args.json else None).returncode
    except OSError as exc:
        return {"command": argv, "exit_status": 127, "error": exc.strerror, "seconds": 0.0}
    return {"command": argv, "exit_status": status, "seconds": round(time.monotonic() - started, 3)}


# ----------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelcast", description="Reliable multicast of model files.")
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--group", help="multicast ADDR:PORT (SSM: 232.0.0.0/8); not with --controller")
    common.add_argument("--controller", help="controller base URL, e.g. http://10.0.0.254:8080 (assigns the group)")
    common.add_argument("--token", help="controller bearer token (default: $MODELCAST_TOKEN)")
    common.add_argument("--model", help="model name registered with the controller")
    common.add_argument("--ip", help="this host's IPv4 address as the controller knows it (default: from the routing table)")
    common.add_argument("--request-timeout", type=float, default=10.0, help="seconds per controller request")
    common.add_argument("--interface", default="0.0.0.0", help="local IPv4 address of the interface to use")
    common.add_argument("--key-file", help="shared secret file; every datagram is MAC'd with it (overrides the controller key)")
    common.add_argument("--json", action="store_true", help="print one JSON summary object on stdout")
    common.add_argument("--quiet", action="store_true")
    common.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    common.add_argument("--metrics-addr", default="127.0.0.1", help="address for --metrics-port (default 127.0.0.1)")
    send = sub.add_parser("send", parents=[common], help="send a file to the group")
    send.add_argument("path")
    send.add_argument("--receivers", type=int, default=None, help="expected receivers (exit 0 when all verified)")
    send.add_argument("--receiver-ip", action="append", help="register a receiver with the controller (repeatable)")
    send.add_argument("--wait-timeout", type=float, default=60.0, help="seconds to wait for the controller's tree")
    send.add_argument("--poll", type=float, default=0.5, help="controller polling interval, seconds")
    send.add_argument("--rate", type=float, default=1000.0, help="rate cap in Mbit/s (starts at 70%%)")
    send.add_argument("--chunk-size", type=int, default=1024 * 1024)
    send.add_argument("--fec-k", type=int, default=64,
                      help="datagrams per FEC parity block: one multicast parity datagram repairs "
                           "different losses at different receivers (0 = off)")
    send.add_argument("--fec-overhead", type=float, default=0.0,
                      help="proactive parity per data datagram, e.g. 0.02 (needs --fec-k)")
    send.add_argument("--payload-size", type=int, default=None,
                      help="data bytes per datagram (default: fill one frame of the route's MTU)")
    send.add_argument("--ttl", type=int, default=1)
    send.add_argument("--gso", action="store_true",
                      help="batch datagrams with UDP GSO (faster sends, burstier: measure with bench_net)")
    send.add_argument("--timeout", type=float, default=60.0, help="max seconds of repair after the stream")
    recv = sub.add_parser("recv", parents=[common], help="receive a file from the group")
    recv.add_argument("--source", required=True, help="sender's IPv4 address (source-specific join)")
    recv.add_argument("--out", required=True, help="output path (e.g. /dev/shm/model.bin); written in place")
    recv.add_argument("--timeout", type=float, default=30.0, help="give up after this long without the sender")
    recv.add_argument("--no-gro", action="store_true", help="do not ask the kernel for UDP GRO")
    recv.add_argument("--on-complete", metavar="CMD", help="run CMD OUT_PATH after verification (exit status in summary)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "send":
            return cmd_send(args)
        return cmd_recv(args)
    except (CliError, ControllerError, ValueError) as exc:
        print(f"modelcast: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"modelcast: error: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("modelcast: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
