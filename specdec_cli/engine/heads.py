"""Medusa heads: guesses of the tokens after the next one, read from the target's own last hidden state.

Head k (k = 1..K) maps the hidden state h_t the target's output layer reads at position t (the one whose logits
gave token t+1) to a guess of token t+1+k: one residual block, h + SiLU(W h + b) with W zero-initialised, then an
output layer over a subset of the vocabulary, initialised from the target's own output rows (Medusa-1; the target is
frozen). Trained by self-distillation: the labels are the target's own greedy continuations. The subset holds the
tokens the target emitted in training, most frequent first: the output layer over it costs a few percent of the
whole vocabulary's, and a token outside it is never drafted (a draft is only a proposal: it costs acceptance, never
correctness; with sampling, q is a distribution over the subset and the rejection rule stays exact).

This module is numpy only: the heads, their training (Adam, cross-entropy over the subset), and the heads file
(GGUF through the `gguf` package, with the target's vocabulary fingerprint and n_embd, so that a file for another
target is refused in one line).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from specdec_cli.errors import ModelFileError

ARCH = "specdec-heads"
FORMAT = "specdec-medusa-1"
LEARNING_RATE = 1e-3  # the Medusa reference run's
BATCH = 256  # positions per training step


_ONE_BLAS_THREAD = False


def one_blas_thread() -> None:
    """numpy's BLAS on one thread from now on, in this process (for a drafter: llama.cpp computes on the
    cores). A guess runs between the target's decodes, and OpenBLAS's threads, which spin a while after each
    call, took the cores llama.cpp's threads compute on: on the F32 target a 19 ms decode took 48-72 ms with
    a guess of three heads between decodes, the guess itself 5-7 ms; held to one thread, 15-19 ms with the
    guess's 2 ms (2 cores)."""
    global _ONE_BLAS_THREAD
    if not _ONE_BLAS_THREAD:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1, user_api="blas")
        _ONE_BLAS_THREAD = True


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


