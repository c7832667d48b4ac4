#!/bin/sh
# What a host offers fleet-agent and what is installed there, as key=value lines: the preflight
# of `fleetd bootstrap` and of playbooks/preflight.yml judge these, and bootstrap compares them
# with what it would install. Changes nothing on the host.
# Usage: fleet-agent-facts.sh PYTHON INSTALL_DIR CONFIG_DIR STATE_DIR UNIT_PATH [FLEETD_URLS]
# With FLEETD_URLS (comma-separated), also asks each for /api/v1/health from the host:
# fleetd_reachable= the first URL that answered, fleetd_unreachable= why the others did not.
set -u
PY=${1:-python3}
INSTALL_DIR=${2:-/opt/fleet-agent}
CONFIG_DIR=${3:-/etc/fleet-agent}
STATE_DIR=${4:-/var/lib/fleet-agent}
UNIT_PATH=${5:-/etc/systemd/system/fleet-agent.service}
FLEETD_URLS=${6:-}

echo "facts_version=1"
echo "uid=$(id -u)"
echo "arch=$(uname -m)"
echo "hostname=$(hostname)"

if command -v "$PY" >/dev/null 2>&1; then
    echo "python_path=$(command -v "$PY")"
    echo "python=$("$PY" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)"
    if "$PY" -c 'import venv' 2>/dev/null; then echo "python_venv=yes"; else echo "python_venv=no"; fi
else
    echo "python_path="
    echo "python="
    echo "python_venv=no"
fi

if command -v systemctl >/dev/null 2>&1; then echo "systemctl=yes"; else echo "systemctl=no"; fi
if [ -d /run/systemd/system ]; then echo "systemd_running=yes"; else echo "systemd_running=no"; fi

dir=$INSTALL_DIR
while [ ! -d "$dir" ] && [ "$dir" != "/" ]; do dir=$(dirname "$dir"); done
echo "disk_free_kb=$(df -Pk "$dir" 2>/dev/null | awk 'NR == 2 { print $4 }')"

driver=""
gpus=""
if command -v nvidia-smi >/dev/null 2>&1; then
    driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
fi
if [ -z "$driver" ] && [ -r /proc/driver/nvidia/version ]; then
    driver=$(sed -n 's/.*Kernel Module[^0-9]*\([0-9][0-9.]*\).*/\1/p' /proc/driver/nvidia/version | head -n 1)
fi
echo "nvidia_driver=$driver"
echo "nvidia_gpus=$gpus"

json_field() {
    # json_field FILE KEY: one top-level string field of a JSON file (a list of strings comma-joined),
    # with whichever Python runs (the host's first: an install's own may be what is broken).
    for candidate in "$PY" "$INSTALL_DIR/current/bin/python"; do
        if [ -x "$candidate" ] || command -v "$candidate" >/dev/null 2>&1; then
            "$candidate" -c 'import json, sys
try:
    value = json.load(open(sys.argv[1])).get(sys.argv[2], "")
    print(",".join(map(str, value)) if isinstance(value, list) else value)
except (OSError, ValueError, AttributeError):
    print("")' "$1" "$2" 2>/dev/null && return
        fi
    done
    echo ""
}

# The install that runs: the one INSTALL_DIR/current names (fleet-agent-versions.sh), else one of
# the older layout (a venv in INSTALL_DIR itself, upgraded in place), whose install_current is empty.
current=$(readlink "$INSTALL_DIR/current" 2>/dev/null)
installed=$INSTALL_DIR
if [ -n "$current" ]; then installed=$INSTALL_DIR/current; fi
if [ -r "$installed/bundle.json" ] && [ -x "$installed/bin/fleet-agent" ] && [ -s "$installed/bin/fleet-agent" ]; then
    echo "installed_version=$(json_field "$installed/bundle.json" version)"
    echo "installed_sha256=$(json_field "$installed/bundle.json" bundle_sha256)"
else
    echo "installed_version="
    echo "installed_sha256="
fi
echo "install_current=$current"
sha() { if [ -r "$1" ]; then sha256sum "$1" | cut -d ' ' -f 1; fi; }
echo "config_sha256=$(sha "$CONFIG_DIR/agent.toml")"
echo "unit_sha256=$(sha "$UNIT_PATH")"
if [ -r "$STATE_DIR/node.json" ] && [ -r "$STATE_DIR/session.token" ]; then
    echo "node_id=$(json_field "$STATE_DIR/node.json" node_id)"
    echo "node_server_url=$(json_field "$STATE_DIR/node.json" server_url)"
    echo "node_server_urls=$(json_field "$STATE_DIR/node.json" server_urls)"
else
    echo "node_id="
    echo "node_server_url="
    echo "node_server_urls="
fi
if command -v systemctl >/dev/null 2>&1; then
    echo "service_active=$(systemctl is-active fleet-agent.service 2>/dev/null | head -n 1)"
    echo "service_enabled=$(systemctl is-enabled fleet-agent.service 2>/dev/null | head -n 1)"
else
    echo "service_active="
    echo "service_enabled="
fi

if [ -n "$FLEETD_URLS" ]; then
    # Reachability, not trust: the certificate is checked by the agent itself (CA file or pin).
    "$PY" - "$FLEETD_URLS" <<'PYEOF' 2>/dev/null || { echo "fleetd_reachable="; echo "fleetd_unreachable=$PY cannot make HTTP requests"; }
import json, ssl, sys, urllib.error, urllib.request
context = ssl.create_default_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
errors = []
for url in [u.strip().rstrip("/") for u in sys.argv[1].split(",") if u.strip()][:16]:
    try:
        with urllib.request.urlopen(url + "/api/v1/health", timeout=5, context=context) as resp:
            if json.load(resp).get("status") == "ok":
                print("fleetd_reachable=" + url)
                break
            errors.append("%s: /api/v1/health did not say ok" % url)
    except urllib.error.HTTPError as exc:
        errors.append("%s: HTTP %s from /api/v1/health (not fleetd?)" % (url, exc.code))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        errors.append("%s: %s" % (url, getattr(exc, "reason", exc)))
else:
    print("fleetd_reachable=")
print("fleetd_unreachable=" + "; ".join(str(e).replace("\n", " ") for e in errors))
PYEOF
fi
