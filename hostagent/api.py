"""The host agent as a library: one call sends a file to a group, one call receives it.

What ``modelcast send`` / ``modelcast recv`` do, callable in-process (e.g. by an
inference server that wants its weights without shelling out)::

    result = hostagent.receive("/dev/shm/llama.bin", hostagent.ReceiveOptions(
        controller="http://10.0.0.254:8080", model="llama", source="10.0.0.1"))
    if result.ok:
        load(result.out)

Both calls block until the transfer ends. They report through callbacks instead of
printing: ``on_event`` gets the protocol's events (``hostagent.events``) and the
orchestration events below, ``on_progress`` a progress snapshot at most every
``PROGRESS_INTERVAL`` seconds. Anything that stops a transfer from starting raises
``TransferError`` or ``ControllerError`` (``str()`` is one printable line; socket
failures surface as ``OSError``); a transfer that ran returns its result, ``ok`` or not.
"""

from __future__ import annotations

import os
import random
import resource
import socket
import threading
import time
import dataclasses
from dataclasses import asdict, dataclass, field, fields
from typing import IO, TYPE_CHECKING, Any, Callable, Optional, Union

from .common import RESUME_INTERVAL, Stats
from .control import ControllerClient, ControllerError, describe_answer, group_endpoint, session_key
from .events import (
    Failed, FileComplete, ManifestReceived, ReceiverCompleted, ReceiverEvent, ReceiverFailed, SenderEvent,
    StreamFinished, TransferFinished,
)
import hostagent.fastrun as fastrun
from . import tree
from .dirs import DirSource, PathSink
from .manifest import cache_dir, cached_digests
from .net import (
    PROBE_GROUP, AddressUnknown, FileSink, FileSource, gso_burst_bytes, gso_segments, own_address, parse_group,
    parse_ipv4, path_mtu, receiver_sockets, run, sender_socket,
)
if TYPE_CHECKING:
    from .receiver import Receiver
from .sender import Sender, SenderConfig, build_manifest_pages, check_chunk_count, file_digests
from .wire import DATA_HEADER_LEN, MAC_LEN, Manifest, derive_key

__all__ = [
    "ControllerError", "GroupAssigned", "GroupJoined", "HookResult", "LeaveFailed", "MetricsServing",
    "OtherContentAnnounced",
    "ReceiveOptions", "ReceiveProgress", "ReceiveResult", "ReceiveStarted", "ReceiverReport", "SendOptions",
    "SendProgress", "SendResult", "SendStarted", "TransferError", "Unauthenticated", "receive", "send", "send_source",
]

_ANY = "0.0.0.0"
PROGRESS_INTERVAL = 0.1  # seconds between on_progress calls
# With a controller, the sender holds its data (manifests only) until the expected
# receivers said HELLO, at most this long: they pick the announced key up as soon as the
# controller has it (a held GET, _WATCH_WAIT), and data sent before that would have to
# be repaired.
_START_WAIT = 1.0
_WATCH_WAIT = 5.0  # a GET of the group is held this long by the controller for a change
_WATCH_POLL = 0.1  # between GETs to a controller that holds none (older), or after an error


class TransferError(Exception):
    """A transfer could not start (bad option, unreadable file, port in use...);
    ``str()`` is one printable line."""


# ----------------------------------------------------------------------------- options


@dataclass(kw_only=True)
class _Common:
    """Where the group comes from and how to reach it: exactly one of ``group``
    ("ADDR:PORT") and ``controller`` (base URL; it assigns the group, supplies the MAC
    key and installs the tree)."""

    group: Optional[str] = None
    controller: Optional[str] = None
    token: Optional[str] = None  # controller bearer token (default: $MODELCAST_TOKEN)
    model: Optional[str] = None  # model name registered with the controller
    ip: Optional[str] = None  # this host's IPv4 as the controller knows it (default: routing table)
    request_timeout: float = 10.0  # seconds per controller request
    interface: str = _ANY  # local IPv4 address of the interface to use
    secret: Optional[bytes] = None  # shared secret: every datagram is MAC'd (overrides the controller key)
    # Run without a MAC key (no secret, and no key from the controller): refused unless
    # set, because then anyone on the path can forge any datagram (docs/security.md).
    insecure: bool = False
    metrics_port: Optional[int] = None  # serve Prometheus metrics here during the transfer
    metrics_addr: str = "127.0.0.1"


@dataclass(kw_only=True)
class SendOptions(_Common):
    """How to send (defaults are the CLI's)."""

    receivers: Optional[int] = None  # expected receivers: ok once all verified
    receiver_ips: tuple[str, ...] = ()  # receivers to register with the controller
    wait_timeout: float = 60.0  # seconds to wait for the controller's tree
    poll: float = 0.5  # controller polling interval, seconds
    rate_mbit: float = 1000.0  # rate cap (the sender starts at 70%)
    chunk_size: int = 1024 * 1024
    fec_k: int = 64  # datagrams per FEC parity block (0: off)
    fec_overhead: float = 0.0  # proactive parity per data datagram (needs fec_k)
    payload_size: Optional[int] = None  # data bytes per datagram (None: fill one frame of the route's MTU)
    ttl: int = 1
    gso: bool = True  # batch paced datagrams with UDP GSO (falls back by itself where refused)
    timeout: float = 60.0  # catch-up bound: receivers not verified this long after the stream fail as stragglers
    # Loss policy (docs/agent.md, "Loss is not congestion"): receivers' loss never cuts the rate
    # below min_rate_mbit (None: 5% of the cap); loss counts as congestion only when more
    # than congestion_quorum of the receivers report it at once; repairs get at most
    # repair_share of the sends while the stream runs.
    min_rate_mbit: Optional[float] = None
    congestion_quorum: float = SenderConfig.congestion_quorum
    repair_share: float = SenderConfig.repair_share
    manifest_cache: bool = True  # reuse the file's digests while it is unchanged (hostagent.manifest)
    lanes: int = 1  # stripe the file over this many sender processes, group ports PORT..PORT+lanes-1 (hostagent.lanes)


@dataclass(kw_only=True)
class ReceiveOptions(_Common):
    """How to receive (defaults are the CLI's); ``source`` is the sender's IPv4 address
    (the join is source-specific)."""

    source: str
    timeout: float = 30.0  # give up after this long without the sender
    gro: bool = True  # ask the kernel for UDP GRO
    # A crash loses at most this long of progress: the resume record (data fdatasynced
    # first) is written at most this long after chunks verify.
    resume_interval: float = RESUME_INTERVAL
    on_complete: Optional[str] = None  # command run as `CMD OUT_PATH` after verification
    # Accept only the model with this content id (``blake3:<hex>``, printed by send): any
    # other manifest is refused, whoever MAC'd it. With a controller it also names the
    # group when ``model`` is not given.
    expect: Optional[str] = None
    hook_stdout: Optional[IO[Any]] = None  # where that command's stdout goes (None: ours)
    # time.monotonic() by which the transfer gives up, whatever arrives (None: no bound;
    # ``timeout`` bounds only silence): a fetch attempt's hard bound (hostagent.serve)
    deadline: Optional[float] = None
    lanes: int = 1  # as the sender's --lanes: one receiver process per lane (hostagent.lanes)


