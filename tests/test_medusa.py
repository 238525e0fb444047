"""The heads drafter (engine/drafters/medusa.py): guesses from the target's hidden state, verified like any draft.

On the fake (tests/fakes.py: its hidden state is a pure function of the same tokens as its logits) the loop's
plumbing, greedy identity, the sampled distribution (with a planted bug caught) and auto's pricing; on the
packaged models, greedy output identical to the target alone with llama.cpp's embeddings output on.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from specdec_cli.engine import heads as H
from specdec_cli.engine import sampling
from specdec_cli.engine.drafters import DraftRequest, NgramDrafter, Proposal
from specdec_cli.engine.drafters.auto import AutoDrafter, AutoState
from specdec_cli.engine.drafters.medusa import HeadsDrafter
from specdec_cli.engine.drafters.policies import compose
from specdec_cli.engine.estimates import BatchCosts
from specdec_cli.engine.model import Model
from specdec_cli.engine.settings import HEADS, GenerateOptions
from specdec_cli.engine.speculative import generate
from tests import distribution
from tests.fakes import FakeModel, greedy_reference


def random_heads(n_embd: int, subset: list[int], n_heads: int = 3, seed: int = 0) -> H.Heads:
    rng = np.random.default_rng(seed)
    out = rng.standard_normal((len(subset), n_embd)).astype(np.float32)
    heads = H.Heads.initial(n_heads, out, np.array(subset, np.int32), "fp")
    heads.w[:] = rng.standard_normal(heads.w.shape).astype(np.float32) * 0.5
    return heads


@pytest.mark.parametrize("adaptive", [True, False])
def test_greedy_output_is_the_targets_and_every_guess_comes_from_a_fresh_hidden_state(adaptive: bool) -> None:
    target = FakeModel(n_vocab=24, seed=3, window=1, call_cost=1.0, token_cost=0.05)
    prompt = [1, 2, 3, 4]
    cfg = GenerateOptions(max_tokens=120, draft_max=3, adaptive=adaptive)
    drafter = HeadsDrafter(_trained_heads(target, prompt))
    res = generate(target, compose(drafter, cfg), prompt, cfg)
    assert res.token_ids == greedy_reference(target, prompt, 120)[0]
    drafted = sum(len(s.drafted) for s in res.steps)
    accepted = sum(s.n_accepted for s in res.steps)
    assert res.steps[0].drafted == ()  # no hidden state before the first verification
    assert drafted > 0 and 0 < accepted <= drafted
    assert all(s.drafter == HEADS for s in res.steps if s.drafted)
    # the prefill went in without hidden states (every token an output would cost it), every step with them
    assert target.hidden_calls == len(res.steps) and not target.hidden_on


def test_a_guess_is_what_the_heads_read_from_the_row_that_gave_the_last_token() -> None:
    target = FakeModel(n_vocab=24, seed=5)
    heads = random_heads(target.n_embd, list(range(24)))
    drafter = HeadsDrafter(heads)
    seen: list[tuple[list[int], list[int]]] = []
    real = drafter.propose

    def spy(req: DraftRequest) -> Proposal:
        p = real(req)
        seen.append((list(req.context), p.tokens))
        return p

    drafter.propose = spy  # type: ignore[method-assign]
    cfg = GenerateOptions(max_tokens=40, draft_max=3, adaptive=False)
    generate(target, drafter, [7, 8, 9], cfg)
    checked = 0
    for context, tokens in seen[1:]:
        expect = heads.guess(target.hidden_after(context[:-1]), 3)  # the state whose logits gave context[-1]
        assert tokens == expect[: len(tokens)], context
        checked += 1
    assert checked > 5


def test_sampled_tokens_follow_target_distribution_with_heads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Heads that always guess the target's most likely second token (a subset of one): accepted with p(x),
    else resampled from p without x. Position 2 is drafted by the heads at every sample."""
    target = FakeModel(n_vocab=40, seed=11, n_ctx=64)
    prompt = [3, 5, 7]
    p1 = sampling.process(target.logits_after(prompt), distribution.SAMPLER)
    mode = int(p1.ids[np.argmax(p1.probs)])
    p2 = sampling.process(target.logits_after([*prompt, mode]), distribution.SAMPLER)
    second = int(p2.ids[np.argmax(p2.probs)])
    heads = random_heads(target.n_embd, [second], n_heads=2)

    def run() -> list[distribution.ChiSquare]:
        first: Counter[int] = Counter()
        after: Counter[int] = Counter()
        for seed in range(1500):
            cfg = GenerateOptions(adaptive=False, max_tokens=3, draft_max=2, **vars(distribution.SAMPLER), seed=seed)
            target.rollback(0)
            ids = generate(target, HeadsDrafter(heads), prompt, cfg).token_ids
            first[ids[0]] += 1
            if ids[0] == mode:
                after[ids[1]] += 1
        d1 = {int(i): float(p) for i, p in zip(p1.ids, p1.probs, strict=True)}
        d2 = {int(i): float(p) for i, p in zip(p2.ids, p2.probs, strict=True)}
        return [distribution.chi_square(first, d1, 1), distribution.chi_square(after, d2, 2)]

    for r in run():
        assert r.n >= 200 and r.pvalue > distribution.P_THRESHOLD, r
    monkeypatch.setattr(sampling, "residual", lambda p, q: p)  # the planted bug is caught
    assert min(r.pvalue for r in run()) < distribution.P_THRESHOLD


