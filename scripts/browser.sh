#!/usr/bin/env bash
# Debian's Chromium, for tests/test_browser.py (a web page streaming a chat from `specdec serve`).
# Playwright (a dev dependency from PyPI) drives it and downloads no browser of its own.
set -euo pipefail
say() { printf 'setup: %s\n' "$*" >&2; }
command -v chromium >/dev/null 2>&1 && exit 0
install=(apt-get install -y -qq --no-install-recommends chromium)
if [ "$(id -u)" = 0 ]; then
    say "installing Debian's chromium for the browser test (about a minute)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive "${install[@]}" >/dev/null
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    say "installing Debian's chromium for the browser test (about a minute)"
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive "${install[@]}" >/dev/null
else
    say "cannot install chromium (not root, no sudo): tests/test_browser.py will fail until it is installed"
fi
