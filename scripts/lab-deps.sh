#!/usr/bin/env bash
# Install and start what the Open vSwitch lab needs (Debian/Ubuntu, root), and the C compiler and
# OpenSSL headers that build the receiver's C path (hostagent/_fastrun.c) when the venv is made. Used by
# .ci/run, `make demo` and the Vagrant VM, so the one recipe is exercised on every CI run.
set -euo pipefail
pkgs="gcc libssl-dev openvswitch-switch mininet iproute2 iputils-ping ethtool nftables uftp iperf3 tcpdump curl rsync opentracker aria2 mktorrent etcd-server chromium chromium-driver"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  echo "lab-deps: installing$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q $missing
fi
# vagrant only validates the Vagrantfile here (no provider runs on these machines);
# without --no-install-recommends apt would pull libvirt and a kernel image.
if ! dpkg -s vagrant >/dev/null 2>&1; then
  echo "lab-deps: installing vagrant (to validate the Vagrantfile)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends vagrant
fi
if ! ovs-vsctl --timeout=3 show >/dev/null 2>&1; then
  echo "lab-deps: starting Open vSwitch"
  # No systemd here; the kernel-module warning is harmless: labs use datapath_type=netdev.
  /usr/share/openvswitch/scripts/ovs-ctl start --system-id=random || true
  ovs-vsctl --timeout=10 show >/dev/null
fi
echo "lab-deps: Open vSwitch $(ovs-vsctl --version | head -1 | awk '{print $NF}') running"
