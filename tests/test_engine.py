"""The engine against the real packaged models: losslessness, rollback, stops, limits."""

from __future__ import annotations

import os
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest

from specdec_cli.bench import prompts as bench_prompts
from specdec_cli.engine import kernels, native, prompting
from specdec_cli.engine.drafters import ModelDrafter, NgramDrafter
from specdec_cli.engine.drafters.policies import compose
from specdec_cli.engine.events import DRAFT, TARGET
from specdec_cli.engine.model import Model
from specdec_cli.engine.settings import GenerateOptions
from specdec_cli.engine.speculative import SpeculativeGenerator, generate
from specdec_cli.engine.stats import Stats
from specdec_cli.errors import ContextError, ModelFileError
from specdec_cli.models import packaged
from tests.conftest import THREADS

PROMPTS = [
    "Write a haiku about the sea.",  # creative
    "def fibonacci(n):\n    # return the n-th Fibonacci number",  # code
    "List three prime numbers and explain why each is prime.",  # reasoning
    "Translate to French: The cat sits on the mat.",  # translation
    "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox",  # input-grounded
]


def chat_tokens(model: Model, text: str) -> list[int]:
    tokens, used = prompting.tokenize_prompt(model, text, use_chat=None, system=None)
    return tokens


_BASELINES: dict[tuple[object, ...], tuple[weakref.ref[Model], list[int]]] = {}


def baseline(target: Model, prompt: list[int], max_tokens: int, **kw: object) -> list[int]:
    """The target alone, greedy; computed once per model object, prompt and settings (greedy output is
    deterministic), so the parametrized tests share it. The weak reference tells a session fixture
    from a later model that happens to get a freed one's id."""
    key = (id(target), tuple(prompt), max_tokens, tuple(sorted(kw.items())))
    hit = _BASELINES.get(key)
    if hit is None or hit[0]() is not target:
        cfg = GenerateOptions(adaptive=False, max_tokens=max_tokens, **kw)  # type: ignore[arg-type]
        hit = _BASELINES[key] = (weakref.ref(target), generate(target, None, prompt, cfg).token_ids)
    return list(hit[1])


