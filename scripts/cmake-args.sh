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
ARGS="${SPECDEC_CMAKE_ARGS:-$ARGS}"