# ----------------------------------------------------------------------------- events


@dataclass(frozen=True)
class GroupAssigned:
    """Send via controller: the group exists; now waiting for the tree (and receivers),
    who need ``content_id`` (whole) to join a group named by it."""

    group_id: Optional[int]
    model: str
    group: tuple[str, int]
    receivers: Optional[int]
    content_id: str = ""


@dataclass(frozen=True)
class GroupJoined:
    """Receive via controller: this host joined the group's tree."""

    group_id: int
    group: tuple[str, int]
    ip: str


@dataclass(frozen=True)
class SendStarted:
    path: str
    size: int
    group: tuple[str, int]
    local: tuple[str, int]  # the sender socket: receivers' NACKs come back here
    content_id: str = ""  # blake3:<hex> (hostagent.tree): what receivers pass to --expect
    files: int = 1  # files in it (a directory: more than one, or one below a directory)


@dataclass(frozen=True)
class ReceiveStarted:
    out: str
    group: tuple[str, int]


@dataclass(frozen=True)
class MetricsServing:
    addr: str
    port: int


@dataclass(frozen=True)
class Unauthenticated:
    """``insecure`` and no key: this transfer's datagrams carry no MAC (``reason`` says why)."""

    reason: str


@dataclass(frozen=True)
class LeaveFailed:
    """Leaving the group after the transfer failed; the transfer's result stands."""

    group_id: int
    error: str


@dataclass(frozen=True)
class OtherContentAnnounced:
    """Receive via controller with ``expect``: the source announced a transfer of
    another content id (on its own group) while this receiver waits for ``expected``."""

    expected: str
    offered: str
    source: str
    group_id: int

    def text(self) -> str:
        return (f"content id mismatch? {self.source} announces {self.offered} (group {self.group_id}), "
                f"this receiver expects {self.expected}")


@dataclass(frozen=True)
class SendProgress:
    sent: int  # file bytes streamed once (first pass)
    total: int
    repairs: int  # repair datagrams sent, unicast + multicast
    verified: int  # receivers that verified the file
    expected: int  # receivers expected (or seen, when none were)


@dataclass(frozen=True)
class ReceiveProgress:
    received: int  # file bytes held
    total: int
    repairs: int  # repair datagrams received
    nacks: int  # NACK datagrams sent


Event = Union[SenderEvent, ReceiverEvent, GroupAssigned, GroupJoined, SendStarted, ReceiveStarted,
              MetricsServing, LeaveFailed, Unauthenticated, OtherContentAnnounced]
OnEvent = Callable[[Event], None]

# ----------------------------------------------------------------------------- results


@dataclass
class ReceiverReport:
    """One receiver as the sender saw it."""

    id: str  # 16 hex digits
    addr: str
    ok: bool
    error: Optional[str]  # why not ok: its failure reason, or "incomplete"
    loss: float = 0.0  # first-transmission loss it reported last (0..1)


@dataclass
class SendResult:
    """What ``modelcast send --json`` prints (``summary()``), plus the protocol's
    final event and, when not ``ok``, the reason in one line (``error``)."""

    ok: bool
    file: str
    bytes: int
    file_digest: str  # BLAKE3 hex
    group: str  # "ADDR:PORT"
    group_id: Optional[int]  # the controller's group id (None without a controller)
    seconds: float
    goodput_mbit: float
    datagrams_sent: int
    bytes_sent: int
    repair_bytes: int
    repair_bytes_unicast: int
    repair_bytes_multicast: int
    nacks: int
    rate_decreases: int
    lowest_rate_mbit: Optional[float]  # the rate after the deepest cut (None: never cut)
    loss_verdicts: dict[str, int]  # closed NACK windows: none / local (repaired) / group / link (congestion)
    receivers: list[ReceiverReport]
    stream_s: Optional[float]  # when the first pass was out, seconds from the start
    completed_s: list[float]  # when each receiver verified, seconds from the start
    final_rate_mbit: float
    repairs_parity: int
    repairs_unicast: int
    repairs_multicast: int
    expected_receivers: Optional[int]
    never_seen: int  # expected receivers never heard from
    authenticated: bool
    gso: bool
    gso_datagrams: int
    send_buffer_drops: int
    dropped: dict[str, int]  # datagrams dropped, by reason
    peak_rss_mb: float  # of this process
    cpu_s: float  # of this process
    finished: TransferFinished = field(metadata={"summary": False})
    error: Optional[str] = field(default=None, metadata={"summary": False})
    lanes: int = 1  # sessions the file was striped over (hostagent.lanes)
    content_id: str = ""  # blake3:<hex> of the manifest (hostagent.tree)
    files: int = 1
    # time.monotonic() (one clock for every process of the host, namespaces included) at
    # the moments a start or an end costs: the socket open and the sender built
    # ("ready"), the first data datagram handed to the kernel ("first_data"), the first
    # pass out ("stream_end"), every expected receiver verified ("verified"), the
    # summary made ("result"). A bench takes them against the process's spawn and exit.
    clock: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict:
        """The JSON summary object."""
        return _summary(self)


@dataclass
class HookResult:
    """The ``on_complete`` command's outcome (127 if it could not be started)."""

    command: list[str]
    exit_status: int
    error: Optional[str]
    seconds: float


@dataclass
class ReceiveResult:
    """What ``modelcast recv --json`` prints (``summary()``)."""

    ok: bool  # verified, and the on_complete command (if any) exited 0
    digest_ok: bool
    out: str
    bytes: int
    receiver_id: str
    file_digest: Optional[str]  # BLAKE3 hex, when verified
    error: Optional[str]  # why not verified
    group: str
    seconds: float
    goodput_mbit: float  # first datagram to verification
    datagrams_received: int
    bytes_received: int
    nacks: int
    repairs_received: int
    duplicates: int
    resumed_chunks: int  # chunks a resume record claimed that re-hashed correctly
    corrupt_chunks: int  # chunks that failed their digest (received, or claimed by the record) and were re-fetched
    resume_records: int  # resume records made durable (fdatasync of the data, then the record)
    record_sync_s: float  # time those took, in the writer thread (not the receive loop)
    authenticated: bool
    verify_s: Optional[float]
    nacks_suppressed: int
    parity_received: int
    fec_recovered: int
    nack_seqs: int
    gro: bool
    gro_batches: int
    coalesced: int  # runs joined from more than one read (GRO super-packets or datagrams read one by one)
    dropped: dict[str, int]
    peak_rss_mb: float  # of this process
    cpu_s: float  # of this process
    on_complete: Optional[HookResult]
    lanes: int = 1  # sessions the file was striped over (hostagent.lanes)
    content_id: Optional[str] = None  # blake3:<hex> of the manifest received
    files: int = 0  # files written (1 for a single file)
    native_rx: bool = fastrun.NATIVE  # the clean-stream path ran in C (hostagent.fastrun)
    early_held: int = 0  # DATA held because it came before the first manifest page (then checked and taken)
    # time.monotonic() when the sockets were joined and the receiver built ("ready"), the
    # transfer's first datagram came ("first"), the file was verified ("verified"), the
    # sender acknowledged it and the loop ended ("acked") and the summary was made
    # ("result"): SendResult.clock's, from this side.
    clock: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict:
        """The JSON summary object."""
        out = _summary(self)
        if out["on_complete"] is not None and out["on_complete"]["error"] is None:
            del out["on_complete"]["error"]
        return out


