#!/usr/bin/env bash
# specdec on an NVIDIA GPU, on a machine with no network: build the patched llama.cpp with CUDA for this GPU
# (or take the one gpu-bundle.sh prebuilt), write random-weight models of real shapes (8B and 135M pairs), probe
# batch-vs-single logits and batch costs with llama.cpp's kernels and with patch 0008's batch-invariant ones
# (GGML_CUDA_BATCH_INVARIANT=1) at every width 1-65, time both with llama-bench, run specdec (a greedy identity
# check of exact mode with a draft, the target alone, exact mode, --kernels fast with each drafter) and
# llama.cpp's own tools on the same pair. $OUT gets four files (the device tool brings back at most 8):
# summary.md (tables), gpu-check.json (all of it, machine-readable, for docs to be generated from; both rewritten
# after every phase, so a run cut short still says what it saw), log.txt, and raw.tar.gz (every run's JSON and
# stderr, probe.json, the tools' output, cmake and build logs, made at the end).
#
#   bash scripts/gpu-bundle.sh                 here, with network: makes .gpu/ (ignored; under 56 MiB)
#   OUT=/some/dir bash scripts/gpu-check.sh    there, from the project's root with .gpu/ carried
#   bash scripts/gpu-check.sh --rehearse       here, no GPU: the same steps on the .venv's CPU build, the 135M
#                                              pair only and short runs (into build/gpu-check-rehearse/out
#                                              unless $OUT is set), to catch the script's bugs for free
# Options: --tree runs the working tree's specdec_cli instead of the bundle's specdec.tar.gz; --quick only checks
# exactness (patch 0008's probes, one sequence and several, greedy identity on the 8B Q4_0 pair, and four requests
# at once through the batch engine), for a device session's last minutes; --graphs only what a change to graph
# reuse needs (greedy identity on the 8B Q4_0 pair, graph_shapes.py, host time beside llama.cpp's tools, four
# requests at once), about three minutes once built.
# Environment: GPU_CHECK_BUDGET (seconds for the whole script: 540 on a GPU; a step that would overrun it is
# skipped, the report is always written), GPU_CHECK_BUILD_ONLY=1 (stop once the library is built and the models
# written: a second call on the warm machine then checks without building), GPU_CHECK_WORK (build, models, caches: build/gpu-check, kept, so a
# second run on a warm machine skips the build and the models), GPU_CHECK_PYTHON (python3; --rehearse:
# .venv/bin/python), GPU_CHECK_TOOLS_BIN (--rehearse: llama.cpp's tools built for the CPU; by default
# build/gpu-check-rehearse/tools-build/bin or build/llama.cpp/bin, where they are), GPU_CHECK_LAYERS=99 (pass
# --gpu-layers 99 --draft-gpu-layers 99 to every run; by default only where the CLI's --gpu-layers default is 0).
# Every step has a timeout; a step that fails is logged and the script goes on. Exit status 1 when a step failed.
set -u

MODE=device
CODE_FROM=bundle
QUICK=0
GRAPHS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rehearse) MODE=rehearse ;;
    --tree) CODE_FROM=tree ;;
    --quick) QUICK=1 ;;
    --graphs) GRAPHS=1 ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (--rehearse, --tree, --quick, --graphs, --help)" >&2; exit 2 ;;
  esac
  shift
done
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
G=$ROOT/.gpu
if [ "$MODE" = rehearse ]; then
  OUT=${OUT:-$ROOT/build/gpu-check-rehearse/out}
  W=${GPU_CHECK_WORK:-$ROOT/build/gpu-check-rehearse}
  BUDGET=${GPU_CHECK_BUDGET:-900}
  PY=${GPU_CHECK_PYTHON:-$ROOT/.venv/bin/python}
else
  [ -n "${OUT:-}" ] || { echo "gpu-check: set OUT to a results folder (the device tool sets it)" >&2; exit 2; }
  W=${GPU_CHECK_WORK:-$ROOT/build/gpu-check}
  BUDGET=${GPU_CHECK_BUDGET:-540}
  PY=${GPU_CHECK_PYTHON:-python3}
fi
T0=$(date +%s)
mkdir -p "$OUT" "$W" || exit 2
OUT=$(cd "$OUT" && pwd)
RAW=$W/raw # the detail files, packed into $OUT/raw.tar.gz at the end
rm -rf "$RAW"
rm -f "$OUT"/{log.txt,summary.md,gpu-check.json,raw.tar.gz}
mkdir -p "$RAW/runs" "$RAW/tools"
export PYTHONUNBUFFERED=1

exec 3>&1 4>&2
exec > >(tee -a "$OUT/log.txt") 2>&1
TEE_PID=$!
exec 5>&1 # the log, for messages from inside redirected steps

