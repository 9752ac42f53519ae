#!/usr/bin/env bash
# Mininet comes from Debian for /usr/bin/python3; expose only the mininet package to the
# venv (not all of Debian's dist-packages) once it is installed. Idempotent: run after
# scripts/lab-deps.sh, which may install Mininet after the venv was built.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
[ -x "$VENV/bin/python" ] || exit 0
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ -d /usr/lib/python3/dist-packages/mininet ]; then
  mkdir -p "$VENV/mininet-path"
  ln -sfn /usr/lib/python3/dist-packages/mininet "$VENV/mininet-path/mininet"
  echo "$PWD/$VENV/mininet-path" > "$site/modelcast-mininet.pth"
fi