def _summary(result: Union[SendResult, ReceiveResult]) -> dict:
    out = asdict(result)
    for spec in fields(result):
        if not spec.metadata.get("summary", True):
            del out[spec.name]
    return out


# ----------------------------------------------------------------------------- send


def send(
    path: str,
    options: Optional[SendOptions] = None,
    *,
    on_event: Optional[OnEvent] = None,
    on_progress: Optional[Callable[[SendProgress], None]] = None,
) -> SendResult:
    """Send ``path`` to the group until every expected receiver verified it (or the
    repair phase gave up); ``result.ok`` says which."""
    opts = options or SendOptions()
    if not os.path.isfile(path) and not os.path.isdir(path):
        raise TransferError(f"no such file or directory: {path}")
    _check_group_source(opts)
    interface = _ipv4(opts.interface)
    if opts.lanes != 1:
        if os.path.isdir(path):
            raise TransferError("--lanes sends a single file; a directory goes in one session")
        if not opts.controller:  # refused before any lane starts
            _require_key(_derive(opts.secret), opts, _ignore, "--group without --key-file")
        return _send_lanes(path, opts, interface, on_event or _ignore, on_progress)
    try:
        source: FileSource | DirSource = DirSource(path) if os.path.isdir(path) else FileSource(path)
    except ValueError as exc:
        raise TransferError(str(exc)) from None
    try:
        return _send(path, opts, source, interface, on_event or _ignore, on_progress)
    finally:
        source.close()


Admit = Callable[[frozenset[str]], frozenset[str]]  # the group's receivers -> those this session serves


def send_source(path: str, source: FileSource | DirSource, digests: tuple[bytes, bytes], options: SendOptions, *,
                admit: Optional[Admit] = None, done: Optional[Callable[[], bool]] = None,
                on_event: Optional[OnEvent] = None) -> SendResult:
    """One session of an open ``source`` whose ``digests`` (chunk digests, whole-content
    digest: ``sender.file_digests``) are known -- ``modelcast serve`` hashes a model once
    and sends it in many rounds. With a controller, ``admit`` picks which of the group's
    receivers this session serves (the others are not repaired: they wait for the next).
    ``done`` (checked every loop turn: make it cheap) True ends the session at once, even
    mid-stream."""
    _check_group_source(options)
    return _send(path, options, source, _ipv4(options.interface), on_event or _ignore, None,
                 digests=digests, admit=admit, done=done)


def _send(path: str, opts: SendOptions, source: FileSource | DirSource, interface: str, emit: OnEvent,
          on_progress: Optional[Callable[[SendProgress], None]], lane: Optional[Any] = None,
          digests: Optional[tuple[bytes, bytes]] = None, admit: Optional[Admit] = None,
          done: Optional[Callable[[], bool]] = None) -> SendResult:
    """One session; ``lane`` (a ``hostagent.lanes.Lane``): the slice ``source`` reads,
    sent as that lane with the whole file's digests cut to it; ``digests``: known ones
    (not read again); ``admit``, ``done``: see ``send_source``."""
    payload_size, max_datagram = _datagram_sizes(opts, interface)
    config = SenderConfig(
        chunk_size=opts.chunk_size, payload_size=payload_size, max_datagram=max_datagram,
        rate_bps=opts.rate_mbit * 1e6, fec_k=opts.fec_k, fec_overhead=opts.fec_overhead,
        expected_receivers=opts.receivers, key=_derive(opts.secret),
        name=os.path.basename(os.path.normpath(path))[:100], linger_timeout=opts.timeout,
        min_rate_bps=None if opts.min_rate_mbit is None else opts.min_rate_mbit * 1e6,
        congestion_quorum=opts.congestion_quorum, repair_share=opts.repair_share,
        session_id=random.SystemRandom().getrandbits(64),
        burst_bytes=gso_burst_bytes(opts.rate_mbit * 1e6) if opts.gso else SenderConfig.burst_bytes,
        send_quantum=gso_segments(max_datagram) if opts.gso else 1,
    )
    try:
        config.validate()
        check_chunk_count(source.size, config.chunk_size)  # before the file is read
    except ValueError as exc:
        raise TransferError(str(exc)) from None
    if not opts.controller:  # (with one, the key comes with the group)
        _require_key(config.key, opts, emit, "--group without --key-file")
    # The manifest needs the content's digests (they also name the model): one read of
    # the file, or of the directory's files, the first time, none while it is unchanged
    # (a directory: while each of the files sent is).
    entries = source.entries_blob if isinstance(source, DirSource) else b""
    if lane is not None:
        config.lane, digests = (lane.index, lane.count, lane.offset), lane.digests
    elif digests is None:
        cache = cache_dir() if opts.manifest_cache else None
        files = [e.path for e in source.space.entries] if isinstance(source, DirSource) else None
        digests, _ = cached_digests(path, config.chunk_size, lambda: file_digests(source, config.chunk_size), cache,
                                    files)
    pages = build_manifest_pages(source, config, config.session_id, digests, entries,  # type: ignore[arg-type]
                                 whole=lane.whole if lane is not None else None)
    group_id: Optional[int] = None
    announced = False
    try:
        if opts.controller:
            client = _client(opts)
            src_ip = _ipv4(opts.ip or _own_address(interface))
            model = opts.model or tree.manifest_id(pages)
            info = client.create_group(model, src_ip, list(opts.receiver_ips) or None)
            group = group_endpoint(info)
            group_id = info.get("id")
            # A fresh key for this transfer, announced with its session and file digest:
            # receivers accept nothing else, so an earlier transfer cannot be replayed to them.
            info = client.rekey(int(info["id"]), f"{config.session_id:016x}", pages[0].file_digest.hex())
            announced = True
            config.start_wait = _START_WAIT
            if config.key is None:
                config.key = session_key(info)
            _require_key(config.key, opts, emit, "the controller gave no session key (no --token?)")
            emit(GroupAssigned(group_id, model, group, opts.receivers, tree.manifest_id(pages)))
            info = client.wait_installed(info, opts.receivers, opts.wait_timeout, opts.poll)
            # Only the group's receivers count (docs/security.md, "Attackers on the data path").
            config.allowed_receivers = frozenset(info.get("receivers") or ()) | frozenset(opts.receiver_ips)
            if admit is not None:
                config.allowed_receivers = admit(config.allowed_receivers)
            if interface == _ANY:
                interface = src_ip  # the tree is rooted at this address: send from it
        else:
            group = _group(opts.group)
        return _send_on(path, opts, source, config, pages, group, group_id, interface, emit, on_progress, admit,
                        done)
    finally:
        if announced:
            _retire(opts, int(group_id), emit)  # type: ignore[arg-type]


