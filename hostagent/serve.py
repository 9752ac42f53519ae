"""An always-on model server and the fetch that asks it for a model (``modelcast serve``,
``modelcast fetch``; docs/serving.md).

``serve`` publishes models (files or directories) under their content ids: for each it
creates the (model id, this host) group, offers the model on the controller
(``POST /v1/offers``) and then runs *rounds*: one ordinary send session
(``api.send_source``) to the hosts that have joined the group. A fetching host needs to
know only the model id: the controller's offers say which host serves it, and the host
joins that group as any receiver does (its own host token, issue 11's keys). Joining is
the request; the server sees it in the group's receiver list.

When a round starts, and who it serves, is ``Rounds`` -- a pure policy (arrivals and
``now`` in, decisions out):

* **Join window.** The first request opens a window. It closes ``quiet_s`` after the
  latest arrival, and at most ``min(max_wait_s, window_share x one transfer's time)``
  after the first: a lone request waits ``quiet_s``, a burst keeps the window open while
  it lasts, bounded so the first in the burst never waits long.
* **Hold while busy.** Requests that come while a round runs, or less than one
  transfer's time after one ended -- a fleet arriving over time -- wait instead up to
  ``min(max_wait_s, hold_share x one transfer's time)`` after the first of them for
  others, so the fleet is served in fewer, fuller rounds (the server's bytes: on the
  model and the lab, docs/benchmarks.md); a lone request at an idle server is not held.
* **Arrivals during a round** are on the tree at once (their join installs it) and take
  the rest of the stream. One that arrives while at most ``admit_share`` of the stream
  is out is *admitted*: the round's sender repairs what it missed (within its repair
  share while the stream runs, after it at up to half the rate: the sender's
  per-receiver repair rate), and the round waits for it. A later one is not admitted:
  it keeps the tail (its resume record holds it), its attempt ends with the round, and
  it takes the beginning from the next round, which starts once its hold (from when it
  asked) is over, at once if that has passed (measured: docs/benchmarks.md).
* **After a round** every admitted host still asking (not verified) is in the next
  round, which opens at once (their window is long past). A waiting host that leaves and asks again
  within ``return_s`` -- a fetch between attempts -- keeps its place: no new window.
* **While a round runs**, its sender's looks at the group are the policy's (the server's
  own loop pauses): a late joiner is admitted, and counted by the sender, in one step.

Rounds of different models run concurrently, each model in its own thread. SIGTERM
(``stop``) withdraws the offers at once, lets running rounds finish, then deletes the
groups.
"""

from __future__ import annotations

import dataclasses
import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import msgpack

from .api import (
    ControllerError, OnEvent, ReceiveOptions, ReceiveResult, SendOptions, SendResult, SendStarted, TransferError, _client,
    _ignore, _ipv4, _own_address, _stop, receive, send_source,
)
from .dirs import DirSource, read_record
from .events import ReceiverCompleted
from .manifest import cache_dir, cached_digests
from .net import STATE_SUFFIX, FileSource
from .rounds import RoundSettings, Rounds  # the policy (re-exported here)
from .sender import check_chunk_count, file_digests
import hostagent.tree as tree

__all__ = ["Backoff", "FetchWaiting", "Fetched", "Model", "RoundDone", "RoundSettings", "RoundStarted", "Rounds", "ServeOptions", "ServeStats",
           "Served", "Sources", "fetch", "serve"]


@dataclass(frozen=True)
class Served:
    """One model is offered: its id, group and offer."""

    model: str
    name: str
    size: int
    group_id: int
    offer_id: int
    revision: str = ""  # a Hugging Face model's commit (hf://ORG/NAME): what the offer names


@dataclass(frozen=True)
class RoundStarted:
    model: str
    round: int
    receivers: tuple[str, ...]


