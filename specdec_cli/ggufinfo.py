"""Facts about a GGUF model from its metadata, without loading weights.

Read through llama.cpp's vocabulary-only load (fast even for a 70B file: tensor
data is mapped, never read, but every tensor's bounds are checked, so a truncated
file is refused). Used by pair-check and the memory benchmark.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from specdec_cli.engine.model import ModelInfo

# llama_ftype (general.file_type) names, as llama.cpp's quantize tool prints them.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4",
}  # fmt: skip


def _int(meta: dict[str, str], key: str, default: int = 0) -> int:
    try:
        return int(meta[key])
    except (KeyError, ValueError):
        return default


@dataclass(frozen=True)
class GGUFSummary:
    path: Path
    file_size: int
    architecture: str
    name: str
    size_label: str
    quantization: str
    n_layers: int
    n_kv_heads: int
    key_length: int
    value_length: int
    n_ctx_train: int
    chat_template: str | None

    @staticmethod
    def from_info(info: ModelInfo) -> GGUFSummary:
        m = info.metadata
        arch = m.get("general.architecture", "unknown")
        heads = _int(m, f"{arch}.attention.head_count")
        emb = _int(m, f"{arch}.embedding_length")
        head_dim = emb // heads if heads else 0
        ftype = _int(m, "general.file_type", -1)
        return GGUFSummary(
            path=info.path,
            file_size=info.file_size,
            architecture=arch,
            name=m.get("general.name", ""),
            size_label=m.get("general.size_label", ""),
            quantization=FILE_TYPES.get(ftype, f"type {ftype}") if ftype >= 0 else "unknown",
            n_layers=_int(m, f"{arch}.block_count"),
            n_kv_heads=_int(m, f"{arch}.attention.head_count_kv", heads),
            key_length=_int(m, f"{arch}.attention.key_length", head_dim),
            value_length=_int(m, f"{arch}.attention.value_length", head_dim),
            n_ctx_train=info.n_ctx_train,
            chat_template=info.chat_template,
        )

    def kv_cache_bytes(self, n_ctx: int) -> int:
        """K and V in f16 for every layer at `n_ctx` (sliding-window caches kept full, as specdec does)."""
        return self.n_layers * n_ctx * self.n_kv_heads * (self.key_length + self.value_length) * 2


def human_gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.0f} MB"


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), else free physical pages; None if unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
