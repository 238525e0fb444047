#!/usr/bin/env bash
# Build the patched llama.cpp for an H100 (sm_90) here, on a machine without a GPU, so that a GPU machine's few
# minutes go to measuring instead of compiling (about 4.5 minutes there on 16 cores; 20 to 30 here on 2).
# Needs nvcc (CUDA 13; this project's machines have it in /usr/local/cuda, without cuBLAS) and the network to
# PyPI: cuBLAS's headers and library come from the nvidia-cublas wheel, and the CUDA driver library, which a
# machine without a GPU lacks, is stood in for at link time by a stub of the functions ggml calls (the GPU
# machine's own driver is the one loaded there). CPU flags: AVX2, not this machine's (the GPU machine's CPU is
# another). Then `bash scripts/gpu-bundle.sh` packs the build into .gpu/prebuilt.tar.xz, and
# scripts/gpu-check.sh uses it where its source and the GPU's compute capability match.
#
#   bash scripts/gpu-prebuild.sh      builds into build/gpu-prebuild (kept: a second run rebuilds what changed)
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf 'gpu-prebuild: %s\n' "$*" >&2; }
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
LLAMA_CPP_PYTHON_VERSION=$(grep -oP '^LLAMA_CPP_PYTHON_VERSION=\K[0-9.]+' scripts/setup.sh)
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$NVCC" ] || { say "no nvcc (set NVCC, or install NVIDIA's CUDA toolkit)"; exit 2; }
command -v ninja >/dev/null || { say "no ninja"; exit 2; }
B=${GPU_PREBUILD_DIR:-$PWD/build/gpu-prebuild}
mkdir -p "$B"
SECONDS=0

# shellcheck disable=SC1091
source scripts/llama-source.sh
SRC="${XDG_CACHE_HOME:-$HOME/.cache}/specdec/gpu-bundle/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION"
llama_source "$SRC"

CUBLAS=$B/cublas
if [ ! -f "$CUBLAS/include/cublas_v2.h" ]; then
  say "fetching cuBLAS's headers and library (nvidia-cublas 13.0, about 420 MB) from PyPI"
  rm -rf "$B/cublas-whl" "$CUBLAS"
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_27_x86_64 \
    -d "$B/cublas-whl" "nvidia-cublas>=13.0,<13.1"
  mkdir -p "$B/cublas-unzip"
  unzip -q -o "$B"/cublas-whl/*.whl 'nvidia/cu13/*' -d "$B/cublas-unzip"
  mv "$B/cublas-unzip/nvidia/cu13" "$CUBLAS"
  rm -rf "$B/cublas-whl" "$B/cublas-unzip"
  ln -sf libcublas.so.13 "$CUBLAS/lib/libcublas.so"
  ln -sf libcublasLt.so.13 "$CUBLAS/lib/libcublasLt.so"
fi
# the functions ggml-cuda calls in the driver library (its virtual memory pool); linked against, never run
mkdir -p "$B/stub"
printf 'int %s(void) { return 0; }\n' cuMemUnmap cuMemSetAccess cuMemRelease cuMemMap cuMemGetAllocationGranularity \
  cuMemCreate cuMemAddressReserve cuMemAddressFree cuGetErrorString cuDeviceGetAttribute cuDeviceGet > "$B/stub/cuda.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$B/stub/libcuda.so" "$B/stub/cuda.c"
ln -sf libcuda.so "$B/stub/libcuda.so.1" # the name the programs' link looks for (ggml-cuda's DT_NEEDED)

ARGS=(-DGGML_RPC=ON -DGGML_NATIVE=OFF -DGGML_LLAMAFILE=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
  -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
say "configuring ${ARGS[*]}"
cmake -S "$SRC/vendor/llama.cpp" -B "$B/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DGGML_CUDA_COMPRESSION_MODE=none "${ARGS[@]}" -DCMAKE_CUDA_COMPILER="$NVCC" \
  -DCMAKE_LIBRARY_PATH="$CUBLAS/lib" -DCUDA_cuda_driver_LIBRARY="$B/stub/libcuda.so" \
  -DCMAKE_CUDA_FLAGS="-I$CUBLAS/include" -DCMAKE_CXX_FLAGS="-I$CUBLAS/include" -DCMAKE_C_FLAGS="-I$CUBLAS/include" \
  > "$B/cmake.log"
say "building llama, llama-bench and llama-speculative-simple with $(nproc) jobs (log: $B/build.log)"
LD_LIBRARY_PATH="$B/stub:$CUBLAS/lib" cmake --build "$B/build" -j "$(nproc)" --target llama llama-bench \
  llama-speculative-simple > "$B/build.log" 2>&1 || { tail -30 "$B/build.log"; exit 1; }
printf '%s' "$PATCHES_SUM" > "$B/patches"
printf '%s' "${ARGS[*]}" > "$B/args"
say "built in $((SECONDS / 60)) min: $B/build/bin (patches $PATCHES_SUM); bash scripts/gpu-bundle.sh packs it"
