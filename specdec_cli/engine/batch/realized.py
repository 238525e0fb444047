"""How the batch's drafting steps really turned out, against what the planner predicted: its correction.

The planner predicts a drafting step's speedup over a plain one from estimates (acceptance by position,
batch costs by size), and picks the best of many plans: it picks the ones whose estimates came out high,
so even unbiased estimates overrate the plan chosen. It also leaves out what a step costs besides the
target's decode (its own Python, reading a row of logits per drafted token). On the F32 pair at two
slots, steps predicted 1.08-1.28x faster than a plain one ran 0.58-0.97x as fast (a dev script, one
process, rounds alternated), and auto served below --no-draft.

So each drafting step is measured, as every step is: its tokens per second of wall time over the plain
steps' at the same number of generating slots (their recent median), divided by the speedup it was
chosen for. The mean of those ratios (older ones decaying, `PRIOR_WEIGHT` of 1.0 beside them) scales
every drafting plan's value when the planner compares it with the plain step: where drafting keeps
falling short of its promise, only plans predicted to win by more are taken; where steps stop drafting,
the ratios decay and drafting is tried again. Never above 1: the correction makes the planner more
careful, never bolder. Steps with a prompt chunk beside them are priced differently (`Planner._value`)
and left out.
"""

from __future__ import annotations

import statistics

from specdec_cli.engine.estimates import RecentMedian

DECAY = 0.995  # per step at that slot count: the ratios remember about the last 200 steps
PRIOR_WEIGHT = 1.0  # a ratio of 1.0, worth this many drafting steps
PLAIN_SAMPLES = 3  # plain steps timed before drafting steps are compared with them
CLIP = 2.0  # one step's ratio is capped (a step that waited on something else)


class Realized:
    def __init__(self) -> None:
        self.plain: dict[int, RecentMedian] = {}  # wall seconds of recent plain steps, by generating slots
        self.ratios: dict[int, float] = {}  # sum of realized / predicted (decayed), by generating slots
        self.weights: dict[int, float] = {}  # how many (decayed)

    def plain_step(self, n_gen: int, seconds: float) -> None:
        ref = self.plain.get(n_gen)
        if ref is None:
            ref = self.plain[n_gen] = RecentMedian()
        ref.add(seconds)
        self._decay(n_gen)

    def drafting_step(self, n_gen: int, tokens: int, seconds: float, predicted: float) -> None:
        """A step with drafts, no prompt chunk: `tokens` emitted in `seconds`, chosen for `predicted`."""
        ref = self.plain.get(n_gen)
        if ref is None or len(ref) < PLAIN_SAMPLES or seconds <= 0 or predicted <= 0:
            return
        plain_rate = n_gen / statistics.median(ref.values)
        ratio = min(tokens / seconds / plain_rate / predicted, CLIP)
        self._decay(n_gen)
        self.ratios[n_gen] = self.ratios.get(n_gen, 0.0) + ratio
        self.weights[n_gen] = self.weights.get(n_gen, 0.0) + 1.0

    def factor(self, n_gen: int) -> float:
        """What a drafting plan's predicted value is multiplied by, with `n_gen` slots generating."""
        w = self.weights.get(n_gen, 0.0)
        return min(1.0, (self.ratios.get(n_gen, 0.0) + PRIOR_WEIGHT) / (w + PRIOR_WEIGHT))

    def _decay(self, n_gen: int) -> None:
        if n_gen in self.weights:
            self.ratios[n_gen] *= DECAY
            self.weights[n_gen] *= DECAY
