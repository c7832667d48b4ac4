#!/usr/bin/env bash
# Sets up a development checkout: the Debian packages it needs (when missing), then .venv
# with fleetd installed in editable mode with its [dev] extra. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 - <<'PY' || { echo "fleetd needs Python >= 3.10 (python3 is $(python3 --version 2>&1))" >&2; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 10) else 1)
PY

packages=()
python3 -c 'import ensurepip, venv' 2>/dev/null || packages+=(python3-venv)
# A real PostgreSQL server for the tests of the HA database path.
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || command -v initdb >/dev/null || packages+=(postgresql)
# SSH test hosts for the provisioning tests: sshd in network namespaces made with iproute2.
command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || packages+=(openssh-server)
command -v ip >/dev/null || packages+=(iproute2)
command -v systemd-analyze >/dev/null || packages+=(systemd)  # verifies the rendered unit
# Debian's Chromium for the admin UI's browser tests (Playwright drives it; no browser downloads).
[ -x /usr/bin/chromium ] || packages+=(chromium)
if [ ${#packages[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "installing Debian packages: ${packages[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${packages[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