# -------------------------------------------------------------- smoke (build)
@pytest.mark.parametrize("which", ["smol", "gemma"])
def test_smoke_decode_in_subprocess(which: str, smol_path: Path, gemma_path: Path) -> None:
    """A llama.cpp build that crashes (e.g. 0.3.36's native build on AMX CPUs, docs/install.md) fails here, not in a user's hands."""
    path = smol_path if which == "smol" else gemma_path
    code = (
        "from specdec_cli.engine.model import Model\n"
        f"m = Model({str(path)!r}, n_ctx=256, n_threads={THREADS})\n"
        "rows = m.decode(m.tokenize('Hello', add_special=True, parse_special=True))\n"
        "import numpy as np; assert np.isfinite(rows).all(); print(int(rows[0].argmax()))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"decode crashed (rc={proc.returncode}): {proc.stderr[-2000:]}"
    assert proc.stdout.strip().isdigit()


# --------------------------------------------------- batch invariance (build)
@pytest.mark.parametrize("which", ["smol", "gemma"])
def test_batched_logits_equal_single_token_logits(which: str, smol: Model, gemma: Model) -> None:
    """Losslessness rests on this: verifying K+1 tokens in one batch gives bit-identical
    logits to decoding them one at a time. The build flags in scripts/setup.sh exist for it."""
    m = smol if which == "smol" else gemma
    toks = m.tokenize("Once upon a time, in a land far away, " * 6, add_special=True, parse_special=True)[:60]
    p = 20
    m.reset()
    m.prefill(toks[:p])
    single = [m.decode([t])[0].copy() for t in toks[p:]]
    for b in (2, 5, 9):
        for start in (p, p + 13, p + 29):
            m.rollback(start)
            rows = m.decode(toks[start : start + b], n_logits=b)
            for j in range(b):
                np.testing.assert_array_equal(rows[j], single[start - p + j], err_msg=f"batch {b} at {start}")
            m.rollback(start)  # restore the cache as it was built, one token at a time
            for t in toks[start:]:
                m.decode([t])


@pytest.mark.parametrize("which", ["smol", "gemma"])
def test_prompt_sized_batches_and_long_context_are_exact(which: str, smol: Model, gemma: Model) -> None:
    """Prompt prefill (64+ tokens: flash attention's tiled path) and single tokens past 512 cells
    (its split-KV path) must also match, or a warm chat cache would answer differently from a cold one."""
    m = smol if which == "smol" else gemma
    toks = m.tokenize(
        "The lighthouse keeper wrote in his log about the sea. " * 70, add_special=True, parse_special=True
    )
    m.reset()
    single = [m.decode([t])[0].copy() for t in toks[:96]]
    m.reset()
    rows = m.decode(toks[:96], n_logits=96)
    for j in range(96):
        np.testing.assert_array_equal(rows[j], single[j], err_msg=f"prefill row {j}")
    m.reset()
    m.prefill(toks[:530])
    single = [m.decode([t])[0].copy() for t in toks[530:539]]
    m.rollback(530)
    rows = m.decode(toks[530:539], n_logits=9)
    for j in range(9):
        np.testing.assert_array_equal(rows[j], single[j], err_msg=f"row {j} at 530")
    m.reset()


def test_invariant_flash_attention_computes_what_the_reference_kernels_do_up_to_rounding(smol_path: Path) -> None:
    """The invariant kernels run flash attention (patch 0003): on Q4_1, which is not repacked, their logits
    differ from the reference kernels' (no flash attention) by rounding only, over one chunk of cells and
    over three. Batch = single alone would not catch an attention computed wrongly the same way every time."""
    def load(which: str) -> Model:
        real = kernels.choose
        kernels.choose = lambda *a, **k: (which, None)  # type: ignore[assignment]
        try:
            return Model(smol_path, n_ctx=640, n_threads=THREADS)
        finally:
            kernels.choose = real  # type: ignore[assignment]

    with load(kernels.REFERENCE) as ref, load(kernels.INVARIANT) as inv:
        toks = ref.tokenize("The lighthouse keeper wrote in his log about the sea. " * 70, add_special=True,
                            parse_special=True)[:600]  # fmt: skip
        assert len(toks) == 600
        for start, n in ((0, 40), (590, 10)):  # the last: 590 cells, three chunks of 256
            ref.prefill(toks[:start])
            inv.prefill(toks[:start])
            a = ref.decode(toks[start : start + n], n_logits=n).copy()
            b = inv.decode(toks[start : start + n], n_logits=n).copy()
            assert not np.array_equal(a, b), "the invariant kernels did not run flash attention"
            assert float(np.abs(a - b).mean()) < 0.5, start  # measured 0.16-0.18: rounding, on logits of scale 30
            assert float((a.argmax(1) == b.argmax(1)).mean()) >= 0.9, start


# Every quantization a target may come in. Q4_0 and Q4_K_M are the ones llama.cpp repacks on x86 (Q2_K too,
# with AVX-512): patch 0002 (patches/llama.cpp/) computes their rows one by one, so exact mode keeps them; Q4_0
# keeps its GEMM, which sums as its GEMV does, unless the switch is off ("Q4_0-rows": the path a failed probe
# takes).
REQUANTIZED = ["Q2_K", "Q8_0", "F32", "Q4_0", "Q4_0-rows", "Q4_K_M"]


@pytest.mark.parametrize("qtype", REQUANTIZED)
def test_requantized_models_run_invariant_kernels_and_batches_equal_single_tokens(qtype: str, smol_path: Path) -> None:
    """The target loads with the batch-invariant kernels (the probe passed), and a prompt-sized batch and
    verification-sized batches give the logits single tokens give."""
    path = packaged.derived_draft(smol_path, qtype.removesuffix("-rows"))
    switch = native.q4_0_gemm_switch()
    assert switch is not None and switch.value  # the set-up's build has patch 0002's switch, on
    switch.value = not qtype.endswith("-rows")
    try:
        _batches_equal_single_tokens(path, qtype)
    finally:
        switch.value = True


def _batches_equal_single_tokens(path: Path, qtype: str) -> None:
    with Model(path, n_ctx=256, n_threads=THREADS) as m:
        assert m.kernels == kernels.INVARIANT, m.warnings
        assert kernels.batch_equals_single(m)  # what the load's probe ran (cached across runs), run here again
        toks = m.tokenize("Once upon a time, in a land far away, " * 8, add_special=True, parse_special=True)[:64]
        single = [m.decode([t])[0].copy() for t in toks]
        m.reset()
        rows = m.decode(toks, n_logits=len(toks))
        for j in range(len(toks)):
            np.testing.assert_array_equal(rows[j], single[j], err_msg=f"{qtype}: prompt row {j}")
        for b in (2, 5, 9):
            for start in (20, 41):
                m.prefill(toks[:start])  # the cache holds the first `start` tokens
                rows = m.decode(toks[start : start + b], n_logits=b)
                for j in range(b):
                    np.testing.assert_array_equal(rows[j], single[start + j], err_msg=f"{qtype}: batch {b} at {start}")


FALLBACK = """
import os, sys
from specdec_cli.engine import kernels
from specdec_cli.engine.model import Model
real = kernels.batch_equals_single
if sys.argv[2] == "pretend":  # the invariant kernels compute a batch differently (a probe that says so), the
    kernels.batch_equals_single = lambda m, *a: False if m.kernels == kernels.INVARIANT else real(m, *a)
if sys.argv[2] == "q4_0-gemm":  # ... only with Q4_0's GEMM on (patch 0002's switch)
    kernels.batch_equals_single = lambda m, *a: False if kernels.q4_0_gemm() else real(m, *a)
m = Model(sys.argv[1], n_ctx=128, n_threads=int(os.environ.get("SPECDEC_THREADS", "2")))  # conftest's
print(m.kernels)
print(*m.warnings, kernels.q4_0_gemm(), sep="\\n")
"""


@pytest.mark.parametrize("how", ["stock", "pretend", "q4_0-gemm"])
def test_exact_mode_falls_back_to_kernels_that_are_exact_with_one_line(how: str, smol_path: Path, tmp_path: Path) -> None:
    """Kernels that are not batch-invariant are never used for a target. With the patches switched off the
    build is stock llama.cpp: its llamafile sgemm computes one token of the attention's products (flash
    attention off) in another order than a batch, so even the reference kernels fail the probe and the
    target decodes alone, said in one line. A build whose invariant kernels fail the probe (with Q4_0's GEMM
    and without) reloads the target with the reference kernels, said in one line; one that fails only with
    Q4_0's GEMM keeps the invariant kernels, the GEMM off, and says nothing. Each verdict is kept: the probe
    runs once."""
    env = {**os.environ, "SPECDEC_CACHE_DIR": str(tmp_path),
           "GGML_CPU_BATCH_INVARIANT": "0" if how == "stock" else "1"}  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", FALLBACK, str(smol_path), how], capture_output=True, text=True,
                          timeout=120, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    kernel_set, *warnings, gemm = proc.stdout.strip().split("\n")
    verdicts = (tmp_path / "kernels.json").read_text()
    if how == "q4_0-gemm":
        assert (kernel_set, warnings, gemm) == (kernels.INVARIANT, [], "False")
        assert verdicts.count('": false') == 1 and verdicts.count('": true') == 1, verdicts
        return
    assert len(warnings) == 1, warnings
    if how == "stock":
        assert kernel_set == kernels.INEXACT
        assert "the target decodes alone, one request at a time" in warnings[0]
    else:
        assert kernel_set == kernels.REFERENCE
        assert "compute a batch of tokens differently" in warnings[0]
        assert "exact mode runs the slower reference kernels" in warnings[0]
    # stock: the reference set's; pretend: the invariant set's, with Q4_0's GEMM and without
    assert verdicts.count('": false') == (1 if how == "stock" else 2), verdicts


def test_decode_longer_than_a_batch_returns_the_last_rows(smol: Model) -> None:
    """More tokens than n_batch in one call: the wanted rows must come from the right positions."""
    toks = smol.tokenize(
        "A long, long road winds over the hills and far away. " * 40, add_special=True, parse_special=True
    )
    n = smol.n_batch + 44
    assert len(toks) >= n
    smol.reset()
    smol.prefill(toks[: n - 3])
    single = [smol.decode([t])[0].copy() for t in toks[n - 3 : n]]
    smol.reset()
    rows = smol.decode(toks[:n], n_logits=3)
    assert smol.tokens == toks[:n]
    for j in range(3):
        np.testing.assert_array_equal(rows[j], single[j])
    smol.reset()


def test_rollback_then_redecode_is_exact(smol: Model) -> None:
    toks = smol.tokenize("The quick brown fox jumps over the lazy dog", add_special=True, parse_special=True)
    smol.reset()
    smol.prefill(toks[:-1])
    ref = smol.decode(toks[-1:])[0].copy()
    smol.reset()
    smol.prefill(toks[:-1])
    smol.decode([123, 456, 789], n_logits=3)
    smol.rollback(len(toks) - 1)
    assert smol.tokens == toks[:-1]
    np.testing.assert_array_equal(smol.decode(toks[-1:])[0], ref)


# ------------------------------------------------------------ greedy identity
@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_identical_to_target_alone(k: int, smol: Model, smol_q2k: Model) -> None:
    for text in PROMPTS:
        prompt = chat_tokens(smol, text)
        base = baseline(smol, prompt, 48)
        res = generate(smol, ModelDrafter(smol_q2k), prompt, GenerateOptions(adaptive=False, max_tokens=48, draft_max=k))
        assert res.token_ids == base, f"K={k} prompt {text!r}"
        stats = Stats()
        for step in res.steps:
            stats.add(step)
        assert 0 < stats.accepted <= stats.drafted
        assert stats.emitted == len(res.token_ids) == stats.emitted_from_draft + stats.emitted_from_target


def test_greedy_draft_equals_target_accepts_everything(smol: Model, smol_twin: Model) -> None:
    prompt = chat_tokens(smol, PROMPTS[1])
    base = baseline(smol, prompt, 40)
    res = generate(smol, ModelDrafter(smol_twin), prompt, GenerateOptions(adaptive=False, max_tokens=40, draft_max=4))
    assert res.token_ids == base
    full_steps = [s for s in res.steps if len(s.drafted) == 4]
    assert full_steps, "expected steps that drafted the full K"
    for s in full_steps:
        assert s.n_accepted == 4  # every draft accepted ...
        assert [e.source for e in s.emitted] == [DRAFT] * 4 + [TARGET]  # ... plus the bonus token


def test_greedy_swapped_pair_identical(smol: Model, smol_q2k: Model) -> None:
    """The Q2_K model as target, the Q4_1 as draft: still the target's own output."""
    for text in PROMPTS[:3]:
        prompt = chat_tokens(smol_q2k, text)
        base = baseline(smol_q2k, prompt, 40)
        res = generate(smol_q2k, ModelDrafter(smol), prompt, GenerateOptions(adaptive=False, max_tokens=40, draft_max=3))
        assert res.token_ids == base


def test_greedy_identical_on_gemma(gemma: Model, gemma_q2k: Model) -> None:
    for text in ("The history of the Roman Empire", "def quicksort(arr):"):
        prompt = gemma.tokenize(text, add_special=True, parse_special=True)
        base = baseline(gemma, prompt, 32)
        for k in (2, 5):
            res = generate(gemma, ModelDrafter(gemma_q2k), prompt, GenerateOptions(adaptive=False, max_tokens=32, draft_max=k))
            assert res.token_ids == base, f"K={k} {text!r}"


# ------------------------------------------------------------------- stops
def test_stops_exactly_at_max_tokens_inside_accepted_run(smol: Model, smol_twin: Model) -> None:
    prompt = chat_tokens(smol, PROMPTS[1])
    for n in (1, 2, 5, 7):
        res = generate(smol, ModelDrafter(smol_twin), prompt, GenerateOptions(adaptive=False, max_tokens=n, draft_max=8))
        assert len(res.token_ids) == n and res.stop_reason == "length"


def test_stops_on_eos_and_never_emits_it(smol: Model, smol_twin: Model) -> None:
    prompt = chat_tokens(smol, "Say just the word yes.")
    res = generate(smol, ModelDrafter(smol_twin), prompt, GenerateOptions(adaptive=False, max_tokens=64, draft_max=8))
    assert res.stop_reason == "eos"
    assert not set(res.token_ids) & smol.eog_ids
    assert res.token_ids == baseline(smol, prompt, 64)


def test_context_fills_up_mid_generation(smol_path: Path, smol_q2k_path: Path) -> None:
    with Model(smol_path, n_ctx=64, n_threads=THREADS) as t, Model(smol_q2k_path, n_ctx=64, n_threads=THREADS) as d:
        prompt = t.tokenize("1, 2, 3, 4, 5, 6, 7, 8, 9,", add_special=True, parse_special=True)
        res = generate(t, ModelDrafter(d), prompt, GenerateOptions(adaptive=False, max_tokens=500, draft_max=4))
        assert res.stop_reason == "context"
        assert len(prompt) + len(res.token_ids) == 64 + 1  # the last token needs no cache slot
        assert res.text
        t.reset()
        assert res.token_ids == baseline(t, prompt, 500)


def test_prompt_longer_than_context_is_refused(smol_path: Path) -> None:
    with Model(smol_path, n_ctx=16, n_threads=THREADS) as t:
        prompt = t.tokenize("word " * 40, add_special=True, parse_special=True)
        with pytest.raises(ContextError, match="--ctx-size"):
            SpeculativeGenerator(t, None, prompt, GenerateOptions(adaptive=False))


# ------------------------------------------------------------- bad files
def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="not found"):
        Model(tmp_path / "nope.gguf", vocab_only=True)


