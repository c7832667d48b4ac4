#!/usr/bin/env bash
# Sets up a checkout, safe to run again.
#   scripts/setup.sh --run   what running needs (scripts/run.sh): Debian's python3-venv when
#                            missing, then .venv with fleetd in editable mode with its [server,agent]
#                            extras.
#   scripts/setup.sh         what testing needs (scripts/test.sh): the Debian packages the tests
#                            use (when missing), then .venv with the [dev] extra (every extra, and
#                            the test tools); a .venv made by --run is completed.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
    --run) extras="server,agent" ;;
    "") extras="dev" ;;
    *) echo "usage: scripts/setup.sh [--run]" >&2; exit 2 ;;
esac

python3 - <<'PY' || { echo "fleetd needs Python >= 3.10 (python3 is $(python3 --version 2>&1))" >&2; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 10) else 1)
PY

packages=()
python3 -c 'import ensurepip, venv' 2>/dev/null || packages+=(python3-venv)
if [ "$extras" = dev ]; then
    # A real PostgreSQL server for the tests of the HA database path.
    compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || command -v initdb >/dev/null || packages+=(postgresql)
    # SSH test hosts for the provisioning tests: sshd in network namespaces made with iproute2.
    command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || packages+=(openssh-server)
    command -v ip >/dev/null || packages+=(iproute2)
    command -v systemd-analyze >/dev/null || packages+=(systemd)  # verifies the rendered unit
    # Debian's Chromium for the admin UI's browser tests (Playwright drives it; no browser downloads).
    [ -x /usr/bin/chromium ] || packages+=(chromium)
    # Podman (with runc: crun refuses hybrid cgroup hosts) and busybox-static for the agent's container
    # instance tests, which build their image from busybox with no registry.
    command -v podman >/dev/null || packages+=(podman)
    command -v runc >/dev/null || packages+=(runc)
    dpkg -s busybox-static >/dev/null 2>&1 || packages+=(busybox-static)
fi
if [ ${#packages[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "installing Debian packages: ${packages[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${packages[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[$extras]"
