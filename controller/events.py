"""The controller's event history: what happened to the fabric and the groups, in order,
for an operator (``GET /v1/events``, the ``/v1/events/stream`` Server-Sent Events, the
web view at ``/ui/``).

It owns a bounded ring of events, each a small JSON object with a monotonic ``id`` (never
reused while the process lives), a wall-clock ``time`` and a ``kind`` (``KINDS``), and
the wake-up of readers waiting for the next one. It must not decide anything: the
modules that act (``controller.topochange``, ``controller.service``, the core's flap
damping) tell it what they did, and an event never changes what is sent.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable, Iterable

__all__ = ["KINDS", "MAX_LISTED", "EventLog", "sse"]

# every kind an event may have; docs/rest.md#events says what each carries
KINDS = frozenset({
    "switch_connected", "switch_lost",
    "port_down", "port_up", "link_up", "link_down", "link_refused",
    "failover", "reroute", "damped", "undamped", "drain",
    "host_learned", "host_forgotten",
    "group_created", "group_deleted", "join", "leave",
    "installed", "install_failed", "refused",
})
MAX_LISTED = 100  # groups named in one event at most (a reroute may move thousands: ``group_count``)
DEFAULT_SIZE = 10_000


class EventLog:
    """A bounded ring of events (the oldest dropped first) and the readers waiting for the
    next one. ``event`` makes the waitable (the app passes Ryu's ``hub.Event``, so a held
    stream is a green thread, not an OS one); ``clock`` gives the events' wall time."""

    def __init__(self, size: int = DEFAULT_SIZE, clock: Callable[[], float] = time.time,
                 event: Callable[[], Any] = threading.Event) -> None:
        if size < 1:
            raise ValueError(f"an event log holds at least one event, not {size}")
        self._ring: deque[dict[str, Any]] = deque(maxlen=size)
        self.counted: Callable[[str], None] | None = None  # (kind) per event: the service's metric
        self._clock = clock
        self._new = event
        self._event = event()
        self.last = 0  # the id of the newest event (0: none yet)

    def use(self, event: Callable[[], Any]) -> None:
        """Make waiters with ``event`` from now on (the app's green ``hub.Event``)."""
        self._new = event
        self._event = event()

    def emit(self, kind: str, group: int | None = None, groups: Iterable[int] | None = None,
             **fields: Any) -> dict[str, Any]:
        """Record one event and wake the readers. ``group``: the one group it concerns;
        ``groups``: several (the first ``MAX_LISTED`` are listed, ``group_count`` says
        how many); other fields as given (JSON values)."""
        if kind not in KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        self.last += 1
        ev: dict[str, Any] = {"id": self.last, "time": round(self._clock(), 3), "kind": kind}
        if group is not None:
            ev["group"] = group
        if groups is not None:
            listed = sorted(groups)
            ev["groups"] = listed[:MAX_LISTED]
            ev["group_count"] = len(listed)
        ev.update(fields)
        self._ring.append(ev)
        if self.counted is not None:
            self.counted(kind)
        event, self._event = self._event, self._new()
        event.set()
        return ev

    @property
    def first(self) -> int:
        """The id of the oldest event still held (``last + 1`` when none is)."""
        return self._ring[0]["id"] if self._ring else self.last + 1

    def since(self, after: int = 0, group: int | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        """The events with an id above ``after``, oldest first, at most ``limit``; with
        ``group``, only those naming it (an event naming more than ``MAX_LISTED`` groups
        is kept for every group: it may concern it)."""
        out: list[dict[str, Any]] = []
        if after >= self.last:
            return out
        start = max(0, len(self._ring) - (self.last - after))  # ids are consecutive in the ring
        for i in range(start, len(self._ring)):
            ev = self._ring[i]
            if group is None or _names(ev, group):
                out.append(ev)
                if len(out) >= limit:
                    break
        return out

    def wait(self, after: int, timeout: float) -> bool:
        """Until an event newer than ``after`` exists, or ``timeout`` s; whether one does."""
        if self.last > after:
            return True
        self._event.wait(timeout)
        return self.last > after


def _names(ev: dict[str, Any], group: int) -> bool:
    if ev.get("group") == group:
        return True
    listed = ev.get("groups")
    return listed is not None and (group in listed or ev.get("group_count", 0) > len(listed))


def sse(ev: dict[str, Any], data: bytes) -> bytes:
    """One Server-Sent Events message for ``ev`` (``data``: its JSON): its id, so a client
    that reconnects resumes with ``Last-Event-ID``, and its kind as the event type."""
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (ev["id"], ev["kind"].encode(), data)
