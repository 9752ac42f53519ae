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
import time
from typing import Any, Callable, NoReturn, Optional, Sequence

from .api import (
    GroupAssigned, GroupJoined, LeaveFailed, MetricsServing, OtherContentAnnounced, ReceiveOptions, ReceiveProgress,
    ReceiveStarted,
    SendOptions, SendProgress, SendStarted, TransferError, Unauthenticated, receive, send,
)
from . import treeview
from .control import ControllerError
from .events import ChunkCorrupt, ManifestReceived, ReceiverCompleted, ReceiverFailed, ReceiverJoined


class CliError(Exception):
    """A problem the user can fix; printed as one line."""


MIN_KEY_BYTES = 16  # a shared secret shorter than this is refused (keygen writes 64 hex digits)


def _secret(path: Optional[str]) -> Optional[bytes]:
    """The shared secret in a key file: refused when empty or short (a typo, a file
    truncated on its way, or a password too short to be a key)."""
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            secret = handle.read().strip()
    except OSError as exc:
        raise CliError(f"cannot read key file {path}: {exc.strerror}") from None
    if len(secret) < MIN_KEY_BYTES:
        what = "is empty" if not secret else f"holds {len(secret)} bytes, fewer than {MIN_KEY_BYTES}"
        raise CliError(f"key file {path} {what}: make one with `modelcast keygen {path}`")
    return secret


def _token(args: argparse.Namespace) -> Optional[str]:
    """The controller token: ``--token-file`` (first line), ``--token``, else None (the
    client then reads $MODELCAST_TOKEN)."""
    path = getattr(args, "token_file", None)
    if path is None:
        return getattr(args, "token", None)
    if getattr(args, "token", None):
        raise CliError("give --token-file or --token, not both")
    try:
        with open(path, encoding="utf-8") as handle:
            token = handle.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read token file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not token:
        raise CliError(f"token file {path} is empty")
    return token


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.json and not args.quiet:
        print(text, file=sys.stderr)


# ----------------------------------------------------------------------------- progress


