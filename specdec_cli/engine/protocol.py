"""What the draft-then-verify loop needs of a model, as a protocol.

`engine.model.Model` (llama.cpp) satisfies it; so does the numpy-backed fake in
tests/fakes.py, which lets the loop's properties (greedy identity, stops,
limits, rollback positions, cache contents) be tested in seconds without GGUF
files. The cache is a single sequence: `tokens` lists what it holds, in order.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from specdec_cli.engine.gguf import ModelInfo, SpecialTexts, VocabInfo
from specdec_cli.engine.rpc import Placement
from specdec_cli.engine.sampling import finite_argmax
from specdec_cli.engine.specials import ControlTexts

Rows = np.ndarray | list[int] | None  # `decode_many`'s for a part: logits rows, or their argmaxes (None: not finite)


class LanguageModel(Protocol):
    n_vocab: int
    n_ctx: int

    @property
    def tokens(self) -> list[int]:
        """What the cache holds, in order."""
        ...

    @property
    def decode_seconds(self) -> float:
        """Time spent inside decode, for stats."""
        ...

    @property
    def decoded_tokens(self) -> int:
        """Tokens evaluated so far (shows cache reuse)."""
        ...

    @property
    def name(self) -> str:
        """The model file's name, for messages."""
        ...

    @property
    def eog_ids(self) -> frozenset[int]: ...

    def token_text(self, token: int) -> bytes: ...

    def decode(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        """Append `tokens` to the cache; return logits for the last `n_logits` of them."""
        ...

    def decode_argmax(self, tokens: Sequence[int], n_logits: int = 1) -> list[int] | None:
        """As `decode`, but the argmax of each of those rows (greedy's tokens; where the model computes them is
        its business: `Model` in its decode's own call into llama.cpp, engine/greedy.py); None where a row is not
        finite."""
        ...

    def argmax_chain(self, tokens: Sequence[int], k: int, stop: frozenset[int]) -> list[int] | None:
        """Greedy drafting: decode `tokens`, then each argmax in turn, until `k` tokens or one in `stop` (that
        last one not decoded); None where a row is not finite. `chain_by_steps` is the plain version."""
        ...

    def rollback(self, n_keep: int) -> None:
        """Forget every cached position from `n_keep` on."""
        ...

    def common_prefix(self, tokens: Sequence[int]) -> int: ...

    def prefill(self, tokens: Sequence[int]) -> None:
        """Make the cache hold exactly `tokens`, reusing the common prefix."""
        ...

    def set_hidden(self, on: bool) -> None:
        """Return hidden states with the logits from now on (every token of a batch is then an output)."""
        ...

    def hidden(self, n: int) -> np.ndarray:
        """The last decode's n hidden states, (n, n_embd), as the output layer reads them: a copy."""
        ...


class LoadedModel(LanguageModel, Protocol):
    """A loaded model as the API, the batch engine and calibration use it: the loop's protocol plus
    its vocabulary, its metadata and several sequences (`seq`). `engine.model.Model` is the real one;
    tests/fakes.py's `FakeGGUF` runs the whole stack (API, CLI, server) in seconds, injected through
    `models.loading.OPENER`."""

    path: Path
    n_seq: int
    n_batch: int
    seq_tokens: list[list[int]]
    pending_moves: set[int]  # sequences `move_seq` moved or overwrote, until the next decode applies it
    warnings: list[str]
    placement: Placement | None  # the RPC servers it is on (None: local; engine/rpc.py)
    where: dict[str, float]  # MiB of weights per RPC server ("local": here), when placed
    kernels: str  # the CPU kernel set it computes with (engine/kernels.py: fast, invariant, reference, inexact)

    @property
    def n_embd(self) -> int:
        """The width of its hidden states (the heads read them: engine/heads.py)."""
        ...

    def abandon(self) -> None:
        """Its RPC server stopped answering: drop the handles unfreed (engine/rpc.py)."""
        ...

    def info(self) -> ModelInfo: ...

    def vocab_info(self) -> VocabInfo: ...

    def special_texts(self) -> SpecialTexts: ...

    def control_ids(self) -> frozenset[int]: ...

    def control_texts(self) -> ControlTexts: ...

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def decode(self, tokens: Sequence[int], n_logits: int = 1, seq: int = 0) -> np.ndarray: ...

    def decode_many(
        self, parts: Sequence[tuple[int, Sequence[int], int, int]], greedy: Collection[int] = ()
    ) -> list[Rows]:
        """Parts of several sequences in one batch: (seq, tokens, n_logits, tail), the rows' logits, or for a
        sequence in `greedy` their argmaxes (None: a row not finite); see `Model.decode_many`."""
        ...

    def decode_next(self, seq: int, token: int) -> list[int] | None:
        """`decode_many([(seq, [token], 1, 0)], {seq})[0]`: one sequence's next token, its greedy token out (the
        batch engine's plain step at one slot); see `Model.decode_next`."""
        ...

    def greedy_run(self, seq: int, token: int, k: int, stop: frozenset[int], seconds: float) -> tuple[list[int], bool]:
        """`decode_next` in a burst: `token`, then each greedy token decoded in turn until `k` tokens, one in
        `stop`, a full context or `seconds` in decodes (the last token not decoded); False: the decode after the
        tokens gave no finite row. `run_by_steps` is the plain version; see `Model.greedy_run`."""
        ...

    def greedy_runs(self, seqs: Sequence[int], tokens: Sequence[int], caps: Sequence[int], stop: frozenset[int],
                    seconds: float, interrupt: Any = None) -> tuple[list[list[int]], bool] | None:  # fmt: skip
        """Several sequences' plain greedy steps in a burst, one batch a step: until one's token is in `stop` or
        its `caps`-th, `seconds` in decodes, or a step during which `interrupt` (a ctypes.c_int32) was set; each
        sequence's tokens (the last not decoded), False where the step after them failed (not kept); None where
        there is no such call. `runs_by_steps` is the plain version; see `Model.greedy_runs`."""
        ...

    def rollback(self, n_keep: int, seq: int = 0) -> None: ...

    def move_seq(self, src: int, dst: int) -> None:
        """Move `src`'s cache to `dst` (dropping `dst`'s), leaving `src` empty; `dst` computes what `src` would."""
        ...

    def save_seq(self, seq: int = 0) -> bytearray:
        """`seq`'s cache as bytes, for `restore_seq` (engine/batch/prompt_cache.py)."""
        ...

    def restore_seq(self, seq: int, data: bytearray, tokens: Sequence[int]) -> bool:
        """Make `seq`'s cache what `save_seq` saved, holding `tokens`; False (and `seq` empty) where it cannot."""
        ...

    def common_prefix(self, tokens: Sequence[int], seq: int = 0) -> int: ...

    def prefill(self, tokens: Sequence[int], seq: int = 0) -> None: ...

    def close(self) -> None: ...


class ModelOpener(Protocol):
    """How models are opened (`Model`'s constructor; a fake in tests)."""

    def __call__(self, path: str | os.PathLike[str], *, n_ctx: int = ..., n_threads: int | None = ...,
                 n_gpu_layers: int = ..., vocab_only: bool = ..., n_seq: int = ...,
                 unified: bool = ..., placement: Placement | None = ..., exact: bool = ...) -> LoadedModel: ...  # fmt: skip


def argmax_rows(rows: np.ndarray) -> list[int] | None:
    """Each row's argmax as ints (greedy's tokens, numpy's way), None where a row is not finite."""
    top = finite_argmax(rows)
    return None if top is None else top.tolist()


def argmax_of_logits(model: LanguageModel, tokens: Sequence[int], n_logits: int = 1) -> list[int] | None:
    """`decode_argmax` as `decode` and numpy's argmax of the rows (a model with no faster way), None where a row
    is not finite."""
    return argmax_rows(model.decode(tokens, n_logits))


def chain_by_steps(model: LanguageModel, tokens: Sequence[int], k: int, stop: frozenset[int]) -> list[int] | None:
    """`argmax_chain` as one `decode_argmax` per token (a model with no faster way)."""
    top = model.decode_argmax(tokens)
    out = top[:1] if top is not None else None
    while out is not None and len(out) < k and out[-1] not in stop:
        top = model.decode_argmax(out[-1:])
        out = out + top[:1] if top is not None else None
    return out


def run_by_steps(model: LoadedModel, seq: int, token: int, k: int, stop: frozenset[int],
                 seconds: float) -> tuple[list[int], bool]:  # fmt: skip
    """`greedy_run` as one `decode_next` per token (a model with no faster way)."""
    out: list[int] = []
    t0 = model.decode_seconds
    while True:
        top = model.decode_next(seq, out[-1] if out else token)
        if top is None:
            return out, False
        out += top
        full = len(model.seq_tokens[seq]) >= model.n_ctx
        if len(out) >= k or out[-1] in stop or full or 0 < seconds <= model.decode_seconds - t0:
            return out, True


def runs_by_steps(model: LoadedModel, seqs: Sequence[int], tokens: Sequence[int], caps: Sequence[int],
                  stop: frozenset[int], seconds: float, interrupt: Any = None) -> tuple[list[list[int]], bool] | None:  # fmt: skip
    """`greedy_runs` as one `decode_many` per step (a model with no faster way)."""
    caps = [min(cap, model.n_ctx - len(model.seq_tokens[seq])) for cap, seq in zip(caps, seqs, strict=True)]
    if min(caps) < 1:
        return None
    outs: list[list[int]] = [[] for _ in seqs]
    pending, t0 = list(tokens), model.decode_seconds
    while True:
        rows = ([model.decode_next(seqs[0], pending[0])] if len(seqs) == 1 else
                model.decode_many([(seq, [token], 1, 0) for seq, token in zip(seqs, pending, strict=True)], seqs))  # fmt: skip
        if any(row is None for row in rows):  # the step is not kept: the caller makes it again its usual way
            for seq in seqs:
                model.rollback(len(model.seq_tokens[seq]) - 1, seq)
            return outs, False
        pending = [int(row[0]) for row in rows if row is not None]
        for out, token in zip(outs, pending, strict=True):
            out.append(token)
        n = len(outs[0])
        if (any(n >= cap or token in stop for cap, token in zip(caps, pending, strict=True))
                or 0 < seconds <= model.decode_seconds - t0 or (interrupt is not None and interrupt.value)):  # fmt: skip
            return outs, True
