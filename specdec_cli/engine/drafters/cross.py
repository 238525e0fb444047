"""A draft model with a different tokenizer: drafts made of text, verified as target tokens.

The draft reads the context as text, re-tokenized with its own vocabulary, and
keeps its KV cache across steps through the common prefix of that token stream
(after a rejection it rolls back in its own positions; re-tokenizing the text is
the map between the two streams). Two ways to turn its drafts into target tokens:

- Greedy (Universal Assisted Generation, as Hugging Face's assisted generation
  does): the draft continues greedily in its own tokens; their text, after a
  lookbehind of the context's last target tokens, is tokenized by the target, and
  the part after the lookbehind is the proposal. If the lookbehind does not come
  back as the same target tokens (a token straddles the boundary: the context ends
  in " th" and the draft goes on with "e"), nothing is proposed this step. The
  target verifies as usual and every emitted token is its own argmax, so greedy
  output is the target's alone.
- Sampling (Token-Level Intersection, "Lossless Speculative Decoding Algorithms
  for Heterogeneous Vocabularies", ICML 2025): the draft samples only among the
  tokens whose text is also one target token (its distribution masked to that
  intersection and renormalised, q'); each draft token maps to its target token;
  ordinary rejection sampling against the target's distribution with q' keeps the
  output distribution exactly the target's. A target token outside the
  intersection simply reaches the draft as text, re-tokenized.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specdec_cli.engine.drafters import DraftRequest, Outcome, Proposal, check_finite
from specdec_cli.engine.protocol import LoadedModel
from specdec_cli.engine.sampling import Dist, process
from specdec_cli.engine.settings import MODEL

LOOKBEHIND = 4  # target tokens re-tokenized with the draft's text, to align the boundary


@dataclass(frozen=True)
class CrossVocab:
    """Which draft tokens are, byte for byte, one target token."""

    draft_to_target: np.ndarray  # int64, -1 where the draft token's text is no single target token
    n_target_texts: int

    @property
    def size(self) -> int:
        return int(np.count_nonzero(self.draft_to_target >= 0))

    @staticmethod
    def build(target: LoadedModel, draft: LoadedModel) -> CrossVocab:
        def pieces(m: LoadedModel) -> dict[int, bytes]:
            control = m.control_ids()
            return {i: m.token_text(i) for i in range(m.n_vocab) if i not in control}

        by_text: dict[bytes, int] = {}
        for i, b in pieces(target).items():
            if b:
                by_text.setdefault(b, i)  # the lowest id when a text repeats
        out = np.full(draft.n_vocab, -1, dtype=np.int64)
        for d, b in pieces(draft).items():
            t = by_text.get(b) if b else None
            if t is not None:
                out[d] = t
        return CrossVocab(out, len(by_text))


def complete_utf8(data: bytes) -> bytes:
    """`data` without a trailing incomplete UTF-8 character."""
    for cut in range(0, min(4, len(data)) + 1):
        try:
            (data[: len(data) - cut] if cut else data).decode("utf-8")
            return data[: len(data) - cut] if cut else data
        except UnicodeDecodeError as exc:
            if exc.reason != "unexpected end of data":
                return data  # invalid bytes, not a cut: leave them to errors="replace"
    return data


class CrossDrafter:
    """A draft model with its own tokenizer, proposing target tokens (see the module's docstring)."""

    name: str = MODEL
    free = False

    def __init__(self, target: LoadedModel, draft: LoadedModel, vocab: CrossVocab, p_min: float = 0.0,
                 window: int | None = None, renormalise: bool = True) -> None:  # fmt: skip
        self.target = target
        self.model = draft
        self.vocab = vocab
        self.p_min = p_min
        self.window = window  # characters of context text the draft re-reads after a pause (auto)
        self.renormalise = renormalise  # False only in the planted-bug test: q' must be renormalised
        self.last_catch_up = (0, 0.0)
        self._seen: list[int] = []
        self._char_offset = 0  # the draft reads the context's text from this character on
        self._bytes = bytearray()
        self.boundary_misses = 0  # proposals dropped because the lookbehind re-tokenized differently
        self._draft_eog = draft.eog_ids

    def decode_seconds(self) -> float:
        return self.model.decode_seconds

    # ------------------------------------------------------------ text
    def _context_bytes(self, context: Sequence[int]) -> bytes:
        """The context as bytes, extended incrementally while it only grows."""
        seen = self._seen
        m = len(seen)
        if m and not (len(context) >= m and context[m - 1] == seen[-1] and context[0] == seen[0]):
            seen.clear()
            self._bytes.clear()
            m = 0
        for t in context[m:]:
            self._bytes += self.target.token_text(t)
            seen.append(t)
        return bytes(self._bytes)

    def _draft_ids(self, context: Sequence[int]) -> list[int] | None:
        data = self._context_bytes(context)
        text = complete_utf8(data)
        if len(text) != len(data):
            return None  # the context ends inside a character: draft once it is complete
        s = text.decode("utf-8", "replace")
        if len(s) < self._char_offset:
            self._char_offset = 0  # a new text
        ids = self.model.tokenize(s[self._char_offset :], add_special=True, parse_special=False)
        if self.window is not None and len(ids) - self.model.common_prefix(ids) > self.window // 4:
            # Far behind (the auto drafter paused it): re-read only the last `window` characters.
            # The offset then stays put, so the next steps reuse the cache through the common prefix.
            self._char_offset = max(0, len(s) - self.window)
            ids = self.model.tokenize(s[self._char_offset :], add_special=True, parse_special=False)
        return ids

    def begin(self, prompt: Sequence[int]) -> None:
        self._char_offset = 0
        ids = self._draft_ids(prompt)
        if ids and len(ids) > 1:
            self.model.prefill(ids[:-1])

    def accept(self, outcome: Outcome) -> None:
        """Nothing now: the next `propose` re-reads the context's text through the common prefix."""

    def _catch_up(self, ids: list[int]) -> np.ndarray:
        keep = min(self.model.common_prefix(ids), len(ids) - 1)
        self.model.rollback(keep)
        t0 = self.model.decode_seconds
        rows = self.model.decode(ids[keep:])
        self.last_catch_up = (len(ids) - keep, self.model.decode_seconds - t0)
        return rows

    # ------------------------------------------------------------ proposals
    def propose(self, req: DraftRequest) -> Proposal:
        ids = self._draft_ids(req.context)
        if not ids:
            return Proposal(k=req.k, source=MODEL)
        rows = self._catch_up(ids)
        if req.sampler.greedy:
            return self._greedy(req, rows)
        return self._sampled(req, rows)

    def _greedy(self, req: DraftRequest, rows: np.ndarray) -> Proposal:
        drafted: list[int] = []
        text = b""
        # K draft tokens, and up to 3 more while the text ends inside a character (byte-level
        # tokens split emoji and CJK): a cut character would be dropped from the proposal.
        while len(drafted) < req.k + 3:
            row = rows[0]
            check_finite(self.model, row)
            tok = int(np.argmax(row))
            if self.p_min > 0.0 and 1.0 / float(np.exp(row - row[tok]).sum()) < self.p_min:
                break
            drafted.append(tok)
            text += self.model.token_text(tok)
            if tok in self._draft_eog or (len(drafted) >= req.k and complete_utf8(text) == text):
                break
            rows = self.model.decode([tok])
        tokens = self.to_target(req.context, drafted)[: req.k]
        return Proposal(tokens, [Dist.point(t) for t in tokens], req.k, MODEL)

    def to_target(self, context: Sequence[int], drafted: Sequence[int]) -> list[int]:
        """Draft tokens as target tokens, aligned on a lookbehind of the context (UAG)."""
        new = b"".join(self.model.token_text(d) for d in drafted if d not in self._draft_eog)
        new = complete_utf8(new)
        if not new:
            return []
        special = self.target.control_ids()
        look: list[int] = []
        for t in reversed(context[-LOOKBEHIND:]):
            if t in special:
                break
            look.insert(0, t)
        head = b"".join(self.target.token_text(t) for t in look)
        try:
            text = (head + new).decode("utf-8")
        except UnicodeDecodeError:
            return []  # the lookbehind starts inside a character: no proposal this step
        ids = self.target.tokenize(text, add_special=False, parse_special=False)
        if ids[: len(look)] != look:
            self.boundary_misses += 1
            return []  # a token straddles the boundary: the proposal would rewrite the context
        return ids[len(look) :]

    def _sampled(self, req: DraftRequest, rows: np.ndarray) -> Proposal:
        m = self.vocab.draft_to_target
        drafted: list[int] = []
        dists: list[Dist] = []
        for j in range(req.k):
            row = rows[0]
            check_finite(self.model, row)
            q = process(row, req.sampler)
            mapped = m[q.ids]
            keep = mapped >= 0
            if not keep.any():
                break  # the draft's whole distribution lies outside the intersection
            probs = q.probs[keep]
            total = float(probs.sum())
            if self.renormalise:
                probs = probs / total
            if self.p_min > 0.0 and probs[0] < self.p_min:
                break
            d_ids = q.ids[keep]
            cum = np.cumsum(probs)
            i = min(int(np.searchsorted(cum, req.rng.random() * cum[-1], side="right")), d_ids.size - 1)
            d_tok, t_tok = int(d_ids[i]), int(mapped[keep][i])
            drafted.append(t_tok)
            t_ids = mapped[keep]
            if np.unique(t_ids).size != t_ids.size:  # two draft texts, one target token: add their mass
                uniq, inverse = np.unique(t_ids, return_inverse=True)
                mass = np.bincount(inverse, weights=probs)
                order = np.argsort(-mass, kind="stable")
                t_ids, probs = uniq[order], mass[order]
            dists.append(Dist(t_ids, probs))
            if t_tok in req.stop_ids or j == req.k - 1:
                break
            rows = self.model.decode([d_tok])
        return Proposal(drafted, dists, req.k, MODEL)
