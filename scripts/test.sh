#!/usr/bin/env bash
# Sets everything up and runs the whole test suite (extra arguments go to pytest).
#   scripts/test.sh --fast   the inner loop: lint, types, and the unit and API tests (without the
#                            agent, provisioning and UI packages and what is marked integration or
#                            sweep; property tests try a fifth of their examples)
set -euo pipefail
cd "$(dirname "$0")/.."
fast=()
if [ "${1:-}" = "--fast" ]; then
    shift
    fast=(-m "not integration and not sweep" --ignore=tests/agent --ignore=tests/provision --ignore=tests/ui)
    export FLEETD_TESTS_FAST=1  # property tests try a fifth of their examples (tests/support/examples.py)
fi
scripts/setup.sh
.venv/bin/ruff check fleetd agent fleetwire fleetconf tests bench scripts  # static checks first: a lint error fails fast
# Nothing newer than the oldest Python setup.cfg admits: vermin, configured in setup.cfg [vermin].
.venv/bin/vermin --violations fleetd agent fleetwire fleetconf tests bench scripts
# Security scan of what ships, medium and high severity; an exception is a per-line `# nosec BXXX  # why`.
.venv/bin/bandit -q -r fleetd agent fleetwire fleetconf --severity-level medium
.venv/bin/mypy  # every package that ships (pyproject.toml [tool.mypy])
exec .venv/bin/python -m pytest -n 2 -q --durations=30 "${fast[@]}" "$@"  # the slowest 30 are listed at the end
