"""Can two models speculate together? The one place that decides.

The rule is llama.cpp's (common/speculative.cpp): same vocabulary type, same
add-BOS/add-EOS flags and the same BOS/EOS ids where they are added, vocabulary
sizes within 128 of each other, and equal token text for every id from 5 up to
the smaller vocabulary. Sizes that differ only by tokens at the end give the
verdict "compatible (padded)".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec_cli.engine.model import VocabInfo

COMPATIBLE = "compatible"
PADDED = "compatible (padded)"
INCOMPATIBLE = "incompatible"

MAX_SIZE_DIFFERENCE = 128
CHECK_START_ID = 5
VOCAB_TYPES = {0: "none", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV", 6: "PLaMo2"}


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reason: str
    differing_ids: int = 0
    first_differences: list[tuple[int, bytes, bytes]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.verdict != INCOMPATIBLE

    def first_difference(self) -> str:
        """'id N ('a' in the target, 'b' in the draft)', or '' when the texts agree."""
        if not self.first_differences:
            return ""
        i, t, d = self.first_differences[0]
        return f"id {i} ({_show(t)} in the target, {_show(d)} in the draft)"


def _show(b: bytes) -> str:
    return repr(b.decode("utf-8", "replace"))


def check(target: VocabInfo, draft: VocabInfo, *, max_examples: int = 5) -> Verdict:
    n = min(target.n_vocab, draft.n_vocab)
    diffs = [i for i in range(CHECK_START_ID, n) if target.texts[i] != draft.texts[i]]
    examples = [(i, target.texts[i], draft.texts[i]) for i in diffs[:max_examples]]

    def bad(reason: str) -> Verdict:
        return Verdict(INCOMPATIBLE, reason, len(diffs), examples)

    if target.vocab_type != draft.vocab_type:
        return bad(
            f"vocabulary types differ: target {VOCAB_TYPES.get(target.vocab_type, target.vocab_type)}, "
            f"draft {VOCAB_TYPES.get(draft.vocab_type, draft.vocab_type)}"
        )
    if target.add_bos != draft.add_bos:
        return bad(f"add-BOS flags differ: target {target.add_bos}, draft {draft.add_bos}")
    if target.add_eos != draft.add_eos:
        return bad(f"add-EOS flags differ: target {target.add_eos}, draft {draft.add_eos}")
    if target.add_bos and target.bos != draft.bos:
        return bad(f"BOS ids differ: target {target.bos}, draft {draft.bos}")
    if target.add_eos and target.eos != draft.eos:
        return bad(f"EOS ids differ: target {target.eos}, draft {draft.eos}")
    gap = abs(target.n_vocab - draft.n_vocab)
    if gap > MAX_SIZE_DIFFERENCE:
        return bad(
            f"vocabulary sizes differ by {gap} (target {target.n_vocab:,}, draft {draft.n_vocab:,}; "
            f"at most {MAX_SIZE_DIFFERENCE} allowed)"
        )
    if diffs:
        return bad(f"{len(diffs):,} token ids have different text")
    if gap:
        return Verdict(PADDED, f"vocabularies equal up to id {n - 1}; sizes differ by {gap} tokens at the end")
    return Verdict(COMPATIBLE, "identical vocabularies")
