"""Live counters of one group's entries, read from the switches when an operator asks
(``GET /v1/groups/{id}/trace``): the (S,G) flow's and the OpenFlow group's packets and
bytes, and each bucket's, so the hop where a count stops rising is where packets stop.

It owns the statistics requests it sends, matching their replies by (switch, xid), and a
short cache: a trace costs two requests per switch of the tree at most once per
``ttl_s``, however often it is asked (a ``--watch`` every second, a web view).
It must not touch anything else of the switches' or the core's state: counters are
read, never acted on.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser

from controller import ofmsgs

log = logging.getLogger("modelcast.counters")

TTL_S = 1.0  # a switch's counters for a group are read again at most this often
TIMEOUT_S = 1.0  # a switch that has not answered by then is reported as not answering
# our xids: the top of the 32-bit range, apart from the ones Ryu numbers plans with
# (a per-datapath counter from a random start; a clash would need it to reach here)
_XID_BASE = 0xF000_0000
_SG_PRIORITIES = (ofmsgs.PRIO_SG, ofmsgs.PRIO_VERSION)


@dataclass
class Reading:
    """One switch's counters for one group: ``flows`` (in_port -> [packets, bytes] of the
    group's (S,G) and version flows by the port they match), ``group`` ([packets,
    bytes]) and ``buckets`` (per bucket, in bucket order) of its OpenFlow group; ``at``
    when they were read (monotonic); ``error`` when the switch did not answer."""

    at: float
    flows: dict[int, list[int]] = field(default_factory=dict)
    group: list[int] | None = None
    buckets: list[list[int]] = field(default_factory=list)
    error: str | None = None


class _Ask:
    """The replies one ``read`` waits for."""

    def __init__(self, event: Any, left: int) -> None:
        self.event = event
        self.left = left

    def one_done(self) -> None:
        self.left -= 1
        if self.left <= 0:
            self.event.set()


class Counters:
    """Reads a group's counters from its switches. ``send(dpid, msg)`` sends a message
    (False: the switch is not connected); ``event`` makes the waitable (the app passes
    Ryu's green ``hub.Event``)."""

    def __init__(self, send: Callable[[int, Any], bool], event: Callable[[], Any] = threading.Event,
                 clock: Callable[[], float] = time.monotonic, ttl_s: float = TTL_S,
                 timeout_s: float = TIMEOUT_S) -> None:
        self._send = send
        self._event = event
        self._clock = clock
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self._xids = itertools.count()
        self._cache: dict[tuple[int, int], Reading] = {}  # (dpid, gid) -> its last reading
        self._waiting: dict[tuple[int, int], tuple[_Ask, Reading, str]] = {}  # (dpid, xid) -> ...
        # requests given up on (dpid, xid) -> when: their replies, if they still come, are
        # dropped here -- a late flow-stats reply must never reach a table read in progress
        self._late: dict[tuple[int, int], float] = {}
        self.requests = 0  # statistics requests sent (the cost of traces)

    def read(self, gid: int, dpids: Iterable[int]) -> dict[int, Reading]:
        """The counters of group ``gid`` on each of ``dpids``, read now unless read within
        ``ttl_s``; waits up to ``timeout_s`` for the switches' answers."""
        now = self._clock()
        out: dict[int, Reading] = {}
        ask = _Ask(self._event(), 0)
        for dpid in sorted(set(dpids)):
            cached = self._cache.get((dpid, gid))
            if cached is not None and now - cached.at <= self.ttl_s and cached.error is None:
                out[dpid] = cached
                continue
            reading = out[dpid] = Reading(at=now)
            for kind, msg in self._requests(dpid, gid):
                xid = _XID_BASE + next(self._xids) % 0x0FFF_FFFF
                msg.xid = xid
                self._waiting[(dpid, xid)] = (ask, reading, kind)
                ask.left += 1
                self.requests += 1
                if not self._send(dpid, msg):
                    del self._waiting[(dpid, xid)]
                    ask.left -= 1
                    reading.error = "not connected"
        if ask.left > 0:
            ask.event.wait(self.timeout_s)
        late_at = self._clock()
        for key, (a, reading, _) in list(self._waiting.items()):
            if a is ask:  # (no answer in time: forgotten, a late one is dropped)
                del self._waiting[key]
                self._late[key] = late_at
                reading.error = reading.error or f"no answer within {self.timeout_s:g} s"
        if len(self._late) > 1024:  # (a switch that never answers them: forget the oldest)
            self._late = {k: t for k, t in self._late.items() if late_at - t <= 60.0}
        for dpid, reading in out.items():
            if reading.at == now:
                self._cache[(dpid, gid)] = reading
        if len(self._cache) > 4096:  # (old readings of groups nobody traces any more)
            self._cache = {k: r for k, r in self._cache.items() if now - r.at <= self.ttl_s}
        return out

    def reply(self, dpid: int, msg: Any) -> bool:
        """A statistics reply from switch ``dpid``: True when it answers one of our
        requests (the caller passes the others on)."""
        waiting = self._waiting.get((dpid, msg.xid))
        if waiting is None:
            if (dpid, msg.xid) in self._late:  # (given up on: dropped, never passed on)
                if not msg.flags & ofp.OFPMPF_REPLY_MORE:
                    del self._late[(dpid, msg.xid)]
                return True
            # group statistics are asked for by traces alone: one nobody waits for is dropped
            return isinstance(msg, parser.OFPGroupStatsReply)
        ask, reading, kind = waiting
        if kind == "flows":
            for stat in msg.body:
                if stat.priority in _SG_PRIORITIES:
                    port = stat.match.get("in_port", 0) if hasattr(stat.match, "get") else 0
                    got = reading.flows.setdefault(port, [0, 0])
                    got[0] += stat.packet_count
                    got[1] += stat.byte_count
        else:
            for stat in msg.body:
                reading.group = [stat.packet_count, stat.byte_count]
                reading.buckets = [[b.packet_count, b.byte_count] for b in stat.bucket_stats]
        if not msg.flags & ofp.OFPMPF_REPLY_MORE:
            del self._waiting[(dpid, msg.xid)]
            ask.one_done()
        return True

    @staticmethod
    def _requests(dpid: int, gid: int) -> list[tuple[str, Any]]:
        dp = ofmsgs.datapath(dpid)
        return [("flows", parser.OFPFlowStatsRequest(
                    dp, 0, ofmsgs.TABLE, ofp.OFPP_ANY, ofp.OFPG_ANY, ofmsgs.cookie(gid),
                    ofmsgs.FULL_MASK, parser.OFPMatch())),
                ("group", parser.OFPGroupStatsRequest(dp, 0, gid))]
