"""Which discovered links the controller believes (pure).

Signed discovery frames (``controller.lldpauth``) stop a host from forging a link, but
not two colluding hosts from *relaying* a genuine frame between them: host A receives the
frame its switch port sends, hands it to host B over any channel, and B sends it into
its own port. The controller then saw a one-hop link between A's and B's ports, forgot
both hosts (a link port holds no host), and routed trees and unicast flows between
those two switches through the two hosts, which can read or drop them (measured on the
OVS lab, leaf-spine 2×3: a relay between h1 and h3 made ``0x3:3 <-> 0x4:3`` a link
within a few seconds).

Two rules, checked before a discovered link changes anything:

- **A pinned fabric** (``--fabric SPEC``: a topology of ``topologies.spec``, e.g.
  ``file:/etc/modelcast/fabric.yaml``, whose switches have the real dpids and port
  numbers): only its links are believed, whatever the frames say. This stops every
  relay, also between hosts that never sent a frame of their own.
  Its hosts are pinned too (``controller.hosts``): known at their port from the start
  (a silent one needs no probe), never moved by a frame claiming their address, never
  forgotten for silence or a port going down.
- **Without one, a link between two host ports is refused**: both of its ends are ports
  where a host the controller learned is still attached. A real cable between two
  switches does not have a learned host at both ends (a host learned on a link port
  before that link was discovered is a start-up race on one port, and is forgotten when
  the link is believed); a link with a host at one end is believed, and that host
  forgotten, as before, but logged as a suspect. A relay between two hosts that stayed
  silent until it started is not stopped by this rule: pin the fabric.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.topoview import LinkKey, TopologyView
from topologies.spec import Topology

REFUSED_KEPT = 16  # the latest refused links (each once), for GET /v1/health


@dataclass(frozen=True)
class Refusal:
    link: LinkKey
    why: str
    kind: str  # "not pinned" | "host ports" (the metric's label)


class LinkGate:
    """Decides for each discovered link; counts and keeps the latest refusals."""

    def __init__(self, fabric: Topology | None = None) -> None:
        self.pinned: frozenset[LinkKey] | None = None if fabric is None else frozenset(
            LinkKey.make(lk.a, lk.a_port, lk.b, lk.b_port) for lk in fabric.links)
        # the pinned fabric's hosts: address -> (mac, dpid, port)
        self.hosts: dict[str, tuple[str, int, int]] = {} if fabric is None else {
            h.ip: (h.mac.lower(), h.dpid, h.port) for h in fabric.hosts}
        self.refused: dict[LinkKey, Refusal] = {}  # (oldest first)
        self.refused_total = 0  # reports refused (Ryu reports each direction of a link)

    def check(self, view: TopologyView, a: int, a_port: int, b: int, b_port: int) -> Refusal | None:
        """Why the link ``a``:``a_port`` <-> ``b``:``b_port`` is not believed, or None
        (then it is). A refusal is counted and kept."""
        key = LinkKey.make(a, a_port, b, b_port)
        if self.pinned is not None:
            if key in self.pinned:
                return None
            return self._refuse(key, "not pinned", "not a link of the pinned fabric (--fabric)")
        ends = [self.hosts_at(view, d, p) for d, p in ((a, a_port), (b, b_port))]
        if all(ends):
            return self._refuse(key, "host ports", (
                f"hosts {', '.join(ends[0])} and {', '.join(ends[1])} are attached at its two ends: "
                "two hosts relaying discovery frames between them? (pin the fabric with --fabric)"))
        return None

    @staticmethod
    def hosts_at(view: TopologyView, dpid: int, port: int) -> list[str]:
        """The learned hosts attached at ``dpid``:``port`` (their addresses)."""
        return sorted(ip for ip in view.hosts_at(dpid, port) if view.host_attached(view.hosts[ip]))

    def allowed(self, key: LinkKey) -> bool:
        """Whether a link restored from saved state may stay (the pinned fabric only: the
        hosts it was checked against are the saved ones too)."""
        return self.pinned is None or key in self.pinned

    def missing(self, view: TopologyView) -> list[LinkKey]:
        """Pinned links that are not up now (not discovered, or down)."""
        if self.pinned is None:
            return []
        down = view.ports_down
        return sorted(k for k in self.pinned if k not in view.links
                      or (k.a, k.a_port) in down or (k.b, k.b_port) in down)

    def _refuse(self, key: LinkKey, kind: str, why: str) -> Refusal:
        r = Refusal(key, why, kind)
        self.refused.pop(key, None)
        self.refused[key] = r
        if len(self.refused) > REFUSED_KEPT:
            del self.refused[next(iter(self.refused))]
        self.refused_total += 1
        return r

    def health(self, view: TopologyView) -> dict:
        """``fabric`` of ``GET /v1/health``."""
        def as_json(k: LinkKey) -> dict:
            return {"a": k.a, "a_port": k.a_port, "b": k.b, "b_port": k.b_port}
        return {"pinned": self.pinned is not None, "pinned_hosts": len(self.hosts),
                "missing_links": [as_json(k) for k in self.missing(view)],
                "refused_total": self.refused_total,
                "refused": [dict(as_json(r.link), why=r.why) for r in self.refused.values()]}