@dataclass(frozen=True)
class RoundDone:
    """One round's outcome: who verified (``late``: admitted mid-round, with the share
    of the stream each missed; ``deferred``: arrived too late, left for the next round)."""

    model: str
    round: int
    receivers: tuple[str, ...]  # at the start
    verified: tuple[str, ...]
    late: dict[str, float]
    deferred: tuple[str, ...]
    bytes_sent: int
    seconds: float
    stream_s: Optional[float]
    error: Optional[str]
    started_at: float = 0.0  # time.monotonic() (system-wide: a lab on the same machine places it)
    stream_at: Optional[float] = None  # time.monotonic() its stream began (set-up done, key announced)
    asked_at: dict[str, float] = field(default_factory=dict)  # its hosts -> when first seen asking (monotonic)
    verified_at: dict[str, float] = field(default_factory=dict)  # host -> when it reported verified (monotonic)


@dataclass
class ServeStats:
    """Per model: what the Prometheus metrics show (``metrics.ServeCollector``)."""

    rounds: int = 0
    receivers: int = 0  # summed over rounds: receivers that verified
    bytes_sent: int = 0  # datagram bytes out, all rounds (data, repairs, manifests)
    size: int = 0
    round_receivers: list[int] = field(default_factory=list)  # verified per round

    @property
    def bytes_per_receiver(self) -> float:
        return self.bytes_sent / self.receivers if self.receivers else 0.0


# ----------------------------------------------------------------------------- serve


@dataclass(kw_only=True)
class ServeOptions:
    """How to serve (defaults are the CLI's): the controller, and the send options every
    round uses (``send``: its ``receivers`` are set per round)."""

    controller: str
    token: Optional[str] = None
    ip: Optional[str] = None  # this host's address as the controller knows it (default: routing table)
    send: SendOptions = field(default_factory=lambda: SendOptions(poll=0.2, wait_timeout=10.0))
    rounds: RoundSettings = field(default_factory=RoundSettings)
    poll: float = 0.1  # seconds between looks at each group's receivers (a controller without held GETs)
    metrics_port: Optional[int] = None
    metrics_addr: str = "127.0.0.1"
    hf_cache: Optional[str] = None  # where hf:// names are resolved (default: $HF_HUB_CACHE, $HF_HOME/hub)


@dataclass
class Model:
    """One published model: its source (open for every round) and the digests that name it."""

    path: str
    name: str
    source: FileSource | DirSource
    digests: tuple[bytes, bytes]
    content_id: str
    size: int
    files: int
    group_id: int = 0
    offer_id: int = 0
    stats: ServeStats = field(default_factory=ServeStats)
    hf: Optional[dict] = None  # a Hugging Face snapshot's offer fields (commit, refs, LFS files)


def open_model(path: str, chunk_size: int) -> Model:
    """Open and hash ``path`` once (a file's digests come from the cache while it is
    unchanged): its content id is what fetchers ask for."""
    if not os.path.isfile(path) and not os.path.isdir(path):
        raise TransferError(f"no such file or directory: {path}")
    try:
        source: FileSource | DirSource = DirSource(path) if os.path.isdir(path) else FileSource(path)
    except ValueError as exc:
        raise TransferError(str(exc)) from None
    try:
        check_chunk_count(source.size, chunk_size)
        entries = source.entries_blob if isinstance(source, DirSource) else b""
        digests, _ = cached_digests(path, chunk_size, lambda: file_digests(source, chunk_size),
                                    None if entries else cache_dir())
    except (ValueError, OSError) as exc:
        source.close()
        raise TransferError(f"{path}: {exc}") from None
    files = len(tree.decode_entries(entries)) if entries else 1
    cid = tree.content_id(entries, source.size, chunk_size, digests[1], digests[0])
    return Model(path, os.path.basename(os.path.normpath(path)), source, digests, cid, source.size, files,
                 stats=ServeStats(size=source.size))


def open_named(path: str, chunk_size: int, hf_cache: Optional[str] = None) -> Model:
    """``path``, or the snapshot an ``hf://ORG/NAME[@REVISION]`` name resolves to in the
    local Hugging Face cache (offline; ``hostagent.hf``), opened as ``open_model`` does:
    a Hugging Face model is offered under its name with its commit."""
    from . import hf

    if not hf.is_hf(path):
        return open_model(path, chunk_size)
    try:
        ref = hf.parse_hf(path)
    except ValueError as exc:
        raise TransferError(str(exc)) from None
    snap = hf.resolve_local(ref, hf.hub_cache(hf_cache))
    model = open_model(snap.path, chunk_size)
    model.name, model.hf = snap.repo, snap.offer_hf()
    return model


