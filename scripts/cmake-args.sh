# Sourced by setup.sh and build-llama-cpp-tools.sh: the CMake flags llama.cpp is
# built with, in $ARGS. One place, so the C++ reference tools and the Python
# bindings run the same kernels.
# Never GGML_NATIVE: on AMX CPUs llama-cpp-python 0.3.36's native build crashes
# in ggml_backend_amx_mul_mat, and a native build is not portable anyway. We
# name the instruction sets this CPU has instead, and leave AMX out.
# GGML_LLAMAFILE=ON (llama.cpp's default): llamafile's sgemm computes batches of
# tokens (prompts, verification) much faster for F32, F16 and Q8_0-family weights.
# Stock llama.cpp sends one token to another kernel, which sums in another order;
# specdec's patch 0004 keeps one token on the same per-row sums in exact mode, so
# batched and single logits stay bit-identical (tests/test_engine.py checks this).
# GGML_RPC=ON: the RPC backend (client and server) in the same libraries, so
# `specdec rpc-server` and `--rpc` speak exactly the bindings' protocol version.
ARGS="-DGGML_RPC=ON -DGGML_NATIVE=OFF -DGGML_LLAMAFILE=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
if [ "$(uname -m)" = "x86_64" ] && [ -r /proc/cpuinfo ]; then
  FLAGS=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  has() { [[ "$FLAGS" == *" $1 "* ]]; }
  if has avx512f && has avx512bw && has avx512vl && has avx512dq && has avx512cd; then
    ARGS+=" -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON"
    has avx512_vnni && ARGS+=" -DGGML_AVX512_VNNI=ON"
    has avx512vbmi && ARGS+=" -DGGML_AVX512_VBMI=ON"
    has avx512_bf16 && ARGS+=" -DGGML_AVX512_BF16=ON"
  elif has avx2 && has fma && has f16c; then
    ARGS+=" -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
  elif has avx; then
    ARGS+=" -DGGML_AVX=ON"
  fi
fi

# The GPU, on top of the CPU flags (never instead of them: RPC and the AMX trap above stay as they are).
# SPECDEC_GPU=cuda or cpu forces either; unset, an NVIDIA GPU that nvidia-smi lists, with a CUDA toolkit
# (nvcc on PATH, in $CUDA_HOME/bin or in /usr/local/cuda/bin), builds for CUDA, for the compute capability the
# driver reports (SPECDEC_CUDA_ARCH, "90" or "86;90", overrides it). A GPU without a toolkit gets the CPU build
# and $GPU_NOTE says what to install. $GPU says what was chosen (cuda or cpu); the wheel cache key follows $ARGS.
GPU=cpu
GPU_NOTE=""
gpu_arch() {  # "9.0" -> "90", one entry per distinct GPU model
  nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' | grep -E '^[0-9]+$' | sort -u | paste -sd';' -
}
find_nvcc() {
  local c
  for c in "$(command -v nvcc 2>/dev/null)" "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" /usr/local/cuda/bin/nvcc; do
    [ -n "$c" ] && [ -x "$c" ] && { printf '%s' "$c"; return 0; }
  done
  return 1
}
has_cublas() {  # llama.cpp's CUDA backend links cuBLAS: a compiler without it is no toolkit to build with
  local root h
  for root in "$(dirname "$(dirname "$(readlink -f "$1")")")" "${CUDA_HOME:-}" /usr/local/cuda; do
    for h in "$root"/include/cublas_v2.h "$root"/targets/*/include/cublas_v2.h; do
      [ -n "$root" ] && [ -e "$h" ] && return 0
    done
  done
  return 1
}
MISSING=""
case "${SPECDEC_GPU:-auto}" in
  cpu) ;;
  cuda|auto)
    ARCH=${SPECDEC_CUDA_ARCH:-$(gpu_arch || true)}
    NVCC=$(find_nvcc || true)
    if [ -n "$NVCC" ] && ! has_cublas "$NVCC"; then
      NVCC=""
      MISSING="nvcc, but no cuBLAS header (cublas_v2.h) beside it, in \$CUDA_HOME or in /usr/local/cuda"
    fi
    if [ -n "$NVCC" ] && { [ -n "$ARCH" ] || [ "${SPECDEC_GPU:-auto}" = cuda ]; }; then
      GPU=cuda
      # no GPU to read (SPECDEC_GPU=cuda on a build machine): llama.cpp's own list of architectures
      ARGS+=" -DGGML_CUDA=ON -DCMAKE_CUDA_COMPILER=$NVCC${ARCH:+ -DCMAKE_CUDA_ARCHITECTURES=$ARCH}"
    elif [ "${SPECDEC_GPU:-auto}" = cuda ]; then
      GPU=missing-toolkit
      GPU_NOTE="SPECDEC_GPU=cuda, but no CUDA toolkit was found (${MISSING:-no compiler, nvcc, on PATH, in \$CUDA_HOME/bin or in /usr/local/cuda/bin}): install NVIDIA's CUDA toolkit (or set CUDA_HOME), or leave SPECDEC_GPU unset"
    elif [ -n "$ARCH" ]; then
      GPU_NOTE="an NVIDIA GPU is here but no CUDA toolkit (${MISSING:-nvcc}): building for the CPU only. Install NVIDIA's CUDA toolkit (or set CUDA_HOME to it) and run scripts/setup.sh again to build for the GPU"
    fi ;;
  *) GPU=invalid; GPU_NOTE="SPECDEC_GPU must be cuda, cpu or unset (auto), got '${SPECDEC_GPU}'" ;;
esac
# Extra flags go after ours (CMake keeps the last value of a variable): -DGGML_CUDA_FA_ALL_QUANTS=ON, say.
ARGS+="${SPECDEC_CMAKE_ARGS:+ $SPECDEC_CMAKE_ARGS}"

# What the sourcing script says of the choice (its say()); false where nothing can be built.
gpu_choice() {
  case "$GPU" in
    invalid|missing-toolkit) say "$GPU_NOTE"; return 1 ;;
    cuda) say "building for an NVIDIA GPU (CUDA) as well as the CPU: SPECDEC_GPU=cpu builds for the CPU only" ;;
    *) [ -z "$GPU_NOTE" ] || say "$GPU_NOTE" ;;
  esac
}
