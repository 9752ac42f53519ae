"""``modelcast send`` / ``modelcast recv``: one transfer, one exit code.

Exit 0 means verified: for ``recv`` every chunk matched its manifest digest (and the
``--on-complete`` hook, if any, exited 0); for ``send`` every expected receiver reported
COMPLETE with the right digest. Any failure is one line on stderr and exit 1 (2 for
usage errors, as argparse does). ``--json`` prints exactly one summary object on stdout.

The multicast group comes either from ``--group ADDR:PORT`` or from the controller
(``--controller URL``), which also supplies the session MAC key and installs the tree.
Every datagram is MAC'd: without a key (``--key-file``, or the controller's, which needs a
``--token``) the agent refuses to run unless ``--insecure`` is given.
The transfer itself is ``hostagent.api``; this module is arguments, output and exit codes.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import sys
from typing import Any, NoReturn, Optional, Sequence

from .api import (
    GroupAssigned, GroupJoined, LeaveFailed, MetricsServing, OtherContentAnnounced, ReceiveOptions, ReceiveProgress,
    ReceiveStarted,
    SendOptions, SendProgress, SendStarted, TransferError, Unauthenticated, receive, send,
)
from .rounds import RoundSettings
from .control import ControllerError
from .events import ChunkCorrupt, ManifestReceived, ReceiverCompleted, ReceiverFailed, ReceiverJoined


class CliError(Exception):
    """A problem the user can fix; printed as one line."""


def _secret(path: Optional[str]) -> Optional[bytes]:
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            return handle.read().strip()
    except OSError as exc:
        raise CliError(f"cannot read key file {path}: {exc.strerror}") from None


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.json and not args.quiet:
        print(text, file=sys.stderr)


# ----------------------------------------------------------------------------- progress


class Progress:
    """A rich progress bar on stderr when it is a terminal (and not --json/--quiet);
    otherwise nothing. The API calls back at most ~10 times a second."""

    def __init__(self, args: argparse.Namespace, label: str) -> None:
        self._bar: Any = None
        self._task: Any = None
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

    @property
    def shown(self) -> bool:
        return self._bar is not None

    def update(self, done: int, total: int, repairs: int, note: str = "") -> None:
        if self._bar is None:
            return
        if self._task is None:
            self._task = self._bar.add_task(self._label, total=total, repairs=0, note="")
        self._bar.update(self._task, completed=done, total=total, repairs=repairs, note=note)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


class Reporter:
    """The human side of one transfer: the API's events as stderr lines, its progress
    as the bar (started when the transfer starts, as before any datagram)."""

    def __init__(self, args: argparse.Namespace, label: str) -> None:
        self.args = args
        self.label = label
        self.bar: Optional[Progress] = None
        self.said_id = ""

    def on_event(self, event: object) -> None:
        args, bar_shown = self.args, self.bar is not None and self.bar.shown
        if isinstance(event, (SendStarted, ReceiveStarted)):
            if isinstance(event, SendStarted):
                what = f"{event.files} files, " if event.files > 1 else ""
                _say(args, f"sending {event.path} ({what}{event.size} bytes) to {event.group[0]}:{event.group[1]} from "
                           f"{event.local[0]}:{event.local[1]}")
                self._content_id(event.content_id)
            self.bar = Progress(args, self.label)
        elif isinstance(event, GroupAssigned):
            self._content_id(event.content_id)  # whole, before the wait: receivers need it to join
            wanted = "" if event.receivers is None else f" and {event.receivers} receivers"
            _say(args, f"group {event.group_id} for model {event.model}: {event.group[0]}:{event.group[1]}, "
                       f"waiting for installation{wanted}")
        elif isinstance(event, OtherContentAnnounced):
            _say(args, f"warning: {event.text()}; still waiting (check --expect)")
        elif isinstance(event, GroupJoined):
            _say(args, f"joined group {event.group_id} ({event.group[0]}:{event.group[1]}) as {event.ip}")
        elif isinstance(event, MetricsServing):
            _say(args, f"metrics on http://{event.addr}:{event.port}/metrics")
        elif isinstance(event, Unauthenticated):
            # Printed even with --json/--quiet: running unauthenticated must never go unnoticed.
            print(f"modelcast: warning: --insecure and {event.reason}: datagrams carry no MAC, anyone on the "
                  "network can forge them, fail or falsely complete this transfer", file=sys.stderr)
        elif isinstance(event, LeaveFailed):
            _say(args, f"warning: leaving group {event.group_id}: {event.error}")
        elif isinstance(event, ReceiverJoined) and not bar_shown:
            _say(args, f"receiver {event.receiver_id:016x} at {event.addr[0]} joined")  # type: ignore[index]
        elif isinstance(event, ReceiverCompleted):
            _say(args, f"receiver {event.receiver_id:016x} at {event.addr[0]} verified")  # type: ignore[index]
        elif isinstance(event, ReceiverFailed):
            _say(args, f"receiver {event.receiver_id:016x} failed: {event.reason}")
        elif isinstance(event, ManifestReceived) and not bar_shown:
            _say(args, f"receiving {event.name or 'file'} ({event.file_size} bytes, "
                       f"{event.chunk_count} chunks, {event.resumed_chunks} already here)")
        elif isinstance(event, ChunkCorrupt):
            _say(args, f"chunk {event.chunk} failed its digest; re-requesting")

    def _content_id(self, content_id: str) -> None:
        """The content id, whole, once per transfer."""
        if content_id and content_id != self.said_id:
            self.said_id = content_id
            _say(self.args, f"content id {content_id} (receivers: --expect {content_id})")

    def on_send_progress(self, p: SendProgress) -> None:
        if self.bar is not None:
            self.bar.update(p.sent, p.total, p.repairs, f"{p.verified}/{p.expected} verified")

    def on_receive_progress(self, p: ReceiveProgress) -> None:
        if self.bar is not None:
            self.bar.update(p.received, p.total, p.repairs, f"nacks {p.nacks}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _require_group_source(args: argparse.Namespace) -> None:
    if args.controller and args.group:
        raise CliError("give either --group or --controller, not both")
    if not args.controller and not args.group:
        raise CliError("--group ADDR:PORT is required without --controller")


def _common(args: argparse.Namespace, secret: Optional[bytes]) -> dict[str, Any]:
    return dict(
        group=args.group, controller=args.controller, token=args.token, model=args.model, ip=args.ip,
        request_timeout=args.request_timeout, interface=args.interface, secret=secret,
        metrics_port=args.metrics_port, metrics_addr=args.metrics_addr, insecure=args.insecure,
    )


# ----------------------------------------------------------------------------- send


def cmd_send(args: argparse.Namespace) -> int:
    if not os.path.isfile(args.path) and not os.path.isdir(args.path):
        raise CliError(f"no such file or directory: {args.path}")
    _require_group_source(args)
    options = SendOptions(
        **_common(args, _secret(args.key_file)), receivers=args.receivers,
        receiver_ips=tuple(args.receiver_ip or ()), wait_timeout=args.wait_timeout, poll=args.poll,
        rate_mbit=args.rate, chunk_size=args.chunk_size, fec_k=args.fec_k, fec_overhead=args.fec_overhead,
        payload_size=args.payload_size, ttl=args.ttl, gso=args.gso, timeout=args.timeout,
        min_rate_mbit=args.min_rate, congestion_quorum=args.congestion_quorum, repair_share=args.repair_share,
        lanes=args.lanes,
    )
    if args.part:
        return _send_parts(args, options)
    report = Reporter(args, "send")
    try:
        result = send(args.path, options, on_event=report.on_event, on_progress=report.on_send_progress)
    finally:
        report.close()
    finished = result.finished
    if args.json:
        print(json.dumps(result.summary()))
    else:
        _say(args, f"{'done' if result.ok else 'FAILED'}: {len(finished.completed)} verified, "
                   f"{len(finished.failed)} failed, {finished.missing} never seen, {result.seconds:.1f}s, "
                   f"{result.goodput_mbit} Mbit/s, repair {result.repair_bytes} bytes")
    if result.error is not None and not args.json:
        print(f"modelcast: error: {result.error}", file=sys.stderr)
    return 0 if result.ok else 1


# ----------------------------------------------------------------------------- recv


def cmd_recv(args: argparse.Namespace) -> int:
    _require_group_source(args)
    secret = _secret(args.key_file)
    if args.controller and not args.model and not args.expect:
        raise CliError("--model is required with --controller (or --expect ID: the content id names the group)")
    options = ReceiveOptions(
        **_common(args, secret), source=args.source, timeout=args.timeout, gro=not args.no_gro,
        resume_interval=args.resume_interval, expect=args.expect,
        # The hook's stdout must not corrupt our single JSON line: send it to stderr.
        on_complete=args.on_complete, hook_stdout=sys.stderr if args.json else None, lanes=args.lanes,
    )
    if args.include and not args.catalog:
        raise CliError("--include picks parts of a catalog: give --catalog FILE (and --expect MODEL_ID)")
    if args.catalog:
        return _receive_parts(args, options)
    report = Reporter(args, "recv")
    try:
        result = receive(args.out, options, on_event=report.on_event, on_progress=report.on_receive_progress)
    finally:
        report.close()
    if args.json:
        print(json.dumps(result.summary()))
    elif result.digest_ok:
        what = f"{result.files} files, " if result.files > 1 else ""
        _say(args, f"verified {args.out} ({what}{result.content_id}), "
                   f"{result.goodput_mbit} Mbit/s, {result.nacks} NACKs, {result.repairs_received} repairs")
    else:
        print(f"modelcast: error: {result.error}", file=sys.stderr)
    hook = result.on_complete
    if hook is not None and hook.exit_status != 0 and not args.json:
        print(f"modelcast: error: --on-complete command exited {hook.exit_status}", file=sys.stderr)
    return 0 if result.ok else 1


# ----------------------------------------------------------------------------- serve, fetch


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT: then the offers are withdrawn, running rounds end, exit 0."""
    import signal
    import threading

    from .serve import RoundDone, RoundStarted, ServeOptions, Served, round_summary, serve

    if not args.controller:
        raise CliError("serve needs --controller (it registers the models and hands out the groups)")
    for path in args.paths:
        if not os.path.isfile(path) and not os.path.isdir(path):
            raise CliError(f"no such file or directory: {path}")
    send = SendOptions(controller=args.controller, token=args.token, rate_mbit=args.rate, chunk_size=args.chunk_size,
                       fec_k=args.fec_k, timeout=args.timeout, poll=0.2, wait_timeout=10.0, insecure=args.insecure,
                       interface=args.interface, request_timeout=args.request_timeout)
    options = ServeOptions(
        controller=args.controller, token=args.token, ip=args.ip, send=send, metrics_port=args.metrics_port,
        metrics_addr=args.metrics_addr,
        rounds=RoundSettings(quiet_s=args.window_quiet, max_wait_s=args.window_max, admit_share=args.admit_share,
                             hold_share=args.window_hold))
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise SystemExit(1)  # a second signal: do not wait for the rounds
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

    def on_event(event: object) -> None:
        if isinstance(event, Served):
            if args.json:
                print(json.dumps({"event": "served", **dataclasses.asdict(event)}), flush=True)
            else:
                _say(args, f"serving {event.name} as {event.model} ({event.size} bytes) on group {event.group_id}")
        elif isinstance(event, RoundStarted):
            _say(args, f"round {event.round} of {event.model[:19]}...: {len(event.receivers)} receivers")
        elif isinstance(event, RoundDone):
            if args.json:
                print(json.dumps(round_summary(event)), flush=True)
            else:
                _say(args, f"round {event.round}: {len(event.verified)} verified ({len(event.late)} joined late, "
                           f"{len(event.deferred)} left for the next round), {event.bytes_sent} bytes, "
                           f"{event.seconds:.1f}s" + (f": {event.error}" if event.error else ""))

    models = serve(args.paths, options, stop, on_event=on_event)
    if args.json:
        print(json.dumps({"event": "stopped", "models": [
            {"model": m.content_id, "name": m.name, "size": m.size, **dataclasses.asdict(m.stats)} for m in models]}))
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    """The model MODEL_ID into --out from whoever offers it; exit 0 only when verified."""
    from .serve import Fetched, fetch

    if not args.controller or args.group:
        raise CliError("fetch needs --controller (it says who serves the model), and no --group")
    options = ReceiveOptions(
        controller=args.controller, token=args.token, ip=args.ip, request_timeout=args.request_timeout,
        interface=args.interface, insecure=args.insecure, source="", timeout=args.timeout, gro=not args.no_gro,
        on_complete=args.on_complete, hook_stdout=sys.stderr if args.json else None)
    attempts = [0]

    def on_event(event: object) -> None:
        if isinstance(event, Fetched):
            attempts[0] = event.attempt
            _say(args, f"attempt {event.attempt} (from {event.source}) ended: {event.error}; resuming")

    result = fetch(args.model_id, args.out, options, patience=args.patience, on_event=on_event)
    if args.json:
        print(json.dumps(dict(result.summary(), attempts=attempts[0] + 1)))
    elif result.digest_ok:
        _say(args, f"verified {args.out} ({result.content_id}) after {attempts[0] + 1} attempts")
    else:
        print(f"modelcast: error: {result.error}", file=sys.stderr)
    return 0 if result.ok else 1