class _Frozen(BatchCosts):
    def observe(self, batch: int, seconds: float) -> None:
        pass


def _auto(target: FakeModel, heads: H.Heads | None, verify_cost: float) -> AutoDrafter:
    state = AutoState(costs=_Frozen({b: 1 + verify_cost * (b - 1) for b in range(1, 10)}, 1.0))
    lookup = NgramDrafter(1000, 1000)  # a lookup that never matches here: the heads or plain decodes
    return AutoDrafter(lookup, None, 8, state, heads=None if heads is None else HeadsDrafter(heads))


def _trained_heads(target: FakeModel, prompt: list[int]) -> H.Heads:
    """Heads trained on the fake's own greedy text: they learn to guess it."""
    text = prompt + greedy_reference(target, prompt, 400)[0]
    hidden = np.stack([target.hidden_after(text[: i + 1]) for i in range(len(text))])
    labels = H.targets_for(np.array(text), 2)
    subset = H.choose_subset(labels[0], 24)
    rng = np.random.default_rng(0)
    heads = H.Heads.initial(2, rng.standard_normal((subset.size, target.n_embd)).astype(np.float32) * 0.1, subset, "fp")
    H.train(heads, hidden, labels, epochs=60)
    return heads


def test_auto_verifies_the_heads_where_they_pay_and_not_where_they_cannot() -> None:
    target = FakeModel(n_vocab=24, seed=3, window=1)
    prompt = [1, 2]
    heads = _trained_heads(target, prompt)
    reference = greedy_reference(target, prompt, 200)[0]
    cheap = _auto(target, heads, 0.05)  # verifying a token more costs 0.05 of a decode: good guesses pay
    res = generate(target, cheap, prompt, GenerateOptions(max_tokens=200))
    assert res.token_ids == reference
    assert sum(s.n_accepted for s in res.steps if s.drafter == HEADS) > 50
    dear = _auto(target, heads, 1.0)  # a batch of b costs b decodes: no draft can pay
    target.rollback(0)
    res = generate(target, dear, prompt, GenerateOptions(max_tokens=200))
    assert res.token_ids == reference
    assert not any(s.drafted for s in res.steps)


def test_greedy_output_is_the_targets_on_the_packaged_models(smol: Model, gemma: Model) -> None:
    """llama.cpp's embeddings output on for every verification batch: the logits are the target's own."""
    for model in (smol, gemma):
        prompt = model.tokenize("The history of the Roman Empire begins", add_special=True, parse_special=False)
        model.reset()
        base = generate(model, None, prompt, GenerateOptions(max_tokens=40)).token_ids
        subset = np.array(sorted(set(base)) + [int(t) for t in prompt], np.int32)
        heads = H.Heads.initial(3, H.output_rows(model.path, subset), subset, "fp")
        for drafter in (compose(HeadsDrafter(heads), GenerateOptions()), HeadsDrafter(heads)):
            model.reset()
            res = generate(model, drafter, prompt, GenerateOptions(max_tokens=40, draft_max=3, adaptive=False))
            assert res.token_ids == base, model.name
        assert sum(len(s.drafted) for s in res.steps) > 0
        model.reset()




def _fake_heads_file(tmp_path: Path, fingerprint: str | None = None) -> Path:
    from specdec_cli.engine.drafters.pool import vocab_fingerprint
    from specdec_cli.models import packaged
    from tests.fakes import FakeGGUF

    fake = FakeGGUF(packaged.smollm2_path())
    heads = random_heads(fake.n_embd, list(range(32, 127)), n_heads=3)
    heads.fingerprint = fingerprint or vocab_fingerprint(fake.vocab_info().texts)
    path = tmp_path / "fake.heads.gguf"
    heads.save(path)
    return path


