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

# The interpreter .venv is built from: FLEETD_PYTHON when set; otherwise the distribution's own
# /usr/bin/python3 when it is new enough, which is what a fresh machine runs (a pyenv or other
# python3 earlier on PATH would hide what that interpreter lacks); otherwise python3 on PATH.
new_enough() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; }
if [ -n "${FLEETD_PYTHON:-}" ]; then
    python=$FLEETD_PYTHON why="FLEETD_PYTHON"
elif [ -x /usr/bin/python3 ] && new_enough /usr/bin/python3; then
    python=/usr/bin/python3 why="the distribution's"
else
    python=$(command -v python3 || true) why="python3 on PATH"
fi
if [ -z "$python" ] || ! new_enough "$python"; then
    echo "fleetd needs Python >= 3.10 (${python:-no python3}: $("${python:-python3}" --version 2>&1 || true));" \
        "set FLEETD_PYTHON to one" >&2
    exit 1
fi
python=$(command -v "$python")

packages=()
"$python" -c 'import ensurepip, venv' 2>/dev/null || packages+=(python3-venv)
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
    # Node.js runs a real OpenID provider (panva's oidc-provider, from npm) for the sign-in tests.
    command -v node >/dev/null || packages+=(nodejs)
    command -v npm >/dev/null || packages+=(npm)
fi
if [ ${#packages[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "installing Debian packages: ${packages[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${packages[@]}" >/dev/null
fi

# A .venv built from another interpreter than the one chosen is built again.
version() { "$1" -c 'import platform, sys; print(platform.python_version(), sys.base_prefix)'; }
want=$(version "$python")
if [ -x .venv/bin/python ] && [ "$(version .venv/bin/python 2>/dev/null || true)" != "$want" ]; then
    echo "rebuilding .venv: it was made from Python $(version .venv/bin/python 2>/dev/null || echo '(broken)')," \
        "not from $python ($want)" >&2
    rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
    echo "making .venv from $python (Python ${want%% *}, $why)"
    "$python" -m venv .venv
fi
# The sign-in tests' OpenID provider, at the versions of its lock file (test-only; never shipped).
# Node.js trusts its own CA list only: the system's is added, for a registry reached through a TLS
# proxy whose CA the system trusts.
if [ "$extras" = dev ] && [ ! -f tests/support/oidc/node_modules/.package-lock.json ]; then
    ca=/etc/ssl/certs/ca-certificates.crt
    [ -n "${NODE_EXTRA_CA_CERTS:-}" ] || [ ! -f "$ca" ] || export NODE_EXTRA_CA_CERTS="$ca"
    npm ci --prefix tests/support/oidc --no-audit --no-fund --loglevel=error
fi
# pip runs only when what it would install changed: the requirements, the constraints or the extras
# (a rerun of scripts/run.sh then starts in a second instead of a no-op pip run's 12 s).
stamp=.venv/.fleetd-installed
key="$extras $(cat setup.cfg pyproject.toml constraints.txt | sha256sum | cut -c1-64)"
have=$(cat "$stamp" 2>/dev/null || true)
if [ "$have" = "$key" ] || { [ "$extras" != dev ] && [ "${have#dev }" = "${key#"$extras" }" ]; }; then
    exit 0
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[$extras]"
echo "$key" > "$stamp"
