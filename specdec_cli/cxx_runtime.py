"""The process's C++ runtime, claimed for llama.cpp before another native library can take its locale.

libstdc++ numbers a locale's facets (`std::collate<char>::id` and the others) from a counter of its own, and
those ids are GNU unique symbols: one definition for the whole process, the first one loaded, whatever the
flags a library is opened with (RTLD_LOCAL and RTLD_DEEPBIND change nothing). A library that carries another
copy of libstdc++ (linked statically with its symbols left visible, or a renamed private copy, as some wheels
ship) and builds a `std::locale` before the system's libstdc++ has built its own leaves the system's facets at
other indices than their ids say. llama.cpp's tokenizer, whose `std::regex` looks up `collate<char>`, then gets
another facet when it loads a vocabulary: `std::bad_cast` from a build made with GCC 12, a jump into
`codecvt<char16_t>::do_unshift` and a segfault from GCC 13 on (seen at every model load of a CUDA build, in a
Python environment with many native packages).

`claim()` builds the system libstdc++'s classic locale first (`std::locale::classic()`, a one-time
initialisation), so its facets get their ids before any other copy can: the package does it as it is imported
(specdec_cli/__init__.py), before anything else, so no library loaded after `import specdec_cli` can break
llama.cpp. One that a program loaded and used before importing specdec still can: docs/gpu.md says how to find
it. tests/test_cxx_runtime.py builds such a library and shows both orders.

It opens libstdc++ into the global scope (RTLD_GLOBAL, where LD_PRELOAD would put it), so that every library
loaded later binds libstdc++'s symbols to the system's copy first. A CUDA build made on an H200 machine carried
another copy of the facets' code in libggml-cuda.so: with libstdc++ opened locally, libllama bound to that copy
and every model load crashed in llama.cpp's regex (gdb: `codecvt<char16_t>::do_unshift` from libggml-cuda.so;
scripts/gpu/diag_load.sh); opened globally, it loads, on the GPU and on the CPU.
"""

from __future__ import annotations

import ctypes


def claim() -> bool:
    """Build the system libstdc++'s classic locale now; False where there is no libstdc++ to load (macOS)."""
    try:
        classic = ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)._ZNSt6locale7classicEv  # std::locale::classic()
    except (OSError, AttributeError):
        return False
    classic.restype = ctypes.c_void_p
    classic()
    return True