class Progress:
    """Progress on stderr (not with --json/--quiet): a rich bar when stderr is a terminal,
    else one plain line a second (a log file, a pipe, a CI job). The API calls back at
    most ~10 times a second."""

    LINE_EVERY_S = 1.0

    def __init__(self, args: argparse.Namespace, label: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._bar: Any = None
        self._task: Any = None
        self._label = label
        self._lines = False
        self._clock = clock
        self._last: Optional[tuple[float, int]] = None  # (when, bytes done) of the last line
        if args.json or args.quiet:
            return
        if not sys.stderr.isatty():
            self._lines = True
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
        if self._lines:
            self._line(done, total, repairs, note)
        if self._bar is None:
            return
        if self._task is None:
            self._task = self._bar.add_task(self._label, total=total, repairs=0, note="")
        self._bar.update(self._task, completed=done, total=total, repairs=repairs, note=note)

    def _line(self, done: int, total: int, repairs: int, note: str) -> None:
        now = self._clock()
        if self._last is not None and now - self._last[0] < self.LINE_EVERY_S:
            return
        rate = "" if self._last is None else \
            f", {(done - self._last[1]) * 8 / max(now - self._last[0], 1e-9) / 1e6:.1f} Mbit/s"
        self._last = (now, done)
        share = f" ({100 * done // total}%)" if total else ""
        print(f"{self._label}: {done / 1e6:.1f} of {total / 1e6:.1f} MB{share}{rate}, repairs {repairs}"
              + (f", {note}" if note else ""), file=sys.stderr, flush=True)

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


def _common(args: argparse.Namespace, secret: Optional[bytes]) -> dict[str, Any]:
    return dict(
        group=args.group, controller=args.controller, token=_token(args), model=args.model, ip=args.ip,
        request_timeout=args.request_timeout, interface=args.interface, secret=secret,
        metrics_port=args.metrics_port, metrics_addr=args.metrics_addr, insecure=args.insecure,
    )


# ----------------------------------------------------------------------------- send


def cmd_send(args: argparse.Namespace) -> int:
    if not os.path.isfile(args.path) and not os.path.isdir(args.path):
        raise CliError(f"no such file or directory: {args.path}")
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

    from .rounds import RoundSettings
    from .serve import RoundDone, RoundStarted, ServeOptions, Served, round_summary, serve

    if not args.controller:
        raise CliError("serve needs --controller (it registers the models and hands out the groups)")
    for path in args.paths:
        if not path.startswith("hf://") and not os.path.isfile(path) and not os.path.isdir(path):
            raise CliError(f"no such file or directory: {path}")
    token = _token(args)
    send = SendOptions(controller=args.controller, token=token, rate_mbit=args.rate, chunk_size=args.chunk_size,
                       fec_k=args.fec_k, timeout=args.timeout, poll=0.2, wait_timeout=10.0, insecure=args.insecure,
                       interface=args.interface, request_timeout=args.request_timeout)
    options = ServeOptions(
        controller=args.controller, token=token, ip=args.ip, send=send, metrics_port=args.metrics_port,
        metrics_addr=args.metrics_addr, hf_cache=args.hf_cache,
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
                at = f"@{event.revision}" if event.revision else ""
                _say(args, f"serving {event.name}{at} as {event.model} ({event.size} bytes) on group {event.group_id}")
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
    """The model MODEL_ID into --out (an hf:// name: into the Hugging Face cache) from
    whoever offers it; exit 0 only when verified."""
    from .serve import Fetched, FetchWaiting, fetch

    hf_ref = None
    if args.model_id.startswith("hf://"):
        from . import hf

        hf_ref = hf.parse_hf(args.model_id)  # (ValueError: one line, exit 1)
        if args.out or args.on_complete:
            raise CliError("an hf:// name goes into the Hugging Face cache (--hf-cache); --out and --on-complete "
                           "are for a content id")
    elif not args.out:
        raise CliError("fetch MODEL_ID needs --out (an hf://ORG/NAME name goes into the Hugging Face cache)")
    options = ReceiveOptions(
        controller=args.controller, token=_token(args), ip=args.ip, request_timeout=args.request_timeout,
        interface=args.interface, insecure=args.insecure, source="", timeout=args.timeout, gro=not args.no_gro,
        on_complete=args.on_complete, hook_stdout=sys.stderr if args.json else None)
    attempts = [0]
    report = Reporter(args, "fetch")

    def on_event(event: object) -> None:
        if isinstance(event, Fetched):
            attempts[0] = event.attempt
            _say(args, f"attempt {event.attempt} (from {event.source}) ended: {event.error}; resuming")
        elif isinstance(event, FetchWaiting):
            _say(args, f"asking again in {event.seconds:g}s: {event.why}")
        else:
            report.on_event(event)

    _say(args, f"waiting for an offer of {args.model_id} (asking {args.controller} for up to {args.patience:g}s)")
    if hf_ref is not None:
        return _fetch_hf(args, hf_ref, options, on_event, report)
    try:
        result = fetch(args.model_id, args.out, options, patience=args.patience, on_event=on_event)
    finally:
        report.close()
    if args.json:
        print(json.dumps(dict(result.summary(), attempts=attempts[0] + 1)))
    elif result.digest_ok:
        _say(args, f"verified {args.out} ({result.content_id}) after {attempts[0] + 1} attempts")
    else:
        print(f"modelcast: error: {result.error}", file=sys.stderr)
    return 0 if result.ok else 1


def _fetch_hf(args: argparse.Namespace, ref: Any, options: ReceiveOptions, on_event: Callable[[object], None],
              report: Any) -> int:
    """``fetch hf://...``: into the Hugging Face cache (hostagent.hf); prints the snapshot."""
    from .hf import hub_cache
    from .hffetch import fetch_hf

    cache = hub_cache(args.hf_cache)
    try:
        done = fetch_hf(ref, cache, options, patience=args.patience, on_event=on_event)
    finally:
        report.close()
    if args.json:
        print(json.dumps(done.summary()))
    elif done.ok:
        how = "already in the cache" if done.had_it else "verified"
        _say(args, f"{how}: {ref} at {done.commit} ({done.model}) in {done.snapshot}")
    else:
        print(f"modelcast: error: {done.error}", file=sys.stderr)
    return 0 if done.ok else 1


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


# ----------------------------------------------------------------------------- ls, keygen


def cmd_ls(args: argparse.Namespace) -> int:
    """The controller's groups (with each receiver's state) and offers, read over REST."""
    from .control import ControllerClient

    client = ControllerClient(args.controller, token=_token(args), request_timeout=args.request_timeout)
    groups = [{k: v for k, v in g.items() if k != "key"} for g in client.list_groups(args.model, args.source)]
    offers = [o for o in client.offers(args.model) if args.source is None or o.get("source") == args.source]
    if args.json:
        print(json.dumps({"groups": groups, "offers": offers}))
        return 0
    print(f"groups ({len(groups)})")
    for g in groups:
        members = g.get("receivers") or {}
        receivers = ", ".join(f"{ip} {state}" for ip, state in sorted(members.items())) if members else "none"
        announced = f", announced session {g['session']}" if g.get("session") else ""
        print(f"  {g.get('id')}  {g.get('model')}  source {g.get('source')}  {g.get('address')}:{g.get('port')}  "
              f"{g.get('state')}{announced}")
        print(f"      receivers: {receivers}")
    print(f"offers ({len(offers)})")
    for o in offers:
        group = f"group {o['group']}" if o.get("group") is not None else "no group"
        print(f"  {o.get('id')}  {o.get('model')}  from {o.get('source')}  {o.get('name') or '-'}  "
              f"{o.get('size')} bytes, {o.get('files')} files, {group}")
    return 0


def cmd_keygen(args: argparse.Namespace) -> int:
    """A shared secret for ``--key-file``: 32 random bytes as hex, readable by the owner only."""
    import secrets

    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if args.force else os.O_EXCL)
    try:
        fd = os.open(args.path, flags, 0o600)
    except FileExistsError:
        raise CliError(f"{args.path} exists: give --force to replace it") from None
    except OSError as exc:
        raise CliError(f"cannot create key file {args.path}: {exc.strerror}") from None
    with os.fdopen(fd, "w") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(secrets.token_hex(32) + "\n")
    _say(args, f"wrote a 256-bit key to {args.path} (mode 0600): copy it to the sender and every receiver")
    return 0


# ----------------------------------------------------------------------------- parser


class _Help(argparse.RawDescriptionHelpFormatter):
    """Help that shows each option's default (where it has one), marks required options
    and prints the epilog's examples as written."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: Optional[int] = None) -> None:
        # argparse builds a formatter for every option it adds, each asking
        # shutil.get_terminal_size() -- and importing shutil with its compression modules,
        # ~3 ms of every agent's start. The same width, asked once (argparse's own - 2).
        super().__init__(prog, indent_increment, max_help_position, _columns() - 2 if width is None else width)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        """Paragraphs wrapped; indented lines (the examples) kept as written."""
        import textwrap

        return "\n".join(line if line.startswith("  ") or not line else
                         textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent)
                         for line in text.splitlines())

    def _get_help_string(self, action: argparse.Action) -> Optional[str]:
        text = action.help or ""
        if action.required and action.option_strings:
            text += " (required)"
        if "%(default)" not in text and action.option_strings and action.default not in (None, False, [],
                                                                                        argparse.SUPPRESS):
            text += " (default: %(default)s)"
        return text


_COLUMNS: list[int] = []


def _columns() -> int:
    """The terminal's width as ``shutil.get_terminal_size`` tells it ($COLUMNS, else the
    terminal on stdout, else 80), looked up once."""
    if not _COLUMNS:
        try:
            columns = int(os.environ.get("COLUMNS", "0"))
        except ValueError:
            columns = 0
        if columns <= 0:
            try:
                columns = os.get_terminal_size(sys.__stdout__.fileno()).columns if sys.__stdout__ else 0
            except (AttributeError, ValueError, OSError):
                columns = 0
        _COLUMNS.append(columns or 80)
    return _COLUMNS[0]


def _examples(*lines: str) -> str:
    return "example:\n" + "\n".join(f"  {line}" for line in lines)


def _controller_options(parser: argparse.ArgumentParser, required: bool,
                        where: Optional[Any] = None) -> None:
    """--controller (in ``where``, e.g. a mutually exclusive group) and how to reach it."""
    (where or parser).add_argument(
        "--controller", required=required, metavar="URL[,URL...]",
        help="the controller's REST base URL, e.g. http://10.0.0.254:8080; several instances of one "
             "controller: every URL, comma-separated (tried in turn)")
    parser.add_argument("--token-file", metavar="PATH",
                        help="read the controller's bearer token (the admin's or this host's) from PATH; "
                             "without it, $MODELCAST_TOKEN")
    parser.add_argument("--token", help="the token itself: seen by every user of this host in ps, so prefer "
                                         "--token-file or $MODELCAST_TOKEN")
    parser.add_argument("--request-timeout", type=float, default=SendOptions.request_timeout, metavar="SECONDS",
                        help="per controller request")


def _host_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ip", help="this host's IPv4 address on the multicast fabric, as the controller knows "
                                     "it (default: the address the multicast route leaves from; never loopback)")
    parser.add_argument("--interface", default=SendOptions.interface, metavar="ADDR",
                        help="the local IPv4 address of the interface to send and join on; 0.0.0.0 lets the "
                             "routes choose")


def _output_options(parser: argparse.ArgumentParser, json_help: str, metrics: bool = True) -> None:
    parser.add_argument("--json", action="store_true", help=json_help)
    parser.add_argument("--quiet", action="store_true", help="print nothing but warnings and errors")
    if metrics:
        parser.add_argument("--metrics-port", type=int, metavar="PORT", help="serve Prometheus metrics on PORT")
        parser.add_argument("--metrics-addr", default=SendOptions.metrics_addr, metavar="ADDR",
                            help="the address --metrics-port listens on")


def _transfer_options(parser: argparse.ArgumentParser) -> None:
    """What send and recv share: the group from a controller or given, and its key."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--group", metavar="ADDR:PORT",
                        help="a source-specific multicast group (232.0.0.0/8) routed without a controller")
    _controller_options(parser, False, source)
    _host_options(parser)
    parser.add_argument("--model", help="the name the model's group is registered under with the controller "
                                        "(default for send: the content id)")
    parser.add_argument("--key-file", metavar="PATH",
                        help="a shared secret (at least 16 bytes; modelcast keygen makes one) that MACs every "
                             "datagram; with --group it is required, with --controller it replaces the "
                             "controller's session key")
    parser.add_argument("--insecure", action="store_true",
                        help="run without a MAC key (no --key-file, no key from the controller): refused "
                             "otherwise, because anyone on the network could then forge datagrams")
    parser.add_argument("--lanes", type=int, default=SendOptions.lanes, metavar="K",
                        help="stripe one file over K processes (cores), on group ports PORT..PORT+K-1, --rate "
                             "shared among them; the sender and its receivers give the same K (--group only)")
    _output_options(parser, "print one JSON summary object on stdout")


