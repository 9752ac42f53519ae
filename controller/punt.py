"""Which host port takes more than its share of a switch's frames to the controller (pure).

A switch sends the controller at most ``--punt-rate`` frames/s (one OpenFlow meter for the
whole switch, ``controller.ofmsgs.punt_meter``). That keeps the controller's time, but one
host flooding new source addresses, or discovery frames, then takes the whole budget: the
first frames of the other hosts on that switch (how a silent host is learned) and the
switch's own discovery frames are dropped with the flood, and its links time out. So the
controller counts the frames each port sends it; a host port over ``limit`` frames in one
second is *quarantined* for ``hold_s``: its frames to the controller pass a meter of their
own (``controller.ofmsgs.quarantine_flows``), and the switch's budget is the other ports'
again. The entries expire on the switch by themselves (a hard timeout)."""

from __future__ import annotations

QUARANTINE_S = 60  # how long a port's frames to the controller stay on their own meter
RELAPSE = 4  # a held port sending this many times its limit again lost its entries


class PuntGuard:
    """Counts frames to the controller per (switch, port) in one-second windows."""

    def __init__(self, limit: int, hold_s: float = QUARANTINE_S) -> None:
        self.limit = limit  # frames/s a port may send us before it is quarantined (0: never)
        self.hold_s = hold_s
        self._window: dict[tuple[int, int], tuple[float, int]] = {}  # -> (window start, count)
        self._held: dict[tuple[int, int], float] = {}  # -> until when its entries last
        self.quarantined = 0  # quarantines ordered since start (/metrics)

    def note(self, dpid: int, port: int, now: float) -> bool:
        """One frame from ``dpid:port`` reached the controller: True when that port is
        to be quarantined now (the caller checks it is a host port; a link port carries
        other switches' frames and is held here without entries, so it is not asked
        about again until ``hold_s`` has passed)."""
        if self.limit <= 0:
            return False
        key = (dpid, port)
        start, count = self._window.get(key, (now, 0))
        if now - start >= 1.0:
            start, count = now, 0
        count += 1
        self._window[key] = (start, count)
        until = self._held.get(key)
        if until is not None and now < until:
            # its frames pass the quarantine meter (``limit``/s): many more means the
            # switch lost the entries (it restarted, someone deleted them)
            if count <= RELAPSE * self.limit:
                return False
        elif count <= self.limit:
            return False
        self._held[key] = now + self.hold_s
        self._window[key] = (now, 0)
        self.quarantined += 1
        return True

    def forget(self, dpid: int) -> None:
        """The switch (re)connected or went away: its tables hold no quarantine now."""
        for table in (self._window, self._held):
            for key in [k for k in table if k[0] == dpid]:
                del table[key]

    def expire(self, now: float) -> None:
        """Drop the counts of ports that sent nothing for a while (bounded state)."""
        self._window = {k: v for k, v in self._window.items() if now - v[0] < 2.0}
        self._held = {k: until for k, until in self._held.items() if now < until}
