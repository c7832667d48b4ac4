#!/usr/bin/env bash
# Sets everything up and runs fleetd (SQLite, the embedded default) with a local fleet-agent
# on this machine. Prints the URL and the admin token; Ctrl-C stops both.
# State lives in .dev/ (FLEETD_DEV_DIR); delete it to start from scratch.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

dev=${FLEETD_DEV_DIR:-$PWD/.dev}
bind=${FLEETD_BIND:-127.0.0.1:8080}
url="http://$bind"
mkdir -p "$dev" && chmod 700 "$dev"
export FLEETD_DATA_DIR="$dev/fleetd"
bin="$PWD/.venv/bin"

# The first admin token is printed once by `fleetd init`; keep it (0600) for this dev setup.
if [ ! -s "$dev/admin.token" ]; then
    if [ -e "$FLEETD_DATA_DIR/fleetd.db" ]; then
        echo "$FLEETD_DATA_DIR holds a database but $dev/admin.token is gone; remove $dev to start over" >&2
        exit 1
    fi
    (umask 077 && "$bin/fleetd" init | tail -n 1 > "$dev/admin.token")
fi
token=$(cat "$dev/admin.token")

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$bin/fleetd" serve --bind "$bind" &
pids+=($!)
for _ in $(seq 1 100); do
    "$bin/python" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
        "$url/api/v1/health" 2>/dev/null && break
    kill -0 "${pids[0]}" 2>/dev/null || { echo "fleetd serve exited" >&2; exit 1; }
    sleep 0.2
done
export FLEETD_URL="$url" FLEETD_TOKEN="$token"

# A local agent: real NVML when an NVIDIA driver answers, otherwise the fake 8 x H100 host,
# labelled simulated=true so that nobody mistakes it for hardware.
agent_dir="$dev/agent"
config="$agent_dir/agent.toml"
if [ ! -s "$config" ]; then
    mkdir -p "$agent_dir" && chmod 700 "$agent_dir"
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        backend="nvml" labels=""
    else
        backend="fake:$PWD/tests/fixtures/nvml/h100_x8.json" labels='simulated = "true"'
    fi
    cat > "$config" <<TOML
server_url = "$url"
state_dir = "$agent_dir/state"
machine_id = "local-$(hostname)"

[labels]
$labels

[local_api]
listen = "${FLEET_AGENT_LOCAL_API_LISTEN:-127.0.0.1:8001}"

[devices]
backend = "$backend"
TOML
fi
if [ ! -s "$agent_dir/state/node.json" ]; then
    "$bin/fleetd" fleet show local >/dev/null 2>&1 || "$bin/fleetd" fleet create local --description "this machine"
    join=$("$bin/fleetd" join-token create --fleet local --single-use --ttl 10m --json \
        | "$bin/python" -c 'import json, sys; print(json.load(sys.stdin)["token"])')
    # The token goes in the environment, not argv, so that it stays out of `ps`.
    FLEET_AGENT_JOIN_TOKEN="$join" "$bin/fleet-agent" join --server "$url" --config "$config"
fi
"$bin/fleet-agent" run --config "$config" &
pids+=($!)

cat <<INFO

fleetd is running at $url (API docs: $url/api/docs)
admin token: $token

  export FLEETD_URL=$url FLEETD_TOKEN=$token
  .venv/bin/fleetd node list

Ctrl-C stops fleetd and the agent.
INFO
wait -n "${pids[@]}"