def test_not_gguf(not_gguf: Path) -> None:
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        Model(not_gguf, vocab_only=True)


def test_truncated_gguf(truncated_gguf: Path) -> None:
    with pytest.raises(ModelFileError, match="truncated"):
        Model(truncated_gguf, n_ctx=64)


# ------------------------------------------------------------ sampling runs
def test_seed_makes_sampled_run_reproducible(smol: Model, smol_q2k: Model) -> None:
    prompt = chat_tokens(smol, "Tell me a short story.")
    cfg = GenerateOptions(adaptive=False, max_tokens=24, draft_max=3, temperature=0.9, seed=42)
    a = generate(smol, ModelDrafter(smol_q2k), prompt, cfg).token_ids
    b = generate(smol, ModelDrafter(smol_q2k), prompt, cfg).token_ids
    c = generate(smol, ModelDrafter(smol_q2k), prompt, GenerateOptions(**{**cfg.__dict__, "seed": 7})).token_ids
    assert a == b
    assert a != c


# ------------------------------------------- n-gram drafter and adaptive K
def _stats(res: object) -> Stats:
    stats = Stats()
    for step in res.steps:  # type: ignore[attr-defined]
        stats.add(step)
    return stats


@pytest.mark.parametrize("adaptive", [True, False])
def test_ngram_greedy_identical_to_target_alone(adaptive: bool, smol: Model) -> None:
    texts = [p.text for p in bench_prompts.PROMPTS if p.category == bench_prompts.INPUT_GROUNDED][:3] + PROMPTS
    accepted = 0
    for text in texts:
        prompt = chat_tokens(smol, text)
        base = baseline(smol, prompt, 48)
        smol.reset()  # so the prefill below decodes exactly len(prompt) - 1 tokens
        before = smol.decoded_tokens
        cfg = GenerateOptions(max_tokens=48, draft_max=6, adaptive=adaptive)
        res = generate(smol, compose(NgramDrafter(2, 4), cfg), prompt, cfg)
        assert res.token_ids == base, f"adaptive={adaptive} prompt {text[:40]!r}"
        stats = _stats(res)
        assert stats.accepted <= stats.drafted
        assert stats.emitted == len(res.token_ids)
        # No verification batch is wasted: a step with no match decodes one token, not k + 1.
        assert smol.decoded_tokens - before == (len(prompt) - 1) + sum(len(s.drafted) + 1 for s in res.steps)
        accepted += stats.accepted
    # The input-grounded prompts are copied from: real speculation happened (the adaptive gate
    # verifies less of what it finds, because batches are expensive on this CPU).
    assert accepted > (0 if adaptive else 20)