def _retire(opts: SendOptions, group_id: int, emit: OnEvent) -> None:
    """The transfer is over: a bare rekey clears its announcement and retires its key."""
    try:
        _client(opts).rekey(group_id)
    except ControllerError as exc:
        emit(LeaveFailed(group_id, f"retiring the session key: {exc}"))


def _send_on(path: str, opts: SendOptions, source: FileSource | DirSource, config: SenderConfig, pages: list,
             group: tuple[str, int], group_id: Optional[int], interface: str, emit: OnEvent,
             on_progress: Optional[Callable[[SendProgress], None]], admit: Optional[Admit] = None,
             done: Optional[Callable[[], bool]] = None) -> SendResult:
    """The sender's socket and loop, once the group and its key are settled."""
    sock = sender_socket(interface, opts.ttl)
    try:
        started = time.monotonic()
        sender = Sender(source, config, started, manifest=pages)
        emit(SendStarted(path, source.size, group, sock.getsockname(), tree.manifest_id(pages), _files(pages[0])))
        metrics = _serve_metrics(opts, "sender", lambda: sender.stats, lambda: (_sent_bytes(sender), source.size), emit)
        try:
            lister = _GroupWatcher(_client(opts), group_id, opts.poll) if opts.controller else None
            try:
                return _stream(path, opts, sender, sock, group, group_id, started, emit, on_progress, lister, admit,
                               done)
            finally:
                if lister is not None:
                    lister.stop()
        finally:
            _stop(metrics)
    finally:
        sock.close()


def _stream(path: str, opts: SendOptions, sender: Sender, sock: socket.socket, group: tuple[str, int],
            group_id: Optional[int], started: float, emit: OnEvent,
            on_progress: Optional[Callable[[SendProgress], None]],
            lister: Optional[_GroupWatcher] = None, admit: Optional[Admit] = None,
            done: Optional[Callable[[], bool]] = None) -> SendResult:
    """Run the sender's loop to its TransferFinished and summarise."""
    reasons: dict[int, str] = {}
    timeline: dict[str, Any] = {"completed_s": []}
    clock = {"ready": started}
    throttle = _Throttle()

    def on_event(event: object) -> None:
        if isinstance(event, StreamFinished):
            clock["stream_end"] = time.monotonic()
            timeline["stream_s"] = round(clock["stream_end"] - started, 3)
        elif isinstance(event, ReceiverCompleted):
            timeline["completed_s"].append(round(time.monotonic() - started, 3))
        elif isinstance(event, ReceiverFailed):
            reasons[event.receiver_id] = event.reason
        elif isinstance(event, TransferFinished):
            timeline["finished"] = event
            clock["verified"] = time.monotonic()
        emit(event)  # type: ignore[arg-type]

    def should_stop() -> bool:
        if "first_data" not in clock and sender.stats.data_sent:  # (sent in this loop turn)
            clock["first_data"] = time.monotonic()
        if done is not None and not sender.finished and done():
            sender.end_now(time.monotonic())
        if lister is not None and (g := lister.changed()) is not None:
            hosts = frozenset(g.get("receivers") or ())
            if admit is not None:
                hosts = admit(hosts)
                sender.set_expected_receivers(len(hosts))  # the session waits for every host admitted
            sender.set_allowed_receivers(hosts | (sender.allowed_receivers or frozenset()))
        if on_progress is not None and throttle.due():
            stats = sender.stats
            want = opts.receivers if opts.receivers is not None else len(sender.peers)
            on_progress(SendProgress(_sent_bytes(sender), sender.layout.file_size,
                                     stats.repairs_unicast + stats.repairs_multicast, len(sender.completed), want))
        return "finished" in timeline

    loop = run(sender, sock, [sock], group, on_event, should_stop, gso=opts.gso)
    finished: TransferFinished = timeline["finished"]
    stats = sender.stats
    size = sender.layout.file_size
    elapsed = time.monotonic() - started
    receivers = [
        ReceiverReport(f"{p.receiver_id:016x}", p.addr[0] if isinstance(p.addr, tuple) else str(p.addr), p.completed,
                       None if p.completed else reasons.get(p.receiver_id, "incomplete"), round(p.loss, 3))
        for p in sorted(sender.peers.values(), key=lambda p: p.receiver_id)
    ]
    return SendResult(
        ok=finished.ok, file=path, bytes=size, file_digest=sender.file_digest.hex(),
        group=f"{group[0]}:{group[1]}", group_id=group_id,
        seconds=round(elapsed, 3), goodput_mbit=_goodput(size, elapsed),
        datagrams_sent=stats.datagrams_out, bytes_sent=stats.bytes_out,
        repair_bytes=stats.repair_bytes, repair_bytes_unicast=stats.repair_bytes_unicast,
        repair_bytes_multicast=stats.repair_bytes_multicast, nacks=stats.nacks_received,
        rate_decreases=stats.rate_decreases, receivers=receivers,
        lowest_rate_mbit=None if sender.lowest_rate is None else round(sender.lowest_rate / 1e6, 1),
        loss_verdicts=sender.loss_verdicts,
        stream_s=timeline.get("stream_s"), completed_s=timeline["completed_s"],
        final_rate_mbit=round(sender.rate / 1e6, 1), repairs_parity=stats.repairs_parity,
        repairs_unicast=stats.repairs_unicast, repairs_multicast=stats.repairs_multicast,
        expected_receivers=opts.receivers, never_seen=finished.missing,
        authenticated=sender.config.key is not None, gso=loop.gso, gso_datagrams=loop.gso_datagrams,
        send_buffer_drops=loop.send_drops, dropped=dict(stats.drops), peak_rss_mb=_peak_rss_mb(), cpu_s=_cpu_s(),
        finished=finished, error=None if finished.ok else _send_failure(finished, opts.receivers),
        content_id=tree.manifest_id(sender.pages), files=_files(sender.pages[0]),
        clock={**clock, "result": time.monotonic()},
    )


def _files(page: Manifest) -> int:
    """Files a manifest describes (its entry list is checked by then, or our own)."""
    return len(tree.decode_entries(page.entries)) if page.entries else 1


