"""A numpy-backed `LanguageModel` for testing the loop's properties without GGUF files.

The logits at a position are a fixed function of the last `window` tokens of the
context up to that position (seeded per context), so they do not depend on how
tokens were batched: a batch of k tokens gives exactly the rows k single decodes
would. A draft fake shares the target's function plus `noise` times another one,
so it agrees with the target often but not always. The cache is checked as the
real one is: decodes append at the next position, never past `n_ctx`, and a
rollback never keeps more than the cache holds. Decode time is simulated (a cost
per call plus one per token), so policies that read costs are deterministic.
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specdec_cli.engine.gguf import ModelInfo, SpecialTexts, VocabInfo
from specdec_cli.engine.protocol import Rows, argmax_of_logits, argmax_rows, chain_by_steps, run_by_steps, runs_by_steps
from specdec_cli.engine.rpc import Placement
from specdec_cli.engine.specials import ControlTexts
from specdec_cli.errors import ContextError


class FakeModel:
    def __init__(
        self,
        n_vocab: int = 24,
        n_ctx: int = 512,
        *,
        seed: int = 0,
        window: int = 2,
        scale: float = 3.0,
        noise: float = 0.0,
        noise_seed: int = 1,
        eog: Sequence[int] = (),
        name: str = "fake.gguf",
        call_cost: float = 1.0,
        token_cost: float = 0.1,
    ) -> None:
        self.n_vocab = n_vocab
        self.n_ctx = n_ctx
        self.seed, self.window, self.scale = seed, window, scale
        self.noise, self.noise_seed = noise, noise_seed
        self._eog = frozenset(eog)
        self._name = name
        self.call_cost, self.token_cost = call_cost, token_cost
        self.tokens: list[int] = []
        self.decode_seconds = 0.0
        self.decoded_tokens = 0
        self.batches: list[int] = []  # size of every decode call, in order
        self._rows: dict[tuple[int, ...], np.ndarray] = {}
        self.n_embd = 8
        self.hidden_on = False
        self.hidden_calls = 0  # decodes made with hidden states on
        self.argmax_calls = 0  # decodes whose rows were reduced to their argmax (decode_argmax)
        self.next_calls = 0  # one sequence's next token alone (decode_next: the batch engine's plain step)
        self.run_calls = 0  # bursts of them (greedy_run: a lone greedy slot's)
        self.runs_calls = 0  # bursts of several sequences' steps (greedy_runs)
        self.runs_many = True  # False: as a library without greedy_runs (the batch engine's other ways)
        self._last_hidden = np.zeros((0, self.n_embd), np.float32)

    # ------------------------------------------------------------ the model
    def _gauss(self, seed: int, key: tuple[int, ...]) -> np.ndarray:
        h = zlib.crc32(np.asarray((seed, *key), dtype=np.int64).tobytes())
        return np.random.default_rng(h).standard_normal(self.n_vocab)

    def logits_after(self, context: Sequence[int]) -> np.ndarray:
        """The logits for the token after `context` (a pure function of its last `window` tokens)."""
        key = tuple(context[-self.window :])
        row = self._rows.get(key)
        if row is None:
            row = self.scale * self._gauss(self.seed, key)
            if self.noise:
                row = row + self.noise * self.scale * self._gauss(self.noise_seed, key)
            row = row.astype(np.float32)
            self._rows[key] = row
        return row

    def hidden_after(self, context: Sequence[int]) -> np.ndarray:
        """The hidden state whose logits are `logits_after(context)`: a pure function of the same tokens."""
        key = tuple(context[-self.window :])
        h = zlib.crc32(np.asarray((self.seed, 7, *key), dtype=np.int64).tobytes())
        return np.random.default_rng(h).standard_normal(self.n_embd).astype(np.float32)

    def set_hidden(self, on: bool) -> None:
        self.hidden_on = on

    def hidden(self, n: int) -> np.ndarray:
        assert self.hidden_on and n <= len(self._last_hidden), (self.hidden_on, n, len(self._last_hidden))
        return self._last_hidden[:n].copy()

    # ------------------------------------------------------ the protocol
    @property
    def name(self) -> str:
        return self._name

    @property
    def eog_ids(self) -> frozenset[int]:
        return self._eog

    def token_text(self, token: int) -> bytes:
        return b" t%d" % token

    def decode(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        n = len(tokens)
        assert 0 < n_logits <= n, (n, n_logits)
        assert all(0 <= t < self.n_vocab for t in tokens), tokens
        if len(self.tokens) + n > self.n_ctx:
            raise ContextError(f"the context is full: {len(self.tokens)} + {n} tokens > {self.n_ctx}")
        self.tokens.extend(int(t) for t in tokens)
        self.batches.append(n)
        self.decoded_tokens += n
        self.decode_seconds += self.call_cost + self.token_cost * n
        end = len(self.tokens)
        if self.hidden_on:  # every token an output, as llama.cpp's embeddings output makes it
            self.hidden_calls += 1
            self._last_hidden = np.stack([self.hidden_after(self.tokens[:i]) for i in range(end - n + 1, end + 1)])
        return np.stack([self.logits_after(self.tokens[:i]) for i in range(end - n_logits + 1, end + 1)])

    def decode_argmax(self, tokens: Sequence[int], n_logits: int = 1) -> list[int] | None:
        """`Model.decode_argmax`'s numpy path (a subclass's `decode`, NaN rows say, goes through it)."""
        self.argmax_calls += 1
        return argmax_of_logits(self, tokens, n_logits)

    def argmax_chain(self, tokens: Sequence[int], k: int, stop: frozenset[int]) -> list[int] | None:
        return chain_by_steps(self, tokens, k, stop)

    def rollback(self, n_keep: int) -> None:
        assert n_keep >= 0
        del self.tokens[n_keep:]

    def common_prefix(self, tokens: Sequence[int]) -> int:
        n = 0
        for a, b in zip(self.tokens, tokens, strict=False):
            if a != b:
                break
            n += 1
        return n

    def prefill(self, tokens: Sequence[int]) -> None:
        keep = self.common_prefix(tokens)
        self.rollback(keep)
        if keep < len(tokens):
            self.decode(tokens[keep:])


def greedy_reference(model: FakeModel, prompt: Sequence[int], max_tokens: int) -> tuple[list[int], str]:
    """What the target alone generates greedily: one token per decode, same stop rules as the loop."""
    context = list(prompt)
    out: list[int] = []
    while len(context) - 1 < model.n_ctx:  # the pending token still fits in the cache
        tok = int(np.argmax(model.logits_after(context)))
        if tok in model.eog_ids:
            return out, "eos"
        out.append(tok)
        context.append(tok)
        if len(out) >= max_tokens:
            return out, "length"
    return out, "context"


# ------------------------------------------------------------------ the whole stack on a fake
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")  # ids 256, 257 (the end of a turn), 258
N_BYTES = 256
WINDOW = 24  # reaches past the template's "<|im_end|>\n<|im_start|>assistant\n" into the user's words
WORDS = np.array([97 <= b <= 122 or b in b" .,\n" for b in range(N_BYTES)] + [False] * len(SPECIALS))


class FakeGGUF(FakeModel):
    """A fake with everything the API, the CLI and the server use of a loaded model (engine/protocol.py's
    `LoadedModel`): a byte tokenizer with ChatML's control tokens, a chat template, metadata, several
    sequences. Opened by `open_fake` in place of llama.cpp (`models.loading.OPENER`), it makes any GGUF
    path a model of the same family: every file's logits are one shared function of the last WINDOW
    tokens plus a little noise seeded by the file's name, so a pair's draft agrees with its target
    often, not always. Logits favour lowercase letters, spaces and stops (text a terminal can show), and the end
    of a turn once there is some text.
    Decode time is simulated, as FakeModel's (0.1 ms a call plus 0.01 ms a token: verifying 9 tokens costs
    1.7 decodes, so drafting can pay), and stays below the wall time the numpy work takes, so stats add up
    and the auto drafter's and the cost gate's decisions are the same on every run.
    """

    def __init__(self, path: str | os.PathLike[str], *, n_ctx: int = 4096, n_threads: int | None = None,
                 n_gpu_layers: int = 0, n_batch: int = 256, vocab_only: bool = False, n_seq: int = 1,
                 unified: bool = False, placement: Placement | None = None, exact: bool = True) -> None:  # fmt: skip
        if placement is not None:
            raise NotImplementedError("a fake model has no RPC placement: RPC is tested with real models")
        self.path = Path(path)
        self.pending_moves: set[int] = set()  # a fake's caches are its token lists: a move is done at once
        self.placement: Placement | None = None
        self.kernels = "invariant" if exact else "fast"
        self.where: dict[str, float] = {}
        noise = 0.25 * (zlib.crc32(self.path.name.encode()) % 5 + 1) / 5
        super().__init__(N_BYTES + len(SPECIALS), n_ctx, seed=7, window=WINDOW, scale=4.0, noise=noise,
                         noise_seed=zlib.crc32(self.path.name.encode()), eog=(N_BYTES + 1,), name=self.path.name,
                         call_cost=1e-4, token_cost=1e-5)  # fmt: skip
        self.n_seq, self.n_batch, self.unified = max(1, n_seq), n_batch, unified
        self.seq_tokens: list[list[int]] = [[] for _ in range(self.n_seq)]
        self.tokens = self.seq_tokens[0]
        self.warnings: list[str] = []
        self.closed = False

    def abandon(self) -> None:  # never placed on an RPC server
        raise NotImplementedError

    def logits_after(self, context: Sequence[int]) -> np.ndarray:
        row = super().logits_after(context).copy()
        row[~WORDS] -= 12.0
        row[N_BYTES + 1] += 1.0 if len(context) > 40 else -12.0  # an end of turn, once there is some text
        return row

    # ------------------------------------------------------------ vocabulary
    def token_text(self, token: int) -> bytes:
        return bytes([token]) if token < N_BYTES else SPECIALS[token - N_BYTES].encode()

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        if not parse_special:
            return list(text.encode())
        ids: list[int] = []
        pattern = "(" + "|".join(re.escape(s) for s in SPECIALS) + ")"
        for piece in re.split(pattern, text):
            ids += [N_BYTES + SPECIALS.index(piece)] if piece in SPECIALS else list(piece.encode())
        return ids

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_text(t) for t in tokens).decode("utf-8", "replace")

    def control_ids(self) -> frozenset[int]:
        return frozenset(range(N_BYTES, N_BYTES + len(SPECIALS)))

    def control_texts(self) -> ControlTexts:
        return ControlTexts.of(SPECIALS)

    def special_texts(self) -> SpecialTexts:
        return SpecialTexts(bos_text="", eos_text="<|im_end|>", add_bos=False)

    def vocab_info(self) -> VocabInfo:
        return VocabInfo(self.n_vocab, 2, -1, N_BYTES + 1, -1, False, False,
                         tuple(self.token_text(i) for i in range(self.n_vocab)), self.eog_ids,
                         self.control_ids())  # fmt: skip

    def info(self) -> ModelInfo:
        size = self.path.stat().st_size if self.path.exists() else 0
        return ModelInfo(self.path, "fake (tests/fakes.py)", size, 1000, 8192, 0, CHATML, {})

    # ------------------------------------------------------------ sequences
    def decode(self, tokens: Sequence[int], n_logits: int = 1, seq: int = 0) -> np.ndarray:
        self.tokens = self.seq_tokens[seq]
        try:
            return super().decode(tokens, n_logits)
        finally:
            self.tokens = self.seq_tokens[0]

    def decode_many(
        self, parts: Sequence[tuple[int, Sequence[int], int, int]], greedy: Collection[int] = ()
    ) -> list[Rows]:
        """`Model.decode_many` (a greedy sequence's rows reduced by numpy, as its first decodes are)."""
        assert sum(len(t) for _, t, _, _ in parts) <= self.n_batch
        out: list[Rows] = []
        hidden = []
        for seq, toks, n_logits, tail in parts:
            if not toks:
                out.append([] if seq in greedy else np.empty((0, self.n_vocab), dtype=np.float32))
                continue
            rows = self.decode(toks, len(toks), seq)[len(toks) - tail - n_logits : len(toks) - tail]
            if seq in greedy:
                self.argmax_calls += 1
                out.append(argmax_rows(rows))
            else:
                out.append(rows)
            if self.hidden_on:
                hidden.append(self._last_hidden)
        if self.hidden_on:  # one batch: every row's hidden state, in batch order (`Model.hidden`)
            self.hidden_calls -= len(hidden) - 1
            self._last_hidden = np.concatenate(hidden) if hidden else np.zeros((0, self.n_embd), np.float32)
        return out

    def decode_next(self, seq: int, token: int) -> list[int] | None:
        self.next_calls += 1
        return self.decode_many([(seq, [token], 1, 0)], (seq,))[0]

    def greedy_run(self, seq: int, token: int, k: int, stop: frozenset[int], seconds: float) -> tuple[list[int], bool]:
        self.run_calls += 1
        return run_by_steps(self, seq, token, k, stop, seconds)

    def greedy_runs(self, seqs: Sequence[int], tokens: Sequence[int], caps: Sequence[int], stop: frozenset[int],
                    seconds: float, interrupt: Any = None) -> tuple[list[list[int]], bool] | None:  # fmt: skip
        if not self.runs_many:
            return None
        self.runs_calls += 1
        return runs_by_steps(self, seqs, tokens, caps, stop, seconds, interrupt)

    def rollback(self, n_keep: int, seq: int = 0) -> None:
        del self.seq_tokens[seq][n_keep:]

    def move_seq(self, src: int, dst: int) -> None:
        self.seq_tokens[dst][:] = self.seq_tokens[src]
        self.seq_tokens[src].clear()

    def save_seq(self, seq: int = 0) -> bytearray:
        """A fake's cache is its tokens (its logits are a function of them): the state is their bytes."""
        return bytearray(np.asarray(self.seq_tokens[seq], dtype=np.int32).tobytes())

    def restore_seq(self, seq: int, data: bytearray, tokens: Sequence[int]) -> bool:
        self.seq_tokens[seq][:] = np.frombuffer(data, dtype=np.int32).tolist()
        assert self.seq_tokens[seq] == list(tokens)
        return True

    def common_prefix(self, tokens: Sequence[int], seq: int = 0) -> int:
        self.tokens = self.seq_tokens[seq]
        try:
            return super().common_prefix(tokens)
        finally:
            self.tokens = self.seq_tokens[0]

    def prefill(self, tokens: Sequence[int], seq: int = 0) -> None:
        keep = self.common_prefix(tokens, seq)
        self.rollback(keep, seq)
        if keep < len(tokens):
            self.decode(tokens[keep:], 1, seq)

    def reset(self) -> None:
        for s in self.seq_tokens:
            s.clear()

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> FakeGGUF:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_fake(path: str | os.PathLike[str], **params: Any) -> FakeGGUF:
    """`models.loading.OPENER`'s stand-in: the file is checked as a GGUF file would be, then faked."""
    from specdec_cli.engine.gguf import check_gguf_file

    return FakeGGUF(check_gguf_file(path), **params)