@dataclass
class Heads:
    w: np.ndarray  # (K, d, d): each head's residual block
    b: np.ndarray  # (K, d)
    out: np.ndarray  # (K, S, d): each head's output rows, for the tokens in `subset`
    subset: np.ndarray  # (S,) int32: the token ids the heads can draft
    fingerprint: str  # the target's vocabulary (engine/drafters/pool.py's `vocab_fingerprint`)
    target: str = ""  # the target file's name, for messages
    settings: dict[str, Any] = field(default_factory=dict)  # how they were trained, held-out accuracy included

    @property
    def n_heads(self) -> int:
        return int(self.w.shape[0])

    @property
    def n_embd(self) -> int:
        return int(self.w.shape[1])

    @classmethod
    def initial(cls, n_heads: int, output_rows: np.ndarray, subset: np.ndarray, fingerprint: str,
                target: str = "") -> Heads:  # fmt: skip
        """Medusa-1's start: every residual block zero (a head first guesses as the target's output layer does)."""
        s, d = output_rows.shape
        return cls(np.zeros((n_heads, d, d), np.float32), np.zeros((n_heads, d), np.float32),
                   np.repeat(output_rows[None].astype(np.float32), n_heads, axis=0), subset.astype(np.int32),
                   fingerprint, target)  # fmt: skip

    def logits(self, k: int, h: np.ndarray) -> np.ndarray:
        """Head k's (0-based) logits over the subset for hidden states h, (N, d) -> (N, S)."""
        a = h + silu(h @ self.w[k].T + self.b[k])
        return a @ self.out[k].T

    def guess(self, h: np.ndarray, n: int) -> list[int]:
        """The first n heads' most likely tokens after hidden state h (d,): positions t+2 .. t+1+n."""
        h = h.reshape(1, -1)
        return [int(self.subset[int(np.argmax(self.logits(k, h)[0]))]) for k in range(min(n, self.n_heads))]

    # ------------------------------------------------------------------ file
    def save(self, path: str | os.PathLike[str]) -> None:
        import gguf

        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        w = gguf.GGUFWriter(str(tmp), ARCH)
        w.add_string("specdec.format", FORMAT)
        w.add_string("specdec.vocab_fingerprint", self.fingerprint)
        w.add_string("specdec.target", self.target)
        w.add_uint32("specdec.n_embd", self.n_embd)
        w.add_uint32("specdec.n_heads", self.n_heads)
        w.add_string("specdec.settings", json.dumps(self.settings, sort_keys=True))
        w.add_tensor("subset", self.subset.astype(np.int32))
        for k in range(self.n_heads):
            w.add_tensor(f"head.{k}.w", self.w[k])
            w.add_tensor(f"head.{k}.b", self.b[k])
            w.add_tensor(f"head.{k}.out", self.out[k])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str], fingerprint: str | None = None, n_embd: int | None = None) -> Heads:
        """A heads file; one clear line (ModelFileError) when it is missing, damaged, not a heads file, or for
        another target (`fingerprint`, `n_embd`: the target's)."""
        import gguf

        path = Path(path)
        if not path.is_file():
            raise ModelFileError(f"no heads file at {path}")
        try:
            r = gguf.GGUFReader(str(path))
            meta = {f.name: f for f in r.fields.values()}

            def text(key: str, default: str | None = None) -> str:
                if default is not None and key not in meta:
                    return default  # gguf writes no empty string
                f = meta[key]
                return bytes(f.parts[f.data[0]]).decode("utf-8")

            def number(key: str) -> int:
                f = meta[key]
                return int(f.parts[f.data[0]][0])

            if text("specdec.format") != FORMAT:
                raise ModelFileError(f"{path} is a heads file of another format ({text('specdec.format')})")
            tensors = {t.name: np.array(t.data) for t in r.tensors}
            k_heads, d = number("specdec.n_heads"), number("specdec.n_embd")
            heads = cls(np.stack([tensors[f"head.{k}.w"].reshape(d, d) for k in range(k_heads)]).astype(np.float32),
                        np.stack([tensors[f"head.{k}.b"].reshape(d) for k in range(k_heads)]).astype(np.float32),
                        np.stack([tensors[f"head.{k}.out"].reshape(-1, d) for k in range(k_heads)]).astype(np.float32),
                        tensors["subset"].astype(np.int32).reshape(-1), text("specdec.vocab_fingerprint"),
                        text("specdec.target", ""), json.loads(text("specdec.settings")))  # fmt: skip
        except ModelFileError:
            raise
        except (KeyError, ValueError, IndexError, TypeError, OSError) as e:
            raise ModelFileError(f"{path} is not a readable heads file ({type(e).__name__}: {e})") from None
        if heads.out.shape[1] != heads.subset.size or not np.isfinite(heads.w).all() or not np.isfinite(heads.out).all():
            raise ModelFileError(f"{path} is a damaged heads file (its shapes or numbers do not add up)")
        if fingerprint is not None and heads.fingerprint != fingerprint:
            raise ModelFileError(f"{path} holds heads for another vocabulary ({heads.target or 'another target'}): "
                                 "train heads for this target with `specdec heads train`")  # fmt: skip
        if n_embd is not None and heads.n_embd != n_embd:
            raise ModelFileError(f"{path} holds heads for a model of width {heads.n_embd}, not {n_embd} "
                                 f"({heads.target or 'another target'})")  # fmt: skip
        return heads


class HiddenModel(Protocol):
    n_batch: int

    def decode(self, tokens: Sequence[int], n_logits: int = 1, seq: int = 0) -> np.ndarray: ...

    def set_hidden(self, on: bool) -> None: ...

    def hidden(self, n: int) -> np.ndarray: ...