def _stream_options(parser: argparse.ArgumentParser, timeout_help: str) -> None:
    """How a stream goes out: what send and each of serve's rounds share."""
    parser.add_argument("--rate", type=float, default=SendOptions.rate_mbit, metavar="MBIT",
                        help="rate cap in Mbit/s on the link, headers and Ethernet framing included (the NIC's "
                             "speed fills it without overrunning it); the sender starts at 70%% and adapts")
    parser.add_argument("--chunk-size", type=int, default=SendOptions.chunk_size, metavar="BYTES",
                        help="bytes per verified chunk (the unit of digests, repair and resume); the content id "
                             "depends on it")
    parser.add_argument("--fec-k", type=int, default=SendOptions.fec_k, metavar="N",
                        help="datagrams per FEC parity block: one multicast parity datagram repairs "
                             "different losses at different receivers (0 = off)")
    parser.add_argument("--timeout", type=float, default=SendOptions.timeout, metavar="SECONDS", help=timeout_help)


def build_parser(only: Optional[str] = None) -> argparse.ArgumentParser:
    """The command line; ``only``: just that command's subparser (what running one command
    needs: building all of them took ~5 ms of every agent's start on the bench's lab)."""
    parser = argparse.ArgumentParser(
        prog="modelcast", formatter_class=_Help,
        description="Reliable multicast of model files and directories: send/recv one transfer, serve/fetch "
                    "for a fleet, catalog for a model in parts, ls to see the controller's groups and offers.",
        epilog="Each command's --help shows its options, their defaults and an example. The token is read "
               "from --token-file or $MODELCAST_TOKEN.")
    parser.add_argument("--version", action=_Version, nargs=0, default=argparse.SUPPRESS,
                        help="show the program's version number and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    if only in (None, "send"):
        send = sub.add_parser(
            "send", formatter_class=_Help, help="send a file or a model directory to the group",
            description="Send a file, or every file under a directory in one session, to the group; exit 0 "
                        "when every expected receiver verified it.",
            epilog=_examples("modelcast send ./llama-3-70b/ --controller http://10.0.0.254:8080 "
                             "--token-file /etc/modelcast/token --receivers 8 --rate 800"))
        send.add_argument("path", help="a file, or a directory: every file under it in one session")
        _transfer_options(send)
        send.add_argument("--receivers", type=int, metavar="N", help="expected receivers: exit 0 once all verified")
        send.add_argument("--receiver-ip", action="append", metavar="IP",
                          help="register a receiver with the controller (repeatable)")
        send.add_argument("--wait-timeout", type=float, default=SendOptions.wait_timeout, metavar="SECONDS",
                          help="wait this long for the controller's tree and the expected receivers")
        send.add_argument("--poll", type=float, default=SendOptions.poll, metavar="SECONDS",
                          help="controller polling interval")
        _stream_options(send, "repair time after the stream: receivers not verified by then fail as stragglers")
        send.add_argument("--fec-overhead", type=float, default=SendOptions.fec_overhead, metavar="FRACTION",
                          help="proactive parity per data datagram, e.g. 0.02 (needs --fec-k)")
        send.add_argument("--payload-size", type=int, metavar="BYTES",
                          help="data bytes per datagram (default: fill one frame of the route's MTU)")
        send.add_argument("--ttl", type=int, default=SendOptions.ttl,
                          help="multicast TTL: how many routers the datagrams may cross (1: the fabric's own "
                               "switches only, which do not count)")
        send.add_argument("--gso", action=argparse.BooleanOptionalAction, default=SendOptions.gso,
                          help="batch paced datagrams with UDP GSO, ~120 KB per wake-up in 64 KB sends "
                               "(--no-gso: one send per datagram)")
        send.add_argument("--min-rate", type=float, default=SendOptions.min_rate_mbit, metavar="MBIT",
                          help="loss that receivers report never takes the rate below this (default: 5%% of "
                               "--rate); only drops at the sender's own link do")
        send.add_argument("--congestion-quorum", type=float, default=SendOptions.congestion_quorum, metavar="FRACTION",
                          help="loss is congestion (the rate is cut) only when more than this fraction of the "
                               "receivers report it at once; fewer are repaired at the group's rate")
        send.add_argument("--repair-share", type=float, default=SendOptions.repair_share, metavar="FRACTION",
                          help="at most this fraction of the sends goes to repairs while the stream runs, so "
                               "lagging receivers never starve it")
        send.add_argument("--part", action="append", metavar="GLOB",
                          help="send DIR in parts, each on its own group named by the part's id: files matching GLOB "
                               "form one part (repeatable), every other file a part of its own; a part no receiver "
                               "joined is not sent (see modelcast catalog)")

    if only in (None, "recv"):
        recv = sub.add_parser(
            "recv", formatter_class=_Help, help="receive a file or a model directory from the group",
            description="Receive the group's file or directory into --out; exit 0 when every byte matched the "
                        "sender's digests (and --on-complete, if given, exited 0).",
            epilog=_examples("modelcast recv --controller http://10.0.0.254:8080 --token-file /etc/modelcast/token "
                             "--expect blake3:5f1c... --source 10.0.0.1 --out /dev/shm/llama-3-70b"))
        _transfer_options(recv)
        recv.add_argument("--source", required=True, metavar="IP", help="the sender's IPv4 address (source-specific join)")
        recv.add_argument("--out", required=True, metavar="PATH",
                          help="where the file or directory goes (e.g. /dev/shm/model.bin): a file is written in "
                               "place; a directory is assembled in .NAME.modelcast-tmp next to it and renamed once "
                               "verified")
        recv.add_argument("--expect", metavar="ID",
                          help="accept only the content with this id (blake3:<hex>, printed by send); with "
                               "--controller and no --model it also names the group")
        recv.add_argument("--catalog", metavar="FILE",
                          help="the model's catalog (modelcast catalog --write): with --expect MODEL_ID, receive the "
                               "parts --include names, each held to its id, merged into OUT")
        recv.add_argument("--include", action="append", metavar="GLOB",
                          help="with --catalog: only the parts whose name or files match GLOB (repeatable)")
        recv.add_argument("--timeout", type=float, default=ReceiveOptions.timeout, metavar="SECONDS",
                          help="give up after this long without the sender")
        recv.add_argument("--no-gro", action="store_true", help="do not ask the kernel for UDP GRO")
        recv.add_argument("--resume-interval", type=float, default=ReceiveOptions.resume_interval, metavar="SECONDS",
                          help="make the resume record durable at most this long after progress")
        recv.add_argument("--on-complete", metavar="CMD", help="run CMD OUT after verification (its exit status is in "
                                                               "the summary)")

    if only in (None, "serve"):
        from .rounds import RoundSettings  # (serve's alone: not loaded by every send and recv)

        srv = sub.add_parser(
            "serve", formatter_class=_Help, help="serve models to whoever fetches them, in batched multicast rounds",
            description="Offer each model under its content id and send it, in rounds, to the hosts that fetch it; "
                        "SIGTERM or SIGINT withdraws the offers and exits 0.",
            epilog=_examples("modelcast serve ./llama-3-70b/ --controller http://10.0.0.254:8080 "
                             "--token-file /etc/modelcast/token --rate 800"))
        srv.add_argument("paths", nargs="+", metavar="PATH",
                         help="a model file or directory, or hf://ORG/NAME[@REVISION]: that snapshot of the local "
                              "Hugging Face cache, offered under its name and commit (repeatable)")
        srv.add_argument("--hf-cache", metavar="DIR",
                         help="the Hugging Face cache hf:// names are found in (default: $HF_HUB_CACHE, else "
                              "$HF_HOME/hub, else ~/.cache/huggingface/hub); read offline")
        _controller_options(srv, True)
        _host_options(srv)
        _stream_options(srv, "a round's catch-up bound: receivers not verified this long after its stream fail")
        srv.add_argument("--window-quiet", type=float, default=RoundSettings.quiet_s, metavar="SECONDS",
                         help="a join window closes this long after its latest request")
        srv.add_argument("--window-max", type=float, default=RoundSettings.max_wait_s, metavar="SECONDS",
                         help="and at most this long (or a quarter of one transfer) after its first")
        srv.add_argument("--window-hold", type=float, default=RoundSettings.hold_share, metavar="FRACTION",
                         help="while the server is busy (a round runs or ended less than one transfer ago) a request "
                              "waits this share of one transfer (within --window-max) for others: fewer, fuller rounds")
        srv.add_argument("--admit-share", type=float, default=RoundSettings.admit_share, metavar="FRACTION",
                         help="a request while at most this share of a round's stream is out joins it and is repaired; "
                              "a later one takes the rest and the next round's start")
        srv.add_argument("--insecure", action="store_true", help="run without MAC keys (see send --insecure)")
        _output_options(srv, "one JSON line per model served and per round")

    if only in (None, "fetch"):
        fch = sub.add_parser(
            "fetch", formatter_class=_Help, help="fetch a model by its id or Hugging Face name from whoever serves it",
            description="Ask the controller who offers MODEL_ID, join that server's group and receive the model "
                        "into --out (resuming across rounds); exit 0 only when verified. An hf://ORG/NAME[@REVISION] "
                        "name is received into the Hugging Face cache instead (blobs, then the snapshot, then the "
                        "ref), where loaders find it offline.",
            epilog=_examples("modelcast fetch blake3:5f1c... --controller http://10.0.0.254:8080 "
                             "--token-file /etc/modelcast/token --out /dev/shm/llama-3-70b"))
        fch.add_argument("model_id", metavar="MODEL_ID",
                         help="the content id (blake3:<hex>) the server printed, or hf://ORG/NAME[@REVISION] (a branch, "
                              "tag or commit; default main)")
        _controller_options(fch, True)
        _host_options(fch)
        fch.add_argument("--out", metavar="PATH", help="output file or directory (written as recv --out does); "
                                                       "with a content id")
        fch.add_argument("--hf-cache", metavar="DIR",
                         help="with an hf:// name: the Hugging Face cache it goes into (default: $HF_HUB_CACHE, else "
                              "$HF_HOME/hub, else ~/.cache/huggingface/hub)")
        fch.add_argument("--timeout", type=float, default=ReceiveOptions.timeout, metavar="SECONDS",
                         help="per attempt: give up after this long without the server")
        fch.add_argument("--patience", type=float, default=300.0, metavar="SECONDS",
                         help="keep asking (waiting for an offer, resuming after each round) this long in all")
        fch.add_argument("--no-gro", action="store_true", help="do not ask the kernel for UDP GRO")
        fch.add_argument("--on-complete", metavar="CMD", help="run CMD OUT after verification")
        fch.add_argument("--insecure", action="store_true", help="run without MAC keys (see recv --insecure)")
        _output_options(fch, "print one JSON summary object on stdout", metrics=False)

    if only in (None, "catalog"):
        cat = sub.add_parser(
            "catalog", formatter_class=_Help, help="publish a model directory in parts, or check a catalog and pick parts",
            description="With DIR: split it into parts, write the catalog (--write) and print the model id and each "
                        "part's id. With --check: verify a catalog against its model id and list the parts to take.",
            epilog=_examples("modelcast catalog ./mixtral/ --part 'experts/0/*' --part 'experts/1/*' "
                             "--write mixtral.catalog"))
        cat.add_argument("path", nargs="?", help="the model directory to split into parts")
        cat.add_argument("--part", action="append", metavar="GLOB",
                         help="files matching GLOB form one part (repeatable); every other file is a part of its own")
        cat.add_argument("--chunk-size", type=int, default=SendOptions.chunk_size, metavar="BYTES",
                         help="the chunk size the parts will be sent with (part ids depend on it)")
        cat.add_argument("--write", metavar="FILE", help="write the catalog (whose digest is the model id) to FILE")
        cat.add_argument("--check", metavar="FILE", help="check this catalog against --expect and list the parts")
        cat.add_argument("--expect", metavar="MODEL_ID", help="the model id (blake3:<hex>) the catalog must hash to")
        cat.add_argument("--include", action="append", metavar="GLOB",
                         help="with --check: only the parts whose name or files match GLOB (repeatable)")
        cat.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    if only in (None, "ls"):
        ls = sub.add_parser(
            "ls", formatter_class=_Help, help="list the controller's groups, their receivers' states, and offers",
            description="The controller's groups (model, source, address, state, each receiver's state, the "
                        "announced session) and the models offered by modelcast serve.",
            epilog=_examples("modelcast ls --controller http://10.0.0.254:8080 --token-file /etc/modelcast/token"))
        _controller_options(ls, True)
        ls.add_argument("--model", help="only the groups and offers of this model")
        ls.add_argument("--source", metavar="IP", help="only the groups and offers of this source")
        ls.add_argument("--json", action="store_true", help='print {"groups": [...], "offers": [...]} (no keys)')

    if only in (None, "keygen"):
        key = sub.add_parser(
            "keygen", formatter_class=_Help, help="write a new shared secret for --key-file",
            description="Write 32 random bytes, as hex, to PATH (mode 0600): the --key-file of a sender and its "
                        "receivers on a network without a controller.",
            epilog=_examples("modelcast keygen /etc/modelcast/secret"))
        key.add_argument("path", metavar="PATH", help="the key file to create")
        key.add_argument("--force", action="store_true", help="replace PATH if it exists")
        key.add_argument("--quiet", action="store_true", help="print nothing but errors")
        key.set_defaults(json=False)
    if only in (None, "trace"):
        treeview.add_parser(sub, _Help, _controller_options, _examples)
    return parser


class _Version(argparse.Action):
    """--version, the package's version looked up only when asked: importlib.metadata
    costs every agent process ~15 ms of start-up CPU."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: Optional[str] = None) -> None:
        print(f"{parser.prog} {_version()}")
        parser.exit()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("modelcast")
    except PackageNotFoundError:
        return "(not installed)"


COMMANDS = {"send": cmd_send, "recv": cmd_recv, "serve": cmd_serve, "fetch": cmd_fetch, "catalog": cmd_catalog,
            "ls": cmd_ls, "keygen": cmd_keygen, "trace": lambda args: treeview.cmd_trace(args, _token(args))}


def main(argv: Optional[Sequence[str]] = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(given[0] if given and given[0] in COMMANDS else None).parse_args(given)
    try:
        return COMMANDS[args.command](args)
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
