"""Benchmarks and baselines (not shipped; not tests: they print numbers, they do not
pass or fail on time). Each reports ratios against a reference timed in the same run.

  ``controller``    tree computation and reroutes at scale (``make bench-controller``)
  ``distribution``  TCP fan-out vs UFTP vs modelcast on the OVS lab (``sudo make bench``)
  ``baselines``     the TCP fan-out and UFTP runs used by ``distribution``
  ``net``           host-agent goodput next to a raw UDP blast (loopback, bridge lab)
  ``agent``         the host agent at 1 Gbit/s and with one lossy receiver, next to TCP and UFTP
  ``scale``         NACK implosion, 8..1024 receivers, in memory (virtual time)

Dependencies point one way: bench -> lab -> product packages.
"""