el() { printf '[%4ss] %s\n' "$(($(date +%s) - T0))" "$*" >&5; }
left() { echo $((T0 + BUDGET - $(date +%s))); }
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >> "$RAW/steps.tsv"; }
FAILED=0
STEP_SECS=0
# step NAME WANT CMD...: CMD under a timeout of WANT seconds, less if the budget has less left (20 s kept for
# the report); skipped when under 10 s would be left. Records rc and seconds in steps.tsv; never exits.
step() {
  local name=$1 want=$2 t s rc note=""
  shift 2
  t=$(($(left) - 20))
  [ "$t" -gt "$want" ] && t=$want
  STEP_SECS=0
  if [ "$t" -lt 10 ]; then
    el "$name: skipped, out of time ($(left) s left of $BUDGET)"
    record "$name" skip 0 "out of time"
    FAILED=1
    return 125
  fi
  s=$(date +%s)
  timeout -k 5 "$t" "$@"
  rc=$?
  STEP_SECS=$(($(date +%s) - s))
  { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } && note="timed out after ${t} s"
  record "$name" "$rc" "$STEP_SECS" "$note"
  if [ "$rc" -ne 0 ]; then
    el "$name: FAILED rc=$rc after ${STEP_SECS} s${note:+ ($note)}"
    FAILED=1
  fi
  return "$rc"
}
skip() { el "$1: skipped ($2)"; record "$1" skip 0 "$2"; }

# --- what is needed --------------------------------------------------------------------------------------
for f in src.tar.xz specdec.tar.gz tok.gguf manifest.json; do
  [ -f "$G/$f" ] || { el "no .gpu/$f: run bash scripts/gpu-bundle.sh here first, and carry .gpu"; exit 2; }
done
GPUPY=$ROOT/scripts/gpu
[ -f "$GPUPY/report.py" ] || GPUPY=$G/gpu
command -v "$PY" >/dev/null || { el "no $PY"; exit 2; }
finish() {
  "$PY" "$GPUPY/report.py" report "$RAW" "$OUT" || el "the report failed"
  tar -czf "$OUT/raw.tar.gz" -C "$RAW" . || el "could not pack raw.tar.gz"
  el "done in $(($(date +%s) - T0)) s: $OUT/summary.md, $OUT/gpu-check.json"
  [ -f "$OUT/summary.md" ] && cat "$OUT/summary.md"
  exec 1>&3 2>&4 5>&-
  wait "$TEE_PID" 2>/dev/null
}
trap 'el "interrupted"; finish; exit 130' INT TERM
fact() { "$PY" "$GPUPY/report.py" set "$RAW" "$1" "$2" >/dev/null || el "could not record $1"; }

if [ "$MODE" = device ]; then
  command -v nvidia-smi >/dev/null || { el "no nvidia-smi: on a machine without a GPU use --rehearse"; exit 2; }
fi
el "gpu-check ($MODE), budget $BUDGET s, work folder $W, results in $OUT"

# --- (a) the stamp -----------------------------------------------------------------------------------------
"$PY" "$GPUPY/report.py" stamp "$RAW" --mode "$MODE" --manifest "$G/manifest.json" --root "$ROOT" >&5 \
  || el "stamp failed"
[ "$MODE" = device ] && nvidia-smi -L
fact mode "$MODE"
fact python "$("$PY" -c 'import sys; print(sys.version.split()[0])')"

# --- the code, the wheels, the source ----------------------------------------------------------------------
if [ "$CODE_FROM" = tree ]; then
  CODE=$ROOT
else
  CODE=$W/specdec
  rm -rf "$CODE"
  mkdir -p "$CODE"
  tar -xzf "$G/specdec.tar.gz" -C "$CODE" || { el "cannot unpack specdec.tar.gz"; exit 2; }
  if [ -d "$ROOT/specdec_cli" ] && ! diff -rq -x __pycache__ "$ROOT/specdec_cli" "$CODE/specdec_cli" >/dev/null 2>&1; then
    el "note: the working tree's specdec_cli differs from the bundle's (running the bundle's; --tree runs the tree's)"
  fi
fi
fact code "$CODE_FROM"

SITE=""
PYV=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$MODE" = device ] || [ "$PYV" = 3.12 ]; then
  SITE=$W/site
  KEY=$(cd "$G/whl" && printf '%s\n' *.whl | sha256sum | cut -c1-16)
  if [ "$(cat "$SITE/.key" 2>/dev/null)" != "$KEY" ]; then
    rm -rf "$SITE"
    if step wheels 120 "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile \
      --no-cache-dir --target "$SITE" "$G"/whl/*.whl; then
      echo "$KEY" > "$SITE/.key"
    fi
  fi
else
  el "Python $PYV: the bundle's wheels are for 3.12; using $PY's own packages"
fi