def test_ngram_greedy_identical_on_gemma(gemma: Model) -> None:
    texts = [p.text for p in bench_prompts.PROMPTS][:2] + ["The history of the Roman Empire"]
    for text in texts:
        prompt = gemma.tokenize(text, add_special=True, parse_special=True)
        base = baseline(gemma, prompt, 32)
        cfg = GenerateOptions(max_tokens=32, draft_max=8, adaptive=True)
        res = generate(gemma, compose(NgramDrafter(1, 3), cfg), prompt, cfg)
        assert res.token_ids == base, text[:40]


def test_adaptive_k_and_p_min_with_the_draft_model_stay_identical(smol: Model, smol_q2k: Model) -> None:
    prompt = chat_tokens(smol, PROMPTS[2])
    base = baseline(smol, prompt, 48)
    cfg = GenerateOptions(max_tokens=48, draft_max=6, draft_min=1, adaptive=True, draft_p_min=0.6)
    res = generate(smol, compose(ModelDrafter(smol_q2k, cfg.draft_p_min), cfg), prompt, cfg)
    assert res.token_ids == base
    ks = [s.k for s in res.steps]
    assert len(set(ks)) > 1, "the schedule never moved K"
    assert all(1 <= k <= 6 for k in ks)
    assert any(len(s.drafted) < s.k for s in res.steps), "p-min never cut a draft short"


