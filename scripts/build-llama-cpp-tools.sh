#!/usr/bin/env bash
# Build llama.cpp's own speculative tools (llama-speculative-simple, llama-lookup),
# llama-server (the serve benchmark's reference) and llama-bench (benchmarks.host_time's)
# from the llama.cpp source inside the llama-cpp-python sdist that specdec uses,
# with the same CMake flags and patches as the bindings (scripts/cmake-args.sh, scripts/llama-source.sh).
# The patched kernels are off unless GGML_CPU_BATCH_INVARIANT=1 is in a tool's environment: llama-server
# runs as stock llama.cpp does.
#   bash scripts/build-llama-cpp-tools.sh [OUT_DIR]      (default: build/llama.cpp)
# then: specdec bench --llama-cpp-bin build/llama.cpp/bin
#       .venv/bin/python -m benchmarks.serve_bench --llama-cpp-bin build/llama.cpp/bin
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMA_CPP_PYTHON_VERSION=0.3.36
OUT=$(realpath -m "${1:-build/llama.cpp}")
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
say() { printf 'build-llama-cpp-tools: %s\n' "$*" >&2; }
source scripts/cmake-args.sh
source scripts/llama-source.sh
gpu_choice || exit 2

SRC="$OUT/src"
llama_source "$SRC"
say "CMAKE_ARGS=$ARGS"
# shellcheck disable=SC2086
cmake -S "$SRC/vendor/llama.cpp" -B "$OUT/cmake" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON $ARGS >/dev/null
TOOLS=(llama-speculative-simple llama-lookup llama-server llama-bench)
cmake --build "$OUT/cmake" -j "$(nproc)" --target "${TOOLS[@]}"
mkdir -p "$OUT/bin"
for t in "${TOOLS[@]}"; do cp "$OUT/cmake/bin/$t" "$OUT/bin/"; done
say "built: ${TOOLS[*]/#/$OUT/bin/}"
