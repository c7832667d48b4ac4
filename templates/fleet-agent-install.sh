#!/bin/sh
# Installs fleet-agent from an offline bundle made by `fleetd bundle build` into a virtual
# environment of its own, INSTALL_DIR/versions/VERSION-SHA12 (SHA12: the bundle's SHA-256, first 12
# hex digits), beside what is installed already: nothing outside that directory is written, so the
# agent that runs keeps running and can be restarted as it is. fleet-agent-versions.sh then points
# INSTALL_DIR/current at it (and back, when the new agent does not come up).
# Needs no network: pip runs from the bundle's own pip wheel with --no-index. Every wheel is checked
# against the SHA-256 in the manifest before pip sees it, and the bundle's own SHA-256 is recorded
# in the new directory's bundle.json (bundle_sha256), written last: a directory without it is an
# install that did not finish, and is removed. On a failure (a full disk, pip) the new directory is
# removed and the error says which step failed and why ("no space left on ..." for a full disk).
# Prints "installed=VERSION", "bundle_sha256=HEX" and "version_dir=versions/NAME" on success. Byte
# code is compiled on first import rather than here: that halves the install time and costs the
# agent nothing.
# Usage: fleet-agent-install.sh BUNDLE_TARBALL PYTHON INSTALL_DIR
set -eu
BUNDLE=$1
PY=$2
INSTALL_DIR=$3

work=$(mktemp -d "${TMPDIR:-/tmp}/fleet-agent-bundle.XXXXXX")
target=""
finished=""
cleanup() {
    rm -rf "$work"
    # A directory without bundle.json is an install that did not finish: nothing keeps it.
    if [ -n "$target" ] && [ -z "$finished" ]; then rm -rf "$target"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# free DIR: "N MiB and M inodes free" on the filesystem of DIR (a full disk may be out of either).
free() {
    dir=$1
    while [ ! -d "$dir" ] && [ "$dir" != "/" ]; do dir=$(dirname "$dir"); done
    echo "$(df -Pk "$dir" 2>/dev/null | awk 'NR == 2 { print int($4 / 1024) }') MiB and" \
        "$(df -Pi "$dir" 2>/dev/null | awk 'NR == 2 { print $4 }') inodes free"
}

# fail STEP WHERE OUTPUT: the cause of a failed step from its output; a full disk is named as one.
fail() {
    # What the failed step left goes first: the free space said is what the host has without it.
    if [ -n "$target" ]; then rm -rf "$target"; fi
    if printf '%s\n' "$3" | grep -qi -e 'no space left' -e 'errno 28' -e 'disk quota exceeded'; then
        echo "error: no space left on $2 ($(free "$2")) while $1; nothing of it is" \
            "left behind and the installed agent is untouched" >&2
    else
        echo "error: $1 failed: $(printf '%s\n' "$3" | grep -v '^[[:space:]]*$' | tail -n 3 | tr '\n' ' ' \
            | cut -c 1-600)" >&2
    fi
    exit 1
}

out=$(tar -xzf "$BUNDLE" -C "$work" 2>&1) || fail "unpacking the bundle" "${TMPDIR:-/tmp}" "$out"
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
    assert all(c.isalnum() or c in ".+!-_" for c in version)
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

name="$version-$(echo "$bundle_sha256" | cut -c 1-12)"
if [ "$(readlink "$INSTALL_DIR/current" 2>/dev/null)" = "versions/$name" ] \
    && [ -r "$INSTALL_DIR/versions/$name/bundle.json" ]; then
    # It is the agent that runs: never rebuilt under it.
    echo "installed=$version"
    echo "bundle_sha256=$bundle_sha256"
    echo "version_dir=versions/$name"
    exit 0
fi
out=$(mkdir -p "$INSTALL_DIR/versions" 2>&1) || fail "making $INSTALL_DIR/versions" "$INSTALL_DIR" "$out"
# The same bundle left from before (an upgrade switched back, or one that did not finish) is made
# again from scratch: a venv is not relocatable, so it is built where it stays.
target="$INSTALL_DIR/versions/$name"
rm -rf "$target"
out=$("$PY" -m venv --without-pip "$target" 2>&1) || fail "making the venv $target" "$INSTALL_DIR" "$out"

# The host's own pip configuration (index URLs, constraints) must not steer an offline install.
out=$(PIP_CONFIG_FILE=/dev/null "$target/bin/python" "$pip_wheel/pip" install --quiet --no-index \
    --no-cache-dir --find-links "$bundle_dir/wheels" --disable-pip-version-check \
    --no-warn-script-location --no-compile "fleetd[agent]==$version" 2>&1) \
    || fail "installing fleet-agent $version with pip" "$INSTALL_DIR" "$out"
# The new entry point must be a whole file that runs: a disk that filled up under pip shows here.
out=$(PYTHONDONTWRITEBYTECODE=1 "$target/bin/fleet-agent" --help 2>&1) || fail "checking the new fleet-agent" "$INSTALL_DIR" "$out"

out=$("$PY" -c 'import json, sys
manifest = json.load(open(sys.argv[1]))
manifest["bundle_sha256"] = sys.argv[3]
with open(sys.argv[2], "w") as fh:
    json.dump(manifest, fh, indent=2, sort_keys=True)
    fh.write("\n")' "$bundle_dir/manifest.json" "$target/bundle.json.tmp" "$bundle_sha256" 2>&1 \
    && chmod 0644 "$target/bundle.json.tmp" && mv -f "$target/bundle.json.tmp" "$target/bundle.json") \
    || fail "recording $target/bundle.json" "$INSTALL_DIR" "$out"
finished=yes
echo "installed=$version"
echo "bundle_sha256=$bundle_sha256"
echo "version_dir=versions/$name"