SRC_KEY=$(sha256sum "$G/src.tar.xz" | cut -c1-16)
if [ "$(cat "$W/src/.key" 2>/dev/null)" != "$SRC_KEY" ]; then
  rm -rf "$W/src"
  mkdir -p "$W/src"
  tar -xJf "$G/src.tar.xz" -C "$W/src" || { el "cannot unpack src.tar.xz"; exit 2; }
  echo "$SRC_KEY" > "$W/src/.key"
fi
el "code, wheels and source ready"

# --- (c) the models, written while llama.cpp builds ---------------------------------------------------------
M=$W/models
if [ "$MODE" = rehearse ]; then
  NAMES=(r135m-q4_0 r135m-l3-q4_0)
  PAIRS=("135m r135m-q4_0 r135m-l3-q4_0")
else
  NAMES=(r135m-q4_0 r135m-l3-q4_0 r8b-q4_0 r8b-l2-q4_0 r8b-q4_k)
  PAIRS=("8b r8b-q4_0 r8b-l2-q4_0" "135m r135m-q4_0 r135m-l3-q4_0")
  [ "$QUICK" = 1 ] && NAMES=(r135m-q4_0 r8b-q4_0 r8b-l2-q4_0)
  [ "$GRAPHS" = 1 ] && NAMES=(r8b-q4_0 r8b-l2-q4_0)
fi
TODO=()
for n in "${NAMES[@]}"; do [ -f "$M/$n.gguf" ] || TODO+=("$n"); done
MODELS_PID=""
if [ ${#TODO[@]} -gt 0 ]; then
  el "writing models in the background: ${TODO[*]}"
  t=$(($(left) - 20))
  [ "$t" -gt 1 ] || t=1
  ( # one process per model: each 8B one is several GB of random numbers, on one core
    for n in "${TODO[@]}"; do
      PYTHONPATH=$SITE timeout -k 5 "$t" "$PY" "$GPUPY/gen_models.py" "$G/tok.gguf" "$M" "$n" > "$RAW/models-$n.log" 2>&1 &
    done
    rc=0
    for job in $(jobs -p); do wait "$job" || rc=1; done
    cat "$RAW"/models-*.log > "$RAW/models.log"
    exit "$rc"
  ) &
  MODELS_PID=$!
  MODELS_T0=$(date +%s)
fi

# --- (b) llama.cpp with CUDA, for this GPU's compute capability, on top of the CPU flags of scripts/cmake-args.sh
BUILT=1
CUDA_CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
[[ "$CUDA_CC" =~ ^[0-9]+$ ]] || { el "no compute capability from nvidia-smi ('$CUDA_CC'): building for 90"; CUDA_CC=90; }
# sourced with SPECDEC_GPU=cuda: its $ARGS names CUDA and the architecture itself where it knows how; else they are added
# shellcheck disable=SC2016
ARGS=$(cd "$CODE" && SPECDEC_GPU=cuda bash -c 'source scripts/cmake-args.sh >/dev/null && printf %s "$ARGS"')
if [[ " $ARGS " != *GGML_CUDA=ON* ]]; then
  ARGS+=" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$CUDA_CC"
elif [[ " $ARGS " != *CMAKE_CUDA_ARCHITECTURES=* ]]; then
  ARGS+=" -DCMAKE_CUDA_ARCHITECTURES=$CUDA_CC"
fi
fact cuda_arch "$CUDA_CC"
fact cmake_args "$ARGS"
el "cmake args: $ARGS"
NV=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; } || true)
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
read -r -a ARGV <<< "$ARGS"
if [ "$MODE" = rehearse ]; then
  BDIR=$W/build-configure-only
else
  BDIR=$W/build
fi
CONF=(cmake -S "$W/src/vendor/llama.cpp" -B "$BDIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF
  -DGGML_CUDA_COMPRESSION_MODE=none "${ARGV[@]}")
configure() {
  rm -rf "$BDIR"
  if ! step configure 120 "${CONF[@]}" > "$RAW/cmake.log" 2>&1; then
    tail -15 "$RAW/cmake.log"
    [ -n "$NV" ] || return 1
    el "configure again, with the toolkit named"
    rm -rf "$BDIR"
    step configure-toolkit 120 "${CONF[@]}" -DCMAKE_CUDA_COMPILER="$NV" \
      -DCUDAToolkit_ROOT="$(dirname "$(dirname "$(readlink -f "$NV")")")" >> "$RAW/cmake.log" 2>&1 \
      || { tail -40 "$RAW/cmake.log"; return 1; }
  fi
  grep -iE "CUDA Toolkit|found CUDA|CUDA_ARCH|ggml-cuda|Including CUDA" "$RAW/cmake.log" | head -5
}

