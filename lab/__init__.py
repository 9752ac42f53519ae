"""Test and lab tooling (not shipped by ``pip install``; like faucet's ``clib/``).

Real labs, which need root:
  ``sh``          the one shell runner, error type, availability check, cleanup helpers
  ``ovs``         a topology on Open vSwitch (userspace datapath) with netns hosts; CLI
  ``bridge``      a kernel Linux-bridge lab for host-agent-only runs at kernel speed
  ``loss``        loss towards a host (netem or nftables) and rate caps on a NIC
  ``probes``      ping, UDP sender/blaster, multicast capture, IGMP member (in a netns)
  ``controller``  ``modelcast-controller`` as a subprocess on free ports
  ``fabric``      controller + OVS lab wired together, hosts learned, port counters
  ``transfer``    one model from a sender to many receivers with the real agents
  ``models``      test "model" files and their digests
  ``demo``        ``make demo``

Simulations, which need nothing:
  ``fakeof``      OpenFlow 1.3 switches in memory (flow/group tables, packet tracing)
  ``netsim``      an in-memory network with loss and virtual time for the host agent

Dependencies point one way: lab -> controller, hostagent, topologies (never back).
"""