def decode_hidden(model: HiddenModel, tokens: Sequence[int], seq: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Append `tokens` to the model's cache; return (logits, hidden) for every one of them, as copies: (n, n_vocab)
    and (n, n_embd). The embeddings output is on for these decodes only (`Model.set_hidden`)."""
    logits, hidden = [], []
    model.set_hidden(True)
    try:
        for start in range(0, len(tokens), model.n_batch):
            part = tokens[start : start + model.n_batch]
            logits.append(model.decode(part, n_logits=len(part), seq=seq).copy())
            hidden.append(model.hidden(len(part)))
    finally:
        model.set_hidden(False)
    if not logits:
        raise ValueError("decode needs at least one token")
    return np.concatenate(logits), np.concatenate(hidden)


def output_rows(path: str | os.PathLike[str], subset: np.ndarray) -> np.ndarray:
    """The target's output-layer rows for the tokens in `subset`, (S, n_embd) float32, read from its GGUF
    (`output.weight`, or `token_embd.weight` where the model ties them, as SmolLM2 does) and dequantized."""
    import gguf
    from gguf.quants import dequantize

    try:
        r = gguf.GGUFReader(str(path))
        tensors = {t.name: t for t in r.tensors}
        t = tensors.get("output.weight") or tensors["token_embd.weight"]
        rows = np.asarray(t.data)[np.asarray(subset, dtype=np.int64)]
        out = rows if t.tensor_type == gguf.GGMLQuantizationType.F32 else dequantize(rows, t.tensor_type)
    except (KeyError, ValueError, IndexError, NotImplementedError, OSError) as e:
        raise ModelFileError(f"cannot read the output layer of {path} ({type(e).__name__}: {e})") from None
    return np.ascontiguousarray(out, dtype=np.float32).reshape(len(subset), -1)


def choose_subset(labels: np.ndarray, limit: int) -> np.ndarray:
    """The tokens the heads may draft: those in `labels`, most frequent first, at most `limit` (ties by id)."""
    ids, counts = np.unique(labels[labels >= 0], return_counts=True)
    order = np.lexsort((ids, -counts))
    return ids[order][:limit].astype(np.int32)


def targets_for(tokens: np.ndarray, n_heads: int) -> np.ndarray:
    """labels[k, t]: the token head k (0-based) must guess from position t's hidden state, token t+2+k (-1 past the
    end). `tokens` is one text: hidden state t is the target's after reading tokens[t]."""
    n = tokens.size
    out = np.full((n_heads, n), -1, np.int64)
    for k in range(n_heads):
        shift = 2 + k
        if n > shift:
            out[k, : n - shift] = tokens[shift:]
    return out


@dataclass
class Adam:
    lr: float = LEARNING_RATE
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    m: dict[str, np.ndarray] = field(default_factory=dict)
    v: dict[str, np.ndarray] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)  # each parameter's own count (the heads step in turn)

    def step(self, name: str, param: np.ndarray, grad: np.ndarray) -> None:
        m = self.m.setdefault(name, np.zeros_like(param))
        v = self.v.setdefault(name, np.zeros_like(param))
        t = self.steps[name] = self.steps.get(name, 0) + 1
        m *= self.b1
        m += (1 - self.b1) * grad
        v *= self.b2
        v += (1 - self.b2) * grad * grad
        lr = self.lr * math.sqrt(1 - self.b2**t) / (1 - self.b1**t)
        param -= (lr * m / (np.sqrt(v) + self.eps)).astype(param.dtype)


def train_step(heads: Heads, k: int, h: np.ndarray, label_idx: np.ndarray, opt: Adam) -> float:
    """One Adam step of head k on hidden states h (N, d) with labels as indices into the subset; returns the mean
    cross-entropy before the step."""
    w, b, out = heads.w[k], heads.b[k], heads.out[k]
    z = h @ w.T + b
    sig = 1.0 / (1.0 + np.exp(-z))
    a = h + z * sig
    logits = a @ out.T
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    n = h.shape[0]
    rows = np.arange(n)
    loss = float(-np.log(np.maximum(p[rows, label_idx], 1e-30)).mean())
    p[rows, label_idx] -= 1.0
    p /= n
    d_out = p.T @ a
    d_a = p @ out
    d_z = d_a * (sig * (1.0 + z * (1.0 - sig)))
    opt.step(f"w{k}", w, d_z.T @ h)
    opt.step(f"b{k}", b, d_z.sum(axis=0))
    opt.step(f"out{k}", out, d_out)
    return loss


