#!/bin/sh
# Installs (or upgrades in place) fleet-agent from an offline bundle made by `fleetd bundle
# build` into the virtual environment INSTALL_DIR. Needs no network: pip runs from the bundle's
# own pip wheel with --no-index. Prints "installed=VERSION" on success. Byte code is compiled
# on first import rather than here: that halves the install time and costs the agent nothing.
# Usage: fleet-agent-install.sh BUNDLE_TARBALL PYTHON INSTALL_DIR
set -eu
BUNDLE=$1
PY=$2
INSTALL_DIR=$3

work=$(mktemp -d "${TMPDIR:-/tmp}/fleet-agent-bundle.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
tar -xzf "$BUNDLE" -C "$work"
set -- "$work"/fleet-agent-bundle-*/manifest.json
[ -r "$1" ] || { echo "error: $BUNDLE is not a fleet-agent bundle (no manifest.json)" >&2; exit 2; }
bundle_dir=$(dirname "$1")
version=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["version"])' "$bundle_dir/manifest.json")
set -- "$bundle_dir"/wheels/pip-*.whl
[ -r "$1" ] || { echo "error: the bundle has no pip wheel" >&2; exit 2; }
pip_wheel=$1

# A venv whose interpreter no longer runs (the system Python was replaced) is made again.
if [ -x "$INSTALL_DIR/bin/python" ] && ! "$INSTALL_DIR/bin/python" -c 'import sys' >/dev/null 2>&1; then
    "$PY" -m venv --clear --without-pip "$INSTALL_DIR"
fi
[ -x "$INSTALL_DIR/bin/python" ] || "$PY" -m venv --without-pip "$INSTALL_DIR"

# The host's own pip configuration (index URLs, constraints) must not steer an offline install.
PIP_CONFIG_FILE=/dev/null "$INSTALL_DIR/bin/python" "$pip_wheel/pip" install --quiet --no-index \
    --find-links "$bundle_dir/wheels" --disable-pip-version-check --no-warn-script-location --no-compile \
    "fleetd[agent]==$version"

cp "$bundle_dir/manifest.json" "$INSTALL_DIR/bundle.json.tmp"
chmod 0644 "$INSTALL_DIR/bundle.json.tmp"
mv -f "$INSTALL_DIR/bundle.json.tmp" "$INSTALL_DIR/bundle.json"
echo "installed=$version"