def serve(paths: list[str], options: ServeOptions, stop: threading.Event, *,
          on_event: Optional[OnEvent] = None) -> list[Model]:
    """Serve ``paths`` (files, directories, ``hf://`` names) until ``stop`` is set; then
    withdraw the offers, let running rounds end and delete the groups. Returns the models
    with their stats."""
    emit = _locked(on_event or _ignore)
    send_opts = dataclasses.replace(options.send, controller=options.controller, token=options.token, group=None)
    client = _client(send_opts)
    # as a sender's: the address its multicast leaves from, never the route to the controller
    my_ip = _ipv4(options.ip or _own_address(_ipv4(send_opts.interface)))
    # Each round's sender looks at its group (late joiners) as often as the policy does.
    send_opts = dataclasses.replace(send_opts, ip=my_ip, metrics_port=None, poll=min(send_opts.poll, options.poll))
    models: list[Model] = []
    metrics = None
    threads = []
    try:
        for p in paths:
            models.append(open_named(p, send_opts.chunk_size, options.hf_cache))
        if len({m.content_id for m in models}) != len(models):
            raise TransferError("two of the paths are the same model (same content id)")
        for m in models:
            m.group_id = int(client.create_group(m.content_id, my_ip)["id"])
            m.offer_id = int(client.offer(m.content_id, my_ip, m.name, m.size, m.files, hf=m.hf)["id"])
            emit(Served(m.content_id, m.name, m.size, m.group_id, m.offer_id, m.hf["commit"] if m.hf else ""))
        if options.metrics_port is not None:
            from .metrics import serve_models

            metrics = serve_models(models, options.metrics_port, options.metrics_addr)
        for m in models:
            t = threading.Thread(target=_model_loop, args=(m, send_opts, options, stop, emit),
                                 name=f"serve-{m.name}", daemon=True)
            t.start()
            threads.append(t)
        stop.wait()
    finally:
        for m in models:  # first: no new fetcher is sent here
            if m.offer_id:
                _quietly(lambda: client.withdraw(m.offer_id))
        stop.set()
        for t in threads:
            t.join()
        for m in models:
            if m.group_id:
                _quietly(lambda: client.delete_group(m.group_id))
            m.source.close()
        _stop(metrics)
    return models


_IDLE_WAIT = 1.0  # a model's held GET of its group at most this long (stop is seen within it)


def _model_loop(m: Model, send_opts: SendOptions, options: ServeOptions, stop: threading.Event,
                emit: OnEvent) -> None:
    """One model: watch its group, run the rounds the policy asks for (one at a time)."""
    client = _client(send_opts)
    policy = Rounds(options.rounds, m.size * 8 / (send_opts.rate_mbit * 1e6) + 1.0)
    lock = threading.Lock()
    round_thread: Optional[threading.Thread] = None
    number = 0
    etag: Optional[str] = None
    asking: frozenset[str] = frozenset()
    while not stop.is_set():
        with lock:
            running, closes = policy.running, policy.window_closes()
        if running:  # the round's sender looks at the group: its look is the policy's (one view, no lag)
            etag = None
            stop.wait(options.poll)
            continue
        # a held GET: back at once when a host asks or leaves, and by the time the open
        # join window closes (a controller without ETags: polled every ``poll`` s)
        wait = _IDLE_WAIT if closes is None else min(_IDLE_WAIT, max(0.0, closes - time.monotonic()))
        try:
            group, etag = client.watch_group(m.group_id, etag, wait)
        except ControllerError:
            etag = None
            stop.wait(options.poll)
            continue  # (restarting): look again
        if stop.is_set():
            break
        if group is not None:
            asking = frozenset(group.get("receivers") or {})
        now = time.monotonic()
        with lock:
            policy.observe(asking, now)
            hosts = policy.due(now)
            if hosts is not None:
                policy.started(hosts, now)
        if hosts is not None:
            number += 1
            emit(RoundStarted(m.content_id, number, tuple(sorted(hosts))))
            round_thread = threading.Thread(target=_round, args=(m, number, hosts, send_opts, policy, lock, emit),
                                            name=f"round-{m.name}-{number}", daemon=True)
            round_thread.start()
        elif etag is None:
            stop.wait(options.poll)
    if round_thread is not None:
        round_thread.join()