# CUDA's runtime and cuBLAS, where the toolkit or a Python package put them: a prebuilt library's RUNPATH names
# the machine it was built on
CUDA_LIBS=""
if [ "$MODE" = device ]; then
  for so in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
    f=$(find /usr/local/cuda*/ /usr/lib /opt -name "$so" 2>/dev/null | head -1)
    [ -n "$f" ] && [[ ":$CUDA_LIBS:" != *":$(dirname "$f"):"* ]] && CUDA_LIBS+=${CUDA_LIBS:+:}$(dirname "$f")
  done
fi
if [ "$MODE" = rehearse ]; then
  LIBS=("$ROOT"/.venv/lib/python3*/site-packages/llama_cpp/lib)
  LIB=${LIBS[0]}
  [ -d "$LIB" ] || { el "no .venv/lib/python3*/site-packages/llama_cpp/lib: run bash scripts/setup.sh"; BUILT=0; }
  TOOLS_BIN=""
  for d in "${GPU_CHECK_TOOLS_BIN:-}" "$W/tools-build/bin" "$ROOT/build/llama.cpp/bin"; do
    [ -n "$d" ] && [ -x "$d/llama-speculative-simple" ] && { TOOLS_BIN=$d; break; }
  done
  NVROOT=$([ -n "$NV" ] && dirname "$(dirname "$(readlink -f "$NV")")")
  CUBLAS=("$NVROOT"/include/cublas_v2.h "$NVROOT"/targets/*/include/cublas_v2.h)
  if [ -z "$NV" ] || ! command -v cmake >/dev/null; then
    skip configure "rehearsal: no nvcc or cmake here"
  elif ! ls "${CUBLAS[@]}" >/dev/null 2>&1; then
    skip configure "rehearsal: $NV has no cuBLAS beside it (a partial toolkit), so CMake cannot configure CUDA here"
  else
    el "rehearsal: configuring the CUDA build (not building it) with $NV"
    F=$FAILED
    if configure; then
      el "configured"
    else
      FAILED=$F # here, not a failure of the script: a toolkit without cuBLAS (say) cannot configure
      el "rehearsal: the CUDA configure failed on this machine (see cmake.log in raw.tar.gz); the GPU machine's toolkit is complete"
    fi
  fi
  skip build "rehearsal: the .venv's CPU library ($LIB)"
else
  LIB=$BDIR/bin
  TOOLS_BIN=$LIB
  BKEY=$(printf '%s %s' "$SRC_KEY" "$ARGS" | sha256sum | cut -c1-16)
  if [ -f "$BDIR/bin/libllama.so" ] && [ "$(cat "$BDIR/.key" 2>/dev/null)" = "$BKEY" ]; then
    skip build "already built in $BDIR (warm machine)"
    fact build "reused"
  elif [ -f "$G/prebuilt.tar.xz" ] && [ "$(cat "$G/prebuilt.key" 2>/dev/null)" = "$SRC_KEY" ] && [ "$CUDA_CC" = 90 ] \
      && rm -rf "$BDIR" && mkdir -p "$BDIR" && tar -xJf "$G/prebuilt.tar.xz" -C "$BDIR" \
      && ! LD_LIBRARY_PATH=$BDIR/bin:$CUDA_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ldd "$BDIR/bin/libggml-cuda.so" | grep "not found"; then
    # gpu-prebuild.sh built this source for sm_90 on a machine without a GPU (CPU flags AVX2, no native ones), and
    # its libraries find theirs here (else it is built here, below)
    skip build "prebuilt by gpu-prebuild.sh for sm_90: $(cat "$G/prebuilt.args" 2>/dev/null)"
    fact build "prebuilt"
    fact cmake_args "$(cat "$G/prebuilt.args" 2>/dev/null)"
  else
    el "nvcc: ${NV:-none}; $(cmake --version | head -1); $(gcc --version | head -1)"
    configure || BUILT=0
    if [ "$BUILT" = 1 ]; then
      el "configured; building llama, llama-bench, llama-speculative-simple with $(nproc) jobs"
      if ! step build 420 cmake --build "$BDIR" -j "$(nproc)" --target llama llama-bench llama-speculative-simple \
        > "$RAW/build.log" 2>&1; then
        grep -m3 -A12 -E "error|Error" "$RAW/build.log"
        tail -20 "$RAW/build.log"
        el "building the library alone"
        step build-llama 120 cmake --build "$BDIR" -j "$(nproc)" --target llama >> "$RAW/build.log" 2>&1 || BUILT=0
      fi
    fi
    if [ "$BUILT" = 1 ] && [ -f "$BDIR/bin/libllama.so" ]; then
      echo "$BKEY" > "$BDIR/.key"
      fact build_seconds "$(($(date +%s) - T0))"
      el "built: $(cd "$BDIR/bin" && echo *)"
    else
      BUILT=0
    fi
  fi
fi
fact library "$LIB"

# --- the models, waited for -----------------------------------------------------------------------------------
if [ -n "$MODELS_PID" ]; then
  wait "$MODELS_PID"
  rc=$?
  record models "$rc" "$(($(date +%s) - MODELS_T0))" "${TODO[*]}"
  cat "$RAW/models.log"
  [ "$rc" -eq 0 ] || { el "models: FAILED rc=$rc"; FAILED=1; }
fi
el "models ready: $(cd "$M" 2>/dev/null && echo *.gguf)"
if [ "$BUILT" = 0 ]; then
  el "no library: nothing can run"
  finish
  exit 1
fi

export LLAMA_CPP_LIB_PATH=$LIB
if [ "$MODE" = device ]; then
  export LD_LIBRARY_PATH=$LIB:$CUDA_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fact ld_library_path "$LD_LIBRARY_PATH"
  ldd "$LIB/libggml-cuda.so" 2>&1 | grep -E "not found|cublas|cudart|libcuda" >&5
fi
export PYTHONPATH=$W/src:$CODE${SITE:+:$SITE}
export XDG_CACHE_HOME=$W/xdg SPECDEC_CACHE_DIR=$W/cache SPECDEC_CONFIG_DIR=$W/config SPECDEC_MODELS_DIR=$W/models-dir
export HF_HUB_OFFLINE=1 NO_COLOR=1 SPECDEC_DEBUG=1
rm -rf "$SPECDEC_CACHE_DIR" # kernel verdicts and calibrations are measured afresh on every check
cd "$CODE" || exit 2        # python -m finds specdec_cli in the current folder first
if [ -n "${GPU_CHECK_BUILD_ONLY:-}" ]; then # built and set up: the next call on the warm machine checks
  el "GPU_CHECK_BUILD_ONLY: built and set up in $W, stopping here"
  finish
  exit 0
fi

# --- (d) the probe: llama.cpp's kernels, then patch 0008's at every width 1-65, flash attention on ---------------
if [ "$MODE" = rehearse ]; then
  PROBE=("$M/r135m-q4_0.gguf" --ngl 0 --prefix "32,64" --threads 1)
  PROBE_INV=("${PROBE[@]}" --sizes 1-9)
else
  PROBE=("$M/r135m-q4_0.gguf" "$M/r8b-q4_0.gguf" "$M/r8b-q4_k.gguf" --prefix "64,1500")
  PROBE_INV=("$M/r8b-q4_0.gguf" "$M/r8b-q4_k.gguf" "$M/r135m-q4_0.gguf" --prefix "64,1000,1500" --sizes 1-65)
fi
probe() { # NAME SWITCH ARGS...: probe.py with GGML_CUDA_BATCH_INVARIANT=SWITCH
  local name=$1 sw=$2 rc
  shift 2
  GGML_CUDA_BATCH_INVARIANT=$sw GGML_CPU_BATCH_INVARIANT=$sw GGML_CPU_TILED_MM=0 step "$name" 100 "$PY" "$GPUPY/probe.py" "$RAW/$name.json" "$@" --fa 1 --label "$name" \
    > "$RAW/$name.log" 2> "$RAW/$name.err"
  rc=$?
  cat "$RAW/$name.log"
  [ "$rc" -eq 0 ] || tail -5 "$RAW/$name.err"
  "$PY" "$GPUPY/report.py" report "$RAW" "$OUT" 2>/dev/null
}
if [ "$GRAPHS" = 1 ]; then
  PROBE_INV=()
elif [ "$QUICK" = 1 ]; then
  [ "$MODE" = device ] && PROBE_INV=("$M/r8b-q4_0.gguf" "$M/r135m-q4_0.gguf" --prefix "64,1500" --sizes 1-65)
else
  probe probe 0 "${PROBE[@]}"
fi
[ ${#PROBE_INV[@]} -gt 0 ] && probe probe-inv 1 "${PROBE_INV[@]}"

# --- several sequences in one batch (a server's step), each against itself alone: patch 0008's kernels, then stock
STREAMS=("$M/r135m-q4_0.gguf")
[ "$MODE" = device ] && STREAMS+=("$M/r8b-q4_0.gguf")
[ "$MODE" = rehearse ] && STREAMS+=(--ngl 0)
[ "$GRAPHS" = 1 ] && STREAMS=()
for sw in $([ ${#STREAMS[@]} -gt 0 ] && echo 1 0); do
  name=streams$([ $sw = 1 ] && echo -inv)
  GGML_CUDA_BATCH_INVARIANT=$sw GGML_CPU_BATCH_INVARIANT=$sw GGML_CPU_TILED_MM=0 step "$name" 60 "$PY" "$GPUPY/probe_streams.py" "$RAW/$name.json" "${STREAMS[@]}" \
    --label "$name" > "$RAW/$name.log" 2> "$RAW/$name.err" || tail -5 "$RAW/$name.err"
  cat "$RAW/$name.log"
done
"$PY" "$GPUPY/report.py" report "$RAW" "$OUT" 2>/dev/null

# --- llama-bench on the 8B target: one token and a 512-token prompt, llama.cpp's kernels and patch 0008's -------
if [ -n "${TOOLS_BIN:-}" ] && [ -x "$TOOLS_BIN/llama-bench" ] && [ "$MODE" = device ] && [ "$QUICK" = 0 ] \
  && [ "$GRAPHS" = 0 ]; then
  for sw in 0 1; do
    GGML_CUDA_BATCH_INVARIANT=$sw step "llama-bench-target-$sw" 60 "$TOOLS_BIN/llama-bench" -m "$M/r8b-q4_0.gguf" \
      -ngl 99 -p 128,512 -n 128 -fa 1 -r 3 -o json > "$RAW/tools/llama-bench-target$([ $sw = 1 ] && echo -inv).json" \
      2> "$RAW/tools/llama-bench-target-$sw.err"
  done
  "$PY" "$GPUPY/report.py" report "$RAW" "$OUT" 2>/dev/null
fi

# --- (e) specdec runs -----------------------------------------------------------------------------------------
SD=("$PY" -m specdec_cli)
HELP=$(COLUMNS=300 TERM=dumb timeout 60 "${SD[@]}" run --help 2>&1)
KERNELS=0
grep -q -- "--kernels" <<< "$HELP" && KERNELS=1
NGL_DEFAULT=$(printf '%s' "$HELP" | "$PY" -c 'import re, sys
t = sys.stdin.read()
m = re.search(r"(?<![\w-])--gpu-layers\b(.*?)(?=\s--[a-z]|\Z)", t, re.S)
d = m and re.search(r"[\[(]default:\s*([^\])]+)[\])]", m.group(1))
print(d.group(1).strip() if d else "?")')
NGL=()
if [ "${GPU_CHECK_LAYERS:-}" = 99 ] || { [ -z "${GPU_CHECK_LAYERS:-}" ] && [ "$NGL_DEFAULT" = 0 ]; }; then
  NGL=(--gpu-layers 99 --draft-gpu-layers 99)
  el "the CLI's --gpu-layers default is ${NGL_DEFAULT}: every run gets ${NGL[*]}"
fi
fact cli_has_kernels_option "$([ "$KERNELS" = 1 ] && echo true || echo false)"
fact cli_gpu_layers_default "$NGL_DEFAULT"
fact layers_added "${NGL[*]:-none}"
[ "$KERNELS" = 1 ] || el "the CLI has no --kernels option: the --kernels fast runs are skipped"

PR="Write a long story about a robot who learns to paint, with many details."
# a rehearsal shares its few cores: one thread everywhere (llama.cpp's spinning threads crawl on busy cores)
if [ "$MODE" = rehearse ]; then N=32; NI=32; NB=24; RT=(--threads 1); TT=(-t 1); else N=128; NI=128; NB=96; RT=(); TT=(); fi

# sd_run NAME PAIR LABEL N WANT ARGS...: one `specdec run --json`, recorded in runs.tsv
sd_run() {
  local name=$1 pair=$2 label=$3 n=$4 want=$5 rc
  shift 5
  step "run:$name" "$want" "${SD[@]}" run "$PR" "$@" "${RT[@]}" -n "$n" --json > "$RAW/runs/$name.json" 2> "$RAW/runs/$name.err"
  rc=$?
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$pair" "$label" "$rc" "$STEP_SECS" "$n" "specdec run PROMPT $* -n $n --json" \
    >> "$RAW/runs.tsv"
  "$PY" - "$RAW/runs/$name.json" "$RAW/runs/$name.err" "$pair $label" "$rc" "$STEP_SECS" <<'PY' >&5
import json, sys
path, err, label, rc, secs = sys.argv[1:]
try:
    d = json.load(open(path))
    s = d["stats"]
    line = (f"tok/s {s['tokens_per_second']:.1f}, drafted {s['drafted']}, accepted {s['accepted']}, "
            f"kernels {d['models'].get('kernels')}, {d['n_tokens']} tokens")
except Exception:
    lines = [x for x in open(err, errors="replace").read().splitlines() if x.strip()]
    line = "no result: " + (lines[-1] if lines else "no output")
print(f"  {label:<34} rc={rc} {secs:>3}s  {line}")
PY
  grep -iE "warn|exact|error" "$RAW/runs/$name.err" | head -2 >&5
}

run_pair() { # NAME T D: the target alone, exact mode (auto), exact model:4 against llama-speculative-simple's K=4
  local p=$1 t=$2 d=$3
  sd_run "$p-no-draft" "$p" no-draft "$N" 60 --target "$t" --no-draft "${NGL[@]}"
  sd_run "$p-exact" "$p" "exact (default)" "$N" 60 --target "$t" --draft "$d" "${NGL[@]}"
  sd_run "$p-exact-model4" "$p" "exact model k4 fixed" "$N" 60 --target "$t" --draft "$d" --drafter model -k 4 --fixed-k \
    "${NGL[@]}"
}
fast_runs() { # NAME T D: --kernels fast (llama.cpp's own kernels) with each drafter
  local p=$1 t=$2 d=$3 c
  if [ "$KERNELS" != 1 ]; then
    for c in fast-model4 fast-auto fast-ngram; do skip "run:$p-$c" "the CLI has no --kernels"; done
    return
  fi
  sd_run "$p-fast-model4" "$p" "fast model k4 fixed" "$N" 60 --target "$t" --draft "$d" --kernels fast \
    --drafter model -k 4 --fixed-k "${NGL[@]}"
  sd_run "$p-fast-auto" "$p" "fast auto" "$N" 60 --target "$t" --draft "$d" --kernels fast "${NGL[@]}"
  sd_run "$p-fast-ngram" "$p" "fast ngram" "$N" 60 --target "$t" --kernels fast --drafter ngram "${NGL[@]}"
}

# --- greedy identity first (what exactness on the GPU is judged by): 8 prompts, the target alone against model:4
"$PY" - "$W/identity.jsonl" <<'PY'
import json, sys
prompts = [
    "Write a long story about a robot who learns to paint, with many details.",
    "Explain how a refrigerator works, step by step.",
    "List ten facts about the Moon, one per line.",
    "Write a Python function that checks whether a string is a palindrome, and explain it.",
    "Describe a busy market in a coastal town at dawn.",
    "Summarise the rules of chess for a beginner.",
    "Write a letter to a friend about a long train journey.",
    "Give a recipe for bread, with quantities and timings.",
]
with open(sys.argv[1], "w") as f:
    for i, p in enumerate(prompts, 1):
        f.write(json.dumps({"prompt": p, "category": f"p{i}", "name": f"p{i}"}) + "\n")
PY
identity() { # KEY TARGET DRAFT ARGS...
  local key=$1 t=$2 d=$3
  shift 3
  step "identity:$key" 150 "${SD[@]}" bench --target "$t" --draft "$d" --prompts "$W/identity.jsonl" \
    --configs "target,model:4" -n "$NI" --repeats 1 --warmup 0 --json "$@" "${NGL[@]}" "${RT[@]}" \
    > "$RAW/identity-$key.json" 2> "$RAW/identity-$key.err"
  tail -2 "$RAW/identity-$key.err"
  "$PY" "$GPUPY/report.py" report "$RAW" "$OUT" 2>/dev/null
  grep -A4 "^## Greedy identity" "$OUT/summary.md"
}
host_time_step() { # REPEATS ARGS...: benchmarks.host_time on the first pair, llama.cpp's tools beside it
  local repeats=$1
  shift
  [ -f "$CODE/benchmarks/host_time.py" ] || { skip host-time "the bundle has no benchmarks/host_time.py"; return; }
  step host-time "$([ "$MODE" = rehearse ] && echo 300 || echo 150)" "$PY" -m benchmarks.host_time --target "$T" \
    --draft "$D" -n "$N" --repeats "$repeats" "$@" ${TOOLS_BIN:+--llama-cpp-bin "$TOOLS_BIN"} \
    --results "$RAW/host-time.json" > "$RAW/host-time.log" 2>&1
  grep -E "host|tokens/s|part|ahead|bursts|runs" "$RAW/host-time.log" | head -20
  "$PY" "$GPUPY/report.py" report "$RAW" "$OUT" 2>/dev/null
}
graph_shapes_step() { # graph_shapes.py on the first pair's target
  step graph-shapes "$([ "$MODE" = rehearse ] && echo 200 || echo 120)" "$PY" "$GPUPY/graph_shapes.py" \
    "$RAW/graph-shapes.json" "$T" "$([ "$MODE" = rehearse ] && echo 8 || echo 64)" > "$RAW/graph-shapes.log" 2>&1
  tail -16 "$RAW/graph-shapes.log"
  "$PY" "$GPUPY/report.py" report "$RAW" "$OUT" 2>/dev/null
}
read -r P T D <<< "${PAIRS[0]}"
T=$M/$T.gguf
D=$M/$D.gguf
identity exact "$T" "$D"
if [ "$GRAPHS" = 1 ]; then # what graph reuse changes: the shapes, the host time, then several requests at once
  graph_shapes_step
  host_time_step 2
fi
# --- several requests at once through the batch engine (a server's slots), each against the target alone -------
step batched "$([ "$MODE" = rehearse ] && echo 300 || echo 150)" "$PY" "$GPUPY/batched.py" "$RAW/batched.json" "$T" "$D" \
  "$NB" $([ "$MODE" = rehearse ] && echo 1) > "$RAW/batched.log" 2> "$RAW/batched.err" || tail -5 "$RAW/batched.err"
cat "$RAW/batched.log"
"$PY" "$GPUPY/report.py" report "$RAW" "$OUT" 2>/dev/null
if [ "$QUICK" = 1 ] || [ "$GRAPHS" = 1 ]; then
  finish
  exit "$FAILED"
fi
[ "$MODE" = device ] && identity exact-q4_k "$M/r8b-q4_k.gguf" "$D"

# --- (f) specdec runs on the first (largest) pair, then llama.cpp's own tools on it ------------------------------
run_pair "$P" "$T" "$D"
"$PY" "$GPUPY/report.py" report "$RAW" "$OUT" 2>/dev/null

if [ -n "$TOOLS_BIN" ]; then
  if [ -x "$TOOLS_BIN/llama-bench" ]; then
    if [ "$MODE" = rehearse ]; then # on a GPU the 8B target was timed above, with both kernel sets
      step llama-bench-target 90 "$TOOLS_BIN/llama-bench" -m "$T" -ngl 99 -p 0 -n 128 -fa 0,1 -r 3 -o json "${TT[@]}" \
        > "$RAW/tools/llama-bench-target.json" 2> "$RAW/tools/llama-bench-target.err"
    fi
    step llama-bench-draft 45 "$TOOLS_BIN/llama-bench" -m "$D" -ngl 99 -p 0 -n 128 -fa 1 -r 3 -o json "${TT[@]}" \
      > "$RAW/tools/llama-bench-draft.json" 2> "$RAW/tools/llama-bench-draft.err"
  else
    skip llama-bench "no llama-bench in $TOOLS_BIN"
  fi
  step llama-speculative-simple-fa-on 60 "$TOOLS_BIN/llama-speculative-simple" -m "$T" -md "$D" -ngl 99 -ngld 99 \
    -p "$PR" -n "$N" --spec-type draft-simple --spec-draft-n-max 4 -fa on --temp 0 "${TT[@]}" \
    > "$RAW/tools/spec-fa-on.txt" 2>&1
  echo "  llama-speculative-simple K=4 fa=on: $(grep -E "decoded|accept " "$RAW/tools/spec-fa-on.txt" | tr -s ' ' | tr '\n' ' ')"
else
  skip llama.cpp-tools "rehearsal: no build/llama.cpp/bin (scripts/build-llama-cpp-tools.sh makes it)"
fi
"$PY" "$GPUPY/report.py" report "$RAW" "$OUT" 2>/dev/null

# --- host time per step on this pair (outside llama_decode), beside llama-bench and llama-speculative-simple ------
host_time_step "$([ "$MODE" = rehearse ] && echo 1 || echo 3)" --ahead-too --bursts-too

# --- CUDA graphs across specdec's batch shapes: steady and alternating shapes, with graphs and without ------------
graph_shapes_step

# --- then what is known to work elsewhere: --kernels fast, the small pair, every layer named ----------------------
fast_runs "$P" "$T" "$D"
DRAFT_NGL=()
[ ${#NGL[@]} -gt 0 ] && DRAFT_NGL=(--draft-gpu-layers 99)
if [ "$MODE" = rehearse ]; then
  skip "run:$P-ngl99" "rehearsal: the CPU library refuses --gpu-layers 99"
else
  sd_run "$P-ngl99" "$P" "exact, --gpu-layers 99" "$N" 60 --target "$T" --draft "$D" --gpu-layers 99 "${DRAFT_NGL[@]}"
fi
for pair in "${PAIRS[@]:1}"; do
  read -r P2 T2 D2 <<< "$pair"
  run_pair "$P2" "$M/$T2.gguf" "$M/$D2.gguf"
  fast_runs "$P2" "$M/$T2.gguf" "$M/$D2.gguf"
done
"$PY" "$GPUPY/report.py" report "$RAW" "$OUT" 2>/dev/null
if [ "$KERNELS" = 1 ]; then identity fast "$T" "$D" --kernels fast; else skip identity:fast "the CLI has no --kernels"; fi


# --- (g) specdec bench ------------------------------------------------------------------------------------------
BENCH=("${SD[@]}" bench --target "$T" --draft "$D" --configs "target,model:4,auto,ngram:auto" --repeats 1 -n "$NB"
  --json) # exact mode: on a GPU with patch 0008 it drafts
step bench 150 "${BENCH[@]}" "${NGL[@]}" "${RT[@]}" > "$RAW/bench.json" 2> "$RAW/bench.err"
tail -3 "$RAW/bench.err"

# --- last, the least needed: the largest target placed on the CPU of a CUDA build (a slow run) --------------------
read -r P T D <<< "${PAIRS[0]}"
sd_run "$P-ngl0" "$P" "exact, --gpu-layers 0" 64 90 --target "$M/$T.gguf" --draft "$M/$D.gguf" --gpu-layers 0 \
  "${DRAFT_NGL[@]}"

finish
exit "$FAILED"
