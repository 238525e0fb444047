"""Show that the sampling distribution test can fail: plant the classic bug and run it.

    .venv/bin/python -m benchmarks.planted_bug [-n 1200] [--drafter model|ngram|auto]  (auto: with token-pool drafts in the mix)

Runs tests/distribution.py's chi-square harness twice on the real models: once
with the engine as it is, once with the residual replaced by p itself (resampling
from p instead of normalise(max(0, p - q)) after a rejection). Prints both
p-values; the bugged engine must land below the test's threshold.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from benchmarks import record
from specdec_cli.engine import sampling
from specdec_cli.engine.drafters import Drafter, ModelDrafter, NgramDrafter
from specdec_cli.engine.model import Model
from specdec_cli.models import packaged
from tests import distribution


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", "--samples", type=int, default=1200)
    ap.add_argument("--drafter", choices=("model", "ngram", "auto", "cross"), default="model")
    record.add_option(ap)
    args = ap.parse_args()
    if args.drafter == "cross":
        return cross(args)
    target_path = packaged.smollm2_path()
    target = Model(target_path, n_ctx=512, n_threads=2)
    drafter: Drafter
    if args.drafter == "model":
        drafter, text = (
            ModelDrafter(Model(packaged.derived_draft(target_path, "Q2_K"), n_ctx=512, n_threads=2)),
            distribution.PROMPT,
        )
    elif args.drafter == "ngram":
        drafter, text = NgramDrafter(2, 4), distribution.NGRAM_PROMPT
    else:
        drafter, text = auto_drafter(target, Model(packaged.derived_draft(target_path, "Q2_K"), n_ctx=512, n_threads=2))
    ok = distribution.run(target, drafter, args.samples, text=text)
    real_residual = sampling.residual
    sampling.residual = lambda p, q: p  # the planted bug
    try:
        bad = distribution.run(target, drafter, args.samples, text=text)
    finally:
        sampling.residual = real_residual
    files = {"target": target_path, "draft": None if args.drafter == "ngram" else packaged.derived_draft(target_path, "Q2_K")}
    return report(args, files, ("correct residual", ok), ("planted bug (resample from p)", bad))


def auto_drafter(target: Model, draft: Model) -> tuple[Drafter, str]:
    """The auto drafter switching between the draft model and the n-gram lookup with a token pool
    (tests/test_distribution.py's fake-model test, here on the real models): verification cheap, a draft
    token at 0.35 target tokens. The pool holds the prompt and 8 tokens the target sampled after it (the
    first one not its most likely), so its match (the whole prompt) beats the context's and it drafts at
    the first step, other tokens than the context's lookup would."""
    import numpy as np

    from specdec_cli.engine.drafters.auto import AutoDrafter, AutoState
    from specdec_cli.engine.drafters.pool import TokenPool
    from specdec_cli.engine.estimates import BatchCosts

    earlier, rng = target.tokenize(distribution.NGRAM_PROMPT, add_special=True, parse_special=True), np.random.default_rng(0)
    for i in range(8):
        dist = distribution.target_dist(target, earlier)
        if i == 0:  # an earlier text that went another way than the context's lookup (" cat") proposes
            del dist[max(dist, key=lambda t: dist[t])]
        earlier.append(int(rng.choice(list(dist), p=np.array(list(dist.values())) / sum(dist.values()))))
    pool = TokenPool()
    pool.add(earlier)

    class Frozen(BatchCosts):
        def observe(self, batch: int, seconds: float) -> None:
            pass

    class Auto(AutoDrafter):
        def propose(self, req):  # type: ignore[no-untyped-def]
            self.state.draft_token_seconds = 0.35
            return super().propose(req)

    state = AutoState(costs=Frozen({b: 1 + 0.1 * (b - 1) for b in range(1, 10)}, 1.0))
    state.draft_token_seconds = 0.35
    return Auto(NgramDrafter(2, 4, pool=pool), ModelDrafter(draft, window=64), 2, state), distribution.NGRAM_PROMPT


def report(args: argparse.Namespace, files: Mapping[str, Any], *runs: tuple[str, list[distribution.ChiSquare]]) -> int:
    """Print each chi-square result and write the results file; exit 0 only when the second (planted-bug) run
    fails the test."""
    for label, rs in runs:
        for r in rs:
            verdict = "pass" if r.pvalue > distribution.P_THRESHOLD else "FAIL"
            print(f"{label:34s} position {r.position}: n={r.n:5d} bins={r.bins:3d} p={r.pvalue:.3g} -> {verdict}")
    caught = any(r.pvalue <= distribution.P_THRESHOLD for r in runs[-1][1])
    print("the test catches the planted bug" if caught else "the test MISSES the planted bug")
    record.save(args, "planted-bug", threads=2, models=files, data={
        "settings": {"drafter": args.drafter, "samples": args.samples, "p_threshold": distribution.P_THRESHOLD},
        "runs": [{"engine": label, "position": r.position, "n": r.n, "bins": r.bins, "pvalue": r.pvalue}
                 for label, rs in runs for r in rs], "caught": caught})  # fmt: skip
    return 0 if caught else 1


def cross(args: argparse.Namespace) -> int:
    """Token-level intersection (Gemma target, SmolLM2 draft); the planted bug: q' not renormalised."""
    from specdec_cli.engine.drafters.cross import CrossDrafter, CrossVocab

    target = Model(packaged.gemma3_path(), n_ctx=512, n_threads=2)
    draft = Model(packaged.smollm2_path(), n_ctx=512, n_threads=2)
    vocab = CrossVocab.build(target, draft)
    from tests.test_cross import CROSS_PROMPT

    ok = distribution.run(target, CrossDrafter(target, draft, vocab), args.samples, text=CROSS_PROMPT)
    bad = distribution.run(target, CrossDrafter(target, draft, vocab, renormalise=False), args.samples, text=CROSS_PROMPT)
    files = {"target": packaged.gemma3_path(), "draft": packaged.smollm2_path()}
    return report(args, files, ("q' renormalised", ok), ("planted bug (q' not renormalised)", bad))


if __name__ == "__main__":
    sys.exit(main())
