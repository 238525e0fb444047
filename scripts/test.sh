#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run lint, type checks and the whole test suite (what CI runs).
# Where there is no `chromium`, Debian's is installed through apt-get (scripts/browser.sh: as root or with sudo)
# for tests/test_browser.py; a line on stderr says so first.
#   bash scripts/test.sh          everything: under 15 minutes on 2 cores
#   bash scripts/test.sh --fast   the same checks on the tests not marked slow (the maths, the fake model through
#                                 the API, CLI and server, errors): under 2 minutes; run it after every change
# Other arguments go to pytest (`bash scripts/test.sh tests/test_settings.py -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
command -v chromium >/dev/null 2>&1 ||
    echo "test: no chromium: scripts/browser.sh installs Debian's through apt-get (as root or with sudo) for tests/test_browser.py" >&2
bash scripts/browser.sh
VENV=${SPECDEC_VENV:-.venv}
select=()
if [[ "${1:-}" == "--fast" ]]; then
    shift
    select=(-m "not slow")
fi
"$VENV/bin/ruff" check specdec_cli tests benchmarks scripts
"$VENV/bin/mypy"
# A pytest-xdist worker a core, two at most (tests/conftest.py gives each worker's models one thread): one
# worker's decodes run while the other starts a process or waits on a server (`-n 0` last: one process).
workers=$(( $(nproc) >= 2 ? 2 : 0 ))
"$VENV/bin/python" -m pytest -ra --durations=15 -n "$workers" "${select[@]}" "$@"  # the slowest tests: the suite must stay under 15 minutes
