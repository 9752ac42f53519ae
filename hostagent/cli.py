"""``modelcast send`` / ``modelcast recv``: one transfer, one exit code.

Exit 0 means verified: for ``recv`` the whole-file digest matched; for ``send`` every
expected receiver reported COMPLETE with the right digest. Any failure is one line on
stderr and exit 1 (2 for usage errors, as argparse does).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional, Sequence

from . import wire
from .common import (
    ChunkCorrupt, Failed, FileComplete, ManifestReceived, ReceiverCompleted, ReceiverFailed,
    TransferFinished,
)
from .net import FileSink, FileSource, parse_group, parse_ipv4, receiver_sockets, run, sender_socket
from .receiver import Receiver, ReceiverConfig
from .sender import Sender, SenderConfig


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


def cmd_send(args: argparse.Namespace) -> int:
    if not os.path.isfile(args.path):
        raise CliError(f"no such file: {args.path}")
    group = parse_group(args.group)
    interface = parse_ipv4(args.interface)
    source = FileSource(args.path)
    config = SenderConfig(
        chunk_size=args.chunk_size, payload_size=args.payload_size, rate_bps=args.rate * 1e6,
        expected_receivers=args.receivers, key=_key(args.key_file),
        name=os.path.basename(args.path)[:100], linger_timeout=args.timeout,
    )
    try:
        config.validate()
    except ValueError as exc:
        raise CliError(str(exc)) from None
    sock = sender_socket(interface, args.ttl)
    started = time.monotonic()
    sender = Sender(source, config, started)
    result: dict = {}
    _say(args, f"sending {args.path} ({source.size} bytes) to {args.group} from {sock.getsockname()[0]}:{sock.getsockname()[1]}")

    def on_event(event: object) -> None:
        if isinstance(event, ReceiverCompleted):
            _say(args, f"receiver {event.receiver_id:016x} at {event.addr[0]} verified")
        elif isinstance(event, ReceiverFailed):
            _say(args, f"receiver {event.receiver_id:016x} failed: {event.reason}")
        elif isinstance(event, TransferFinished):
            result["finished"] = event

    try:
        run(sender, sock, [sock], group, on_event, lambda: "finished" in result)
    finally:
        source.close()
        sock.close()
    finished: TransferFinished = result["finished"]
    stats = sender.stats
    elapsed = time.monotonic() - started
    summary = {
        "ok": finished.ok, "file": args.path, "bytes": source.size,
        "file_digest": sender.file_digest.hex(), "seconds": round(elapsed, 3),
        "completed": [f"{r:016x}" for r in finished.completed],
        "failed": [f"{r:016x}" for r in finished.failed], "never_seen": finished.missing,
        "datagrams_sent": stats.datagrams_out, "bytes_sent": stats.bytes_out,
        "nacks_received": stats.nacks_received, "repair_bytes_unicast": stats.repair_bytes_unicast,
        "repair_bytes_multicast": stats.repair_bytes_multicast, "dropped": dict(stats.drops),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        _say(args, f"{'done' if finished.ok else 'FAILED'}: {len(finished.completed)} verified, "
                   f"{len(finished.failed)} failed, {finished.missing} never seen, {elapsed:.1f}s")
    return 0 if finished.ok else 1


def cmd_recv(args: argparse.Namespace) -> int:
    group = parse_group(args.group)
    source_ip = parse_ipv4(args.source)
    interface = parse_ipv4(args.interface)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir) or not os.access(out_dir, os.W_OK):
        raise CliError(f"cannot write output in {out_dir}")
    try:
        sink = FileSink(args.out)
    except OSError as exc:
        raise CliError(f"cannot open {args.out}: {exc.strerror}") from None
    config = ReceiverConfig(key=_key(args.key_file), idle_timeout=args.timeout)
    mc, uc = receiver_sockets(group[0], group[1], source_ip, interface)
    receiver = Receiver(sink, config, time.monotonic(), state=sink.load_state())
    result: dict = {}

    def on_event(event: object) -> None:
        if isinstance(event, ManifestReceived):
            _say(args, f"receiving {event.name or 'file'} ({event.file_size} bytes, "
                       f"{event.chunk_count} chunks, {event.resumed_chunks} already here)")
        elif isinstance(event, ChunkCorrupt):
            _say(args, f"chunk {event.chunk} failed its digest; re-requesting")
        elif isinstance(event, (FileComplete, Failed)):
            result["end"] = event

    def done() -> bool:
        # After success, linger until the sender acknowledged our COMPLETE.
        return "end" in result and (isinstance(result["end"], Failed) or receiver.get_timer() is None)

    started = time.monotonic()
    try:
        run(receiver, uc, [mc, uc], group, on_event, done)
        end = result["end"]
        if isinstance(end, FileComplete) and receiver.manifest is not None:
            sink.finish(receiver.manifest.file_size)
    finally:
        sink.close()
        mc.close()
        uc.close()
    ok = isinstance(end, FileComplete)
    stats = receiver.stats
    summary = {
        "ok": ok, "out": args.out, "receiver_id": f"{receiver.receiver_id:016x}",
        "file_digest": end.file_digest.hex() if ok else None,
        "error": None if ok else end.reason, "seconds": round(time.monotonic() - started, 3),
        "resumed_chunks": receiver.resumed_chunks, "nacks_sent": stats.nacks_sent,
        "repairs_received": stats.repairs_received, "duplicates": stats.duplicates,
        "dropped": dict(stats.drops),
    }
    if args.json:
        print(json.dumps(summary))
    elif ok:
        _say(args, f"verified {args.out} (blake3 {end.file_digest.hex()[:16]}...)")
    else:
        print(f"modelcast: error: {end.reason}", file=sys.stderr)
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelcast", description="Reliable multicast of model files.")
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--group", required=True, help="multicast ADDR:PORT (SSM: 232.0.0.0/8)")
    common.add_argument("--interface", default="0.0.0.0", help="local IPv4 address of the interface to use")
    common.add_argument("--key-file", help="shared secret file; every datagram is MAC'd with it")
    common.add_argument("--json", action="store_true", help="print one JSON result object on stdout")
    common.add_argument("--quiet", action="store_true")
    send = sub.add_parser("send", parents=[common], help="send a file to the group")
    send.add_argument("path")
    send.add_argument("--receivers", type=int, default=None, help="expected receivers (exit 0 when all verified)")
    send.add_argument("--rate", type=float, default=1000.0, help="rate cap in Mbit/s (starts at 70%%)")
    send.add_argument("--chunk-size", type=int, default=1024 * 1024)
    send.add_argument("--payload-size", type=int, default=1400)
    send.add_argument("--ttl", type=int, default=1)
    send.add_argument("--timeout", type=float, default=60.0, help="max seconds of repair after the stream")
    recv = sub.add_parser("recv", parents=[common], help="receive a file from the group")
    recv.add_argument("--source", required=True, help="sender's IPv4 address (source-specific join)")
    recv.add_argument("--out", required=True)
    recv.add_argument("--timeout", type=float, default=30.0, help="give up after this long without the sender")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "send":
            return cmd_send(args)
        return cmd_recv(args)
    except (CliError, ValueError) as exc:
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
