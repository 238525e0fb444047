#!/usr/bin/env bash
# Build llama.cpp's own speculative tools (llama-speculative-simple, llama-lookup) and
# llama-server (the serve benchmark's reference)
# from the llama.cpp source inside the llama-cpp-python sdist that specdec uses,
# with the same CMake flags as the bindings (scripts/cmake-args.sh).
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

SRC="$OUT/src"
if [ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]; then
  mkdir -p "$OUT/sdist" "$SRC"
  say "fetching the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist from PyPI"
  "$PYTHON" -m pip download -q --no-deps --no-binary :all: -d "$OUT/sdist" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
  tar -xzf "$OUT"/sdist/llama_cpp_python-*.tar.gz -C "$SRC" --strip-components=1
fi
say "CMAKE_ARGS=$ARGS"
# shellcheck disable=SC2086
cmake -S "$SRC/vendor/llama.cpp" -B "$OUT/cmake" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON $ARGS >/dev/null
cmake --build "$OUT/cmake" -j "$(nproc)" --target llama-speculative-simple llama-lookup llama-server
mkdir -p "$OUT/bin"
cp "$OUT"/cmake/bin/llama-speculative-simple "$OUT"/cmake/bin/llama-lookup "$OUT"/cmake/bin/llama-server "$OUT/bin/"
say "built: $OUT/bin/llama-speculative-simple $OUT/bin/llama-lookup $OUT/bin/llama-server"
