"""Mininet custom-topology file: ``mn --custom topologies/mn.py --topo leaf_spine,2,4,2``.

Every Mininet topology here is derived from the same ``topologies.spec`` definition the
simulation uses, with explicit dpids, port numbers, IPs and MACs, so both agree exactly.
Mininet ``exec``s this file without ``__file__``; the repository root is found from the
code object so ``topologies`` imports under Debian's Python too.
"""

import inspect
import os
import sys

_here = os.path.dirname(os.path.abspath(inspect.currentframe().f_code.co_filename))
if os.path.dirname(_here) not in sys.path:
    sys.path.insert(0, os.path.dirname(_here))

from mininet.topo import Topo  # noqa: E402

from topologies import spec  # noqa: E402


class SpecTopo(Topo):
    """A Mininet Topo built from a ``spec.Topology``."""

    def build(self, topology):  # type: ignore[override]
        for dpid, name in sorted(topology.switches.items()):
            self.addSwitch(name, dpid="%016x" % dpid, protocols="OpenFlow13")
        for link in topology.links:
            self.addLink(topology.switches[link.a], topology.switches[link.b],
                         port1=link.a_port, port2=link.b_port)
        for h in topology.hosts:
            self.addHost(h.name, ip=h.ip + "/8", mac=h.mac)
            self.addLink(h.name, topology.switches[h.dpid], port1=0, port2=h.port)


def _family(name):
    return lambda *args: SpecTopo(topology=spec.FAMILIES[name](*[int(a) for a in args]))


topos = {
    "linear": _family("linear"),
    "ring": _family("ring"),
    "leaf_spine": _family("leaf-spine"),
    "fat_tree": _family("fat-tree"),
    "topofile": lambda path: SpecTopo(topology=spec.from_file(path)),
}
