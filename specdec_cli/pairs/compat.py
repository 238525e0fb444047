"""Can two models speculate together? The one place that decides.

The rule is llama.cpp's (common/speculative.cpp): same vocabulary type, same
add-BOS/add-EOS flags and the same BOS/EOS ids where they are added, vocabulary
sizes within 128 of each other, and equal token text for every id from 5 up to
the smaller vocabulary. Sizes that differ only by tokens at the end give the
verdict "compatible (padded)".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec_cli.engine.gguf import VocabInfo

COMPATIBLE = "compatible"
PADDED = "compatible (padded)"
CROSS = "compatible (different tokenizers)"
INCOMPATIBLE = "incompatible"
MIN_INTERSECTION = 256  # token texts the two vocabularies must share for a draft to propose anything

MAX_SIZE_DIFFERENCE = 128
CHECK_START_ID = 5
VOCAB_TYPES = {0: "none", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV", 6: "PLaMo2"}


@dataclass(frozen=True)
class CrossFacts:
    """What drafting across tokenizers has to work with (engine/drafters/cross.py)."""

    intersection: int  # draft tokens whose text is exactly one target token
    draft_vocab: int
    probe_share: float  # of the probe texts' target tokens, the share inside the intersection
    modes: tuple[str, ...]  # "greedy" (re-tokenized drafts), "sampling" (token-level intersection)


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reason: str
    differing_ids: int = 0
    first_differences: list[tuple[int, bytes, bytes]] = field(default_factory=list)
    cross: CrossFacts | None = None

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


def cross_check(target: Any, draft: Any, same: Verdict) -> Verdict:
    """The verdict for vocabularies that differ (`same` says how): can the draft propose across them?

    `target`/`draft` are engine Models (vocabulary-only is enough).
    """
    from specdec_cli.engine.drafters.cross import CrossVocab

    vocab = CrossVocab.build(target, draft)
    if vocab.size < MIN_INTERSECTION:
        return dataclasses.replace(
            same,
            reason=f"{same.reason}, and only {vocab.size} of the draft's token texts are target tokens "
            f"(at least {MIN_INTERSECTION} are needed to draft across tokenizers)",
        )
    inside = set(vocab.draft_to_target[vocab.draft_to_target >= 0].tolist())
    ids = [t for text in PROBES.values() for t in target.tokenize(text, add_special=False, parse_special=False)]
    share = sum(t in inside for t in ids) / max(len(ids), 1)
    facts = CrossFacts(vocab.size, draft.n_vocab, share, ("greedy", "sampling"))
    return Verdict(
        CROSS,
        f"different tokenizers ({same.reason}); {vocab.size:,} of the draft's {draft.n_vocab:,} token texts are "
        f"target tokens: drafts are re-tokenized (greedy) or drawn from that intersection (sampling)",
        same.differing_ids,
        same.first_differences,
        facts,
    )


# ---------------------------------------------------------------- the report
PROBES: dict[str, str] = {
    "English prose": "The quick brown fox jumps over the lazy dog. It was the best of times.",
    "indented code": "def add(a, b):\n    if a > b:\n        return a + b\n\treturn b - a  # tab\n",
    "numbers": "3.14159 2718 1,000,000 -42 0x1F 1e-9 12:30 2026-11-22",
    "emoji and Unicode": "naïve café Ωmega ∑ 😀🚀 ½ ß ﬁ",
    "CJK": "你好，世界。日本語のテキスト。한국어 문장.",
    "leading/trailing whitespace": "   padded text with spaces   \n\n",
}
CHAT_PROBE = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And times 3?"},
]


@dataclass(frozen=True)
class RoundTrip:
    probe: str
    same: bool
    n_target: int
    n_draft: int
    first_mismatch: int | None  # index of the first differing id


@dataclass(frozen=True)
class ModelFacts:
    path: str
    architecture: str
    size_label: str
    file_size: int
    quantization: str
    vocab_type: str
    n_vocab: int
    bos: int
    eos: int
    eot: int
    add_bos: bool
    add_eos: bool
    has_chat_template: bool


@dataclass(frozen=True)
class PairReport:
    target: ModelFacts
    draft: ModelFacts
    verdict: Verdict
    special_differences: list[tuple[int, bytes, bytes]]
    templates_equal: bool
    round_trips: list[RoundTrip]
    memory_needed: int
    memory_available: int | None
    ctx_size: int

    @property
    def fits(self) -> bool:
        return self.memory_available is None or self.memory_needed <= self.memory_available

    def as_dict(self, probe: Any = None, heads: Any = None) -> dict[str, Any]:
        """`pair-check --json` (byte strings as text); `probe`: `--probe`'s result (probe.ProbeResult, which
        runs generations through the API: this module, below the API, does not import it); `heads`: the
        heads' (probe.HeadsProbeResult), with `--heads`."""
        payload: dict[str, Any] = _plain(dataclasses.asdict(self))
        payload["verdict"] = self.verdict.verdict
        payload["reason"] = self.verdict.reason
        c = self.verdict.cross
        payload["cross"] = None if c is None else _plain(dataclasses.asdict(c))
        payload["fits_in_memory"] = self.fits
        payload["probe"] = _plain(dataclasses.asdict(probe)) if probe else None
        if heads is not None:
            payload["heads_probe"] = _plain(dataclasses.asdict(heads))
        return payload


