"""specdec: lossless speculative decoding for local GGUF models."""

from specdec_cli import cxx_runtime

cxx_runtime.claim()  # first, before any native library: llama.cpp's tokenizer needs it (cxx_runtime.py)

__version__ = "0.1.0"
