"""What a GGUF file is and says: the check that a path is one, the facts read from a loaded model
(vocabulary, metadata), and what they imply (the KV cache's size against the memory available).

Facts are read through llama.cpp's vocabulary-only load (fast even for a 70B file: tensor data is
mapped, never read, but every tensor's bounds are checked, so a truncated file is refused). No
ctypes here: engine/model.py reads them, pair-check and the memory benchmark use them.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec_cli.errors import ContextError, ModelFileError

GGUF_MAGIC = b"GGUF"
MAX_CTX = 2**31 - 1  # llama.cpp's n_ctx is a uint32; no model comes near this


def check_gguf_file(path: str | os.PathLike[str]) -> Path:
    """Fail early, with one clear line, on a path that cannot be a GGUF model.

    Only a regular file is opened: a FIFO or a device would block the read (or
    never end), so it is refused from its `stat`, which is also where a symlink
    loop shows up.
    """
    p = Path(path).expanduser()
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise ModelFileError(f"model file not found: {p}") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ModelFileError(f"{p} is a symbolic link loop, not a model file") from None
        raise ModelFileError(f"cannot read {p}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ModelFileError(f"{p} is a directory, not a GGUF model file")
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device"
        raise ModelFileError(f"{p} is {kind}, not a regular file: specdec reads models from regular files only")
    try:
        with p.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelFileError(f"cannot read {p}: {exc.strerror}") from None
    if magic != GGUF_MAGIC:
        raise ModelFileError(
            f"{p} is not a GGUF file (it starts with {magic!r}, not b'GGUF'); "
            "convert it with llama.cpp's convert_hf_to_gguf.py or download a .gguf"
        )
    return p


@dataclass(frozen=True)
class VocabInfo:
    """What decides whether two models can speculate together."""

    n_vocab: int
    vocab_type: int
    bos: int
    eos: int
    eot: int
    add_bos: bool
    add_eos: bool
    texts: tuple[bytes, ...]
    eog_ids: frozenset[int]
    special_ids: frozenset[int]  # control and user-defined tokens


@dataclass(frozen=True)
class SpecialTexts:
    bos_text: str
    eos_text: str
    add_bos: bool


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    description: str
    file_size: int
    n_params: int
    n_ctx_train: int
    n_swa: int
    chat_template: str | None
    metadata: dict[str, str]


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


def check_context_fits(info: ModelInfo, n_ctx: int, n_seq: int = 1) -> list[str]:
    """Refuse a context whose KV cache cannot fit in memory, before llama.cpp tries to allocate it;
    the warnings to show (a context above the model's training length).

    llama.cpp allocates the whole cache up front and the kernel overcommits, so an absurd --ctx-size
    would otherwise grow to the machine's memory.
    """
    name = info.path.name
    need = GGUFSummary.from_info(info).kv_cache_bytes(n_ctx * n_seq)
    have = available_memory()
    if n_ctx * n_seq > MAX_CTX or (have is not None and need > have):
        have_text = f"{human_gb(have)} available" if have is not None else "more than this machine has"
        slots = f" for each of {n_seq} parallel sequences" if n_seq > 1 else ""
        raise ContextError(
            f"--ctx-size {n_ctx:,}{slots} needs about {human_gb(need)} of KV cache for {name}, "
            f"{have_text}: choose a smaller --ctx-size (the model was trained on {info.n_ctx_train:,} tokens)"
        )
    if 0 < info.n_ctx_train < n_ctx:
        return [f"--ctx-size {n_ctx:,} is above {name}'s training context ({info.n_ctx_train:,} tokens): "
                "past that, its output may degrade"]  # fmt: skip
    return []


def model_info(C: Any, model: Any, path: Path) -> ModelInfo:  # noqa: N803 - the bindings, as elsewhere
    """What a loaded llama_model says of itself (through the bindings `C`; engine/model.py passes them)."""
    buf = ctypes.create_string_buffer(256)
    C.llama_model_desc(model, buf, len(buf))
    meta: dict[str, str] = {}
    kbuf = ctypes.create_string_buffer(256)
    vbuf = ctypes.create_string_buffer(4096)
    for i in range(C.llama_model_meta_count(model)):
        C.llama_model_meta_key_by_index(model, i, kbuf, len(kbuf))
        C.llama_model_meta_val_str_by_index(model, i, vbuf, len(vbuf))
        key = kbuf.value.decode("utf-8", "replace")
        if key.startswith("tokenizer.ggml.") and key not in (
            "tokenizer.ggml.model",
            "tokenizer.ggml.pre",
        ):
            continue
        meta[key] = vbuf.value.decode("utf-8", "replace")
    tmpl = C.llama_model_chat_template(model, None)
    return ModelInfo(
        path=path,
        description=buf.value.decode("utf-8", "replace"),
        file_size=path.stat().st_size,
        n_params=int(C.llama_model_n_params(model)),
        n_ctx_train=int(C.llama_model_n_ctx_train(model)),
        n_swa=int(C.llama_model_n_swa(model)),
        chat_template=tmpl.decode("utf-8") if tmpl else None,
        metadata=meta,
    )
