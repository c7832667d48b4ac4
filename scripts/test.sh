#!/usr/bin/env bash
# Sets everything up and runs the whole test suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check fleetd agent fleetwire fleetconf tests bench scripts  # static checks first: a lint error fails fast
.venv/bin/mypy  # the typed packages (pyproject.toml [tool.mypy])
exec .venv/bin/python -m pytest -n 2 -q "$@"
