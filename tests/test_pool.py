"""The token pool (engine/drafters/pool.py): longest match, frequency, growing drafts, a byte budget."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from specdec_cli import api
from specdec_cli.cli import app
from specdec_cli.engine.drafters import DraftRequest, NgramDrafter
from specdec_cli.engine.drafters.pool import BYTES_PER_TOKEN, TokenPool, vocab_fingerprint
from specdec_cli.engine.sampling import SamplerSettings
from specdec_cli.errors import PoolFileError
from tests.fakes import open_fake


def test_a_repeat_is_drafted_from_the_earlier_text() -> None:
    pool = TokenPool(n_min=2)
    pool.add([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert pool.propose([0, 1, 2, 3], 4) == ([4, 5, 6], 3)  # the match is [1, 2, 3]: at most 3 tokens
    assert pool.propose([7, 1, 2, 3, 4, 5], 8) == ([6, 7, 8, 9], 5)  # a longer match earns more; the text ends
    assert pool.propose([9, 9], 4) == ([], 0)


def test_the_draft_follows_the_majority_and_stops_where_they_disagree() -> None:
    pool = TokenPool(n_min=2)
    for tail in ([5, 6, 7], [5, 6, 7], [5, 6, 9]):
        pool.add([1, 2, 3, 4, *tail])
    assert pool.propose([1, 2, 3, 4], 8)[0] == [5, 6, 7]  # 7 by two of three (more than min_share)
    pool.add([1, 2, 3, 4, 5, 6, 9])
    assert pool.propose([1, 2, 3, 4], 8)[0] == [5, 6]  # two against two: no confidence past 6


def test_the_longest_match_wins_over_a_more_frequent_shorter_one() -> None:
    pool = TokenPool(n_min=2)
    for _ in range(3):
        pool.add([8, 2, 3, 40, 41])
    pool.add([7, 1, 2, 3, 50, 51])
    assert pool.propose([7, 1, 2, 3], 2) == ([50, 51], 4)


def test_no_match_crosses_two_texts() -> None:
    pool = TokenPool(n_min=2)
    pool.add([1, 2, 3])
    pool.add([4, 5, 6])
    assert pool.propose([1, 2], 4) == ([3], 2)  # the first text ends after 3: the draft does too
    assert pool.propose([2, 3], 4) == ([], 0)  # nothing ever followed [2, 3]


def test_the_budget_drops_the_oldest_texts_first() -> None:
    budget = 40 * BYTES_PER_TOKEN
    pool = TokenPool(budget, n_min=2)
    for i in range(20):
        pool.add([100 + i, 1, 2, 3, 200 + i])
        assert pool.bytes_used <= budget
    assert pool.evicted > 0
    assert pool.propose([119, 1, 2, 3], 4)[0] == [219]  # the newest is kept
    assert pool.propose([100, 1, 2, 3], 4)[0] != [200]  # the oldest is gone
    TokenPool(0).add([1, 2, 3, 4])  # a zero budget keeps nothing, and says nothing


def test_a_word_for_word_repeat_is_matched_on_the_whole_context() -> None:
    """A context that is an earlier text's beginning (a retried request) is matched on all of it, past
    n_max, and earns a draft as long as that; the same tokens inside or after other tokens do not."""
    text = list(range(100, 200))
    pool = TokenPool(n_min=2, n_max=8)
    pool.add([1, 2, 3])
    pool.add(text)
    assert pool.propose(text[:40], 64) == (text[40:80], 40)  # a draft as long as the match
    assert pool.propose(text[:70], 64) == (text[70:100], 70)  # ... until the earlier text ends
    assert pool.propose(text[10:50], 64) == (text[50:58], 8)  # the middle of a text: n_max
    assert pool.propose([7, *text[:40]], 64) == (text[40:48], 8)  # more than the earlier beginning
    assert pool.propose(text[:5], 3) == (text[5:8], 5)  # a context within n_max: its whole length too


texts = st.lists(st.lists(st.integers(0, 5), min_size=0, max_size=12), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(texts, st.lists(st.integers(0, 5), min_size=2, max_size=10), st.integers(1, 8))
def test_every_draft_is_a_continuation_of_the_match_in_some_text(pool_texts: list[list[int]], context: list[int],
                                                                    k: int) -> None:  # fmt: skip
    pool = TokenPool(n_min=2)
    for t in pool_texts:
        pool.add(t)
    draft, m = pool.propose(context, k)
    assert len(draft) <= k and (m == 0 or m >= 2)
    assert len(draft) <= max(m, 1)
    if draft:  # some kept text holds the matched context tail followed by the draft's first token
        tail = context[-m:]
        assert any(t[i : i + m + 1] == [*tail, draft[0]] for t in pool_texts for i in range(len(t))), (tail, draft)


# ------------------------------------------------------------- through the API (the fake model)
PROMPT = "Write a line about the sea."


@pytest.fixture
def no_calibration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEC_CALIBRATE", "0")


@pytest.mark.parametrize("drafter", ["ngram", "auto"])
def test_a_repeated_request_is_drafted_from_the_first(no_calibration: None, drafter: str) -> None:
    with api.load(open_model=open_fake, n_ctx=1024, drafter=drafter) as spec:
        first = spec.generate(PROMPT, max_tokens=64)
        assert spec.pool is not None and len(spec.pool) >= len(first.token_ids)
        again = spec.generate(PROMPT, max_tokens=64)
        assert again.token_ids == first.token_ids  # exact, drafts or not
        assert again.stats.accepted > first.stats.accepted
        assert again.stats.accepted >= len(first.token_ids) // 2, again.stats
    with api.load(open_model=open_fake, n_ctx=1024, drafter=drafter, pool_mb=0) as spec:
        assert spec.pool is None
        spec.generate(PROMPT, max_tokens=64)
        assert spec.generate(PROMPT, max_tokens=64).stats.accepted <= first.stats.accepted


@pytest.mark.parametrize("drafter", ["ngram", "auto"])
def test_what_long_matches_are_worth_is_remembered_across_requests(no_calibration: None, drafter: str) -> None:
    """Once repeats have come true, a later repeat drafts long from its first step (the acceptance of long
    pool matches is kept across texts, and --drafter ngram's gate across generations), not one token a
    step until its own proposals come true."""
    with api.load(open_model=open_fake, n_ctx=1024, drafter=drafter) as spec:
        for prompt in (PROMPT, PROMPT, "Tell me about the sea.", "Tell me about the sea."):
            last = spec.generate(prompt, max_tokens=64)
        first_steps = [len(s.drafted) for s in last.steps[:2]]
        assert min(first_steps) >= 4, [len(s.drafted) for s in last.steps]


@pytest.mark.parametrize("drafter", ["ngram", "auto"])
def test_a_word_for_word_repeat_drafts_past_16_and_stays_exact(no_calibration: None, drafter: str) -> None:
    """Once a retried request has come true, the next one is priced by its own table (REPEAT) and drafts up
    to 64 tokens a step, not the 16 a long match inside a changed text is worth."""
    with api.load(open_model=open_fake, n_ctx=1024, drafter=drafter) as spec:
        first = spec.generate(PROMPT, max_tokens=128)
        spec.generate(PROMPT, max_tokens=128)
        again = spec.generate(PROMPT, max_tokens=128)
        assert again.token_ids == first.token_ids
        drafted = [len(s.drafted) for s in again.steps]
        assert max(drafted) > 16 and len(drafted) <= 4, drafted


def test_a_repeat_so_far_is_priced_apart_from_long_matches() -> None:
    """A proposal matched on the whole context is priced by the REPEAT table (kept across texts); one
    matched on fewer tokens by LONG. Repeats that came true to their end are then drafted far, while long
    matches that broke after four tokens are drafted short."""
    from specdec_cli.engine.drafters.gate import LONG, REPEAT, CostGate
    from specdec_cli.engine.estimates import BatchCosts

    costs = {b: 1.0 + 0.14 * (b - 1) for b in range(2, 18)}  # the F32 target's shape: c(17) about 3.2
    gate = CostGate(BatchCosts(costs, 0.02))
    text = list(range(1000, 1300))
    for start in (40, 104, 168):  # a repeat's proposals, all right
        gate.propose(start, text[start : start + 64], pool_match=start)
        assert gate.shadow.regime == REPEAT
        gate.score(text[: start + 64])
    for start in (40, 60, 80):  # long matches in a changed text: right for 4 tokens
        gate.propose(start, [*text[start : start + 4], *range(16)], pool_match=32)
        assert gate.shadow.regime == LONG
        gate.score(text[: start + 20])
    gate.shadow.clear()  # a new text: both tables are kept
    gate.propose(50, text[50:114], pool_match=50)
    assert gate.choose(64) >= 48
    gate.propose(50, text[50:114], pool_match=32)
    assert gate.choose(64) <= 8


def test_long_pool_matches_are_priced_apart_and_kept_across_texts() -> None:
    from specdec_cli.engine.drafters.gate import HIT, LONG, ShadowScore

    shadow = ShadowScore()
    head = [9] * 20  # the context before: longer than the match (else the whole context repeats, REPEAT)
    shadow.propose(20, [1, 2, 3], pool_match=ShadowScore.LONG_MATCH)
    shadow.score([*head, 1, 2, 3])
    shadow.propose(23, [7, 8])  # a short match (the context's)
    assert shadow.acceptance is shadow.tables[HIT]  # priced by its own table
    shadow.score([*head, 1, 2, 3, 7, 0])
    assert shadow.tables[LONG].hits == [1.0, 1.0, 1.0]
    assert shadow.tables[HIT].hits == [1.0, 0.0]
    shadow.clear()  # a new text: in-context copying is mostly forgotten, long matches are not
    assert shadow.tables[LONG].hits == [1.0, 1.0, 1.0]
    assert shadow.tables[HIT].hits == [0.25, 0.0]
    pool = TokenPool()
    pool.add([5, 6, 1, 2, 3, 4])
    d = NgramDrafter(2, 4, pool=pool)
    req = DraftRequest([5, 6, 1, 2], 2, SamplerSettings(), np.random.default_rng(0), frozenset())
    d.begin(req.context)
    assert d.propose(req).pool_match == 4  # the proposal says which pool match it continues


def test_long_matches_share_one_table_after_a_hit_or_a_miss_and_start_trusted() -> None:
    """A long pool match is priced by one table whatever the latest first token was (its drafts come true
    after a miss as after a hit), and before any is scored that table trusts them more than in-context
    copying is trusted: with batches that cost little more than a token, the first long draft of a
    workload is verified far, a short one of the same length is not."""
    from specdec_cli.engine.drafters.gate import LONG, MISS, CostGate, ShadowScore
    from specdec_cli.engine.estimates import BatchCosts

    shadow = ShadowScore()
    head = [9] * 20  # the context before: longer than the match (else the whole context repeats, REPEAT)
    shadow.propose(20, [7, 8])  # a short match, then its first token turns out wrong: the next comes after a miss
    shadow.score([*head, 1, 2])
    assert not shadow.last_ok
    shadow.propose(22, [3, 4], pool_match=ShadowScore.LONG_MATCH)
    assert shadow.acceptance is shadow.tables[LONG]
    shadow.propose(22, [3, 4])
    assert shadow.acceptance is shadow.tables[MISS]

    cheap = {b: 1.0 + 0.12 * (b - 1) for b in range(2, 18)}  # the F32 target's shape: c(17) about 3
    draft = list(range(16))
    long_gate, short_gate = CostGate(BatchCosts(cheap, 0.02)), CostGate(BatchCosts(cheap, 0.02))
    long_gate.propose(20, draft, pool_match=ShadowScore.LONG_MATCH)
    short_gate.propose(20, draft, pool_match=ShadowScore.LONG_MATCH - 1)
    assert long_gate.choose(16) >= 4 > short_gate.choose(16)


def test_a_seeded_sampled_run_does_not_depend_on_the_pool(no_calibration: None) -> None:
    """Its text must depend on the seed alone: what earlier requests left in the pool must not change it."""
    with api.load(open_model=open_fake, n_ctx=1024, drafter="ngram") as spec:
        kw = {"max_tokens": 48, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 5}
        a = spec.generate(PROMPT, **kw)
        spec.generate(PROMPT, max_tokens=48)
        b = spec.generate(PROMPT, **kw)
        assert a.token_ids == b.token_ids


def test_pool_mb_is_checked(no_calibration: None) -> None:
    with pytest.raises(ValueError, match="^pool_mb must be a number of megabytes"):
        api.load(open_model=open_fake, pool_mb=-1)


def test_the_n_gram_drafter_prefers_the_longer_match() -> None:
    pool = TokenPool(n_min=2)
    pool.add([9, 8, 7, 1, 2, 3, 4, 5, 6])
    d = NgramDrafter(2, 4, pool=pool)
    d.begin([1, 2, 30, 9, 8, 7, 1, 2])
    d.sync([1, 2, 30, 9, 8, 7, 1, 2])
    assert d.match(4) == ([30, 9, 8, 7], 2)  # the context's own match: [1, 2]
    assert pool.propose([1, 2, 30, 9, 8, 7, 1, 2], 4) == ([3, 4, 5, 6], 5)  # the pool's: [9, 8, 7, 1, 2]


# ------------------------------------------------------------- kept across runs (--ngram-cache)
FP = vocab_fingerprint([b"a", b"b", b"c"])


def test_a_saved_pool_drafts_the_same_after_loading(tmp_path: Path) -> None:
    pool = TokenPool(n_min=2)
    for t in ([1, 2, 3, 4, 5], [7, 1, 2, 3, 9], [1, 2, 3, 4, 6]):
        pool.add(t)
    pool.save(tmp_path / "p.pool", FP)
    again = TokenPool(n_min=2)
    assert again.load(tmp_path / "p.pool", FP) == 15
    for context in ([1, 2, 3], [7, 1, 2, 3], [0, 1, 2]):
        assert again.propose(context, 4) == pool.propose(context, 4)


def test_a_damaged_or_foreign_file_is_one_clear_error(tmp_path: Path) -> None:
    pool = TokenPool(n_min=2)
    pool.add([1, 2, 3, 4])
    pool.save(tmp_path / "p.pool", FP)
    with pytest.raises(PoolFileError, match="another vocabulary"):
        TokenPool().load(tmp_path / "p.pool", vocab_fingerprint([b"x"]))
    bad = TokenPool(n_min=2)
    bad.add([1, 2, 99])
    bad.save(tmp_path / "ids.pool", FP)  # the right vocabulary, but an id past its 3 tokens
    with pytest.raises(PoolFileError, match="holds a token id outside the vocabulary"):
        TokenPool().load(tmp_path / "ids.pool", FP, n_vocab=3)
    data = (tmp_path / "p.pool").read_bytes()
    for name, content in [("cut", data[: len(data) // 2]), ("junk", b"not a pool at all"), ("empty", b"")]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(PoolFileError, match="is not a specdec token pool, or is damaged"):
            TokenPool().load(tmp_path / name, FP)


KILLED_SAVER = """
import sys
from specdec_cli.engine.drafters.pool import TokenPool
pool = TokenPool(1 << 30)
for i in range(400):
    pool.add([i % 7, 1, 2, 3] * 250)
print("saving", flush=True)
while True:
    pool.save(sys.argv[1], sys.argv[2])
"""


@pytest.mark.slow
def test_a_kill_during_save_leaves_a_pool_that_loads(tmp_path: Path) -> None:
    """SIGKILL at several moments of a save loop: the file is always the old pool or the new, whole."""
    path = tmp_path / "p.pool"
    small = TokenPool()
    small.add([5, 6, 7, 8])
    small.save(path, FP)
    for delay in (0.05, 0.2, 0.5, 0.9):
        proc = subprocess.Popen([sys.executable, "-c", KILLED_SAVER, str(path), FP], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "saving"
        time.sleep(delay)
        proc.kill()
        proc.wait(10)
        n = TokenPool(1 << 30).load(path, FP)
        assert n in (4, 400 * 1000), n
    assert not [p for p in tmp_path.iterdir() if p.name != "p.pool" and not p.name.endswith(".tmp")]


def test_a_save_removes_what_killed_saves_left_behind(tmp_path: Path) -> None:
    path = tmp_path / "p.pool"
    stale, fresh = tmp_path / ".p.pool.abc123.tmp", tmp_path / ".p.pool.def456.tmp"  # as mkstemp names them
    other = tmp_path / ".q.pool.abc123.tmp"  # another pool's
    for f in (stale, fresh, other):
        f.write_bytes(b"partial")
    old = time.time() - 3600
    for f in (stale, other):
        os.utime(f, (old, old))
    pool = TokenPool()
    pool.add([5, 6, 7, 8])
    pool.save(path, FP)
    assert not stale.exists()  # a killed save's leftover
    assert fresh.exists() and other.exists()  # perhaps another process's save in progress; not this file's
    assert TokenPool().load(path, FP) == 4


def test_the_api_keeps_the_pool_across_loads(no_calibration: None, tmp_path: Path) -> None:
    cache = tmp_path / "pool.bin"
    with api.load(open_model=open_fake, n_ctx=1024, drafter="ngram", ngram_cache=cache) as spec:
        first = spec.generate(PROMPT, max_tokens=64)
    assert cache.exists()
    with api.load(open_model=open_fake, n_ctx=1024, drafter="ngram", ngram_cache=cache) as spec:
        assert spec.pool is not None and len(spec.pool) > len(first.token_ids)
        again = spec.generate(PROMPT, max_tokens=64)  # a new process's first ask is a repeat
    assert again.token_ids == first.token_ids
    assert again.stats.accepted >= len(first.token_ids) // 2
    with pytest.raises(PoolFileError, match="another vocabulary"), api.load(
        open_model=lambda p, **kw: _other_vocab(open_fake(p, **kw)), n_ctx=1024, ngram_cache=cache
    ):
        pass


def _other_vocab(model: Any) -> Any:
    real = model.vocab_info

    def vocab_info() -> Any:
        return dataclasses.replace(real(), texts=(b"other", *real().texts[1:]))

    model.vocab_info = vocab_info
    return model


def test_the_cli_keeps_the_pool_across_runs(no_calibration: None, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from specdec_cli.models import loading

    monkeypatch.setattr(loading, "OPENER", open_fake)
    cache = tmp_path / "pool.bin"
    args = ["run", PROMPT, "-n", "48", "--json", "--drafter", "ngram", "--ctx-size", "1024", "--ngram-cache", str(cache)]
    runs = [json.loads(CliRunner().invoke(app, args).stdout) for _ in range(2)]
    assert runs[0]["text"] == runs[1]["text"]
    assert runs[1]["stats"]["accepted"] > runs[0]["stats"]["accepted"]
    (tmp_path / "junk").write_bytes(b"junk")
    res = CliRunner().invoke(app, [*args[:-1], str(tmp_path / "junk")])
    assert res.exit_code == 1 and res.stderr.startswith("Error: ") and "damaged" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_a_pool_built_from_a_folder_drafts_its_text(no_calibration: None, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """`specdec ngram-cache build`: the folder's text, in the target's tokens, ready for --ngram-cache."""
    from specdec_cli.models import loading

    monkeypatch.setattr(loading, "OPENER", open_fake)
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "a.md").write_text("the quick brown fox jumps over the lazy dog\n")
    (corpus / "sub" / "b.py").write_text("def add(a, b):\n    return a + b\n")
    (corpus / "c.bin").write_bytes(b"\xff\xfe")  # not a text suffix: not read
    (corpus / "d.txt").write_bytes(b"\xff\xfe not utf-8")
    res = CliRunner().invoke(app, ["ngram-cache", "build", str(tmp_path / "p.pool"), "--from", str(corpus), "--json"])
    assert res.exit_code == 0, res.stderr
    info = json.loads(res.stdout)
    assert (info["files"], info["skipped"]) == (2, 1) and info["tokens"] > 40
    with api.load(open_model=open_fake, n_ctx=512, ngram_cache=tmp_path / "p.pool") as spec:
        assert spec.pool is not None
        assert spec.pool.propose(list(b"the quick brown"), 8)[0] == list(b" fox jum")
    bad = CliRunner().invoke(app, ["ngram-cache", "build", str(tmp_path / "p.pool"), "--from", str(tmp_path / "nope")])
    assert bad.exit_code == 2 and bad.stderr.strip() == f"Error: --from {tmp_path / 'nope'}: not a folder"