def _round(m: Model, number: int, hosts: frozenset[str], send_opts: SendOptions, policy: Rounds,
           lock: threading.Lock, emit: OnEvent) -> None:
    """One send session to ``hosts`` (and the late joiners the policy admits)."""
    started = time.monotonic()

    def admit(group: frozenset[str]) -> frozenset[str]:
        # While a round runs, its sender's looks at the group are the policy's only ones:
        # a late joiner is admitted and counted by the sender in the same step.
        with lock:
            policy.observe(group, time.monotonic())
            return group & policy.admitted()

    served: dict[str, float] = {}  # host -> when it verified
    finished = threading.Event()  # every host the round serves verified: the rest of the stream helps nobody

    def on_event(event: object) -> None:
        if isinstance(event, SendStarted):
            with lock:
                policy.streaming(time.monotonic())
        elif isinstance(event, ReceiverCompleted) and isinstance(event.addr, tuple):
            served.setdefault(event.addr[0], time.monotonic())
            with lock:
                if policy.admitted() <= served.keys():
                    finished.set()

    result: Optional[SendResult] = None
    error: Optional[str] = None
    try:
        result = send_source(m.path, m.source, m.digests, dataclasses.replace(send_opts, receivers=len(hosts)),
                             admit=admit, done=finished.is_set, on_event=on_event)
    except (ControllerError, TransferError, OSError) as exc:
        error = str(exc)
    except Exception as exc:  # a bug must not stop the server's other rounds: report it, go on
        error = f"round failed: {type(exc).__name__}: {exc}"
    verified = frozenset(r.addr for r in result.receivers if r.ok) if result is not None else frozenset()
    with lock:
        late, deferred, stream_at = dict(policy.late), tuple(sorted(policy.deferred)), policy.stream_since
        asked = {h: round(t, 3) for h, t in policy.asked.items() if h in hosts or h in late or h in deferred}
        policy.ended(verified, time.monotonic(), result.stream_s if result is not None else None)
        m.stats.rounds += 1
        m.stats.receivers += len(verified)
        m.stats.round_receivers.append(len(verified))
        m.stats.bytes_sent += result.bytes_sent if result is not None else 0
    if result is not None and not result.ok and error is None:
        error = result.error
    emit(RoundDone(m.content_id, number, tuple(sorted(hosts)), tuple(sorted(verified)), late, deferred,
                   result.bytes_sent if result is not None else 0, round(time.monotonic() - started, 3),
                   result.stream_s if result is not None else None, error, started, stream_at, asked,
                   {h: round(t, 3) for h, t in served.items()}))


def _quietly(call: Callable[[], Any]) -> None:
    try:
        call()
    except ControllerError:
        pass


def _locked(emit: OnEvent) -> OnEvent:
    """Events from several threads, one at a time."""
    lock = threading.Lock()

    def forward(event: Any) -> None:
        with lock:
            emit(event)

    return forward


# ----------------------------------------------------------------------------- fetch


# A fetch attempt ends by itself at this share of --patience (at least MIN_ATTEMPT_S), so
# a source that stalls, trickles or lies gives way to the next while patience remains.
ATTEMPT_SHARE = 0.5
MIN_ATTEMPT_S = 30.0
BACKOFF_FIRST_S = 0.5  # pause after an attempt or a call that got nowhere; doubled up to BACKOFF_MAX_S
BACKOFF_MAX_S = 10.0
NO_OFFER_POLL_S = 1.0  # between looks at the offers while nobody offers the model
# What an attempt's receiver refused from its source: the source sent another content.
REFUSED = ("wrong_content_id", "wrong_file", "manifest_mismatch", "bad_entries", "inconsistent")


