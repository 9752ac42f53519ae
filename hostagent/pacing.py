"""Sender pacing (sans-IO): a token bucket whose rate follows AIMD below a hard cap.

Multicast has no per-receiver congestion window, so the sender paces itself: datagrams
leave only while the bucket holds tokens, refilled at ``rate``. The rate starts below the
cap (switch buffers overrun on bursts), ramps up fast until the first congestion signal
(a start below the cap is a precaution, not a measurement) and gently after it, and is
cut multiplicatively at most once per ``interval`` when a NACK window closes with
receivers reporting real loss of first transmissions.

No clock and no socket: every call takes ``now``.
"""

from __future__ import annotations


class Pacer:
    """Token bucket (bytes) at ``rate`` (bits/s), additive increase and multiplicative
    decrease of that rate within ``[cap_bps * min_fraction, cap_bps]``."""

    def __init__(
        self,
        cap_bps: float,
        now: float,
        *,
        initial_fraction: float,
        min_fraction: float,
        ramp_increase: float,
        increase: float,
        decrease: float,
        interval: float,
        burst_bytes: int,
        max_datagram: int,
    ) -> None:
        """``ramp_increase`` / ``increase``: additive step per clean ``interval`` as a
        fraction of the cap, before / after the first decrease; ``decrease``: factor
        applied on congestion. The bucket starts with one datagram's worth of tokens."""
        self.cap_bps = cap_bps
        self.rate = cap_bps * initial_fraction
        self.congested = False  # a loss report arrived since the last window closed
        self.decreases = 0
        self._floor = cap_bps * min_fraction
        self._ramp = ramp_increase
        self._increase = increase
        self._decrease = decrease
        self._interval = interval
        self._burst = float(burst_bytes)
        self._tokens = float(min(burst_bytes, max_datagram))
        self._last_refill = now
        self._last_decrease = -1e18

    @property
    def may_send(self) -> bool:
        """Tokens left (a datagram may overdraw the bucket; the debt delays the next)."""
        return self._tokens > -1e-6

    def spend(self, nbytes: int) -> None:
        self._tokens -= nbytes

    def refill(self, now: float) -> None:
        """Add the tokens earned since the last refill, growing the rate first unless
        congestion was signalled or the last decrease is under one interval old."""
        elapsed = now - self._last_refill
        if elapsed <= 0:
            return
        if not self.congested and now - self._last_decrease >= self._interval and self.rate < self.cap_bps:
            # Additive increase, proportional to elapsed clean time, never above the cap.
            step = self._ramp if self.decreases == 0 else self._increase
            self.rate = min(self.cap_bps, self.rate + self.cap_bps * step * elapsed / self._interval)
        self._tokens = min(self._burst, self._tokens + elapsed * self.rate / 8)
        self._last_refill = now

    def next_send_at(self) -> float:
        """When the bucket is out of debt again (a datagram may leave)."""
        return self._last_refill + max(0.0, -self._tokens) / (self.rate / 8) + 1e-9

    def window_closed(self, now: float) -> bool:
        """A NACK window closed: if it carried a congestion signal, cut the rate (at most
        once per interval) and report True. The signal is cleared either way, or it
        would stay latched and stop the additive increase for good."""
        cut = self.congested and now - self._last_decrease >= self._interval
        if cut:
            self.refill(now)
            self.rate = max(self._floor, self.rate * self._decrease)
            self._last_decrease = now
            self.decreases += 1
        self.congested = False
        return cut