class _GroupWatcher:
    """Follows the group on the controller in a thread, so the loop never blocks on HTTP:
    the sender learns late joiners (on the list before their first datagram), a receiver
    a transfer announced after it joined. Each GET is held by the controller until the
    group changes (``watch_group``); a controller that holds none is polled every
    ``poll`` s."""

    def __init__(self, client: ControllerClient, group_id: Optional[int], poll: float,
                 wait: float = _WATCH_WAIT) -> None:
        self._group: Optional[dict] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(client, group_id, poll, wait), daemon=True)
        self._thread.start()

    def _run(self, client: ControllerClient, group_id: Optional[int], poll: float, wait: float) -> None:
        etag = None
        while group_id is not None and not self._stop.is_set():
            try:
                group, etag = client.watch_group(int(group_id), etag, wait)
            except ControllerError:
                group = etag = None  # (restarting): keep what we have
            if group is not None and not self._stop.is_set():
                self._group = group
            if etag is None and self._stop.wait(poll):
                return

    def changed(self) -> Optional[dict]:
        """The latest answer, once per answer (None: nothing new)."""
        group, self._group = self._group, None
        return group

    def stop(self) -> None:
        self._stop.set()


def _datagram_sizes(opts: SendOptions, interface: str) -> tuple[int, int]:
    """(payload bytes, max datagram): ``payload_size`` or, by default, what fills one
    frame on the multicast route (the group is not known yet with a controller: any SSM
    address takes the same multicast route)."""
    probe = _group(opts.group)[0] if opts.group else PROBE_GROUP
    # Capped at a 9000-byte jumbo frame: loopback's 64 KiB "MTU" is no wire's.
    mtu = min(path_mtu(probe, 9, interface), 9000)
    max_datagram = mtu - 28  # IPv4 + UDP headers
    if opts.payload_size is not None:
        return opts.payload_size, max(max_datagram, opts.payload_size + DATA_HEADER_LEN + MAC_LEN)
    return max_datagram - DATA_HEADER_LEN - MAC_LEN, max_datagram


