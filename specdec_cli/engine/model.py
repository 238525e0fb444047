"""The one wrapper that owns llama.cpp handles; nothing else in specdec touches ctypes.

What speculative decoding needs from a model is small: tokenize and detokenize,
decode a batch of tokens asking for logits at chosen positions only, read those
logits as numpy *views* (no copy of the vocabulary unless the caller asks), and
roll the KV cache back to a position. `Model` does exactly that and tracks which
tokens its cache holds, so callers can reuse a common prefix instead of
re-evaluating it.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import os
import stat
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specdec_cli.engine.specials import ControlTexts
from specdec_cli.errors import ContextError, ModelFileError, UnsupportedModelError, UsageError

GGUF_MAGIC = b"GGUF"
MAX_CTX = 2**31 - 1  # llama.cpp's n_ctx is a uint32; no model comes near this


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)

# Exact mode. Speculative verification decodes K+1 tokens in one batch; the output
# is identical to the target alone only if a batch computes bit-identical logits
# to single-token decoding. CPU kernels that break that are turned off: the tiled
# K-quant matmul (taken above a batch-size floor), the repacked-weight GEMMs
# ("extra buffer types", taken from 4 rows) and flash attention (see Model).
# tests/test_engine.py checks bit-identity on the packaged models. ggml reads this
# variable once per process.
os.environ.setdefault("GGML_CPU_TILED_MM", "0")

# llama.cpp's log goes through one process-wide callback: we keep the recent lines
# (to explain a failed load) and forward them to stderr only when asked to.
_LOG_LINES: collections.deque[str] = collections.deque(maxlen=200)
_LOG_STATE = {"verbose": False, "installed": False}
_LOG_LOCK = threading.Lock()
_LOG_CALLBACK: Any = None  # keep a reference: ctypes must not collect it


def _llama() -> Any:
    """Import the ctypes bindings lazily so `--help` stays fast."""
    import llama_cpp.llama_cpp as C  # noqa: N812

    return C


def set_verbose(verbose: bool) -> None:
    """Show llama.cpp's own log on stderr (it is hidden by default)."""
    _LOG_STATE["verbose"] = verbose
    _install_log_callback()


def _install_log_callback() -> None:
    global _LOG_CALLBACK
    with _LOG_LOCK:
        if _LOG_STATE["installed"]:
            return
        C = _llama()  # noqa: N806

        def _on_log(level: int, text: bytes | None, _user: Any) -> None:
            if not text:
                return
            line = text.decode("utf-8", errors="replace")
            _LOG_LINES.append(line)
            if _LOG_STATE["verbose"]:
                os.write(2, text)

        _LOG_CALLBACK = C.llama_log_callback(_on_log)
        C.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
        C.llama_backend_init()
        _LOG_STATE["installed"] = True


def _last_log_error() -> str:
    """The most telling recent llama.cpp log line, for an error message.

    llama.cpp logs the cause ("error loading model: tensor ... not within the file
    bounds", or the GGUF reader's "this GGUF file is version 7 but ...") before a
    generic "failed to load model": prefer the cause.
    """
    lines = [line.strip() for line in _LOG_LINES if line.strip()]
    for line in lines:  # the GGUF reader names what is wrong with the header
        if line.startswith("gguf_") and ": " in line and "failed to read" not in line:
            return line.split(": ", 1)[1]
    for line in reversed(lines):
        if "error loading model:" in line:
            cause = line.split("error loading model:", 1)[1].strip()
            if "failed to load model from" not in cause:
                return cause
    for line in reversed(lines):
        if "error" in line.lower() or "failed" in line.lower():
            return line
    return ""


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


def encode_utf8(text: str, what: str = "the text") -> bytes:
    """UTF-8 bytes, or a UsageError naming the first invalid byte.

    Python decodes argv and stdin with surrogateescape, so invalid input arrives
    as lone surrogates; they would otherwise fail deep inside tokenization.
    """
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = ord(text[exc.start])
        byte = f"byte 0x{bad - 0xDC00:02x}" if 0xDC80 <= bad <= 0xDCFF else f"code point U+{bad:04X}"
        raise UsageError(f"{what} is not valid UTF-8 ({byte} at character {exc.start})") from None


