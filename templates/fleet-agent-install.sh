#!/bin/sh
# Installs (or upgrades in place) fleet-agent from an offline bundle made by `fleetd bundle
# build` into the virtual environment INSTALL_DIR. Needs no network: pip runs from the bundle's
# own pip wheel with --no-index. Every wheel is checked against the SHA-256 in the manifest
# before pip sees it, and the bundle's own SHA-256 is recorded in INSTALL_DIR/bundle.json
# (bundle_sha256), so a rebuilt bundle of the same version is told apart. Prints
# "installed=VERSION" and "bundle_sha256=HEX" on success. Byte code is compiled
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
# The manifest must be valid and every wheel in it present with its SHA-256; nothing else is installed.
version=$("$PY" - "$bundle_dir" <<'PYEOF'
import hashlib, json, os, sys
root = sys.argv[1]
try:
    manifest = json.load(open(os.path.join(root, "manifest.json")))
    version, wheels = manifest["version"], manifest["wheels"]
    assert isinstance(version, str) and version and isinstance(wheels, dict) and wheels
except (OSError, ValueError, KeyError, TypeError, AssertionError):
    sys.exit("error: the bundle's manifest.json is not a valid fleet-agent manifest")
for name, digest in sorted(wheels.items()):
    path = os.path.join(root, "wheels", os.path.basename(name))
    try:
        with open(path, "rb") as fh:
            actual = hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        sys.exit("error: %s is in the manifest but not in the bundle" % name)
    if actual != digest:
        sys.exit("error: %s does not match its SHA-256 in the manifest" % name)
listed = {os.path.basename(n) for n in wheels}
extra = sorted(n for n in os.listdir(os.path.join(root, "wheels")) if n not in listed)
if extra:
    sys.exit("error: wheels not in the manifest: %s" % ", ".join(extra))
print(version)
PYEOF
) || exit 2
bundle_sha256=$(sha256sum "$BUNDLE" | cut -d ' ' -f 1)
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
# pip leaves an installed fleetd of the same version alone: a rebuilt bundle (another SHA-256) must
# still put its own fleetd in place, or the host would run the old code under the new bundle_sha256.
set -- "$bundle_dir"/wheels/fleetd-*.whl
if [ -r "$1" ]; then
    PIP_CONFIG_FILE=/dev/null "$INSTALL_DIR/bin/python" "$pip_wheel/pip" install --quiet --no-index --no-deps \
        --force-reinstall --disable-pip-version-check --no-warn-script-location --no-compile "$1"
fi

"$PY" -c 'import json, sys
manifest = json.load(open(sys.argv[1]))
manifest["bundle_sha256"] = sys.argv[3]
with open(sys.argv[2], "w") as fh:
    json.dump(manifest, fh, indent=2, sort_keys=True)
    fh.write("\n")' "$bundle_dir/manifest.json" "$INSTALL_DIR/bundle.json.tmp" "$bundle_sha256"
chmod 0644 "$INSTALL_DIR/bundle.json.tmp"
mv -f "$INSTALL_DIR/bundle.json.tmp" "$INSTALL_DIR/bundle.json"
echo "installed=$version"
echo "bundle_sha256=$bundle_sha256"
