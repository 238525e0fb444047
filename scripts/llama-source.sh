# Sourced by setup.sh and build-llama-cpp-tools.sh: the llama.cpp source both build, which is the one vendored
# in the llama-cpp-python sdist with specdec's patches (patches/llama.cpp/, docs/design.md#the-kernels) applied.
#   $PATCHES_SUM           a hash of the patches (a build cache key follows it)
#   llama_source DIR       DIR holds the sdist, unpacked and patched (again only when the patches changed)
# Needs $LLAMA_CPP_PYTHON_VERSION, $PYTHON and say().
PATCH_FILES=(patches/llama.cpp/*.patch)
PATCHES_SUM=$(cat "${PATCH_FILES[@]}" | sha256sum | cut -c1-16)

llama_source() {
  local dir=$1 p
  if [ -f "$dir/vendor/llama.cpp/CMakeLists.txt" ] && [ "$(cat "$dir/.specdec-patches" 2>/dev/null)" = "$PATCHES_SUM" ]; then
    return 0
  fi
  rm -rf "$dir" "$dir.sdist"
  mkdir -p "$dir" "$dir.sdist"
  say "fetching the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist from PyPI"
  "$PYTHON" -m pip download -q --no-deps --no-binary :all: -d "$dir.sdist" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
  tar -xzf "$dir.sdist"/llama_cpp_python-*.tar.gz -C "$dir" --strip-components=1
  rm -rf "$dir.sdist"
  for p in "${PATCH_FILES[@]}"; do
    say "applying $p"
    if command -v patch >/dev/null; then
      patch -s -p1 -d "$dir/vendor/llama.cpp" < "$p"
    else
      git -C "$dir/vendor/llama.cpp" apply -p1 "$(realpath "$p")"
    fi
  done
  printf '%s' "$PATCHES_SUM" > "$dir/.specdec-patches"
}
