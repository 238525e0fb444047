#!/usr/bin/env bash
# Where a specdec process crashes on a CUDA library built on the GPU machine: after
#   GPU_CHECK_BUILD_ONLY=1 bash scripts/gpu-check.sh
# (same machine, same call or the next while it is warm), from the project's root:
#   bash scripts/gpu/diag_load.sh
# loads a model (the small random-weight one gpu-check wrote) in several ways, each in a process of its own
# under Python's faulthandler: specdec imported first (as its commands do) with the weights on the CPU and on
# the GPU, llama-cpp-python's bindings first, llama.cpp's system info first, the system libstdc++ preloaded,
# the bindings alone, the CLI; then the libraries mapped after the imports, and a gdb (or cuda-gdb) backtrace
# of the first way. Writes $OUT/diag.txt (each way's output and exit status) and prints its tail.
# Environment: DIAG_W (gpu-check's work folder: build/gpu-check), DIAG_LIB (the library's folder), DIAG_T (the
# model), DIAG_CODE (specdec's code: the bundle's copy), GPU_CHECK_PYTHON; on a machine without a GPU, pointed at
# the .venv's library and the packaged model, it rehearses the same steps.
ROOT=$PWD; W=${DIAG_W:-$ROOT/build/gpu-check}; LIB=${DIAG_LIB:-$W/build/bin}; M=$W/models
PY=${GPU_CHECK_PYTHON:-python3}
CUDA_LIBS=""
for so in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
  f=$(find /usr/local/cuda*/ /usr/lib /opt -name "$so" 2>/dev/null | head -1)
  [ -n "$f" ] && CUDA_LIBS+=${CUDA_LIBS:+:}$(dirname "$f")
done
export LLAMA_CPP_LIB_PATH=$LIB LD_LIBRARY_PATH=$LIB:$CUDA_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$W/src:$W/specdec:$W/site HF_HUB_OFFLINE=1 NO_COLOR=1 SPECDEC_CACHE_DIR=$W/cache
cd "${DIAG_CODE:-$W/specdec}" || exit 2
OUT=${OUT:-$ROOT/build/diag}
mkdir -p "$OUT"
D=$OUT/diag.txt
: > "$D"
T=${DIAG_T:-$M/r135m-q4_0.gguf}
v() { local name=$1; shift; echo "=== $name" >> "$D"; timeout -k 3 20 "$@" >> "$D" 2>&1; echo "rc=$? ($name)" >> "$D"; }
echo "python: $(command -v $PY) $($PY -V 2>&1)" >> "$D"
ldd "$LIB/libllama.so" >> "$D" 2>&1
LOAD="from specdec_cli.engine.model import Model; m = Model('$T', n_gpu_layers=NGL); print('loaded', m.n_ctx); print(m.tokenize('Hello world', add_special=True, parse_special=False))"
MAPS="import re; print(sorted({l.split()[-1] for l in open('/proc/self/maps') if re.search(r'stdc|c\+\+|libllama|libggml|gomp', l)}))"
v "a: specdec first, ngl 0" $PY -X faulthandler -c "import specdec_cli.api; ${LOAD/NGL/0}"
v "b: specdec first, ngl 99" $PY -X faulthandler -c "import specdec_cli.api; ${LOAD/NGL/99}"
v "c: llama_cpp first" $PY -X faulthandler -c "import llama_cpp; import specdec_cli.api; ${LOAD/NGL/0}"
v "d: system info first" $PY -X faulthandler -c "import specdec_cli.api; from specdec_cli.engine import native; native.bindings().llama_print_system_info(); ${LOAD/NGL/0}"
v "e: maps after imports" $PY -c "import specdec_cli.api; from specdec_cli.engine import native; native.bindings(); $MAPS"
v "g: preload system libstdc++" env LD_PRELOAD=$(ldconfig -p | grep -m1 'libstdc++.so.6 ' | awk '{print $NF}') $PY -X faulthandler -c "import specdec_cli.api; ${LOAD/NGL/0}"
v "h: plain llama_cpp load" $PY -X faulthandler -c "import llama_cpp as C; C.llama_backend_init(); p=C.llama_model_default_params(); p.n_gpu_layers=0; m=C.llama_model_load_from_file(b'$T', p); print('model', bool(m))"
v "i: cli" $PY -X faulthandler -m specdec_cli run "Hello" --target "$T" --no-draft -n 4
GDB=$(command -v gdb || command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null)
if [ -n "$GDB" ]; then
  v "gdb a" "$GDB" -q -batch -ex run -ex bt -ex "info sharedlibrary" --args $PY -c "import specdec_cli.api; ${LOAD/NGL/0}"
else
  echo "no gdb" >> "$D"
fi
tail -c 6000 "$D"
