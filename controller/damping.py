"""Flapping links held out of the trees (the idea of BGP's route-flap damping, RFC 2439):
a link that goes down ``flaps`` times within ``window_s`` is held out of every new tree
and detour for ``hold_s``, doubled at each hold that follows within ``window_s`` of the
last one's end (up to ``max_hold_s``), so trees stop moving with it.

It owns the downs and holds per link (a link by its two switches) and decides from the
``now`` it is given; it must not touch the view or the trees (``MulticastCore`` holds
and releases the link in the view: ``TopologyView.damp``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

Pair = frozenset  # the two switches of a link


@dataclass
class Damping:
    """Downs and holds per link; ``flaps`` 0: never hold."""

    flaps: int = 3
    window_s: float = 60.0
    hold_s: float = 30.0
    max_hold_s: float = 900.0
    _downs: dict[Pair, deque] = field(default_factory=dict)
    held: dict[Pair, float] = field(default_factory=dict)  # link -> when its hold ends
    _last: dict[Pair, tuple[float, float]] = field(default_factory=dict)  # link -> (its last hold, its end)

    def down(self, pair: Pair, now: float) -> float | None:
        """The link went down at ``now``: the end of the hold this starts, or None."""
        if self.flaps <= 0 or pair in self.held:
            return None
        downs = self._downs.setdefault(pair, deque())
        downs.append(now)
        while downs and downs[0] < now - self.window_s:
            downs.popleft()
        if len(downs) < self.flaps:
            return None
        downs.clear()
        last = self._last.get(pair)
        hold = min(self.max_hold_s, 2 * last[0]) if last and now - last[1] <= self.window_s else self.hold_s
        self.held[pair] = now + hold
        self._last[pair] = (hold, now + hold)
        return now + hold

    def due(self, now: float) -> list[Pair]:
        """The links whose hold ended by ``now`` (released: forgotten here)."""
        out = [p for p, until in self.held.items() if until <= now]
        for p in out:
            del self.held[p]
        return sorted(out, key=sorted)

    def report(self, now: float) -> list[dict]:
        """The held links and the seconds each has left (for /v1/health)."""
        return [{"switches": sorted(p), "held_s": round(max(0.0, until - now), 1)}
                for p, until in sorted(self.held.items(), key=lambda kv: sorted(kv[0]))]