def _plain(x: Any) -> Any:
    if isinstance(x, bytes):
        return x.decode("utf-8", "replace")
    if isinstance(x, (list, tuple)):
        return [_plain(i) for i in x]
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def special_differences(t: VocabInfo, d: VocabInfo) -> list[tuple[int, bytes, bytes]]:
    """Control/user-defined tokens whose text differs, or that only one side has."""
    ids = sorted(t.special_ids | d.special_ids)
    out = []
    for i in ids:
        tt = t.texts[i] if i < t.n_vocab else b"(none)"
        dt = d.texts[i] if i < d.n_vocab else b"(none)"
        if tt != dt:
            out.append((i, tt, dt))
    return out


def _compare(name: str, a: list[int], b: list[int]) -> RoundTrip:
    mismatch = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if mismatch is None and len(a) != len(b):
        mismatch = min(len(a), len(b))
    return RoundTrip(name, a == b, len(a), len(b), mismatch)


def round_trips(target: Any, draft: Any, template: str | None) -> list[RoundTrip]:
    """Does the draft turn the same text into the same ids? (`target`/`draft` are engine Models.)"""
    out = []
    for name, text in PROBES.items():
        a = target.tokenize(text, add_special=True, parse_special=False)
        b = draft.tokenize(text, add_special=True, parse_special=False)
        out.append(_compare(name, a, b))
    if template:
        from specdec_cli.engine import templates

        sp = target.special_texts()
        try:
            rendered = templates.render(
                template, CHAT_PROBE, bos_token=sp.bos_text, eos_token=sp.eos_text, source=target.name
            )
        except templates.ChatTemplateError:
            return out  # a broken template is reported when it is used; the vocabularies are what matter here
        a = target.tokenize(rendered, add_special=False, parse_special=True)
        b = draft.tokenize(rendered, add_special=False, parse_special=True)
        out.append(_compare("conversation (chat template)", a, b))
    return out


def inspect_pair(target_path: Path, draft_path: Path, ctx_size: int) -> PairReport:
    """Everything pair-check reports, from the vocabularies and metadata only."""
    from specdec_cli.engine.gguf import GGUFSummary, available_memory
    from specdec_cli.engine.model import Model

    with Model(target_path, vocab_only=True) as tm, Model(draft_path, vocab_only=True) as dm:
        tv, dv = tm.vocab_info(), dm.vocab_info()
        ti, di = tm.info(), dm.info()
        ts, ds = GGUFSummary.from_info(ti), GGUFSummary.from_info(di)
        verdict = check(tv, dv)
        if not verdict.ok:
            verdict = cross_check(tm, dm, verdict)
        template = ti.chat_template
        try:
            trips = round_trips(tm, dm, template)
        except Exception:  # a template that cannot render the probe conversation
            trips = round_trips(tm, dm, None)

    def facts(s: GGUFSummary, v: VocabInfo) -> ModelFacts:
        return ModelFacts(
            path=str(s.path),
            architecture=s.architecture,
            size_label=s.size_label,
            file_size=s.file_size,
            quantization=s.quantization,
            vocab_type=VOCAB_TYPES.get(v.vocab_type, str(v.vocab_type)),
            n_vocab=v.n_vocab,
            bos=v.bos,
            eos=v.eos,
            eot=v.eot,
            add_bos=v.add_bos,
            add_eos=v.add_eos,
            has_chat_template=s.chat_template is not None,
        )

    needed = ts.file_size + ds.file_size + ts.kv_cache_bytes(ctx_size) + ds.kv_cache_bytes(ctx_size)
    return PairReport(
        target=facts(ts, tv),
        draft=facts(ds, dv),
        verdict=verdict,
        special_differences=special_differences(tv, dv),
        templates_equal=ti.chat_template == di.chat_template,
        round_trips=trips,
        memory_needed=needed,
        memory_available=available_memory(),
        ctx_size=ctx_size,
    )
