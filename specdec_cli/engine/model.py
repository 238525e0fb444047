"""A loaded model: its llama_model and llama_context handles, the batch, the KV cache bookkeeping.

Speculative decoding needs little from a model: tokenize, detokenize, decode a batch with logits at chosen
rows (numpy *views*) or their argmaxes, and roll the cache back. `Model` does that and tracks what its cache
holds, so callers reuse a common prefix. Its helpers engine/llama_batch.py, engine/backend_argmax.py,
engine/greedy.py and engine/vocab.py call the bindings for it; the process-wide side is engine/native.py, the
kernels engine/kernels.py.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np

from specdec_cli.engine import kernels
from specdec_cli.engine.backend_argmax import BackendArgmax, in_graph
from specdec_cli.engine.gguf import ModelInfo, check_context_fits, check_gguf_file, model_info
from specdec_cli.engine.greedy import NO_TOKEN, GreedyMethods, NativeGreedy
from specdec_cli.engine.kv_cache import CacheMethods
from specdec_cli.engine.llama_batch import LlamaBatch, Part, part_seqs
from specdec_cli.engine.native import (
    bindings,
    clear_log,
    cuda_invariant_switch,
    cuda_invariant_width,
    install_log_callback,
    last_log_error,
    load_failure,
    out_of_memory,
    usable_cores,
)
from specdec_cli.engine.protocol import Rows, argmax_rows
from specdec_cli.engine.rpc import Placement
from specdec_cli.engine.vocab import Vocab, VocabMethods
from specdec_cli.errors import ContextError, ModelFileError, RpcError, UnsupportedModelError, UsageError

_NO_ROWS = np.empty((0, 0), dtype=np.float32)  # `_decode(view=False)`: the logits are not read


class Model(VocabMethods, CacheMethods, GreedyMethods):
    """One GGUF model and (unless `vocab_only`) one llama.cpp context for it. With `n_seq` = 1 the cache is one
    sequence and `tokens` lists what it holds. With `n_seq` > 1 (continuous batching, engine/batch/) it holds
    `n_seq` sequences of `n_ctx` tokens, each in its own KV stream (llama.cpp's non-unified cache) unless
    `unified`, so a sequence's cells sit where they would alone and its logits are bit-identical to a solo
    run's; `seq_tokens[s]` lists sequence s, every cache method takes `seq` (default 0), and `decode_many`
    decodes parts of several in one `llama_decode`. Exact mode (engine/kernels.py) unless `exact` is False."""

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
        exact: bool = True,
    ) -> None:
        self.path = check_gguf_file(path)
        install_log_callback()
        C = bindings()  # noqa: N806
        self._C = C
        self._model: Any = None
        self._ctx: Any = None
        self._batch: Any = None
        self.n_seq = max(1, n_seq)
        self.unified = unified
        self.seq_tokens: list[list[int]] = [[] for _ in range(self.n_seq)]
        self.pending_moves: set[int] = set()  # sequences a `move_seq` has moved or overwritten, until the next decode
        self._stale = False  # seq 0 has cells past its tokens: a rollback left to the next call (CacheMethods.rollback)
        self._defer_rollback = False  # seq 0's rollbacks may wait (the patch's calls remove such cells; one went)
        self.tokens: list[int] = self.seq_tokens[0]
        self.decode_seconds = 0.0  # time spent inside llama_decode, for stats
        self.decoded_tokens = 0  # tokens evaluated so far (shows cache reuse)
        self.warnings: list[str] = []  # things the user should know about how it was loaded
        self._info: ModelInfo | None = None

        mparams = C.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers
        mparams.vocab_only = vocab_only
        self.exact, self.n_gpu_layers = exact, n_gpu_layers  # not exact: a draft (it only proposes), llama.cpp's kernels
        # The kernels (engine/kernels.py): chosen, loaded, probed; `settle` reopens with the reference ones
        self.kernels, why = kernels.choose(exact, self.placement is None, n_gpu_layers, vocab_only)
        # patch 0008's process-wide switch, set before each of this model's decodes: on for an exact GPU model
        self._cuda_switch = cuda_invariant_switch() if n_gpu_layers > 0 else None
        mparams.use_extra_bufts = self.kernels != kernels.REFERENCE
        self._open(mparams, lambda: self._init_context(n_ctx, n_threads, n_batch, vocab_only))

        def reopen() -> None:
            self.close()
            self.warnings, mparams.use_extra_bufts = [], self.kernels != kernels.REFERENCE
            self._open(mparams, lambda: self._init_context(n_ctx, n_threads, n_batch, vocab_only))

        self.kernels, why = kernels.settle(self, why, reopen)
        self.warnings += [why] if why else []
        # the widest batch whose rows the GPU computes as single tokens (patch 0008); None: any width (a CPU's).
        # Every decode stays within it, prompts included: a wider one would take llama.cpp's own kernels, whose
        # rows depend on the batch's make-up (and so on what a previous turn left undecoded)
        self.exact_width = cuda_invariant_width() if self.kernels == kernels.GPU else None
        if self.exact_width:
            self.n_batch = min(n_batch, self.exact_width)

    placement: Placement | None = None  # local; engine/rpc_model.py's PlacedModel puts layers on RPC servers
    where: dict[str, float] = {}  # MiB of weights per RPC server ("local": here), when placed
    abandoned = False  # an RPC server it was on stopped answering: never freed (engine/rpc_faults.py)

    def _open(self, mparams: Any, init_context: Callable[[], None]) -> None:
        """Load the weights, then the context; a failed load frees what it allocated (not left to __del__)."""
        clear_log()
        model = self._C.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not model:
            raise out_of_memory(f"{self.path.name} with {mparams.n_gpu_layers} layers on the GPU",
                                "put fewer there (--gpu-layers)") or ModelFileError(load_failure(self.path))
        self._model = model
        try:
            init_context()
            self._ready()
        except BaseException:
            self.close()  # an abandoned model stays as it is
            raise

    def _ready(self) -> None:
        """After the weights and the context are loaded (a hook)."""

    def _init_context(self, n_ctx: int, n_threads: int | None, n_batch: int, vocab_only: bool) -> None:
        C = self._C  # noqa: N806
        model = self._model
        self._vocab_ptr = C.llama_model_get_vocab(model)
        self.vocab = Vocab(C, lambda: self._vocab)
        self.n_vocab = self.vocab.n_vocab
        self.n_ctx = 0
        if vocab_only:
            return

        n_seq = self.n_seq
        self.warnings += check_context_fits(self.info(), n_ctx, n_seq)
        threads = self.n_threads = n_threads or usable_cores()
        cparams = C.llama_context_default_params()
        cparams.n_ctx = n_ctx * n_seq
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        cparams.n_seq_max = n_seq
        # One KV stream per sequence: in a unified cache, sequences' cells interleave and the attention sums run
        # in another order than a solo run's (not bit-identical). A draft may share one (`unified`): its numbers
        # need not match a solo run's, and a unified batch is always one micro-batch.
        cparams.kv_unified = self.unified
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.no_perf = True
        cparams.n_outputs_max_per_seq = 0  # backend sampling may take every output row of a batch (verification)
        # Flash attention (engine/kernels.py): off for the reference kernels (_DISABLED), else llama.cpp's choice
        cparams.flash_attn_type = 0 if self.kernels == kernels.REFERENCE else -1  # (_AUTO: on, on a CPU)
        # Sliding-window layers normally evict cells older than the window; a rollback would then leave holes,
        # and the output would drift from the target alone. The full-size SWA cache keeps rollback exact.
        if C.llama_model_n_swa(model) > 0:
            cparams.swa_full = True
        # A CPU's exact kernels keep every batch there: a GPU build sends a batch of 32+ tokens' products to the
        # GPU even with no layers on it (op offload), in another order than the one token left on the CPU.
        cparams.op_offload = self.kernels not in (kernels.INVARIANT, kernels.REFERENCE)
        ctx = C.llama_init_from_model(model, cparams)
        if not ctx:
            if oom := out_of_memory(f"a context of {n_ctx} tokens for {self.path.name}", "try a smaller --ctx-size"):
                raise oom
            reason = last_log_error()
            raise ModelFileError(
                f"llama.cpp could not create a context of {n_ctx} tokens for "
                f"{self.path}{': ' + reason if reason else ''}; try a smaller --ctx-size"
            )
        self._ctx = ctx
        # llama.cpp may round the context up (to a multiple of 256); the user's --ctx-size is the limit we enforce.
        self.n_ctx = min(n_ctx, int(C.llama_n_ctx_seq(ctx)))
        self.n_batch = n_batch
        self._mem = C.llama_get_memory(ctx)
        self._batch = LlamaBatch(C, ctx, n_batch, self.n_vocab, n_seq > 1)
        self.hidden_on = False  # every row an output, with its hidden state (`set_hidden`)
        # greedy tokens computed in the graph (`decode_argmax`, `decode_many`) where that pays: backend_argmax.py
        self._argmax = BackendArgmax(C, ctx) if self.placement is None and in_graph(C, model, self.n_gpu_layers) else None
        self._logits_seen = False  # numpy saw this context's logits finite (the in-graph argmax cannot)
        # a greedy decode and its argmaxes, or a greedy draft's decodes, in one call (engine/greedy.py)
        self._native = NativeGreedy.of(C, ctx) if self.placement is None else None

    # ------------------------------------------------------------------ info
    @property
    def _vocab(self) -> Any:
        """The vocabulary handle; a closed model raises instead of handing llama.cpp a freed pointer."""
        if self._model is None:
            raise UsageError(f"{self.path.name} has been closed: load it again")
        return self._vocab_ptr

    def _context(self, settle: bool = True) -> Any:
        """The context, for a call into llama.cpp; a closed model raises. `settle`: seq 0's cells past its tokens
        (a rollback left to the next call) removed first: every call but the patch's own, which remove them."""
        if self._ctx is None:
            raise (RpcError(f"{self.path.name} was on an RPC server that stopped answering: load it again")
                   if self.abandoned else UsageError(f"{self.path.name} has been closed (or was loaded vocabulary-only)"))
        if self._stale and settle:
            self._stale = False
            self._C.llama_memory_seq_rm(self._mem, 0, len(self.seq_tokens[0]), -1)
        return self._ctx

    @property
    def name(self) -> str:
        return self.path.name

    def info(self) -> ModelInfo:
        """The file's metadata, read once (a server asks for the chat template on every request)."""
        self._vocab  # noqa: B018 - raises on a closed model
        if self._info is None:
            self._info = model_info(self._C, self._model, self.path)
        return self._info

    # ---------------------------------------------------------------- decode
    def decode(self, tokens: Sequence[int], n_logits: int = 1, seq: int = 0) -> np.ndarray:
        """Append `tokens` to the cache; return logits for the last `n_logits` of them: a zero-copy
        ``(n_logits, n_vocab)`` float32 view of llama.cpp's output buffer, valid until the next call that decodes."""
        if self._argmax is not None and seq in self._argmax.chains:
            self._argmax.detach(seq)  # raw logits again (a sampled run after greedy ones)
        return self._decode(tokens, n_logits, seq)

    def _decode(self, tokens: Sequence[int], n_logits: int, seq: int, view: bool = True) -> np.ndarray:
        """`decode`; `view` False: no logits view made (nobody reads them), an empty array returned."""
        n = len(tokens)
        self._context()
        if n == 0:
            raise ValueError("decode needs at least one token")
        if n_logits > n:
            raise ValueError("more logits than tokens requested")
        if n_logits > self.n_batch:
            raise ValueError(f"at most {self.n_batch} logits rows per decode, asked for {n_logits}")
        self._check_room(seq, n)
        held = self.seq_tokens[seq]
        if n <= self.n_batch:  # one llama_decode: every step's case (a step's host time is counted: design.md)
            self._batch.fill(0, seq, len(held), tokens, n_logits, 0, self.hidden_on)
            self._run_batch(n, (seq,))
            held.extend(tokens)
            return self._batch.logits(n - n_logits if self.hidden_on else 0, n_logits) if view else _NO_ROWS
        # Chunks of n_batch, aligned so that the last chunk holds every wanted row:
        # llama.cpp's output buffer only keeps the last llama_decode's rows.
        first = n % self.n_batch or self.n_batch
        bounds = [0, *range(first, n + 1, self.n_batch)]
        first_out = n - n_logits  # index in `tokens` of the first wanted row
        for start, end in zip(bounds, bounds[1:], strict=False):
            self._batch.fill(0, seq, len(held), tokens[start:end], max(0, end - max(first_out, start)), 0, self.hidden_on)
            self._run_batch(end - start, (seq,))
            held.extend(tokens[start:end])
        last = bounds[-1] - bounds[-2]  # with hidden states on, every row of the last chunk is an output
        return self._batch.logits(last - n_logits if self.hidden_on else 0, n_logits)

    def decode_many(self, parts: Sequence[Part], greedy: Collection[int] = ()) -> list[Rows]:
        """Decode several sequences' tokens in ONE llama_decode: `parts` are (seq, tokens, n_logits,
        tail), at most `n_batch` tokens in all, one part per sequence; the last `tail` tokens get no
        logits (fillers) and the n_logits before them do. Returns each part's logits, as views valid
        until the next call that decodes; for a sequence in `greedy`, their argmaxes instead, taken as
        `decode_argmax`'s (in the decode's call, the graph's once the logits were seen finite; None: a row
        not finite)."""
        self._context()
        seqs, row = part_seqs(parts, self.n_batch), 0
        for seq, toks, n_logits, tail in parts:
            self._check_room(seq, len(toks))
            self._batch.fill(row, seq, len(self.seq_tokens[seq]), toks, n_logits, tail, self.hidden_on)
            row += len(toks)
        a, out_seqs = self._argmax, [s for s, _, n, _ in parts if n or self.hidden_on]  # those with output rows
        graph = a.prepare(out_seqs, greedy, self._logits_seen and not self.hidden_on) if a and (greedy or a.chains) else ()
        n_out = sum(p[2] for p in parts)
        native: dict[int, int] = {}  # greedy seq: where its rows' tokens start in `tops` (one call: engine/greedy.py)
        if row and greedy and self._native is not None and not self.hidden_on:
            rows: list[int] = []  # output rows from the last output (llama.cpp's indices), the greedy parts' only
            sampled: list[bool] = []
            first = 0
            for seq, _, n_logits, _ in parts:
                if seq in greedy:
                    native[seq] = len(rows)
                    rows += range(first - n_out, first + n_logits - n_out)
                    sampled += [seq in graph] * n_logits
                first += n_logits
            tops = self._decode_rows(row, tuple(seqs), rows, sampled)
        elif row:
            self._run_batch(row, tuple(seqs))
        out: list[Rows] = []
        first, row = 0, 0
        for seq, toks, n_logits, tail in parts:
            self.seq_tokens[seq].extend(toks)
            if self.hidden_on:  # every row is an output: a part's logits rows are where its tokens are
                first = row + len(toks) - tail - n_logits
            if seq in native:
                out.append(self._greedy_rows(tops[native[seq] : native[seq] + n_logits]))
            elif seq in graph:  # the graph's argmaxes; else numpy's, which sees a row that is not finite
                out.append(a.tokens(n_logits, n_out - first - n_logits))  # type: ignore[union-attr]
            elif seq in greedy:
                top = argmax_rows(self._batch.logits(first, n_logits))
                self._logits_seen = self._logits_seen or (top is not None and n_logits > 0)
                out.append(top)
            else:
                out.append(self._batch.logits(first, n_logits))
            first += n_logits
            row += len(toks)
        return out

    def _check_room(self, seq: int, n: int) -> None:
        held = len(self.seq_tokens[seq])
        if held + n > self.n_ctx:
            raise ContextError(f"the context is full: {held} + {n} tokens > --ctx-size {self.n_ctx}")

    def _run_batch(self, n_tokens: int, seqs: tuple[int, ...], sync: bool = True) -> None:
        """llama_decode of the batch as filled; `sync` False: not waited for (`GreedyMethods.start_next`)."""
        C = self._C  # noqa: N806
        self._batch.handle.n_tokens = n_tokens
        self._switch_kernels()
        t0 = time.perf_counter()
        ret = C.llama_decode(self._ctx, self._batch.handle)
        if sync:
            C.llama_synchronize(self._ctx)
        self.decode_seconds += time.perf_counter() - t0
        self.pending_moves.clear()  # llama_decode applies them before anything else
        if self._argmax is not None:
            self._argmax.decoded()
        if ret != 0:
            self._failed(ret, seqs)
        self.decoded_tokens += n_tokens

    def _switch_kernels(self) -> None:
        """Before each of this model's llama_decode calls: patch 0008's CUDA kernels on for an exact GPU target,
        off for the rest (a draft, `--kernels fast`), so each context always computes (and keeps CUDA graphs)
        with its own."""
        if self._cuda_switch is not None:
            self._cuda_switch.value = self.kernels == kernels.GPU

    def _failed(self, ret: int, seqs: tuple[int, ...]) -> None:
        if ret == NO_TOKEN:  # engine/greedy.py's calls: that decode went in, its token did not come out
            raise RuntimeError(f"llama.cpp sampled no token after {self.path.name}'s decode (backend sampling)")
        # llama_decode leaves the cache as it was for a failed ubatch; resynchronise our view of it.
        for seq in seqs:
            self._resync(seq)
        if ret == 1:
            held = max(len(self.seq_tokens[s]) for s in seqs)
            raise ContextError(f"no room left in the KV cache at {held} tokens (--ctx-size {self.n_ctx})")
        raise UnsupportedModelError(f"llama_decode failed with code {ret}")

    def set_hidden(self, on: bool) -> None:
        """llama.cpp's embeddings output on or off (engine/heads.py). With it on, every token of a batch is an
        output (its logits computed too), which a prompt's prefill must not pay: on for the decodes that need it."""
        self._C.llama_set_embeddings(self._context(), on)
        self.hidden_on = on

    def hidden(self, n: int) -> np.ndarray:
        """The last decode's first n hidden states (every row of its batch, in order), as the output layer reads
        them (after the output norm): a copy."""
        return np.ctypeslib.as_array(self._C.llama_get_embeddings(self._context()), shape=(n, self.n_embd)).copy()

    @property
    def n_embd(self) -> int:
        """The width of its hidden states."""
        return int(self._C.llama_model_n_embd(self._model))

    # --------------------------------------------------------------- cleanup
    def abandon(self) -> None:
        """Never free it (a model on an RPC server that stopped answering, engine/rpc_model.py): no more
        decoding; its vocabulary and metadata stay readable."""
        self.abandoned = True
        self._ctx = None

    def close(self) -> None:
        C = self._C  # noqa: N806
        if self.abandoned:
            return
        if self._batch is not None:
            self._batch.free()
            self._batch = None
        if self._ctx is not None:
            C.llama_free(self._ctx)
            self._ctx = None
        argmax, self._argmax = getattr(self, "_argmax", None), None
        if argmax is not None:  # after its context (which held it attached)
            argmax.free()
        if self._model is not None:
            C.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order
        with contextlib.suppress(Exception):
            self.close()
