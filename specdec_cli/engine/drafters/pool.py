"""A token pool: the prompts and outputs of earlier generations, for the n-gram lookup to draft from.

Local workloads repeat themselves across requests (an agent re-asks after a tool error, a script
sends the same schema again, a user asks again): every token of a repeat was generated before, but
the per-generation n-gram lookup only sees the current context. The pool keeps what earlier
generations of one loaded pair read and wrote (one vocabulary: the pair's), and proposes from it as
suffix decoding does (vLLM's, after ArcticInference):

- the longest match: the occurrences of the context's last `n_min` tokens are found through an index,
  and each is extended backwards, up to `n_max` tokens; the longest matches are kept;
- frequency, not only recency: the draft walks forward from those occurrences, and at each position
  takes the token most of them continue with; it stops where no more than `min_share` of them agree
  (the confidence: by default a majority is needed) or none is left;
- a draft length that grows with the match: at most `spec_factor` x the match length (a long match
  has earned a long draft; two tokens of agreement earn two).

Sequences are concatenated with a separator (no match crosses two of them). Memory is bounded by a
byte budget, counted as the arrays and index entries the pool holds (`bytes_used`); past it, the
oldest sequences are dropped and the index is rebuilt from the rest (in one go, down to three
quarters of the budget, so a rebuild is rare). Thread-safe: every slot of a server shares one pool.
"""

from __future__ import annotations

import glob
import hashlib
import os
import tempfile
import threading
import time
import zipfile
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from specdec_cli.errors import PoolFileError, UsageError

SEPARATOR = -1
# What one pool token costs, as counted: its slot in the token list, the kept sequence, its position in the
# index and the index's share of keys and list headers. Measured with tracemalloc: 69 bytes a token for
# 182k tokens (the README of the time and two source files in SmolLM2's tokens, 500-token sequences, six times over).
BYTES_PER_TOKEN = 72
MAX_OCCURRENCES = 64  # the latest occurrences of an n_min-gram examined per lookup
STALE_TMP_SECONDS = 600  # a temporary file of a save older than this was left by a killed process
FORMAT = "specdec-token-pool-1"


def vocab_fingerprint(texts: Sequence[bytes]) -> str:
    """What a saved pool is valid for: every token's text, in id order (the same tokens mean the same ids)."""
    h = hashlib.sha256(str(len(texts)).encode())
    for t in texts:
        h.update(len(t).to_bytes(4, "little"))
        h.update(t)
    return h.hexdigest()