def _load_failure(path: Path) -> str:
    """What to tell the user when llama.cpp refuses a file."""
    reason = _last_log_error()
    size = path.stat().st_size
    if any(line.startswith("gguf_") and "failed to read header" in line for line in _LOG_LINES):
        return f"{path} ({size:,} bytes) has an invalid GGUF header: {reason or 'llama.cpp could not read it'}"
    hint = f": {reason}" if reason else ""
    return (
        f"llama.cpp could not load {path} ({size:,} bytes){hint}. The file may be truncated "
        "(re-download it) or use an architecture this llama.cpp build does not know"
    )


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


class Model:
    """One GGUF model and (unless `vocab_only`) one llama.cpp context for it.

    With `n_seq` = 1 the cache is a single sequence and `tokens` lists what it
    holds, in order. With `n_seq` > 1 (continuous batching, engine/batch.py) the
    context holds `n_seq` sequences of `n_ctx` tokens each, every one in its own
    KV stream (llama.cpp's non-unified cache) unless `unified`, so a sequence's
    cells sit where they would if it ran alone and its logits are bit-identical
    to a solo run's whatever runs beside it; `seq_tokens[s]` lists what sequence s holds, and
    every cache method takes the sequence (`seq`, default 0). `decode_many`
    decodes parts of several sequences in one `llama_decode`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_gpu_layers: int = 0,
        n_batch: int = 256,
        vocab_only: bool = False,
        n_seq: int = 1,
        unified: bool = False,
    ) -> None:
        self.path = check_gguf_file(path)
        _install_log_callback()
        C = _llama()  # noqa: N806
        self._C = C
        self._model: Any = None
        self._ctx: Any = None
        self._batch: Any = None
        self.n_seq = max(1, n_seq)
        self.unified = unified
        self.seq_tokens: list[list[int]] = [[] for _ in range(self.n_seq)]
        self.tokens: list[int] = self.seq_tokens[0]
        self.decode_seconds = 0.0  # time spent inside llama_decode, for stats
        self.decoded_tokens = 0  # tokens evaluated so far (shows cache reuse)
        self.warnings: list[str] = []  # things the user should know about how it was loaded

        mparams = C.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers
        mparams.vocab_only = vocab_only
        mparams.use_extra_bufts = False  # see "Exact mode" above
        _LOG_LINES.clear()
        model = C.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not model:
            raise ModelFileError(_load_failure(self.path))
        self._model = model
        try:
            self._init_context(n_ctx, n_threads, n_batch, vocab_only)
        except BaseException:
            self.close()  # a failed load frees what it allocated, not leaving it to __del__
            raise

    def _init_context(self, n_ctx: int, n_threads: int | None, n_batch: int, vocab_only: bool) -> None:
        C = self._C  # noqa: N806
        model = self._model
        self._vocab_ptr = C.llama_model_get_vocab(model)
        self.n_vocab = int(C.llama_vocab_n_tokens(self._vocab_ptr))
        self._pieces: dict[int, bytes] = {}
        self._eog: frozenset[int] | None = None
        self._controls: ControlTexts | None = None
        self._control_ids: frozenset[int] | None = None
        self.n_ctx = 0
        if vocab_only:
            return

        n_seq = self.n_seq
        self._check_context_fits(n_ctx, n_seq)
        threads = n_threads or usable_cores()
        cparams = C.llama_context_default_params()
        cparams.n_ctx = n_ctx * n_seq
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        cparams.n_seq_max = n_seq
        # One KV stream per sequence: in a unified cache, sequences' cells interleave and the
        # attention sums run in another order than a solo run's (not bit-identical). A draft may
        # share one (`unified`): its numbers need not match a solo run's, and a unified batch is
        # always one micro-batch, whatever each sequence contributes.
        cparams.kv_unified = self.unified
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.no_perf = True
        # Exact mode, continued: flash attention on the CPU switches to a tiled kernel
        # for batches of 64+ queries and to a split-KV reduction for single tokens
        # once the cache holds 512+ cells; both change the summation order.
        cparams.flash_attn_type = 0  # LLAMA_FLASH_ATTN_TYPE_DISABLED
        # Sliding-window layers normally evict cells older than the window; a
        # rollback would then leave holes, and the output would drift from the
        # target alone. The full-size SWA cache keeps rollback exact.
        if C.llama_model_n_swa(model) > 0:
            cparams.swa_full = True
        ctx = C.llama_init_from_model(model, cparams)
        if not ctx:
            reason = _last_log_error()
            raise ModelFileError(
                f"llama.cpp could not create a context of {n_ctx} tokens for "
                f"{self.path}{': ' + reason if reason else ''}; try a smaller --ctx-size"
            )
        self._ctx = ctx
        # llama.cpp may round the context up (to a multiple of 256); the user's
        # --ctx-size is the limit we enforce, so behaviour does not depend on padding.
        self.n_ctx = min(n_ctx, int(C.llama_n_ctx_seq(ctx)))
        self.n_batch = n_batch
        self._mem = C.llama_get_memory(ctx)
        self._batch = C.llama_batch_init(n_batch, 0, 1)
        b = self._batch
        self._b_token = np.ctypeslib.as_array(b.token, shape=(n_batch,))
        self._b_pos = np.ctypeslib.as_array(b.pos, shape=(n_batch,))
        self._b_logits = np.ctypeslib.as_array(ctypes.cast(b.logits, ctypes.POINTER(ctypes.c_int8)), shape=(n_batch,))
        self._b_seq = np.zeros(n_batch, dtype=np.int32)  # the seq id each batch row holds now
        for i in range(n_batch):
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0

    def _check_context_fits(self, n_ctx: int, n_seq: int = 1) -> None:
        """Refuse a context whose KV cache cannot fit in memory, before llama.cpp tries to allocate it.

        llama.cpp allocates the whole cache up front and the kernel overcommits, so
        an absurd --ctx-size would otherwise grow to the machine's memory. Above the
        model's training length it only warns (`self.warnings`).
        """
        from specdec_cli.ggufinfo import GGUFSummary, available_memory, human_gb

        info = self.info()
        need = GGUFSummary.from_info(info).kv_cache_bytes(n_ctx * n_seq)
        have = available_memory()
        if n_ctx * n_seq > MAX_CTX or (have is not None and need > have):
            have_text = f"{human_gb(have)} available" if have is not None else "more than this machine has"
            slots = f" for each of {n_seq} parallel sequences" if n_seq > 1 else ""
            raise ContextError(
                f"--ctx-size {n_ctx:,}{slots} needs about {human_gb(need)} of KV cache for {self.path.name}, "
                f"{have_text}: choose a smaller --ctx-size (the model was trained on {info.n_ctx_train:,} tokens)"
            )
        if 0 < info.n_ctx_train < n_ctx:
            self.warnings.append(
                f"--ctx-size {n_ctx:,} is above {self.path.name}'s training context ({info.n_ctx_train:,} tokens): "
                "past that, its output may degrade"
            )

    # ------------------------------------------------------------------ info
    @property
    def _vocab(self) -> Any:
        """The vocabulary handle; a closed model raises instead of handing llama.cpp a freed pointer."""
        if self._model is None:
            raise UsageError(f"{self.path.name} has been closed: load it again")
        return self._vocab_ptr

    def _context(self) -> Any:
        if self._ctx is None:
            raise UsageError(f"{self.path.name} has been closed (or was loaded vocabulary-only)")
        return self._ctx

    @property
    def name(self) -> str:
        return self.path.name

    def vocab_info(self) -> VocabInfo:
        C = self._C  # noqa: N806
        v = self._vocab
        texts = tuple(C.llama_vocab_get_text(v, i) or b"" for i in range(self.n_vocab))
        special_mask = (1 << 3) | (1 << 4)  # LLAMA_TOKEN_ATTR_CONTROL | USER_DEFINED
        special = frozenset(i for i in range(self.n_vocab) if C.llama_vocab_get_attr(v, i) & special_mask)
        return VocabInfo(
            n_vocab=self.n_vocab,
            vocab_type=int(C.llama_vocab_type(v)),
            bos=int(C.llama_vocab_bos(v)),
            eos=int(C.llama_vocab_eos(v)),
            eot=int(C.llama_vocab_eot(v)),
            add_bos=bool(C.llama_vocab_get_add_bos(v)),
            add_eos=bool(C.llama_vocab_get_add_eos(v)),
            texts=texts,
            eog_ids=self.eog_ids,
            special_ids=special,
        )

    def special_texts(self) -> SpecialTexts:
        """BOS/EOS texts and flags, without reading the whole vocabulary."""
        C = self._C  # noqa: N806
        v = self._vocab
        bos, eos = int(C.llama_vocab_bos(v)), int(C.llama_vocab_eos(v))

        def text(i: int) -> str:
            return (C.llama_vocab_get_text(v, i) or b"").decode("utf-8", "replace") if i >= 0 else ""

        return SpecialTexts(text(bos), text(eos), bool(C.llama_vocab_get_add_bos(v)))

    def control_ids(self) -> frozenset[int]:
        """Ids of the CONTROL tokens (BOS, EOS, turn markers, unused slots)."""
        if self._control_ids is None:
            C = self._C  # noqa: N806
            v = self._vocab
            self._control_ids = frozenset(i for i in range(self.n_vocab) if C.llama_vocab_get_attr(v, i) & (1 << 3))
        return self._control_ids

    def control_texts(self) -> ControlTexts:
        """Texts of the CONTROL tokens: the only ones llama.cpp parses specially (and only when asked)."""
        if self._controls is None:
            C = self._C  # noqa: N806
            v = self._vocab
            texts = ((C.llama_vocab_get_text(v, i) or b"").decode("utf-8", "replace") for i in sorted(self.control_ids()))
            self._controls = ControlTexts.of(texts)
        return self._controls

    @property
    def eog_ids(self) -> frozenset[int]:
        """End-of-generation tokens (EOS, EOT, <end_of_turn>, ...), per llama.cpp."""
        if self._eog is None:
            C = self._C  # noqa: N806
            self._eog = frozenset(i for i in range(self.n_vocab) if C.llama_vocab_is_eog(self._vocab, i))
        return self._eog

    def info(self) -> ModelInfo:
        C = self._C  # noqa: N806
        self._vocab  # noqa: B018 - raises on a closed model
        buf = ctypes.create_string_buffer(256)
        C.llama_model_desc(self._model, buf, len(buf))
        meta: dict[str, str] = {}
        kbuf = ctypes.create_string_buffer(256)
        vbuf = ctypes.create_string_buffer(4096)
        for i in range(C.llama_model_meta_count(self._model)):
            C.llama_model_meta_key_by_index(self._model, i, kbuf, len(kbuf))
            C.llama_model_meta_val_str_by_index(self._model, i, vbuf, len(vbuf))
            key = kbuf.value.decode("utf-8", "replace")
            if key.startswith("tokenizer.ggml.") and key not in (
                "tokenizer.ggml.model",
                "tokenizer.ggml.pre",
            ):
                continue
            meta[key] = vbuf.value.decode("utf-8", "replace")
        tmpl = C.llama_model_chat_template(self._model, None)
        return ModelInfo(
            path=self.path,
            description=buf.value.decode("utf-8", "replace"),
            file_size=self.path.stat().st_size,
            n_params=int(C.llama_model_n_params(self._model)),
            n_ctx_train=int(C.llama_model_n_ctx_train(self._model)),
            n_swa=int(C.llama_model_n_swa(self._model)),
            chat_template=tmpl.decode("utf-8") if tmpl else None,
            metadata=meta,
        )

    def token_text(self, token: int) -> bytes:
        """The bytes a token renders as (special tokens render as nothing)."""
        piece = self._pieces.get(token)
        if piece is None:
            buf = ctypes.create_string_buffer(64)
            n = self._C.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = self._C.llama_token_to_piece(self._vocab, token, buf, -n, 0, False)
            piece = buf.raw[:n]
            self._pieces[token] = piece
        return piece

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_text(t) for t in tokens).decode("utf-8", "replace")

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        data = encode_utf8(text)
        cap = len(data) + 16
        arr = (self._C.llama_token * cap)()
        n = self._C.llama_tokenize(self._vocab, data, len(data), arr, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            arr = (self._C.llama_token * cap)()
            n = self._C.llama_tokenize(self._vocab, data, len(data), arr, cap, add_special, parse_special)
        return list(arr[:n])

    # ---------------------------------------------------------------- decode
    def decode(self, tokens: Sequence[int], n_logits: int = 1, seq: int = 0) -> np.ndarray:
        """Append `tokens` to the cache; return logits for the last `n_logits` of them.

        The result is a zero-copy ``(n_logits, n_vocab)`` float32 view of
        llama.cpp's output buffer: valid until the next call that decodes.
        """
        n = len(tokens)
        self._context()
        if n == 0:
            raise ValueError("decode needs at least one token")
        if n_logits > n:
            raise ValueError("more logits than tokens requested")
        if n_logits > self.n_batch:
            raise ValueError(f"at most {self.n_batch} logits rows per decode, asked for {n_logits}")
        self._check_room(seq, n)
        # Chunks of n_batch, aligned so that the last chunk holds every wanted row:
        # llama.cpp's output buffer only keeps the last llama_decode's rows.
        first = n % self.n_batch or self.n_batch
        bounds = [0, *range(first, n + 1, self.n_batch)]
        first_out = n - n_logits  # index in `tokens` of the first wanted row
        for start, end in zip(bounds, bounds[1:], strict=False):
            self._fill(0, seq, tokens[start:end], max(0, end - max(first_out, start)))
            self._run_batch(end - start, (seq,))
            self.seq_tokens[seq].extend(tokens[start:end])
        return self._logits(0, n_logits)

    def decode_many(self, parts: Sequence[tuple[int, Sequence[int], int, int]]) -> list[np.ndarray]:
        """Decode several sequences' tokens in ONE llama_decode: `parts` are (seq, tokens, n_logits,
        tail), at most `n_batch` tokens in all, one part per sequence; the last `tail` tokens get no
        logits (fillers) and the n_logits before them do. Returns each part's logits, as views valid
        until the next call that decodes."""
        self._context()
        total = sum(len(toks) for _, toks, _, _ in parts)
        if total > self.n_batch:
            raise ValueError(f"decode_many takes at most {self.n_batch} tokens, got {total}")
        if len({s for s, _, _, _ in parts}) != len(parts):
            raise ValueError("decode_many takes one part per sequence")
        row = 0
        for seq, toks, n_logits, tail in parts:
            if not (0 <= n_logits and 0 <= tail and n_logits + tail <= len(toks)):
                raise ValueError("more logits than tokens requested")
            self._check_room(seq, len(toks))
            self._fill(row, seq, toks, n_logits, tail)
            row += len(toks)
        if row:
            self._run_batch(row, tuple(s for s, _, _, _ in parts))
        out, first = [], 0
        for seq, toks, n_logits, _ in parts:
            self.seq_tokens[seq].extend(toks)
            out.append(self._logits(first, n_logits))
            first += n_logits
        return out

    def _check_room(self, seq: int, n: int) -> None:
        held = len(self.seq_tokens[seq])
        if held + n > self.n_ctx:
            raise ContextError(f"the context is full: {held} + {n} tokens > --ctx-size {self.n_ctx}")

    def _fill(self, row: int, seq: int, tokens: Sequence[int], n_logits: int, tail: int = 0) -> None:
        """Write `tokens` of sequence `seq` into batch rows from `row`, logits for the n_logits
        before the last `tail` tokens."""
        n = len(tokens)
        p0 = len(self.seq_tokens[seq])
        end = row + n
        self._b_token[row:end] = tokens
        self._b_pos[row:end] = np.arange(p0, p0 + n, dtype=np.int32)
        self._b_logits[row:end] = 0
        if n_logits:
            self._b_logits[end - tail - n_logits : end - tail] = 1
        if self.n_seq > 1:
            seq_id = self._batch.seq_id
            for i in np.flatnonzero(self._b_seq[row:end] != seq) + row:
                seq_id[i][0] = seq
            self._b_seq[row:end] = seq

    def _run_batch(self, n_tokens: int, seqs: tuple[int, ...]) -> None:
        C = self._C  # noqa: N806
        self._batch.n_tokens = n_tokens
        t0 = time.perf_counter()
        ret = C.llama_decode(self._ctx, self._batch)
        C.llama_synchronize(self._ctx)
        self.decode_seconds += time.perf_counter() - t0
        if ret != 0:
            # llama_decode leaves the cache as it was for a failed ubatch;
            # resynchronise our view of it before reporting.
            for seq in seqs:
                self._resync(seq)
            if ret == 1:
                held = max(len(self.seq_tokens[s]) for s in seqs)
                raise ContextError(f"no room left in the KV cache at {held} tokens (--ctx-size {self.n_ctx})")
            raise UnsupportedModelError(f"llama_decode failed with code {ret}")
        self.decoded_tokens += n_tokens

    def _logits(self, first: int, n_logits: int) -> np.ndarray:
        if n_logits == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        ptr = self._C.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(ptr, shape=(first + n_logits, self.n_vocab))[first:]

    def _resync(self, seq: int = 0) -> None:
        pos_max = int(self._C.llama_memory_seq_pos_max(self._mem, seq))
        del self.seq_tokens[seq][pos_max + 1 :]

    def rollback(self, n_keep: int, seq: int = 0) -> None:
        """Forget every cached position from `n_keep` on."""
        tokens = self.seq_tokens[seq]
        if n_keep >= len(tokens):
            return
        self._context()
        ok = self._C.llama_memory_seq_rm(self._mem, seq, n_keep, -1)
        if not ok:
            raise UnsupportedModelError(
                f"{self.path.name}: this architecture cannot roll its cache back "
                "(recurrent or hybrid model); speculative decoding needs that, "
                "so run it with --no-draft"
            )
        del tokens[n_keep:]

    def common_prefix(self, tokens: Sequence[int], seq: int = 0) -> int:
        """How many leading tokens the cache already holds (called every step: no Python loop)."""
        held = self.seq_tokens[seq]
        n = min(len(tokens), len(held))
        if held[:n] == list(tokens[:n]):
            return n
        diff = np.flatnonzero(np.asarray(held[:n]) != np.asarray(tokens[:n]))
        return int(diff[0])

    def sync(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        """Make the cache hold exactly `tokens` and return the last logits.

        Only the tokens after the common prefix are evaluated. At least one
        token is always (re)decoded so that fresh logits exist.
        """
        keep = min(self.common_prefix(tokens), len(tokens) - n_logits)
        self.rollback(keep)
        return self.decode(tokens[keep:], n_logits)

    def prefill(self, tokens: Sequence[int], seq: int = 0) -> None:
        """Make the cache hold exactly `tokens` (no logits needed); reuse the common prefix."""
        keep = self.common_prefix(tokens, seq)
        self.rollback(keep, seq)
        if keep < len(tokens):
            self.decode(tokens[keep:], n_logits=1, seq=seq)

    def reset(self) -> None:
        self._context()
        self._C.llama_memory_clear(self._mem, True)
        for tokens in self.seq_tokens:
            tokens.clear()

    # --------------------------------------------------------------- cleanup
    def close(self) -> None:
        C = self._C  # noqa: N806
        if self._batch is not None:
            C.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx is not None:
            C.llama_free(self._ctx)
            self._ctx = None
        if self._model is not None:
            C.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order
        try:
            self.close()
        except Exception:
            pass


# llama_ftype values for the quantizations we derive models with (F32: a dequantized, bandwidth-bound target).
QUANT_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q2_K": 10, "Q3_K_S": 11, "Q3_K_M": 12, "Q4_K_M": 15}


def quantize(src: str | os.PathLike[str], dst: str | os.PathLike[str], qtype: str, n_threads: int = 0) -> None:
    """Requantize a GGUF through llama.cpp's quantize API (used to derive drafts)."""
    if qtype not in QUANT_TYPES:
        raise ModelFileError(f"unknown quantization {qtype!r}; choose one of {', '.join(QUANT_TYPES)}")
    check_gguf_file(src)
    _install_log_callback()
    C = _llama()  # noqa: N806
    params = C.llama_model_quantize_default_params()
    params.ftype = QUANT_TYPES[qtype]
    params.allow_requantize = True
    params.nthread = n_threads
    ret = C.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if ret != 0:
        reason = _last_log_error()
        raise ModelFileError(f"quantizing {src} to {qtype} failed{': ' + reason if reason else ''}")
