"""modelcast controller: pure multicast-tree core plus a thin Ryu (OpenFlow 1.3) shim."""
