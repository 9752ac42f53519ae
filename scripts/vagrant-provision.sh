#!/usr/bin/env bash
# Provision the Vagrant lab VM (root, Debian 12 or Ubuntu 22.04) with exactly what CI
# uses: scripts/lab-deps.sh (apt packages, Open vSwitch running) and scripts/venv.sh
# (.venv with ryu and modelcast). Idempotent: `vagrant provision` re-runs it safely.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

# Ryu 4.34 builds only with setuptools<58, which does not run on Python 3.12+: use 3.11.
pick_python() {
  for py in python3.11 python3; do
    if command -v "$py" >/dev/null 2>&1 &&
       "$py" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 12))'; then
      echo "$py"; return 0
    fi
  done
  return 1
}

echo "provision: apt packages for the venv (make, python3 venv support)"
apt-get update -q
pkgs="make rsync"
if ! py=$(pick_python); then
  pkgs="$pkgs python3.11"   # Ubuntu 22.04 (universe)
fi
apt-get install -y -q $pkgs
py=$(pick_python) || {
  echo "provision: error: no Python 3.11 on this box (ryu 4.34 needs it); use bento/debian-12" >&2
  exit 1
}
# `python3 -m venv` needs ensurepip, packaged separately on Debian/Ubuntu.
"$py" -c 'import ensurepip' 2>/dev/null || apt-get install -y -q "$(basename "$py")-venv"

bash scripts/lab-deps.sh
PYTHON="$py" bash scripts/venv.sh
echo "provision: ready -- vagrant ssh -c 'cd $(pwd) && sudo make demo'"
