"""Sender pacing (sans-IO): a token bucket whose rate follows AIMD below a hard cap, and
the policy that decides which loss is congestion.

Multicast has no per-receiver congestion window, so the sender paces itself: datagrams
leave only while the bucket holds tokens, refilled at ``rate``. The rate starts below the
cap (switch buffers overrun on bursts), ramps up fast until the first congestion signal
(a start below the cap is a precaution, not a measurement) and gently after it, and is
cut multiplicatively at most once per ``interval`` when a NACK window closes on a
congestion verdict of the ``LossClassifier``.

Loss is not congestion, and the group is not its slowest member: one receiver losing
datagrams (a bad NIC, a busy CPU, a lossy last hop) is that receiver's problem, served by
repair, and must not slow everyone else down. The sender cuts its rate only for loss
that the *group* shares -- loss reported by more than ``quorum`` of the receivers at once
-- or for drops at its own link, which every datagram crosses.

No clock and no socket: every call takes ``now``.
"""

from __future__ import annotations

import enum
from typing import Optional

# Datagrams a receiver's reported loss (a NACK's ``loss_permille``) averages over: a
# per-datagram EWMA of first-transmission loss with this horizon (``ReceiverConfig``).
# Long enough that random 1% loss does not read as the 2% tolerance; so a burst stays in
# the figure for about this many datagrams after it ended, and the sender does not read
# it as new congestion until that many datagrams were streamed after its cut.
LOSS_HORIZON = 1024

# What a datagram costs an Ethernet link beyond its UDP payload: IPv4 (20) and UDP (8)
# headers, the Ethernet header (14) and FCS (4), preamble (8) and the inter-frame gap (12).
# The pacer charges it per datagram, so a ``--rate`` equal to the NIC's speed is what the
# link carries: counting payload alone overran a 1500-MTU link by 4.5% (1538 bytes of
# link time per 1472 of payload) and a 9000-MTU one by 0.7%, and a long transfer at that
# rate built a queue until it dropped.
LINK_OVERHEAD = 66


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
        self.lowest_cut: Optional[float] = None  # the rate after the deepest cut so far
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

    def window_closed(self, now: float, floor: Optional[float] = None, may_cut: bool = True) -> bool:
        """A NACK window closed: if it carried a congestion signal, cut the rate (at most
        once per interval, never below ``floor``, default the hard floor; not at all
        unless ``may_cut``: the signal is one already answered) and report True. The
        signal is cleared either way, or it would stay latched and stop the additive
        increase for good."""
        floor = self._floor if floor is None else max(self._floor, floor)
        cut = (may_cut and self.congested and now - self._last_decrease >= self._interval
               and self.rate > floor)
        if cut:
            self.refill(now)
            self.rate = max(floor, self.rate * self._decrease)
            self.lowest_cut = self.rate if self.lowest_cut is None else min(self.lowest_cut, self.rate)
            self._last_decrease = now
            self.decreases += 1
        self.congested = False
        return cut


class RepairBudget:
    """While the stream runs, repairs get at most ``share`` of the paced datagrams, so a
    lagging receiver is served in parallel without starving the stream everyone else
    is waiting for. Unused budget is kept only up to ``depth`` datagrams: a receiver
    that starts lagging late cannot spend what a quiet stretch saved and stall the
    stream for a burst."""

    def __init__(self, share: float, depth: float) -> None:
        self.share = share
        self._depth = depth
        self._credit = 0.0  # datagrams' worth of repair allowance

    @property
    def allows(self) -> bool:
        return self.share > 0 and self._credit >= 0.0

    def sent(self, repair: bool) -> None:
        """One paced datagram left while streaming (a repair or a first transmission)."""
        self._credit = min(self._depth, self._credit + self.share - (1.0 if repair else 0.0))