def test_the_cli_runs_the_heads_and_refuses_a_missing_or_foreign_file(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    import json

    from typer.testing import CliRunner

    from specdec_cli.cli import app
    from specdec_cli.models import loading
    from tests.fakes import open_fake

    monkeypatch.setattr(loading, "OPENER", open_fake)
    monkeypatch.setenv("SPECDEC_CALIBRATE", "0")
    base = ["run", "Say hello.", "-n", "32", "--json", "--ctx-size", "1024"]
    alone = CliRunner().invoke(app, [*base, "--no-draft"])
    assert alone.exit_code == 0, alone.stderr
    good = _fake_heads_file(tmp_path)
    for drafter in ("heads", "auto"):
        res = CliRunner().invoke(app, [*base, "--drafter", drafter, "--heads", str(good)])
        assert res.exit_code == 0, res.stderr
        data = json.loads(res.stdout)
        assert data["token_ids"] == json.loads(alone.stdout)["token_ids"]
        assert data["models"]["heads"] == str(good) and data["settings"]["drafter"] == drafter
    assert json.loads(CliRunner().invoke(app, [*base, "--drafter", "heads", "--heads", str(good), "--fixed-k"])
                      .stdout)["stats"]["drafted"] > 0  # fmt: skip
    missing = CliRunner().invoke(app, [*base, "--drafter", "heads"])
    assert missing.exit_code == 2 and "needs --heads FILE" in missing.stderr
    (tmp_path / "x").mkdir()
    foreign = _fake_heads_file(tmp_path / "x", "another")
    for args in (["--heads", str(foreign)], ["--heads", str(tmp_path / "none.gguf")]):
        res = CliRunner().invoke(app, [*base, "--drafter", "heads", *args])
        assert res.exit_code == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert "Traceback" not in res.stderr


def test_concurrent_heads_requests_are_the_target_alone(tmp_path: Path, smol: Model) -> None:
    """Four slots in one batch with hidden states on (engine/batch/): each slot's guesses come from its own
    rows, prompt chunks move no row, and every request is the target's own greedy text, with fair slots off
    and on (their layouts found a filler-only sequence changing a later one's token while hidden states were
    on: no fillers then). The heads are fitted to these very answers (so that they pay and are verified)."""
    import threading

    from specdec_cli import api
    from specdec_cli.engine.drafters.pool import vocab_fingerprint

    prompts = ["Name three rivers.", "Count to ten in words.", "Write a line about the sea.", "Say hello.",
               "List the days of the week."]  # fmt: skip
    with api.load(smol.path, n_ctx=512, drafter=None) as solo:
        ids = [solo.tokenize(p).ids for p in prompts]
    alone = []
    for prompt in ids:
        smol.reset()
        alone.append(generate(smol, None, prompt, GenerateOptions(max_tokens=40)).token_ids)
    hidden, labels = [], []
    for prompt, answer in zip(ids, alone, strict=True):
        smol.reset()
        text = np.array(prompt + answer)
        hidden.append(H.decode_hidden(smol, list(text))[1])
        labels.append(H.targets_for(text, 3))
    smol.reset()
    h, lab = np.concatenate(hidden), np.concatenate(labels, axis=1)
    subset = H.choose_subset(lab[0], 4096)
    heads = H.Heads.initial(3, H.output_rows(smol.path, subset), subset, vocab_fingerprint(smol.vocab_info().texts))
    H.train(heads, h, lab, epochs=40)
    path = tmp_path / "h.gguf"
    heads.save(path)
    with api.load(smol.path, n_ctx=512, parallel=4, heads=path) as par:
        # Costs that do not learn, verification cheap: the plan verifies the guesses whatever the machine's load
        # (learned from a busy machine's batch times, it verified fewer: 15 accepted in one run beside a second
        # test process). The texts are the target's whatever the costs.
        par.batch_engine().state.costs = _Frozen({b: 1 + 0.1 * (b - 1) for b in range(1, 10)}, 1.0)

        def one(i: int, drafter: str, out: dict[int, api.Generation]) -> None:
            out[i] = par.generate(prompts[i], max_tokens=40, drafter=drafter)

        for drafter, fair in (("heads", False), ("auto", False), ("heads", True)):
            par.batch_engine().set_fair(fair)  # fair slots keep the heads' drafts off beside three streams
            out: dict[int, api.Generation] = {}
            threads = [threading.Thread(target=one, args=(i, drafter, out)) for i in range(len(prompts))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(300)
            for i in range(len(prompts)):
                assert out[i].token_ids == alone[i], (drafter, prompts[i])
            accepted = sum(g.stats.accepted for g in out.values())
            assert fair or accepted > 20, (drafter, accepted)


def test_the_cost_gate_skips_guesses_that_cost_time_and_do_not_pay() -> None:
    """`--drafter heads` where verifying costs as much as decoding: the gate verifies no guess, and guessing
    (half a target token here) is skipped as often as keeps it under auto.SHADOW_SHARE of the time."""
    from specdec_cli.engine.drafters.auto import SHADOW_SHARE
    from specdec_cli.engine.drafters.gate import CostGate
    from specdec_cli.engine.drafters.policies import CostGated
    from specdec_cli.engine.sampling import Dist, SamplerSettings

    class Slow:
        name, free, proposal_seconds, calls = HEADS, True, 0.5, 0

        def begin(self, prompt: object) -> None: ...

        def accept(self, outcome: object) -> None: ...

        def decode_seconds(self) -> float:
            return 0.0

        def propose(self, req: DraftRequest) -> Proposal:
            self.calls += 1
            return Proposal([1, 2], [Dist.point(1), Dist.point(2)], 2, HEADS)

    slow = Slow()
    gated = CostGated(slow, gate=CostGate(_Frozen({b: float(b) for b in range(1, 10)}, 1.0)))
    req = DraftRequest([0, 1, 2], 2, SamplerSettings(), np.random.default_rng(0), frozenset())
    assert all(gated.propose(req).tokens == [] for _ in range(100))
    assert slow.calls == math.ceil(100 / math.ceil(0.5 / SHADOW_SHARE))  # one guess in 25