@dataclass(frozen=True)
class Fetched:
    """A fetch attempt ended without the model (``retry``: the next one resumes).
    ``set_aside``: it got nothing verified from ``source`` (or was refused content):
    other sources are asked first."""

    attempt: int
    source: str
    error: str
    set_aside: bool = False


@dataclass(frozen=True)
class FetchWaiting:
    """``fetch`` waits ``seconds`` before asking again, because ``why`` (nobody offers
    the model yet, the controller is unavailable, the last attempt got nowhere)."""

    why: str
    seconds: float


class Sources:
    """Which offer a fetch tries next (pure: offers in, one out). A source that failed
    this fetch (``failed``: nothing verified, or content refused) comes after every other,
    fewest failures first, then the one that failed longest ago; among the others, one
    that already gave verified chunks (``gave``) first, then one whose group exists
    (its server is up), then the earliest offer."""

    def __init__(self) -> None:
        self.failures: dict[str, int] = {}
        self.failed_at: dict[str, float] = {}
        self.given: dict[str, int] = {}

    def pick(self, offers: list[Any]) -> Optional[dict]:
        usable = [o for o in offers if isinstance(o, dict) and isinstance(o.get("source"), str)]
        return min(usable, key=self._rank) if usable else None

    def _rank(self, offer: dict) -> tuple:
        source = offer["source"]
        oid = offer.get("id")
        return (self.failures.get(source, 0), self.failed_at.get(source, float("-inf")), -self.given.get(source, 0),
                offer.get("group") is None, oid if isinstance(oid, int) else 1 << 62, source)

    def failed(self, source: str, now: float) -> None:
        self.failures[source] = self.failures.get(source, 0) + 1
        self.failed_at[source] = now

    def gave(self, source: str, chunks: int) -> None:
        self.given[source] = self.given.get(source, 0) + chunks


class Backoff:
    """Pauses between tries that got nowhere: ``BACKOFF_FIRST_S`` doubling up to
    ``BACKOFF_MAX_S`` (+-20% so a fleet does not ask in step), or the controller's
    Retry-After within the same cap; ``reset`` after progress."""

    def __init__(self, rng: Optional[random.Random] = None) -> None:
        self._rng = rng or random.Random()
        self._next = BACKOFF_FIRST_S

    def pause(self, retry_after: Optional[float] = None) -> float:
        base, self._next = self._next, min(self._next * 2, BACKOFF_MAX_S)
        if retry_after is not None:
            return min(max(0.0, retry_after), BACKOFF_MAX_S)
        return min(BACKOFF_MAX_S, base * self._rng.uniform(0.8, 1.2))

    def reset(self) -> None:
        self._next = BACKOFF_FIRST_S


def permanent(exc: ControllerError) -> bool:
    """The controller refused the call (a 4xx that is not "not yet"): asking again gets
    the same answer. Anything else -- unreachable, a 5xx, no answer in time, a follower's
    404 for a group just made, a source that did not announce -- may go another way."""
    return getattr(exc, "status", None) is not None and not getattr(exc, "transient", False)