class TokenPool:
    def __init__(self, budget_bytes: int = 64 << 20, *, n_min: int = 2, n_max: int = 32, min_share: float = 0.5,
                 spec_factor: float = 1.0) -> None:  # fmt: skip
        if budget_bytes < 0 or not 1 <= n_min <= n_max:
            raise ValueError("a pool needs budget_bytes >= 0 and 1 <= n_min <= n_max")
        self.budget_bytes = budget_bytes
        self.n_min, self.n_max = n_min, n_max
        self.min_share, self.spec_factor = min_share, spec_factor
        self._sequences: deque[tuple[int, ...]] = deque()
        self._tokens: list[int] = []
        self._index: dict[tuple[int, ...], list[int]] = {}  # n_min-gram -> positions after each occurrence
        self._lock = threading.Lock()
        self.evicted = 0  # sequences dropped to stay within the budget

    # ------------------------------------------------------------ contents
    def __len__(self) -> int:
        """Tokens held (separators not counted)."""
        return len(self._tokens) - len(self._sequences)

    @property
    def bytes_used(self) -> int:
        return len(self._tokens) * BYTES_PER_TOKEN

    def add(self, tokens: Sequence[int]) -> None:
        """Keep one finished text (a prompt and what was generated after it)."""
        seq = tuple(int(t) for t in tokens)
        if len(seq) <= self.n_min or (len(seq) + 1) * BYTES_PER_TOKEN > self.budget_bytes:
            return
        with self._lock:
            self._sequences.append(seq)
            self._append(seq)
            if self.bytes_used > self.budget_bytes:
                target = self.budget_bytes * 3 // 4
                total = self.bytes_used
                while self._sequences and total > target:
                    total -= (len(self._sequences.popleft()) + 1) * BYTES_PER_TOKEN
                    self.evicted += 1
                self._rebuild()

    def clear(self) -> None:
        with self._lock:
            self._sequences.clear()
            self._rebuild()

    def _append(self, seq: tuple[int, ...]) -> None:
        toks, index, n = self._tokens, self._index, self.n_min
        base = len(toks)
        toks.extend(seq)
        toks.append(SEPARATOR)
        for i in range(n, len(seq)):  # the n-gram ending before position i is followed by seq[i]
            index.setdefault(seq[i - n : i], []).append(base + i)

    # ---------------------------------------------------------- persistence
    def save(self, path: str | os.PathLike[str], fingerprint: str) -> None:
        """Write the pool to `path` atomically: a temporary file in the same folder, flushed to disk, then
        renamed over `path`, so a crash (or a kill) at any moment leaves the old file or the new one."""
        path = Path(path)
        with self._lock:
            seqs = list(self._sequences)
        lengths = np.array([len(s) for s in seqs], dtype=np.int64)
        tokens = np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=int(lengths.sum()))
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, format=np.array(FORMAT), fingerprint=np.array(fingerprint), lengths=lengths,
                         tokens=tokens)  # fmt: skip
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        remove_stale_temporaries(path)

    def load(self, path: str | os.PathLike[str], fingerprint: str, n_vocab: int | None = None) -> int:
        """Add the texts saved in `path` (oldest first, as saved); returns how many tokens. A file that is
        not a pool, is damaged, or was saved for another vocabulary raises `PoolFileError` (never a pool
        of the wrong tokens: drafts would stay exact, but useless); so does a token id outside `n_vocab` (a
        hand-made file: such an id must never reach the model)."""
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                fmt, saved_for = str(data["format"]), str(data["fingerprint"])
                lengths, tokens = data["lengths"], data["tokens"]
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # numpy's own words would mislead
            fmt = ""
        problem = None
        if fmt != FORMAT:
            problem = "is not a specdec token pool, or is damaged"
        elif lengths.ndim != 1 or tokens.ndim != 1 or int(lengths.sum()) != len(tokens) or (lengths < 0).any():
            problem = "is damaged (its lengths do not add up)"
        elif saved_for != fingerprint:
            raise PoolFileError(f"{path} was saved for a model with another vocabulary: give another --ngram-cache "
                                "file for this one")  # fmt: skip
        elif len(tokens) and (int(tokens.min()) < 0 or (n_vocab is not None and int(tokens.max()) >= n_vocab)):
            problem = "holds a token id outside the vocabulary"
        if problem is not None:
            raise PoolFileError(f"{path} {problem}: delete it or give another --ngram-cache file")
        ends = np.cumsum(lengths)
        for end, n in zip(ends.tolist(), lengths.tolist(), strict=True):
            self.add(tokens[end - n : end].tolist())
        return int(lengths.sum())

    def _rebuild(self) -> None:
        self._tokens, self._index = [], {}
        for seq in self._sequences:
            self._append(seq)

    # -------------------------------------------------------------- drafts
    def propose(self, context: Sequence[int], k: int) -> tuple[list[int], int]:
        """Up to `k` tokens to follow `context`, and the length of the match they come from (0: none):
        `len(context)` when the whole context is the beginning of an earlier text (a word-for-word
        repeat so far), else at most `n_max`."""
        n = self.n_min
        if k < 1 or len(context) < n:
            return [], 0
        with self._lock:
            starts = self._index.get(tuple(context[-n:]))
            if not starts:
                return [], 0
            toks = self._tokens
            best, matched = 0, []
            limit = min(self.n_max, len(context))
            for pos in starts[-MAX_OCCURRENCES:]:
                m = n
                while m < limit and pos - m - 1 >= 0 and toks[pos - m - 1] == context[-m - 1]:
                    m += 1
                if m > best:
                    best, matched = m, [pos]
                elif m == best:
                    matched.append(pos)
            if best == limit:  # as far as the walk goes: is the whole context an earlier text's beginning?
                whole = self._repeats(context, matched)
                if whole:
                    best, matched = len(context), whole
            cap = min(k, max(1, int(self.spec_factor * best)))
            out: list[int] = []
            while matched and len(out) < cap:
                votes: dict[int, list[int]] = {}  # token -> [how many continue with it, the latest position]
                for pos in matched:
                    tok = toks[pos]
                    if tok != SEPARATOR:
                        v = votes.setdefault(tok, [0, pos])
                        v[0] += 1
                        v[1] = max(v[1], pos)
                if not votes:
                    break
                tok, (count, _) = max(votes.items(), key=lambda kv: (kv[1][0], kv[1][1]))  # most, then latest
                if count <= self.min_share * len(matched):
                    break
                out.append(tok)
                matched = [pos + 1 for pos in matched if toks[pos] == tok]
            return out, best

    def _repeats(self, context: Sequence[int], matched: list[int]) -> list[int]:
        """Those of `matched` (positions just after a match) preceded by the whole context, from an earlier
        text's first token on. One slice comparison each: this runs only for matches as long as the walk."""
        toks, n = self._tokens, len(context)
        ctx = list(context)
        return [pos for pos in matched
                if pos >= n and (pos == n or toks[pos - n - 1] == SEPARATOR) and toks[pos - n : pos] == ctx]


def remove_stale_temporaries(path: Path) -> None:
    """Delete what saves of `path` killed before their rename left behind (a younger one may be another
    process's save in progress: left alone)."""
    now = time.time()
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        try:
            if now - tmp.stat().st_mtime > STALE_TMP_SECONDS:
                tmp.unlink()
        except OSError:
            pass  # gone already, or not ours to delete


def open_pool_file(pool: TokenPool | None, path: str | os.PathLike[str], texts: Sequence[bytes]) -> tuple[Path, str, int]:
    """`--ngram-cache`: read a pool saved by an earlier run into `pool` (none yet: it is created when the
    pool is saved). Returns the file, the vocabulary's stamp to save it with, and the tokens read."""
    if pool is None:
        raise UsageError("--ngram-cache needs the token pool: leave --pool-mb above 0")
    file = Path(path).expanduser()
    if not file.parent.is_dir():
        raise UsageError(f"--ngram-cache {file}: no folder {file.parent}")
    stamp = vocab_fingerprint(texts)
    return file, stamp, pool.load(file, stamp, len(texts)) if file.exists() else 0
