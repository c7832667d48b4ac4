#!/usr/bin/env bash
# Sets everything up and runs the whole test suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest -n 2 -q "$@"
