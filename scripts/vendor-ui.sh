#!/usr/bin/env bash
# Vendor the web view's JavaScript graph library (cytoscape, MIT) into controller/ui/vendor/,
# where the controller serves it from and pip ships it: the page loads nothing from a CDN
# (the machines it runs on are often offline). The npm tarball of the pinned version is
# checked against its pinned sha512 before anything is unpacked; its LICENSE goes beside
# the script. Idempotent: a vendored copy of the pinned version is left as it is. Called
# by scripts/venv.sh; installs npm with apt (root, Debian) when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=cytoscape
VERSION=3.34.4
# the registry's dist.integrity for cytoscape-3.34.4.tgz (npm view cytoscape@3.34.4 dist.integrity)
SHA512=msY99tMY8iWTg+sIPGfSqDcPNOt4xcj+v/K/7qUFaCUxxlqnMkUYLBjRUzn9W5CU/R2hrmtJa5+UtovrEM2ctg==
DEST=controller/ui/vendor
STAMP="$DEST/$NAME.version"
if [ -f "$DEST/$NAME.min.js" ] && [ -f "$DEST/$NAME.LICENSE" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$VERSION" ]; then
  echo "vendor-ui: $NAME $VERSION already in $DEST"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "vendor-ui: installing npm (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q npm
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "vendor-ui: fetching $NAME@$VERSION"
(cd "$tmp" && npm pack "$NAME@$VERSION" --silent >/dev/null)
tarball="$tmp/$NAME-$VERSION.tgz"
got=$(python3 -c 'import base64, hashlib, sys; print(base64.b64encode(hashlib.sha512(open(sys.argv[1], "rb").read()).digest()).decode())' "$tarball")
if [ "$got" != "$SHA512" ]; then
  echo "vendor-ui: $NAME-$VERSION.tgz has sha512-$got, expected sha512-$SHA512: refusing it" >&2
  exit 1
fi
tar -xzf "$tarball" -C "$tmp" package/dist/$NAME.min.js package/LICENSE
mkdir -p "$DEST"
cp "$tmp/package/dist/$NAME.min.js" "$DEST/$NAME.min.js"
cp "$tmp/package/LICENSE" "$DEST/$NAME.LICENSE"
echo "$VERSION" > "$STAMP"
echo "vendor-ui: $NAME $VERSION (sha512 checked) in $DEST"
