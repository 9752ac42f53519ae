"""When a model server's round starts and whom it serves: ``Rounds``, a pure policy
(arrivals and ``now`` in, decisions out; no clock, no I/O), and its knobs
``RoundSettings``. ``hostagent.serve`` runs it (its docstring tells the policy in full);
it lives apart so that the CLI can read the knobs' defaults without loading the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["RoundSettings", "Rounds"]


# ----------------------------------------------------------------------------- policy


@dataclass(frozen=True)
class RoundSettings:
    """The round policy's knobs (docs/serving.md)."""

    quiet_s: float = 0.5  # a join window closes this long after its latest arrival...
    max_wait_s: float = 3.0  # ...and at most this long after its first,
    window_share: float = 0.25  # ...or this share of one transfer's time, if shorter
    admit_share: float = 0.25  # arrivals while at most this share of the stream is out are repaired in the round
    done_grace_s: float = 10.0  # a verified host still in the group this long is asking again
    return_s: float = 5.0  # a waiting host that left and asks again within this keeps its place (a fetch's retry)
    # While the server is busy (a round runs, or one ended less than one transfer ago) a
    # request waits up to this share of one transfer's time (within max_wait_s) for
    # others, not just quiet_s: a fleet arriving over time is served in fewer, fuller
    # rounds. A lone request at an idle server still waits only its window.
    hold_share: float = 1.0

    def validate(self) -> None:
        if self.quiet_s <= 0 or self.max_wait_s < 0 or not 0 <= self.window_share <= 1:
            raise ValueError("quiet_s must be > 0, max_wait_s >= 0 and window_share in [0, 1]")
        if not 0 <= self.hold_share <= 2:
            raise ValueError("hold_share must be in [0, 2]")
        if not 0 <= self.admit_share <= 1 or self.done_grace_s <= 0 or self.return_s < 0:
            raise ValueError("admit_share must be in [0, 1], done_grace_s > 0 and return_s >= 0")


class Rounds:
    """When to start a round of one model, and whom it serves: arrivals and ``now`` in,
    decisions out (no clock, no I/O). ``observe`` the hosts asking (the group's receivers)
    whenever known; ``due`` says when a round should start and with whom; the shell
    reports ``started`` and ``ended``; ``admitted`` is whom the running round serves."""

    def __init__(self, settings: RoundSettings, transfer_s: float) -> None:
        settings.validate()
        self.settings = settings
        self.transfer_s = max(transfer_s, 1e-3)  # one stream's time: estimated, then measured
        self.waiting: dict[str, float] = {}  # host -> when it started asking (not in the running round)
        self._admitted: set[str] = set()
        self._done: dict[str, float] = {}  # verified hosts not yet gone from the group -> when verified
        self.running_since: Optional[float] = None
        self.stream_since: Optional[float] = None  # when the running round's stream began
        self.late: dict[str, float] = {}  # this round's admitted late joiners -> share of the stream they missed
        self.deferred: set[str] = set()  # arrived during this round, left for the next
        self.asked: dict[str, float] = {}  # host -> when it was first seen asking (until served or gone)
        self._left: dict[str, tuple[float, float]] = {}  # waiting hosts that left -> (their place, when they left)
        self._warm_until = -1.0  # busy until then: the last round's end + one transfer
        self._held = False  # the waiting hosts came while the server was busy: they wait up to the hold

    @property
    def running(self) -> bool:
        return self.running_since is not None

    def admitted(self) -> frozenset[str]:
        """The hosts the running round serves (none between rounds)."""
        return frozenset(self._admitted)

    def observe(self, asking: frozenset[str], now: float) -> list[str]:
        """The hosts in the group now. Returns the new arrivals admitted to the running
        round (each is repaired what it missed)."""
        for host in [h for h in self._done if h not in asking]:
            del self._done[host]  # verified and gone: a later join is a new request
        for host in [h for h in self._done if now - self._done[h] >= self.settings.done_grace_s]:
            del self._done[host]  # verified long ago and still there: it asks again
        for host in [h for h in self.waiting if h not in asking]:
            # Gone -- given up, or a fetch between attempts (the round it was in closed
            # under it): one back within return_s keeps its place, no new window.
            self._left[host] = (self.waiting.pop(host), now)
        for host in [h for h in self._left if now - self._left[h][1] > self.settings.return_s]:
            del self._left[host]
        for host in [h for h in self.asked if h not in asking and h not in self._admitted and h not in self._left]:
            del self.asked[host]  # (the running round's hosts leave as they verify: kept to its end)
        admitted = []
        for host in sorted(asking):
            if host in self._done or host in self.waiting or host in self._admitted:
                continue
            self.asked.setdefault(host, now)
            if host in self._left:
                place = self._left.pop(host)[0]
                if self.running_since is None or place >= self.running_since:
                    self.waiting[host] = place  # back before the round it waits for: its place
                    continue
            if self.running_since is not None:
                # (before the stream begins -- the round's REST calls -- nothing is missed)
                missed = max(0.0, now - (self.stream_since or now)) / self.transfer_s
                if missed <= self.settings.admit_share:
                    self._admitted.add(host)
                    self.late[host] = round(min(missed, 1.0), 3)
                    admitted.append(host)
                    continue
                self.deferred.add(host)
            if not self.waiting:
                self._held = self.settings.hold_share > 0 and (self.running_since is not None or now <= self._warm_until)
            self.waiting[host] = now
        return admitted

    def window_closes(self) -> Optional[float]:
        """When the open join window closes (None: nobody waits)."""
        if not self.waiting:
            return None
        s = self.settings
        first, last = min(self.waiting.values()), max(self.waiting.values())
        if self._held:
            return first + min(s.max_wait_s, s.hold_share * self.transfer_s)
        return min(first + min(s.max_wait_s, s.window_share * self.transfer_s), last + s.quiet_s)

    def due(self, now: float) -> Optional[frozenset[str]]:
        """The hosts a round should start with now (None: not yet, or one is running)."""
        closes = self.window_closes()
        if self.running_since is not None or closes is None or now < closes:
            return None
        return frozenset(self.waiting)

    def started(self, hosts: frozenset[str], now: float) -> None:
        self.running_since = now
        self.stream_since = None
        self._admitted = set(hosts)
        self.late = {}
        self.deferred = set()
        for host in hosts:
            self.waiting.pop(host, None)

    def streaming(self, now: float) -> None:
        """The running round's stream begins (its group is set up, its key announced)."""
        self.stream_since = now

    def ended(self, verified: frozenset[str], now: float, stream_s: Optional[float] = None) -> None:
        """The round is over: ``verified`` hosts are served; every other admitted host
        still asking is first in the next round (its window is long closed)."""
        assert self.running_since is not None
        for host in self._admitted:
            if host in verified:
                self._done[host] = now
                self.asked.pop(host, None)
            else:
                self.waiting[host] = self.running_since
        held = self.settings.hold_share > 0
        for host in self.deferred:
            if host in self.waiting:  # (held: its hold runs from when it asked, else its window is past)
                self.waiting[host] = min(self.waiting[host], self.asked.get(host, now) if held else self.running_since)
        if stream_s:
            self.transfer_s = stream_s
        self._warm_until = now + self.transfer_s
        self._held = bool(self.waiting) and held
        self.running_since = self.stream_since = None
        self._admitted = set()


# ----------------------------------------------------------------------------- events, stats
