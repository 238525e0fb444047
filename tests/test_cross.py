"""Drafts with a different tokenizer (engine/drafters/cross.py): Gemma-3-270M target, SmolLM2-135M draft.

Greedy: the output is the target's alone, token for token, on prompts where the two
tokenizers split text differently, for K in {1, 3, 6}, and on a same-vocabulary pair
sent through the cross-tokenizer path. Sampling (token-level intersection): the
chi-square test at positions 1 and 2 (`python -m benchmarks.planted_bug --drafter
cross` shows it failing with q' left unnormalised).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from specdec_cli import pairs
from specdec_cli.cli import app
from specdec_cli.engine.drafters import DraftRequest
from specdec_cli.engine.drafters.cross import CrossDrafter, CrossVocab, complete_utf8
from specdec_cli.engine.model import Model
from specdec_cli.engine.settings import GenerateOptions
from specdec_cli.engine.speculative import SpeculativeGenerator, generate
from specdec_cli.engine.stats import Stats
from tests import distribution
from tests.conftest import THREADS

PROMPTS = {
    "code": "def fibonacci(n):\n    ",
    "CJK": "日本の首都は",
    "emoji": "Emoji story: 🌊",
    "prose": "The history of the Roman Empire began",
    "split words": "Antidisestablishmentarianism and floccinaucinihilipilification are",
    "numbers": "The first primes are 2, 3, 5, 7, 11,",
    "url": "See https://example.com/path?query=1&x=",
    "whitespace": "List:\n\n  - apples\n  - ",
}
N_TOKENS = 24
CROSS_PROMPT = "日本の首都は"  # less than half the draft's mass is in the intersection here: q' renormalisation matters


@pytest.fixture(scope="module")
def smol_draft(smol_path: Path) -> Iterator[Model]:
    m = Model(smol_path, n_ctx=1024, n_threads=THREADS)  # its own context: the `smol` fixture may be a target
    yield m
    m.close()


@pytest.fixture(scope="module")
def cross_vocab(gemma: Model, smol_draft: Model) -> CrossVocab:
    return CrossVocab.build(gemma, smol_draft)


def test_the_vocabularies_really_differ_and_share_most_draft_texts(gemma: Model, smol_draft: Model,
                                                                   cross_vocab: CrossVocab) -> None:  # fmt: skip
    assert gemma.n_vocab == 262_144 and smol_draft.n_vocab == 49_152
    assert 40_000 < cross_vocab.size < 49_152  # most SmolLM2 texts are single Gemma tokens, not all
    mapped = cross_vocab.draft_to_target
    d = int(np.flatnonzero(mapped >= 0)[100])
    assert gemma.token_text(int(mapped[d])) == smol_draft.token_text(d)


def test_greedy_identity_across_tokenizers(gemma: Model, smol_draft: Model, cross_vocab: CrossVocab) -> None:
    misses = drafted = 0
    for name, text in PROMPTS.items():
        prompt = gemma.tokenize(text, add_special=True, parse_special=False)
        alone = generate(gemma, None, prompt, GenerateOptions(adaptive=False, max_tokens=N_TOKENS)).token_ids
        assert len(alone) == N_TOKENS, name
        for k in (1, 3, 6):
            drafter = CrossDrafter(gemma, smol_draft, cross_vocab)
            gen = SpeculativeGenerator(gemma, drafter, prompt, GenerateOptions(adaptive=False, max_tokens=N_TOKENS, draft_max=k))
            stats = Stats.of(list(gen.events()))
            assert gen.result.token_ids == alone, (name, k)
            assert stats.accepted <= stats.drafted
            misses += drafter.boundary_misses
            drafted += stats.drafted
    assert drafted > 100  # drafts were really made and verified
    assert misses > 0  # and some were dropped at a boundary that re-tokenized differently


def test_greedy_identity_same_vocabulary_through_the_cross_path(smol: Model, smol_q2k: Model) -> None:
    vocab = CrossVocab.build(smol, smol_q2k)
    accepted = 0
    for text in list(PROMPTS.values())[:4]:
        prompt = smol.tokenize(text, add_special=True, parse_special=False)
        alone = generate(smol, None, prompt, GenerateOptions(adaptive=False, max_tokens=N_TOKENS)).token_ids
        for k in (1, 3, 6):
            drafter = CrossDrafter(smol, smol_q2k, vocab)
            gen = SpeculativeGenerator(smol, drafter, prompt, GenerateOptions(adaptive=False, max_tokens=N_TOKENS, draft_max=k))
            stats = Stats.of(list(gen.events()))
            assert gen.result.token_ids == alone, (text, k)
            accepted += stats.accepted
    assert accepted > 50


def test_a_boundary_that_retokenizes_differently_proposes_nothing(gemma: Model, smol_draft: Model,
                                                                 cross_vocab: CrossVocab) -> None:  # fmt: skip
    drafter = CrossDrafter(gemma, smol_draft, cross_vocab)
    # "Hello wor" + "ld": the target writes "Hello world" with " world", one token, so its " wor" would
    # have to be rewritten: the proposal is dropped, not spliced.
    context = gemma.tokenize("Hello wor", add_special=True, parse_special=False)
    assert gemma.token_text(context[-1]) == b" wor"
    assert drafter.to_target(context, smol_draft.tokenize("ld is big", add_special=False, parse_special=False)) == []
    assert drafter.boundary_misses == 1
    # At a clean boundary the same words come back as the target's own tokens.
    context = gemma.tokenize("Hello", add_special=True, parse_special=False)
    out = drafter.to_target(context, smol_draft.tokenize(" world is big", add_special=False, parse_special=False))
    assert out == gemma.tokenize(" world is big", add_special=False, parse_special=False)


def test_a_draft_cut_inside_a_character_is_held_back(gemma: Model, smol_draft: Model, cross_vocab: CrossVocab) -> None:
    assert complete_utf8("🌊".encode()[:3]) == b""
    assert complete_utf8(b"ab" + "é".encode()[:1]) == b"ab"
    drafter = CrossDrafter(gemma, smol_draft, cross_vocab)
    wave = smol_draft.tokenize(" 🌊", add_special=False, parse_special=False)
    assert len(wave) > 1  # SmolLM2 splits the emoji over byte-level tokens
    context = gemma.tokenize("Sea:", add_special=True, parse_special=False)
    assert drafter.to_target(context, wave[:-1]) == gemma.tokenize(" ", add_special=False, parse_special=False)


def test_sampled_drafts_come_from_the_intersection(gemma: Model, smol_draft: Model, cross_vocab: CrossVocab) -> None:
    drafter = CrossDrafter(gemma, smol_draft, cross_vocab)
    context = gemma.tokenize(distribution.PROMPT, add_special=True, parse_special=False)
    drafter.begin(context)
    req = DraftRequest(context, 4, distribution.SAMPLER, np.random.default_rng(0), gemma.eog_ids)
    proposal = drafter.propose(req)
    assert proposal.tokens
    inside = set(cross_vocab.draft_to_target[cross_vocab.draft_to_target >= 0].tolist())
    for tok, q in zip(proposal.tokens, proposal.dists, strict=True):
        assert tok in inside and set(q.ids.tolist()) <= inside
        assert abs(float(q.probs.sum()) - 1.0) < 1e-9  # q' renormalised over the intersection
        assert q.prob(tok) > 0


@pytest.mark.slow
def test_sampling_is_lossless_across_tokenizers(gemma: Model, smol_draft: Model, cross_vocab: CrossVocab) -> None:
    results = distribution.run(gemma, CrossDrafter(gemma, smol_draft, cross_vocab), 600, text=CROSS_PROMPT)
    for r in results:
        assert r.n >= 200, f"too few samples at position {r.position}: {r.n}"
        assert r.pvalue > distribution.P_THRESHOLD, r


# --------------------------------------------------------------- the commands
def test_pair_check_fourth_verdict(gemma_path: Path, smol_path: Path) -> None:
    res = CliRunner().invoke(app, ["pair-check", str(gemma_path), str(smol_path), "--json"])
    assert res.exit_code == 0, res.stderr
    import json

    data = json.loads(res.stdout)
    assert data["verdict"] == pairs.CROSS
    cross = data["cross"]
    assert cross["intersection"] > 40_000 and 0 < cross["probe_share"] < 1 and cross["modes"] == ["greedy", "sampling"]


def test_run_accepts_the_pair_and_says_so_once(gemma_path: Path, smol_path: Path) -> None:
    import json

    base = ["run", "--raw", PROMPTS["prose"], "--target", str(gemma_path), "-n", "16", "--json",
            "--ctx-size", "512", "--threads", str(THREADS)]  # fmt: skip
    res = CliRunner().invoke(app, [*base, "--draft", str(smol_path), "--drafter", "model"], env={"SPECDEC_CALIBRATE": "0"})
    assert res.exit_code == 0, res.stderr
    notes = [line for line in res.stderr.splitlines() if "different tokenizer" in line]
    assert len(notes) == 1 and notes[0].startswith("Note: ")
    alone = CliRunner().invoke(app, [*base, "--no-draft"])
    assert json.loads(res.stdout)["token_ids"] == json.loads(alone.stdout)["token_ids"]
    assert json.loads(res.stdout)["stats"]["drafted"] > 0


def test_api_auto_and_model_drafters_on_the_cross_pair(gemma_path: Path, smol_path: Path) -> None:
    """Through the API (which builds the cross drafter itself), greedy output is the target's for every drafter."""
    from specdec_cli import api

    with api.load(gemma_path, smol_path, n_ctx=512, n_threads=THREADS) as spec:
        assert spec.cross and any("different tokenizer" in n for n in spec.notes)
        outputs = {d: spec.generate(PROMPTS["prose"], chat=False, max_tokens=N_TOKENS, drafter=d)
                   for d in ("none", "model", "auto", "ngram")}  # fmt: skip
    alone = outputs.pop("none").token_ids
    for drafter, g in outputs.items():
        assert g.token_ids == alone, drafter
    assert outputs["model"].stats.drafted > 0