class PeerBudget:
    """What one receiver's repair requests may cost the sender: ``total`` bytes over the
    transfer and ``rate`` bytes/s on average (a bucket ``burst`` bytes deep). Every
    repair for it is charged: a unicast one whole as it is sent, a multicast or parity
    one when queued, split among the receivers that asked for it. Requests are cut to what it can still afford, so
    neither a forged id nor a receiver that keeps asking can make the sender spend more
    than its budget, or repair it faster than ``rate`` (others' repairs go on)."""

    def __init__(self, total: float, rate: float, burst: float, now: float, unit: float = 1.0) -> None:
        self.total = total
        self.unit = unit  # the smallest repair (one datagram): less left than this is nothing left
        self.rate = rate
        self.burst = burst
        self.spent = 0.0  # bytes charged so far
        self._tokens = burst
        self._at = now

    def charge(self, nbytes: float, now: float) -> None:
        self._refill(now)
        self._tokens -= nbytes
        self.spent += nbytes

    @property
    def exhausted(self) -> bool:
        return self.total - self.spent < self.unit

    def affordable(self, now: float) -> float:
        """Bytes of repair it may ask for now (never negative)."""
        self._refill(now)
        return max(0.0, min(self._tokens, self.total - self.spent))

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now


class Verdict(enum.Enum):
    """What a closed NACK window's loss reports mean for the rate."""

    NONE = "none"  # no loss above the tolerance reported
    LOCAL = "local"  # one or a minority of receivers: their own problem, repair them
    GROUP = "group"  # loss shared by more than the quorum of the group: congestion
    LINK = "link"  # the sender's own link dropped datagrams: congestion


class LossClassifier:
    """Tells congestion from one receiver's own problem.

    Each NACK carries the receiver's loss of first transmissions (smoothed over ~1000
    datagrams). A receiver counts as *lossy* while its last report, at most ``memory``
    seconds old, is above ``tolerance``. When a window with fresh loss reports closes,
    the loss is the group's (congestion) if more than ``quorum`` of the group is lossy,
    and the receivers' own otherwise. The group is every receiver still taking part,
    including those that already verified: after the stream, one straggler among
    finished receivers stays a minority and its catch-up is not throttled.
    Drops at the sender's own link (the socket layer reports them) are always
    congestion. Receivers suppress NACKs for loss the group shares, so ``memory`` must
    span several of their NACK backoffs for the silent majority to be counted.
    """

    def __init__(self, *, quorum: float, tolerance: float, memory: float) -> None:
        self.quorum = quorum
        self.tolerance = tolerance
        self.memory = memory
        self._reports: dict[int, tuple[float, float]] = {}  # receiver -> (when, loss)
        self._send_drops = 0
        self._pending = False  # a report above the tolerance since the last verdict
        self.verdicts: dict[Verdict, int] = {v: 0 for v in Verdict}

    def report(self, rid: int, loss: float, now: float, requests: bool = True) -> bool:
        """A receiver's loss report (``requests``: its NACK asked for something). True
        if it is a signal -- above the tolerance -- to be judged when the window closes."""
        self._reports[rid] = (now, loss)
        signal = loss > self.tolerance and requests
        self._pending = self._pending or signal
        return signal

    def shared(self, now: float, group: int) -> bool:
        """More than the quorum of a ``group`` of receivers (at least one) is lossy now."""
        return self.lossy(now) > self.quorum * max(1, group)

    def send_dropped(self, count: int) -> None:
        """The sender's own socket or link refused ``count`` datagrams."""
        self._send_drops += count

    def forget(self, rid: int) -> None:
        """The receiver left the group (failed): it no longer counts either way."""
        self._reports.pop(rid, None)

    def lossy(self, now: float) -> int:
        """Receivers whose last report, fresh enough, is above the tolerance."""
        horizon = now - self.memory
        return sum(1 for when, loss in self._reports.values() if when >= horizon and loss > self.tolerance)

    @property
    def pending(self) -> bool:
        """A possible congestion signal waits for its verdict."""
        return self._pending or self._send_drops > 0

    def verdict(self, now: float, group: int) -> Verdict:
        """Judge the signals since the last verdict; ``group`` is how many receivers
        take part (at least one)."""
        signalled, self._pending = self._pending, False
        if self._send_drops:
            self._send_drops = 0
            found = Verdict.LINK
        elif not signalled:
            found = Verdict.NONE
        elif self.shared(now, group):
            found = Verdict.GROUP
        else:
            found = Verdict.LOCAL
        self.verdicts[found] += 1
        return found