# ----------------------------------------------------------------------------- parts


def _send_parts(args: argparse.Namespace, options: SendOptions) -> int:
    from .parts import send_parts  # (loaded when used: a plain send or recv does not pay for it)

    report = Reporter(args, "send")
    try:
        result = send_parts(args.path, args.part, options, on_event=report.on_event)
    finally:
        report.close()
    return _parts_done(args, result)


def _receive_parts(args: argparse.Namespace, options: ReceiveOptions) -> int:
    import hostagent.catalog as catalog
    from .parts import receive_parts

    try:
        with open(args.catalog, "rb") as handle:
            blob = handle.read(catalog.MAX_CATALOG_BYTES + 1)
    except OSError as exc:
        raise CliError(f"cannot read catalog {args.catalog}: {exc.strerror}") from None
    report = Reporter(args, "recv")
    try:
        result = receive_parts(args.out, blob, args.include or [], options, on_event=report.on_event)
    finally:
        report.close()
    return _parts_done(args, result)


def _parts_done(args: argparse.Namespace, result: Any) -> int:
    if args.json:
        print(json.dumps(result.summary()))
    else:
        for part in result.parts:
            where = f"on {part.group}, {part.bytes_on_wire} bytes on the wire" if part.group else (
                "not sent (no receiver asked for it)" if part.ok else "not sent")
            _say(args, f"{part.name}: {part.content_id} {where}{'' if part.ok else ' FAILED: ' + str(part.error)}")
        _say(args, f"{'done' if result.ok else 'FAILED'}: model {result.model_id}, {result.bytes} bytes of parts, "
                   f"{result.bytes_on_wire} on the wire, {result.seconds:.1f}s")
    if result.error is not None and not args.json:
        print(f"modelcast: error: {result.error}", file=sys.stderr)
    return 0 if result.ok else 1


