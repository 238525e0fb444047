"""specdec: lossless speculative decoding for local GGUF models."""

__version__ = "0.1.0"