def fetch(model_id: str, out: str, options: ReceiveOptions, *, patience: float = 300.0,
          attempt_s: Optional[float] = None, on_event: Optional[OnEvent] = None,
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
          rng: Optional[random.Random] = None) -> ReceiveResult:
    """Receive the model ``model_id`` into ``out`` from a host that offers it: the
    controller's offers name the servers (``Sources`` ranks them); the join is the request.
    An attempt that ends without the model (this host arrived late in a round: the sender
    closed before it had everything) is followed by another, which resumes from the record
    and catches up in the next round. ``patience`` bounds the whole fetch, and every
    attempt ends by itself after ``attempt_s`` (default ``ATTEMPT_SHARE`` of it), so no
    source holds it: one that gave nothing verified is set aside for the others. A
    controller that refuses a call (a 4xx) ends the fetch at once with its message
    (``ControllerError``); what may go another way later is asked again after a pause
    (``Backoff``) until patience ends."""
    emit = on_event or _ignore
    try:
        tree.parse_content_id(model_id)
    except ValueError as exc:
        raise TransferError(str(exc)) from None
    if not options.controller:
        raise TransferError("fetch needs a controller (it says who serves the model)")
    client = _client(options)
    deadline = clock() + patience
    per_attempt = attempt_s if attempt_s is not None else max(MIN_ATTEMPT_S, ATTEMPT_SHARE * patience)
    sources, backoff = Sources(), Backoff(rng)
    attempt = 0
    last = "nobody offered it"

    def wait(seconds: float, why: str) -> None:
        seconds = min(seconds, max(0.0, deadline - clock()))
        if seconds > 0:
            emit(FetchWaiting(why, round(seconds, 3)))
            sleep(seconds)

    while True:
        if clock() >= deadline:
            raise TransferError(f"no verified {model_id} within --patience {patience:g}s ({last})")
        try:
            offer = sources.pick(client.offers(model_id))
        except ControllerError as exc:
            if permanent(exc):
                raise
            last = str(exc)
            wait(backoff.pause(getattr(exc, "retry_after", None)), f"the controller is unavailable: {exc}")
            continue
        if offer is None:
            last = f"nobody offers {model_id} (GET /v1/offers)"
            wait(NO_OFFER_POLL_S, f"nobody offers {model_id} yet")
            continue
        attempt += 1
        source = offer["source"]
        if sources.failures.get(source):  # every source has failed this fetch: not at once again
            wait(backoff.pause(), f"every source of {model_id} failed this fetch; trying {source} again")
        before = _held(out)
        ends = min(deadline, clock() + per_attempt)
        opts = dataclasses.replace(options, source=source, expect=model_id, model=model_id, group=None,
                                   timeout=max(1.0, min(options.timeout, ends - clock())),
                                   deadline=time.monotonic() + max(0.0, ends - clock()))
        try:
            result = receive(out, opts, on_event=emit)
        except ControllerError as exc:
            if permanent(exc):
                raise
            last = str(exc)
            blamed = not getattr(exc, "transient", False)  # (the controller's trouble is not the source's)
            if blamed:
                sources.failed(source, clock())
            emit(Fetched(attempt, source, str(exc), blamed))
            wait(backoff.pause(getattr(exc, "retry_after", None)), last)
            continue
        if result.digest_ok:
            return result
        gained = _gained(before, _held(out))
        refused = any(result.dropped.get(reason) for reason in REFUSED)
        last = result.error or "not verified"
        if clock() >= deadline:
            result.error = f"not verified within --patience {patience:g}s: {last}"
            return result
        if gained and not refused:
            sources.gave(source, gained)
            backoff.reset()
            emit(Fetched(attempt, source, last))
        else:
            sources.failed(source, clock())
            emit(Fetched(attempt, source, last, True))


def _held(out: str) -> tuple[Optional[bytes], int]:
    """What ``out``'s resume record says is verified: (file digest, chunks)."""
    try:
        record = msgpack.unpackb(read_record(out + STATE_SUFFIX) or b"\x80", raw=False)
        digest, ranges = record.get("digest"), record.get("verified") or []
        return (digest if isinstance(digest, bytes) else None), sum(e - s for s, e in ranges)
    except Exception:  # no record, not ours, or not one: nothing held
        return None, 0


def _gained(before: tuple[Optional[bytes], int], after: tuple[Optional[bytes], int]) -> int:
    """Chunks an attempt verified, by the record (another file's record: none)."""
    if after[0] is None or before[0] not in (None, after[0]):
        return 0
    return max(0, after[1] - before[1])


def round_summary(done: RoundDone) -> dict:
    """A round as ``modelcast serve --json`` prints it (one line per round)."""
    return {"event": "round", **dataclasses.asdict(done)}