# ----------------------------------------------------------------------------- catalog


def cmd_catalog(args: argparse.Namespace) -> int:
    """Publish a model in parts (``catalog DIR --part GLOB``: write the catalog, print the
    model id and each part's id), or, on a receiver, check a catalog against the model id
    and print the parts its ``--include`` globs name (``catalog --check FILE --expect ID``)."""
    import hostagent.catalog as catalog
    import hostagent.tree as tree
    from .parts import describe_parts

    if args.check:
        if not args.expect:
            raise CliError("--check needs --expect MODEL_ID (the catalog is trusted only through it)")
        try:
            with open(args.check, "rb") as handle:
                blob = handle.read(catalog.MAX_CATALOG_BYTES + 1)
        except OSError as exc:
            raise CliError(f"cannot read catalog {args.check}: {exc.strerror}") from None
        model_id = args.expect
        parts = catalog.select(catalog.decode_catalog(blob, tree.parse_content_id(model_id)), args.include or ())
    else:
        if not args.path or not os.path.isdir(args.path):
            raise CliError("give a model directory to split, or --check CATALOG")
        blob, parts = describe_parts(args.path, args.part or [], args.chunk_size)
        model_id = catalog.catalog_id(blob)
        if args.write:
            with open(args.write, "wb") as handle:
                handle.write(blob)
    if args.json:
        print(json.dumps({"model_id": model_id, "chunk_size": args.chunk_size,
                          "parts": [{"name": p.name, "content_id": p.content_id, "size": p.size, "files": list(p.paths)}
                                    for p in parts]}))
    else:
        print(model_id)
        for part in parts:
            print(f"{part.content_id}  {part.size:>12}  {part.name}  ({len(part.paths)} files)")
    return 0