def accuracy(heads: Heads, hidden: np.ndarray, labels: np.ndarray) -> list[float]:
    """Per head, the share of positions (with a label) where its top guess is the label: over all labelled
    positions, a label outside the subset counting as a miss."""
    out = []
    for k in range(heads.n_heads):
        keep = labels[k] >= 0
        if not keep.any():
            out.append(0.0)
            continue
        guess = heads.subset[np.argmax(heads.logits(k, hidden[keep]), axis=1)]
        out.append(float((guess == labels[k][keep]).mean()))
    return out


def index_labels(heads: Heads, labels: np.ndarray) -> np.ndarray:
    """Token ids as places in the heads' subset: -1 outside it (and for a label of -1)."""
    table = np.full(max(int(labels.max(initial=-1)), int(heads.subset.max(initial=-1))) + 2, -1, np.int64)
    table[heads.subset] = np.arange(heads.subset.size)
    return table[labels]  # a label of -1 reads the table's last entry: -1


def chain_rates(heads: Heads, hidden: np.ndarray, labels: np.ndarray) -> list[float]:
    """P(heads 1..j all guess right), j = 1..K, over the positions: a greedy draft of j guesses is accepted
    whole that often (a label past the text's end is a miss)."""
    if not hidden.shape[0]:
        return [0.0] * heads.n_heads
    right = np.stack([heads.subset[np.argmax(heads.logits(k, hidden), axis=1)] == labels[k]
                      for k in range(heads.n_heads)])  # fmt: skip
    return [float(x) for x in np.cumprod(right, axis=0).mean(axis=1)]


def expected_run(heads: Heads, hidden: np.ndarray, labels: np.ndarray) -> float:
    """Mean over positions of how many heads in a row, from head 1, guess right: the tokens a draft of all
    the heads adds when the target verifies it greedily."""
    return sum(chain_rates(heads, hidden, labels))


def train(heads: Heads, hidden: np.ndarray, labels: np.ndarray, epochs: int, *, seed: int = 0,
          on_step: Callable[[int, int, float], None] | None = None, should_stop: Callable[[], bool] | None = None,
          opt: Adam | None = None) -> list[float]:  # fmt: skip
    """Train every head on (hidden (N, d), labels (K, N)), positions shuffled each epoch; returns each head's last
    epoch's mean loss. Labels outside the subset (or -1) are left out. `on_step(done, total, loss)` after each
    step; `should_stop()` ends training early (the heads keep what they learned). `opt`: an optimizer to go
    on with (its moments), for training an epoch at a time."""
    idx = index_labels(heads, labels)
    rng = np.random.default_rng(seed)
    opt = opt or Adam()
    batches = [(k, pos) for k in range(heads.n_heads) for pos in _batches(np.flatnonzero(idx[k] >= 0), rng, epochs)]
    total, losses = len(batches), [math.nan] * heads.n_heads
    running: dict[int, list[float]] = {}
    for done, (k, pos) in enumerate(_interleave(batches), start=1):
        if should_stop is not None and should_stop():
            break
        loss = train_step(heads, k, hidden[pos], idx[k][pos], opt)
        running.setdefault(k, []).append(loss)
        if on_step is not None:
            on_step(done, total, loss)
    for k, xs in running.items():
        tail = xs[-max(1, len(xs) // max(epochs, 1)) :]
        losses[k] = float(np.mean(tail))
    return losses


def _batches(positions: np.ndarray, rng: np.random.Generator, epochs: int) -> Iterator[np.ndarray]:
    for _ in range(epochs):
        order = rng.permutation(positions)
        for i in range(0, order.size, BATCH):
            yield order[i : i + BATCH]


def _interleave(batches: list[tuple[int, np.ndarray]]) -> Iterator[tuple[int, np.ndarray]]:
    """The heads' steps taken in turn (head 1, 2, .., 1, 2, ..), so a stop keeps every head as far along."""
    per: dict[int, list[np.ndarray]] = {}
    for k, pos in batches:
        per.setdefault(k, []).append(pos)
    for i in range(max((len(v) for v in per.values()), default=0)):
        for k in sorted(per):
            if i < len(per[k]):
                yield k, per[k][i]
