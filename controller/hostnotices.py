"""What the operator is told about hosts: each one learned or forgotten, and each frame
that claims a known host's address from elsewhere -- dropped (the host is pinned by
``--fabric`` or declared over REST: said at most once a minute per host) or contested
(the holder is probed where it is).

It owns these log lines, their rate limit and the matching events (``host_learned``,
``host_forgotten``; ``controller.events``). It must not change anything: host
discovery (``controller.hosts``) has decided already, and the app sends and applies its
``Actions``.
"""

from __future__ import annotations

import logging

from controller.events import EventLog
from controller.hosts import Actions, HostDiscovery
from controller.topoview import TopologyView

log = logging.getLogger("modelcast.hosts")


class HostNotices:
    """The log lines of discovery's ``Actions``; a spoofed claim on one host is said at
    most once every ``quiet_s``."""

    def __init__(self, quiet_s: float = 60.0) -> None:
        self.quiet_s = quiet_s
        self._warned: dict[str, float] = {}  # host -> when a claim on it was last said

    def tell(self, acts: Actions, view: TopologyView, discovery: HostDiscovery, now: float,
             events: EventLog | None = None) -> None:
        for ip in acts.learned:
            h = view.hosts[ip]
            log.info("host %s (%s) at switch %#x port %d", ip, h.mac, h.dpid, h.port)
            if events is not None:
                events.emit("host_learned", host=ip, mac=h.mac, dpid=h.dpid, port=h.port)
        for ip in acts.forgotten:
            log.info("host %s forgotten (port down, or silent and not answering probes)", ip)
            if events is not None:
                events.emit("host_forgotten", host=ip)
        for ip in acts.spoofed:
            if now - self._warned.get(ip, float("-inf")) < self.quiet_s:
                continue
            self._warned[ip] = now
            pinned = ip in discovery.pinned
            place = discovery.pinned.get(ip) or discovery.reserved.get(ip)
            if place is None:  # (its declaration was removed meanwhile)
                continue
            mac, dpid, port = place
            log.warning("a frame claims host %s's address from elsewhere: dropped (%s at switch %#x "
                        "port %d, %s; said at most once a minute)", ip,
                        "--fabric pins it" if pinned else "declared over REST", dpid, port, mac)
        for ip in acts.contested:
            h = view.hosts[ip]
            log.warning("a frame claims host %s's address from elsewhere: not moved; probing it at "
                        "switch %#x port %d (forgotten if silent, then learned where it is)",
                        ip, h.dpid, h.port)
