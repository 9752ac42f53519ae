"""Parameterised lab topologies: one definition per family, used by the simulated fabric
(``Topology.graph()``) and by Mininet/OVS labs (``topologies/mn.py``, ``topologies.lab``)."""

from topologies.spec import (
    FAMILIES,
    Builder,
    Host,
    Link,
    Topology,
    TopologyError,
    fat_tree,
    from_dict,
    from_file,
    leaf_spine,
    linear,
    parse,
    ring,
)

__all__ = [
    "FAMILIES", "Builder", "Host", "Link", "Topology", "TopologyError", "fat_tree",
    "from_dict", "from_file", "leaf_spine", "linear", "parse", "ring",
]
