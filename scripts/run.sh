#!/usr/bin/env bash
# Sets up what running needs (scripts/setup.sh --run) and runs fleetd (SQLite, the embedded
# default) with a local fleet-agent on this machine. Prints the URLs and the admin token;
# Ctrl-C stops the agent (its tasks are requeued, no attempt used), then fleetd.
# State lives in .dev/ (FLEETD_DEV_DIR); delete it to start from scratch.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --run

dev=${FLEETD_DEV_DIR:-$PWD/.dev}
bind=${FLEETD_BIND:-127.0.0.1:8080}
url="http://$bind"
# Traversable, not listable: tasks run as other uids and reach their volumes under the agent's state
# dir below; what is secret here (admin.token, fleetd's database) has its own 0600/0700 modes.
mkdir -p "$dev" && chmod 711 "$dev"
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

fleetd_pid="" agent_pid=""
# SIGTERM to one process, then wait for it to exit: bounded, SIGKILL after that.
stop() {
    local pid=$1 seconds=$2
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 $((seconds * 10))); do
        kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
        sleep 0.1
    done
    echo "pid $pid still runs after ${seconds}s; killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
# The agent first, while fleetd still runs: it stops its tasks and reports them (fleetd requeues
# their jobs without using an attempt). Its bound covers the task kill grace (10 s) and the reports.
cleanup() {
    trap '' INT TERM
    if [ -n "$agent_pid" ]; then echo "stopping fleet-agent, then fleetd" >&2; fi
    stop "$agent_pid" 40
    stop "$fleetd_pid" 40
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

healthy() {
    "$bin/python" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
        "$url/api/v1/health" 2>/dev/null
}
if healthy; then
    echo "a server already answers at $url (another scripts/run.sh?); stop it, or choose another FLEETD_BIND" >&2
    exit 1
fi
# Each in its own session: Ctrl-C signals this script alone, which then stops them in order.
setsid "$bin/fleetd" serve --bind "$bind" &
fleetd_pid=$!
for _ in $(seq 1 100); do
    healthy && break
    kill -0 "$fleetd_pid" 2>/dev/null || { echo "fleetd serve exited" >&2; exit 1; }
    sleep 0.2
done
export FLEETD_URL="$url" FLEETD_TOKEN="$token"

# A local agent: real NVML when an NVIDIA driver answers, otherwise the fake 8 x H100 host,
# labelled simulated=true so that nobody mistakes it for hardware.
agent_dir="$dev/agent"
config="$agent_dir/agent.toml"
mkdir -p "$agent_dir" && chmod 711 "$agent_dir"
# Every folder above the state dir must let other uids through (a checkout in root's 0700 home does
# not): otherwise the state dir goes where they can reach it.
state_dir="$agent_dir/state"
blocked=""
dir=$(cd "$agent_dir" && pwd -P)
while [ "$dir" != / ]; do
    dir=$(dirname "$dir")
    [ -n "$(find "$dir" -maxdepth 0 -perm -o+x 2>/dev/null)" ] || { blocked=$dir; break; }
done
if [ -n "$blocked" ]; then
    state_dir="/var/tmp/fleetd-dev-$(id -u)-$(echo "$PWD" | sha256sum | cut -c1-8)/agent-state"
    mkdir -p "$(dirname "$state_dir")" && chmod 711 "$(dirname "$state_dir")"
    echo "$blocked does not let other users through, so tasks (which run as other uids) could not reach" \
        "their volumes under it: the agent keeps its state in $state_dir" >&2
fi
if [ ! -s "$config" ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        backend="nvml" labels=""
    else
        backend="fake:$PWD/tests/fixtures/nvml/h100_x8.json" labels='simulated = "true"'
    fi
    cat > "$config" <<TOML
server_url = "$url"
state_dir = "$state_dir"
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
    # This machine as it is: no validation gate (a workstation GPU often runs without persistence mode or ECC),
    # and the admin token's work may run as root, as a developer's own machine expects.
    if ! "$bin/fleetd" fleet show local >/dev/null 2>&1; then
        "$bin/fleetd" fleet create local --description "this machine" --allow-root-tasks --no-validation
        echo "fleet 'local' lets admin tokens' tasks run as root on this machine (--allow-root-tasks);" \
            "submitter tokens' tasks run as their own uids. Turn it off: fleetd fleet update local --no-allow-root-tasks" >&2
    fi
    join=$("$bin/fleetd" join-token create --fleet local --single-use --ttl 10m --json \
        | "$bin/python" -c 'import json, sys; print(json.load(sys.stdin)["token"])')
    # The token goes in the environment, not argv, so that it stays out of `ps`.
    FLEET_AGENT_JOIN_TOKEN="$join" "$bin/fleet-agent" join --server "$url" --config "$config"
fi
setsid "$bin/fleet-agent" run --config "$config" &
agent_pid=$!

cat <<INFO

fleetd is running at $url
admin UI:    $url/ui/ (sign in with the admin token)
  deploy an instance: $url/ui/instances/new   submit a job: $url/ui/jobs/new
  fleets: $url/ui/fleets   quotas: $url/ui/quotas   webhooks: $url/ui/webhooks   usage: $url/ui/usage
API docs:    $url/api/docs
admin token: $token

  export FLEETD_URL=$url FLEETD_TOKEN=$token
  .venv/bin/fleetd node list

fleet 'local' runs admin tokens' tasks as root (--allow-root-tasks); submitters' tasks run as their own uids.
Ctrl-C stops the agent (its jobs' tasks are stopped and requeued; instances keep running), then fleetd.
INFO
wait -n "$fleetd_pid" "$agent_pid"