def test_a_batch_row_changes_its_sequence_id_only_where_another_sequence_held_it() -> None:
    """LlamaBatch.fill with several sequences: a one-token part takes plain stores (host time), a longer one numpy;
    either way every row ends up holding its part's sequence id, whatever the row held before."""
    from specdec_cli.engine.llama_batch import LlamaBatch

    batch = LlamaBatch(native.bindings(), None, 8, 4, several=True)
    try:
        held = lambda: [batch.handle.seq_id[i][0] for i in range(8)]  # noqa: E731
        assert held() == [0] * 8
        batch.fill(0, 2, 10, [5, 6, 7], 1, 0, False)  # three rows of sequence 2
        batch.fill(3, 1, 4, [9], 1, 0, False)  # one row of sequence 1
        assert held()[:4] == [2, 2, 2, 1] and list(batch.token[:4]) == [5, 6, 7, 9]
        assert list(batch.pos[:4]) == [10, 11, 12, 4] and list(batch.wants[:4]) == [0, 0, 1, 1]
        batch.fill(0, 3, 0, [8], 1, 0, False)  # rows change hands: one token, then two over a row of each
        batch.fill(1, 1, 6, [4, 4], 0, 0, False)
        batch.fill(3, 1, 8, [1], 0, 0, False)  # already sequence 1's
        assert held()[:4] == [3, 1, 1, 1] and list(batch.seq[:4]) == [3, 1, 1, 1]
        assert list(batch.wants[:4]) == [1, 0, 0, 0]
    finally:
        batch.free()
