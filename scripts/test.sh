#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite, lint and type checks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${SPECDEC_VENV:-.venv}
"$VENV/bin/ruff" check specdec_cli tests benchmarks
"$VENV/bin/mypy"
"$VENV/bin/python" -m pytest -ra --durations=15 "$@"  # the slowest tests: the suite must stay under 15 minutes