def _sent_bytes(sender: Sender) -> int:
    """First-pass progress in file bytes (the stream position)."""
    layout = sender.layout
    if layout.total_seq == 0:
        return 0
    return min(layout.file_size, layout.file_size * sender.stream_position // layout.total_seq)


def _send_failure(finished: TransferFinished, expected: Optional[int]) -> str:
    if expected is not None and len(finished.completed) < expected:
        return f"only {len(finished.completed)} of {expected} receivers verified the file"
    if finished.failed:
        return f"{len(finished.failed)} receivers failed"
    return "no receiver verified the file"


# ----------------------------------------------------------------------------- receive


def receive(
    out: str,
    options: ReceiveOptions,
    *,
    on_event: Optional[OnEvent] = None,
    on_progress: Optional[Callable[[ReceiveProgress], None]] = None,
) -> ReceiveResult:
    """Receive the group's file into ``out`` (renamed there once verified, resumable: a resume
    record sits next to it until the file is verified). With a controller, join the
    group's tree first and leave it afterwards, whatever happened."""
    emit = on_event or _ignore
    _check_group_source(options)
    source_ip = _ipv4(options.source)
    interface = _ipv4(options.interface)
    out_dir = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(out_dir) or not os.access(out_dir, os.W_OK):
        raise TransferError(f"cannot write output in {out_dir}")
    key = _derive(options.secret)
    if options.expect is not None:
        try:
            tree.parse_content_id(options.expect)
        except ValueError as exc:
            raise TransferError(str(exc)) from None
    if options.lanes != 1:
        if not options.controller:  # refused before any lane starts
            _require_key(key, options, _ignore, "--group without --key-file")
        return _receive_lanes(out, options, source_ip, interface, key, emit, on_progress)
    if not options.controller:
        _require_key(key, options, emit, "--group without --key-file")
        return _receive(out, options, _group(options.group), source_ip, interface, key, emit, on_progress)
    model = options.model or options.expect  # a group may be named by the content id
    if not model:
        raise TransferError("model is required with a controller (or expect: a content id names the group)")
    if options.expect is None:
        _warn_unpinned(model)
    client = _client(options)
    my_ip = _ipv4(options.ip or _own_address(interface, source_ip))
    info = client.create_group(model, source_ip)
    group = group_endpoint(info)
    info = client.join(int(info["id"]), my_ip)
    gid = int(info["id"])
    try:
        if (info.get("receivers") or {}).get(my_ip) == "unreachable":
            raise TransferError(f"controller cannot reach this host ({my_ip}) in group {gid}")
        emit(GroupJoined(gid, group, my_ip))
        return _receive(out, options, group, source_ip, interface, key, emit, on_progress, (client, gid, info))
    finally:
        try:
            client.leave(gid, my_ip)
        except ControllerError as exc:
            emit(LeaveFailed(gid, str(exc)))


@dataclass(frozen=True)
class _Expected:
    """What a receiver accepts: datagrams MAC'd with ``key``, of ``session`` (None: the
    first whose manifest arrives) and a manifest of the file ``file_digest`` (None: any)."""

    key: Optional[bytes]
    session: Optional[int] = None
    file_digest: Optional[bytes] = None


def _announced(group: dict, secret_key: Optional[bytes]) -> Optional[_Expected]:
    """The transfer a controller answer announces with its key (None: none announced)."""
    text = group.get("session")
    if not text:
        return None
    try:
        session = int(text, 16)
        digest = bytes.fromhex(group["file_digest"]) if group.get("file_digest") else None
    except (TypeError, ValueError):
        raise ControllerError("controller announced a malformed session or file digest") from None
    return _Expected(secret_key if secret_key is not None else session_key(group), session, digest)


def _await_announced(client: ControllerClient, gid: int, joined: dict, secret_key: Optional[bytes],
                     timeout: float, expect: Optional[str] = None, emit: Optional[OnEvent] = None) -> _Expected:
    """The transfer the group's source announced (its rekey): at once when the join
    answered it, else as soon as the source announces one (the socket is already open,
    so datagrams sent meanwhile wait in its buffer). With ``expect`` (the content id
    that named the group), a source that announces another content id meanwhile is
    said (``OtherContentAnnounced``, and in the timeout's message): a mistyped
    ``--expect`` waits on a group nobody sends to."""
    first = _announced(joined, secret_key)
    if first is not None:
        return first
    deadline = time.monotonic() + timeout
    last: Any = joined
    etag = None
    other: Optional[OtherContentAnnounced] = None
    while True:
        if expect is not None and other is None and joined.get("model") == expect:
            other = _other_content(client, str(joined.get("source")), expect)
            if other is not None and emit is not None:
                emit(other)
        try:
            group, etag = client.watch_group(gid, etag, min(_WATCH_WAIT, max(0.0, deadline - time.monotonic())))
        except ControllerError as exc:  # (restarting, or failing over): not yet
            group, etag, last = None, None, f"(unreachable: {exc})"
        if group is not None:
            last = group
            found = _announced(group, secret_key)
            if found is not None:
                return found
        if time.monotonic() >= deadline:
            hint = f"; {other.text()}" if other is not None else ""
            raise ControllerError(f"timed out after {timeout:g}s waiting for the source of group {gid} "
                                  f"to announce a transfer (last answer: {describe_answer(last)}){hint}")
        if etag is None:
            time.sleep(_WATCH_POLL)


def _other_content(client: ControllerClient, source: str, expect: str) -> Optional[OtherContentAnnounced]:
    """A transfer ``source`` announced on a group named by another content id, while it
    offers no ``expect`` (``modelcast serve`` offers every model it serves, one round at
    a time); None when there is none, or the controller cannot say."""
    try:
        groups = client.list_groups(source=source)
        if groups and any(o.get("source") == source for o in client.offers(expect)):
            return None
    except ControllerError:
        return None
    for g in groups:
        model = str(g.get("model") or "")
        if g.get("session") and model.startswith(tree.ID_PREFIX) and model != expect:
            return OtherContentAnnounced(expect, model, source, int(g.get("id") or 0))
    return None


def content_mismatch(expected: str, offered: Optional[str]) -> str:
    """The one line a receiver fails with when the sender's manifest is not ``--expect``'s."""
    return (f"content id mismatch: expected {expected}, the sender offers "
            f"{offered or 'another (its manifest does not hash to the expected id)'}")


def _receive(out: str, opts: ReceiveOptions, group: tuple[str, int], source_ip: str, interface: str,
             key: Optional[bytes], emit: OnEvent,
             on_progress: Optional[Callable[[ReceiveProgress], None]],
             joined: Optional[tuple[ControllerClient, int, dict]] = None,
             lane: Optional[tuple[int, int]] = None, sink_factory: Callable[[str], Any] = PathSink,
             ended: Optional[Callable[[Receiver], None]] = None) -> ReceiveResult:
    """Receive on the group's sockets. ``joined`` (client, group id, join answer): the
    key, session and digest come from the controller, and a new announcement is taken
    until a manifest locks the receiver onto one transfer. ``lane`` (index, count): take
    only that lane's manifest, into the sink ``sink_factory`` makes (hostagent.lanes:
    the lane's slice of the file); by default a ``PathSink`` (a file or a directory: the
    manifest says which). ``ended``: given the receiver once its loop ended."""
    try:
        sink = sink_factory(out)
    except OSError as exc:
        raise TransferError(f"cannot open {out}: {exc.strerror}") from None
    try:
        mc, uc = receiver_sockets(group[0], group[1], source_ip, interface)
    except BaseException:
        sink.close()
        raise
    metrics = watcher = None
    try:
        expect = _Expected(key)
        if joined is not None:
            client, gid, answer = joined
            expect = _await_announced(client, gid, answer, key, opts.timeout, opts.expect, emit)
            _require_key(expect.key, opts, emit, "the controller gave no session key (no --token?)")
        from .receiver import Receiver, ReceiverConfig  # (here: a send never loads the receiver)

        config = ReceiverConfig(key=expect.key, session_id=expect.session, file_digest=expect.file_digest,
                                idle_timeout=opts.timeout, state_save_interval=opts.resume_interval,
                                content_id=tree.parse_content_id(opts.expect) if opts.expect else None,
                                lane=lane or ReceiverConfig.lane, deadline=opts.deadline)
        receiver = Receiver(sink, config, time.monotonic(), state=sink.load_state())
        ready = time.monotonic()
        emit(ReceiveStarted(out, group))
        metrics = _serve_metrics(opts, "receiver", lambda: receiver.stats, lambda: _held_bytes(receiver), emit)
        if joined is not None:
            watcher = _GroupWatcher(joined[0], joined[1], _WATCH_POLL)

        def reannounced() -> None:
            """Before a manifest locks it, the receiver follows a new announcement (the
            one it joined with was left behind by an earlier sender that crashed);
            then it stops asking."""
            if watcher is None:
                return
            if receiver.manifest is not None:
                watcher.stop()
                return
            g = watcher.changed()
            new = _announced(g, key) if g is not None else None
            if new is not None and (new.session, new.key) != (receiver.session, receiver.config.key) and new.key:
                receiver.expect(new.session, new.file_digest, new.key)  # type: ignore[arg-type]

        result = _listen(out, opts, receiver, sink, mc, uc, group, emit, on_progress, reannounced, ready)
        if ended is not None:
            ended(receiver)
        return result
    finally:
        if watcher is not None:
            watcher.stop()
        sink.close()
        mc.close()
        uc.close()
        _stop(metrics)


def _listen(out: str, opts: ReceiveOptions, receiver: Receiver, sink: PathSink | FileSink, mc: socket.socket,
            uc: socket.socket, group: tuple[str, int], emit: OnEvent,
            on_progress: Optional[Callable[[ReceiveProgress], None]],
            each_turn: Callable[[], None] = lambda: None, ready: Optional[float] = None) -> ReceiveResult:
    """Run the receiver's loop until it verified the file (and the sender acknowledged)
    or gave up; run the on_complete command; summarise. ``each_turn`` runs every loop
    turn (in the loop's thread); ``ready``: when the group was joined (the clock's mark)."""
    fastrun.warn_if_pure()
    marks: dict[str, Any] = {}
    throttle = _Throttle()
    expected = opts.expect

    def on_event(event: object) -> None:
        if isinstance(event, ManifestReceived):  # the file's first datagram, this loop turn
            marks.setdefault("first", time.monotonic())
        elif isinstance(event, (FileComplete, Failed)):
            marks["end"] = event
            marks.setdefault("end_at", time.monotonic())
            if isinstance(event, FileComplete):  # (verified within the manifest's loop turn)
                marks.setdefault("first", marks["end_at"])
        emit(event)  # type: ignore[arg-type]

    def done() -> bool:
        each_turn()
        if expected is not None and receiver.manifest is None and "end" not in marks \
                and receiver.stats.drops["wrong_content_id"]:
            # an authenticated first page that does not hash to --expect: refused, nothing
            # written; waiting on would only take the rest of the stream for nothing
            on_event(Failed(content_mismatch(expected, receiver.offered_content_id)))
        if receiver.layout is not None:
            if "first" not in marks:  # (called every loop turn: no clock read once set)
                marks["first"] = time.monotonic()
            if on_progress is not None and throttle.due():
                stats = receiver.stats
                on_progress(ReceiveProgress(*_held_bytes(receiver), stats.repairs_received, stats.nacks_sent))
        # After success, linger until the sender acknowledged our COMPLETE.
        return "end" in marks and (isinstance(marks["end"], Failed) or receiver.get_timer() is None)

    started = time.monotonic()
    loop = run(receiver, uc, [mc, uc], group, on_event, done, gro=opts.gro)
    acked = time.monotonic()
    end = marks["end"]
    ok = isinstance(end, FileComplete)
    offered = receiver.content_id() if receiver.config.lane[1] == 1 else None  # (a lane's: its slice's)
    if expected is not None and not ok and offered is not None and offered != expected:
        end = Failed(content_mismatch(expected, offered))  # (a manifest of several pages: refused at its last)
    if ok and receiver.manifest is not None:
        sink.finish(receiver.manifest.file_size)
    records = sink.record_stats
    stats = receiver.stats
    size = receiver.manifest.file_size if receiver.manifest else 0
    # Goodput from the first datagram of the file to verification (not our idle wait).
    first = marks.get("first", started)
    elapsed = (marks.get("end_at") or time.monotonic()) - first
    hook = _run_hook(opts.on_complete, out, opts.hook_stdout) if ok and opts.on_complete else None
    return ReceiveResult(
        ok=ok and (hook is None or hook.exit_status == 0), digest_ok=ok, out=out,
        bytes=size, receiver_id=f"{receiver.receiver_id:016x}",
        file_digest=end.file_digest.hex() if isinstance(end, FileComplete) else None,
        error=end.reason if isinstance(end, Failed) else None,
        group=f"{group[0]}:{group[1]}", seconds=round(time.monotonic() - started, 3),
        goodput_mbit=_goodput(size, elapsed) if ok else 0.0,
        datagrams_received=stats.datagrams_in, bytes_received=stats.bytes_in, nacks=stats.nacks_sent,
        repairs_received=stats.repairs_received, duplicates=stats.duplicates,
        resumed_chunks=receiver.resumed_chunks, corrupt_chunks=stats.corrupt_chunks,
        resume_records=records[0], record_sync_s=round(records[1], 3),
        authenticated=receiver.config.key is not None,
        verify_s=round(marks["end_at"] - first, 3) if "end_at" in marks else None,
        nacks_suppressed=stats.nacks_suppressed, parity_received=stats.parity_received,
        fec_recovered=stats.fec_recovered, nack_seqs=stats.nack_seqs_requested, gro=loop.gro,
        gro_batches=loop.gro_batches, coalesced=loop.coalesced, dropped=dict(stats.drops), peak_rss_mb=_peak_rss_mb(), cpu_s=_cpu_s(),
        on_complete=hook,
        content_id=receiver.content_id(),
        files=_files(receiver.manifest) if receiver.manifest else 0,
        early_held=stats.early_held,
        clock={"ready": ready or started, **{k: marks[v] for k, v in (("first", "first"), ("verified", "end_at")) if v in marks},
               "acked": acked, "result": time.monotonic()},
    )


def _held_bytes(receiver: Receiver) -> tuple[int, int]:
    """(file bytes held, file size): progress for the bar and the metrics."""
    layout = receiver.layout
    if layout is None or layout.total_seq == 0:
        return 0, layout.file_size if layout else 0
    return layout.file_size * receiver.have.count // layout.total_seq, layout.file_size


def _run_hook(command: str, out: str, stdout: Optional[IO[Any]]) -> HookResult:
    """Run ``command OUT`` after a verified transfer (e.g. load the model)."""
    import shlex  # (here: start-up of every agent process counts; few run a hook)
    import subprocess

    argv = shlex.split(command) + [os.path.abspath(out)]
    started = time.monotonic()
    try:
        status = subprocess.run(argv, stdout=stdout).returncode
    except OSError as exc:
        return HookResult(argv, 127, exc.strerror, 0.0)
    return HookResult(argv, status, None, round(time.monotonic() - started, 3))


# ----------------------------------------------------------------------------- lanes


def _send_lanes(path: str, opts: SendOptions, interface: str, emit: OnEvent,
                on_progress: Optional[Callable[[SendProgress], None]]) -> SendResult:
    """``send`` striped over ``opts.lanes`` lanes (hostagent.lanes), each lane at
    ``rate / lanes`` on group port PORT + lane."""
    from . import lanes

    try:
        lanes.check(opts.lanes, opts.group, opts.controller)
    except lanes.LaneError as exc:
        raise TransferError(str(exc)) from None
    started = time.monotonic()
    with FileSource(path) as source:
        digests = cached_digests(path, opts.chunk_size, lambda: file_digests(source, opts.chunk_size),
                                 cache_dir() if opts.manifest_cache else None)[0]
        size = source.size
    count = opts.lanes

    def one(lane: Any, lane_emit: OnEvent, lane_progress: Any) -> SendResult:
        per = dataclasses.replace(
            opts, group=lanes.lane_group(opts.group or "", lane.index), lanes=1, rate_mbit=opts.rate_mbit / count,
            min_rate_mbit=None if opts.min_rate_mbit is None else opts.min_rate_mbit / count,
            metrics_port=None if opts.metrics_port is None else opts.metrics_port + lane.index)
        with FileSource(path, lane.offset, lane.length) as part:
            return _send(path, per, part, interface, lane_emit, lane_progress, lane=lane)

    whole = tree.content_id(b"", size, opts.chunk_size, digests[1], digests[0])  # what one lane would send
    try:
        results, failed = lanes.run(lanes.plan(size, opts.chunk_size, count, digests), one,
                                    _started_once(emit, SendStarted, size=size, content_id=whole),
                                    lanes.merge_progress(on_progress), lambda r: r.ok)
    except lanes.LaneError as exc:
        raise TransferError(str(exc)) from None
    result = lanes.merge_send(results, failed, count, size, opts.group or "", time.monotonic() - started, _cpu_s())
    result.content_id = whole
    return result


def _receive_lanes(out: str, opts: ReceiveOptions, source_ip: str, interface: str, key: Optional[bytes],
                   emit: OnEvent, on_progress: Optional[Callable[[ReceiveProgress], None]]) -> ReceiveResult:
    """``receive`` of a file sent with ``--lanes``: one receiver process per lane, each
    writing its slice of the file into OUT's temporary (``dirs.own_tmp``, where a receive
    without lanes writes too); once every lane verified its slice and the lanes' digests
    hash to the content id (``--expect``'s, when given), the file is trimmed and renamed
    to OUT and the hook run, once. OUT is untouched until then."""
    import shutil

    from . import lanes
    from .dirs import own_tmp, rename_into_place

    try:
        lanes.check(opts.lanes, opts.group, opts.controller)
    except lanes.LaneError as exc:
        raise TransferError(str(exc)) from None
    started = time.monotonic()
    count = opts.lanes
    try:
        tmp, fd, fallback = own_tmp(out)
        os.close(fd)
    except OSError as exc:
        raise TransferError(f"cannot write beside {out}: {exc.strerror}") from None
    part = os.path.join(tmp, os.path.basename(os.path.abspath(out)))

    def one(index: int, lane_emit: OnEvent, lane_progress: Any) -> tuple[ReceiveResult, int, Optional[bytes], int]:
        per = dataclasses.replace(opts, group=lanes.lane_group(opts.group or "", index), lanes=1, on_complete=None,
                                  metrics_port=None if opts.metrics_port is None else opts.metrics_port + index)
        sinks: list[FileSink] = []
        got: list[Receiver] = []

        def sink(_: str) -> FileSink:
            sinks.append(FileSink(part, lanes.state_path(out, index), trim=False))
            return sinks[-1]

        result = _receive(out, per, _group(per.group), source_ip, interface, key, lane_emit, lane_progress,
                          None, (index, count), sink, got.append)
        manifest = got[0].manifest if got else None
        return (result, sinks[0].base if sinks else 0, got[0].chunk_digests() if got else None,
                manifest.chunk_size if manifest is not None else 0)

    results: dict[int, ReceiveResult] = {}
    found: Optional[str] = None
    error: Optional[str] = None
    try:
        try:
            outcomes, failed = lanes.run(list(range(count)), one, _started_once(emit, ReceiveStarted),
                                         lanes.merge_progress(on_progress), lambda r: r[0].digest_ok)
        except lanes.LaneError as exc:
            raise TransferError(str(exc)) from None
        results.update((i, r) for i, (r, _, _, _) in outcomes.items())
        size = max(base + r.bytes for r, base, _, _ in outcomes.values())
        if failed is not None:
            error = results[failed].error or "failed"
            if not error.startswith("content id mismatch"):  # (the same sentence in every lane: said once)
                error = f"lane {failed}: {error}"
        elif len({(r.file_digest, chunk) for r, _, _, chunk in outcomes.values()}) != 1:
            error = "the lanes carried different files"
        else:
            digests = [outcomes[i][2] or b"" for i in range(count)]
            found = lanes.whole_id(size, outcomes[0][3], bytes.fromhex(results[0].file_digest or ""), digests)
            if opts.expect is not None and found != opts.expect:
                error = content_mismatch(opts.expect, found)  # (every lane's first page named the id: a liar)
            else:
                os.truncate(part, size)  # stale bytes of an older, longer file (no lane trims)
                with open(part, "rb") as handle:
                    os.fsync(handle.fileno())
                rename_into_place(part, out, tmp)
    finally:
        if fallback or not any(r.bytes for r in results.values()):
            shutil.rmtree(tmp, ignore_errors=True)  # (nothing to resume: no lane took a manifest, or none finds it)
    result = lanes.merge_receive(results, error, count, size, opts.group or "", time.monotonic() - started, _cpu_s())
    result.out = out
    result.content_id = found
    if error is None and opts.on_complete:
        result.on_complete = _run_hook(opts.on_complete, out, opts.hook_stdout)
        result.ok = result.on_complete.exit_status == 0
    return result


def _started_once(emit: OnEvent, kind: type, **fields: Any) -> OnEvent:
    """The lanes' events for the caller: their ``kind`` (SendStarted, ReceiveStarted)
    once, for the whole transfer (``fields`` replaced), everything else as it comes."""
    seen: list[bool] = []

    def forward(event: Event) -> None:
        if isinstance(event, kind):
            if seen:
                return
            seen.append(True)
            event = dataclasses.replace(event, **fields)  # type: ignore[type-var]
        emit(event)

    return forward


# ----------------------------------------------------------------------------- shared


def _ignore(event: Event) -> None:
    pass


class _Throttle:
    """True at most once per PROGRESS_INTERVAL (and on the first call)."""

    def __init__(self) -> None:
        self._next = 0.0

    def due(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + PROGRESS_INTERVAL
        return True


def _check_group_source(opts: _Common) -> None:
    if opts.controller and opts.group:
        raise TransferError("give either a group or a controller, not both")
    if not opts.controller and not opts.group:
        raise TransferError("a group (ADDR:PORT) is required without a controller")


def _ipv4(text: str) -> str:
    try:
        return parse_ipv4(text)
    except ValueError as exc:
        raise TransferError(str(exc)) from None


def _group(text: Optional[str]) -> tuple[str, int]:
    try:
        return parse_group(text or "")
    except ValueError as exc:
        raise TransferError(str(exc)) from None


def _derive(secret: Optional[bytes]) -> Optional[bytes]:
    return derive_key(secret) if secret is not None else None


def _warn_unpinned(model: str) -> None:
    """Any host the controller lets join may hold the group's key, so only a content id
    pins what arrives (docs/security.md, "Receivers"): say so, once, on stderr."""
    import logging  # (here: a receiver with --expect never loads it)

    logging.getLogger("modelcast.agent").warning(
        "modelcast: warning: receiving model %r with no --expect content id: nothing pins what arrives, the group's "
        "source decides it (give --expect blake3:<id> to accept only that content)", model)


def _require_key(key: Optional[bytes], opts: _Common, emit: OnEvent, why: str) -> None:
    """No MAC key: refuse, unless ``insecure`` (then say so: ``Unauthenticated``)."""
    if key is not None:
        return
    if not opts.insecure:
        raise TransferError(f"{why}: datagrams would not be authenticated and anyone on the network could "
                            "forge them; give a key (--key-file, or a controller --token) or --insecure")
    emit(Unauthenticated(why))


def _client(opts: _Common) -> ControllerClient:
    assert opts.controller is not None
    return ControllerClient(opts.controller, token=opts.token, request_timeout=opts.request_timeout)


def _own_address(interface: str, toward: Optional[str] = None) -> str:
    """This host's address on the fabric (``net.own_address``): what it registers with
    the controller as a group's source or receiver."""
    try:
        return own_address(interface, toward)
    except AddressUnknown as exc:
        raise TransferError(str(exc)) from None


def _url_host(url: str) -> str:
    """The (first) controller's host: the route towards it names this host's address."""
    from urllib.parse import urlsplit

    host = urlsplit(url.split(",")[0].strip()).hostname
    if not host:
        raise TransferError(f"no host in controller URL {url!r}")
    return host


def _serve_metrics(opts: _Common, role: str, stats: Callable[[], Stats],
                   progress: Callable[[], tuple[int, int]], emit: OnEvent) -> Any:
    """The Prometheus exporter for this transfer (None without ``metrics_port``)."""
    if opts.metrics_port is None:
        return None
    from .metrics import serve

    try:
        server = serve(role, stats, progress, opts.metrics_port, opts.metrics_addr)
    except OSError as exc:
        raise TransferError(f"cannot serve metrics on {opts.metrics_addr}:{opts.metrics_port}: {exc.strerror}") from None
    emit(MetricsServing(opts.metrics_addr, opts.metrics_port))
    return server


def _stop(server: Any) -> None:
    """Free the metrics port: an in-process caller may transfer again on it."""
    if server is not None and hasattr(server, "shutdown"):
        server.shutdown()
        server.server_close()


def _cpu_s() -> float:
    """CPU seconds this process has used (user + system): the cost side of goodput."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return round(u.ru_utime + u.ru_stime, 3)


def _peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


def _goodput(nbytes: int, seconds: float) -> float:
    return round(nbytes * 8 / seconds / 1e6, 1) if seconds > 0 else 0.0