# ----------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelcast", description="Reliable multicast of model files.")
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--group", help="multicast ADDR:PORT (SSM: 232.0.0.0/8); not with --controller")
    common.add_argument("--controller", help="controller base URL, e.g. http://10.0.0.254:8080 (assigns the group); "
                        "several instances of one controller: URL,URL,... (tried in turn)")
    common.add_argument("--token", help="controller bearer token (default: $MODELCAST_TOKEN)")
    common.add_argument("--model", help="model name registered with the controller")
    common.add_argument("--ip", help="this host's IPv4 address as the controller knows it (default: from the routing table)")
    common.add_argument("--request-timeout", type=float, default=SendOptions.request_timeout, help="seconds per controller request")
    common.add_argument("--interface", default=SendOptions.interface, help="local IPv4 address of the interface to use")
    common.add_argument("--key-file", help="shared secret file; every datagram is MAC'd with it (overrides the controller key)")
    common.add_argument("--insecure", action="store_true",
                        help="run without a MAC key (no --key-file, no key from the controller): refused otherwise; "
                             "anyone on the network can then forge datagrams")
    common.add_argument("--json", action="store_true", help="print one JSON summary object on stdout")
    common.add_argument("--quiet", action="store_true")
    common.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    common.add_argument("--metrics-addr", default=SendOptions.metrics_addr, help="address for --metrics-port (default 127.0.0.1)")
    common.add_argument("--lanes", type=int, default=SendOptions.lanes, metavar="K",
                        help="stripe the file over K lanes, one process (core) each on group ports PORT..PORT+K-1, "
                             "--rate shared among them; sender and receivers must give the same K (default 1)")
    send = sub.add_parser("send", parents=[common], help="send a file or a model directory to the group")
    send.add_argument("path", help="a file, or a directory: every file under it in one session")
    send.add_argument("--receivers", type=int, default=None, help="expected receivers (exit 0 when all verified)")
    send.add_argument("--receiver-ip", action="append", help="register a receiver with the controller (repeatable)")
    send.add_argument("--wait-timeout", type=float, default=SendOptions.wait_timeout, help="seconds to wait for the controller's tree")
    send.add_argument("--poll", type=float, default=SendOptions.poll, help="controller polling interval, seconds")
    send.add_argument("--rate", type=float, default=SendOptions.rate_mbit,
                      help="rate cap in Mbit/s on the link (headers and Ethernet framing included: "
                           "the NIC's speed fills it without overrunning it; starts at 70%%)")
    send.add_argument("--chunk-size", type=int, default=SendOptions.chunk_size)
    send.add_argument("--fec-k", type=int, default=SendOptions.fec_k,
                      help="datagrams per FEC parity block: one multicast parity datagram repairs "
                           "different losses at different receivers (0 = off)")
    send.add_argument("--fec-overhead", type=float, default=SendOptions.fec_overhead,
                      help="proactive parity per data datagram, e.g. 0.02 (needs --fec-k)")
    send.add_argument("--payload-size", type=int, default=None,
                      help="data bytes per datagram (default: fill one frame of the route's MTU)")
    send.add_argument("--ttl", type=int, default=SendOptions.ttl)
    send.add_argument("--gso", action=argparse.BooleanOptionalAction, default=SendOptions.gso,
                      help="batch paced datagrams with UDP GSO, ~120 KB per wake-up in 64 KB sends (default on; "
                           "--no-gso: one send per datagram)")
    send.add_argument("--timeout", type=float, default=SendOptions.timeout,
                      help="max seconds of repair after the stream (catch-up): receivers still not verified "
                           "then are reported failed as stragglers")
    send.add_argument("--min-rate", type=float, default=SendOptions.min_rate_mbit, metavar="MBIT",
                      help="loss that receivers report never takes the rate below this (default: 5%% of --rate); "
                           "only drops at the sender's own link do")
    send.add_argument("--congestion-quorum", type=float, default=SendOptions.congestion_quorum, metavar="FRACTION",
                      help="loss is congestion (the rate is cut) only when more than this fraction of the receivers "
                           "report it at once; fewer are repaired at the group's rate (default %(default)s)")
    send.add_argument("--repair-share", type=float, default=SendOptions.repair_share, metavar="FRACTION",
                      help="max fraction of the sends given to repairs while the stream runs, so lagging "
                           "receivers never starve it (default %(default)s)")
    send.add_argument("--part", action="append", metavar="GLOB",
                      help="send DIR in parts, each on its own group named by the part's id: files matching GLOB "
                           "form one part (repeatable), every other file a part of its own; a part no receiver "
                           "joined is not sent (see modelcast catalog)")
    recv = sub.add_parser("recv", parents=[common], help="receive a file or a model directory from the group")
    recv.add_argument("--source", required=True, help="sender's IPv4 address (source-specific join)")
    recv.add_argument("--out", required=True,
                      help="output path (e.g. /dev/shm/model.bin): a file is written in place; a directory is "
                           "assembled in .NAME.modelcast-tmp next to it and renamed to OUT once verified")
    recv.add_argument("--expect", metavar="ID",
                      help="accept only the model with this content id (blake3:<hex>, printed by send); with "
                           "--controller and no --model it also names the group")
    recv.add_argument("--catalog", metavar="FILE",
                      help="the model's catalog (modelcast catalog --write): with --expect MODEL_ID, receive the "
                           "parts --include names, each held to its id, merged into OUT")
    recv.add_argument("--include", action="append", metavar="GLOB",
                      help="with --catalog: only the parts whose name or files match GLOB (repeatable)")
    recv.add_argument("--timeout", type=float, default=ReceiveOptions.timeout, help="give up after this long without the sender")
    recv.add_argument("--no-gro", action="store_true", help="do not ask the kernel for UDP GRO")
    recv.add_argument("--resume-interval", type=float, default=ReceiveOptions.resume_interval, metavar="SECONDS",
                      help="make the resume record durable at most this long after progress (default %(default)s)")
    recv.add_argument("--on-complete", metavar="CMD", help="run CMD OUT_PATH after verification (exit status in summary)")
    srv = sub.add_parser("serve", help="serve models to whoever fetches them, in batched multicast rounds")
    srv.add_argument("paths", nargs="+", metavar="PATH", help="a model file or directory (repeatable)")
    srv.add_argument("--controller", required=True, help="controller base URL")
    srv.add_argument("--token", help="controller bearer token: the admin's or this host's (default: $MODELCAST_TOKEN)")
    srv.add_argument("--ip", help="this host's IPv4 address as the controller knows it")
    srv.add_argument("--interface", default=SendOptions.interface, help="local IPv4 address of the interface to use")
    srv.add_argument("--request-timeout", type=float, default=SendOptions.request_timeout)
    srv.add_argument("--rate", type=float, default=SendOptions.rate_mbit, help="rate cap in Mbit/s on the link, per round")
    srv.add_argument("--chunk-size", type=int, default=SendOptions.chunk_size, help="(the content ids depend on it)")
    srv.add_argument("--fec-k", type=int, default=SendOptions.fec_k)
    srv.add_argument("--timeout", type=float, default=SendOptions.timeout,
                     help="a round's catch-up bound: receivers not verified this long after its stream fail")
    srv.add_argument("--window-quiet", type=float, default=RoundSettings.quiet_s, metavar="SECONDS",
                     help="a join window closes this long after its latest request (default %(default)s)")
    srv.add_argument("--window-max", type=float, default=RoundSettings.max_wait_s, metavar="SECONDS",
                     help="and at most this long (or a quarter of one transfer) after its first (default %(default)s)")
    srv.add_argument("--window-hold", type=float, default=RoundSettings.hold_share, metavar="FRACTION",
                     help="while the server is busy (a round runs or ended less than one transfer ago) a request "
                          "waits this share of one transfer (within --window-max) for others: fewer, fuller rounds "
                          "(default %(default)s)")
    srv.add_argument("--admit-share", type=float, default=RoundSettings.admit_share, metavar="FRACTION",
                     help="a request while at most this share of a round's stream is out joins it and is repaired; "
                          "a later one takes the rest and the next round's start (default %(default)s)")
    srv.add_argument("--insecure", action="store_true", help="run without MAC keys (see send --insecure)")
    srv.add_argument("--metrics-port", type=int, help="serve Prometheus metrics (rounds, receivers, bytes) here")
    srv.add_argument("--metrics-addr", default=SendOptions.metrics_addr)
    srv.add_argument("--json", action="store_true", help="one JSON line per model served and per round")
    srv.add_argument("--quiet", action="store_true", help="print nothing but errors")
    fch = sub.add_parser("fetch", parents=[common], help="fetch a model by its id from whoever serves it")
    fch.add_argument("model_id", metavar="MODEL_ID", help="the content id (blake3:<hex>) the server printed")
    fch.add_argument("--out", required=True, help="output file or directory (written as recv --out does)")
    fch.add_argument("--timeout", type=float, default=ReceiveOptions.timeout,
                     help="per attempt: give up after this long without the server")
    fch.add_argument("--patience", type=float, default=300.0,
                     help="keep asking (resuming each time) for this long in all (default %(default)s)")
    fch.add_argument("--no-gro", action="store_true", help="do not ask the kernel for UDP GRO")
    fch.add_argument("--on-complete", metavar="CMD", help="run CMD OUT_PATH after verification")
    cat = sub.add_parser("catalog", help="publish a model directory in parts, or check a catalog and pick parts")
    cat.add_argument("path", nargs="?", help="the model directory to split into parts")
    cat.add_argument("--part", action="append", metavar="GLOB",
                     help="files matching GLOB form one part (repeatable); every other file is a part of its own")
    cat.add_argument("--chunk-size", type=int, default=SendOptions.chunk_size,
                     help="the chunk size the parts will be sent with (part ids depend on it)")
    cat.add_argument("--write", metavar="FILE", help="write the catalog (whose digest is the model id) to FILE")
    cat.add_argument("--check", metavar="FILE", help="check this catalog against --expect and list the parts")
    cat.add_argument("--expect", metavar="MODEL_ID", help="the model id (blake3:<hex>) the catalog must hash to")
    cat.add_argument("--include", action="append", metavar="GLOB",
                     help="with --check: only the parts whose name or files match GLOB (repeatable)")
    cat.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "send":
            return cmd_send(args)
        if args.command == "catalog":
            return cmd_catalog(args)
        if args.command == "serve":
            return cmd_serve(args)
        if args.command == "fetch":
            return cmd_fetch(args)
        return cmd_recv(args)
    except (CliError, TransferError, ControllerError, ValueError) as exc:
        print(f"modelcast: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # one line naming the file and the errno (ENOSPC: disk full), no traceback
        where = f"{exc.filename}: " if exc.filename else ""
        code = f" ({errno.errorcode[exc.errno]})" if exc.errno in errno.errorcode else ""
        print(f"modelcast: error: {where}{exc.strerror or exc}{code}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("modelcast: interrupted", file=sys.stderr)
        return 130


def run() -> NoReturn:
    """The ``modelcast`` command: ``main``, then out without the interpreter's teardown.
    By then every file is written and closed and every thread done, and tearing down
    the modules and objects of a transfer cost another ~40-50 ms of wall time and CPU
    per process (measured on the agent bench's lab) before a waiting script saw the exit
    status. Where something is left to the normal exit (a thread still running, output
    that cannot be flushed), it takes the normal exit."""
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(code)
    if "threading" in sys.modules:
        import threading

        if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
            sys.exit(code)
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    os._exit(code)


if __name__ == "__main__":
    run()
