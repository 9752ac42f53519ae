"""What one distribution run put on the fabric, from two snapshots of every link's byte
counters (``Fabric.link_bytes``): the total over all links and directions, split into the
parts that tell the methods apart.

Every method must deliver N copies on the receivers' downlinks and one copy on the
sender's uplink; what differs is the rest: inter-switch (core) links, and the receivers'
own uplinks, which peer-to-peer and chains use to forward and multicast leaves idle.
Pure: no lab needed, so it is unit-tested.
"""

from __future__ import annotations

from typing import Any, Mapping

from topologies.spec import Topology

Snapshot = Mapping[tuple[str, str], int]


def summarize(topo: Topology, before: Snapshot, after: Snapshot, sender: str) -> dict[str, Any]:
    """Bytes per class of link direction between two snapshots, plus the busiest one.

    ``sender_link`` is the sender's uplink, ``host_down`` every host downlink (what
    was delivered), ``host_up`` every other host's uplink (forwarding by receivers),
    ``core`` inter-switch links; ``total`` is their sum, ``peak`` the largest single
    direction and ``peak_link`` its "from>to" name."""
    hosts = {h.name for h in topo.hosts}
    delta = {k: after[k] - before.get(k, 0) for k in after}
    parts = {"sender_link": 0, "host_down": 0, "host_up": 0, "core": 0}
    for (src, dst), n in delta.items():
        if src == sender:
            parts["sender_link"] += n
        elif src in hosts:
            parts["host_up"] += n
        elif dst in hosts:
            parts["host_down"] += n
        else:
            parts["core"] += n
    peak = max(delta.items(), key=lambda kv: kv[1], default=(("-", "-"), 0))
    return {"total": sum(delta.values()), **parts, "peak": peak[1],
            "peak_link": f"{peak[0][0]}>{peak[0][1]}"}
