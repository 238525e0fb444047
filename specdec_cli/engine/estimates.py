"""What the speedup model needs, learned while generating: acceptance by position and batch costs.

The speedup of one step over a plain one-token decode (docs/design.md, "The speedup model"):

    E(K) / (K c_d + c_v(K+1)),   E(K) = 1 + sum_{i<=K} P(the first i drafted tokens are accepted)

with c_d the draft's cost per token and c_v(b) the cost of verifying a batch of b
tokens, both in units of one single-token target decode. `Acceptance` estimates
the P(...) terms, `BatchCosts` the c_v(b), from what the run measures; the
auto drafter and the n-gram cost gate both decide with them, and only from the
past, so greedy output and the sampled distribution stay the target's.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping

DECAY = 0.97  # weight of older observations, per observation
PRIOR_MARGINAL = 0.3  # assumed cost of each extra token in a batch, before any is measured or calibrated


class Acceptance:
    """Conditional acceptance by position: P(position i accepted | every earlier one was).

    Estimates are smoothed with weight `weight` (in observations), position 0
    towards `prior` and each later position towards the one before it, and older
    observations decay, so a drafter that stops matching the text is
    noticed within a few dozen steps.
    """

    def __init__(self, prior: float = 0.5, weight: float = 2.0, decay: float = DECAY, unseen: float = 1.0) -> None:
        self.prior, self.weight, self.decay = prior, weight, decay
        # A position no proposal has reached yet is assumed `unseen` times as good as the one before it
        # (1.0: as good). Below 1, a draft can only grow a few positions past what was seen: see _extend.
        self.unseen = unseen
        self.tries: list[float] = []  # tries[i]: proposals that reached position i + 1
        self.hits: list[float] = []  # hits[i]: ... and were accepted there
        self.n = 0  # observations, undecayed
        # rates, P(first i accepted) and their running sums by position, extended as asked and dropped
        # when an observation changes them: the batch planner prices every draft length of every slot
        # each step, and recomputing each from position 0 cost it milliseconds a step
        self._r: list[float] = []
        self._p: list[float] = []
        self._sum: list[float] = [0.0]

    def rate(self, i: int) -> float:
        return self._rates(i + 1)[i]

    def _extend(self, n: int) -> None:
        """Each position is smoothed towards the one before it (position 0 towards `prior`): a
        position rarely reached because K stayed short is assumed to behave like the last one
        measured, so K can grow when drafts are good; with `unseen` below 1, one never reached (fewer
        than one try, after decay) a little worse, so K grows a few positions past the evidence at a time."""
        r, p, acc = self._r, self._p, self._sum
        prior = r[-1] if r else self.prior
        for i in range(len(r), n):
            t = self.tries[i] if i < len(self.tries) else 0.0
            h = self.hits[i] if i < len(self.hits) else 0.0
            if t < 1.0 and i:
                prior *= self.unseen ** (1.0 - t)
            prior = (h + prior * self.weight) / (t + self.weight)
            r.append(prior)
            p.append((p[-1] if p else 1.0) * prior)
            acc.append(acc[-1] + p[-1])

    def _changed(self) -> None:
        self._r, self._p, self._sum = [], [], [0.0]

    def _rates(self, n: int) -> list[float]:
        """Rates for positions 0..n-1."""
        self._extend(n)
        return self._r[:n]

    def p_run(self, n: int) -> list[float]:
        """P(the first i tokens are accepted), i = 1..n."""
        self._extend(n)
        return self._p[:n]

    def expected(self, k: int) -> float:
        """E(k): tokens a step that verifies k drafted tokens emits, on average."""
        self._extend(k)
        return 1.0 + self._sum[max(k, 0)]

    def forget(self, keep: float) -> None:
        """Weigh everything seen so far by `keep` (a new text: its own evidence should dominate soon)."""
        self.tries = [t * keep for t in self.tries]
        self.hits = [h * keep for h in self.hits]
        self._changed()

    def observe(self, n_proposed: int, n_accepted: int) -> None:
        """A proposal of n tokens whose first n_accepted were right (positions past the first miss were not reached)."""
        n = min(n_proposed, n_accepted + 1)
        if n <= 0:
            return
        self.begin_proposal()
        for i in range(n):
            self.record(i, i < n_accepted)

    def begin_proposal(self) -> None:
        """A new proposal is about to be recorded, position by position: older ones weigh less."""
        self.tries = [t * self.decay for t in self.tries]
        self.hits = [h * self.decay for h in self.hits]
        self.n += 1
        self._changed()

    def record(self, i: int, hit: bool) -> None:
        """Position i of the current proposal (every earlier one right) was reached: right or wrong."""
        while len(self.tries) <= i:
            self.tries.append(0.0)
            self.hits.append(0.0)
        self.tries[i] += 1.0
        if hit:
            self.hits[i] += 1.0
        self._changed()


class RecentMedian:
    """The median of the last `window` values: one slow outlier moves it little, unlike a moving average."""

    def __init__(self, window: int = 15) -> None:
        self.values: deque[float] = deque(maxlen=window)

    def add(self, x: float) -> float:
        """Add a value; the median of the window. Called every step (a plain one too): sorted() on the few
        values, not statistics.median's checks."""
        self.values.append(x)
        s = sorted(self.values)
        n = len(s)
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2

    def __len__(self) -> int:
        return len(self.values)


class BatchCosts:
    """c_v(b): seconds to decode a batch of b tokens (logits at every row) over seconds for one.

    Each size keeps the median of its last `WINDOW` timings, not a moving
    average: one slow single-token decode (a noisy neighbour, a frequency dip)
    must not make batches look cheap. That was the n-gram gate's open-ended
    loss: an inflated one-token time made verification look nearly free, the
    gate then verified every step, so no plain decode ever corrected the figure.
    A size is trusted after `MIN_SAMPLES` timings. Sizes not measured yet follow
    the calibration (`prior`, relative costs) scaled by how the measured sizes
    compare with it (a calibration taken on a busier or quieter machine only
    gives the shape; not when `interpolate`, see `_build`), else the mean marginal cost of the sizes known, else
    `PRIOR_MARGINAL`. Costs never fall as the batch grows, and where measurements say they do (noise), a
    token more still costs `MIN_RISE` of the mean marginal cost: a flat stretch would price drafts as free.

    Every size is relative to one single-token decode *now*: measured, else the one the measured sizes imply
    through the calibration's shape (`one`). A parallel server rarely decodes one token alone; relative to the
    calibrated one-token time, batches measured on a machine slower than at calibration looked dear beside
    the calibrated small ones: at 8 slots (F32 pair) batches of 8 to 13 were all priced at 3.25 (measured 8,
    interpolated 9-12, a noisy 13 floored), so 5 drafted tokens looked free, and two passes of 3 and 4 tokens
    (1.46 + 1.82, calibrated) as cheap as one of 8 with a filler.
    """

    WINDOW = 15
    MIN_SAMPLES = 3
    MIN_RISE = 0.5
    SETTLED = 0.01  # a size's median is updated (and the table rebuilt) when it moves by more than this

    def __init__(
        self, prior: Mapping[int, float] | None = None, prior_one: float | None = None, interpolate: bool = False
    ) -> None:
        self.prior = dict(prior or {})
        self.prior_one = prior_one
        # True where sizes are known sparsely (a parallel server's calibration): a size between two
        # known ones is interpolated between them rather than priced by the mean marginal cost.
        self.interpolate = interpolate
        self.samples: dict[int, RecentMedian] = {}
        self._medians: dict[int, float] = {}
        self._relative: dict[int, float] = {}  # cleared when a median moves (`observe`)
        self._one: float | None = None  # `one` where no single-token decode is measured; cleared likewise
        self._span = 9  # sizes the table covers when rebuilt
        self.version = 0  # counts the changes to the prices: what is computed from them may be kept till then

    def observe(self, batch: int, seconds: float) -> None:
        xs = self.samples.get(batch)
        if xs is None:  # not setdefault: it would build a RecentMedian every step, to throw it away
            xs = self.samples[batch] = RecentMedian(self.WINDOW)
        median = xs.add(seconds)
        if len(xs) < self.MIN_SAMPLES:
            return
        old = self._medians.get(batch)
        if old is not None and abs(median - old) <= self.SETTLED * old:
            return  # a median that moved less than that keeps the table: a batch server observes every step
        self._medians[batch] = median
        self._relative.clear()
        self._one = None
        self.version += 1

    def measured(self, b: int) -> float | None:
        """Seconds for a batch of b as this run measured it (None until MIN_SAMPLES timings)."""
        return self._medians.get(b)

    @property
    def one(self) -> float | None:
        """Seconds for a single-token decode now: measured; else what the measured sizes imply through the
        calibration's shape (the median of measured(b) / prior(b)); else calibrated."""
        measured = self.measured(1)
        if measured is not None:
            return measured
        if self._one is None:
            ratios = [m / p for b, m in self._medians.items() if b >= 2 and (p := self._prior_at(b)) is not None]
            self._one = statistics.median(ratios) if ratios else self.prior_one
        return self._one

    def _prior_at(self, b: int) -> float | None:
        """The calibration's relative cost of b tokens, linear between the calibrated sizes (None past them)."""
        if b in self.prior:
            return self.prior[b]
        below = max((s for s in self.prior if s < b), default=1)
        above = min((s for s in self.prior if s > b), default=None)
        if above is None:
            return None
        c0 = self.prior.get(below, 1.0)
        return c0 + (self.prior[above] - c0) * (b - below) / (above - below)

    def relative(self, b: int) -> float:
        if b <= 1:
            return 1.0
        table = self._relative
        if b not in table:
            self._span = max(self._span, b)
            self._build(self._span)
        return table[b]

    def _build(self, n: int) -> None:
        """c_v(2..n) in one pass: measured where the run has measured; elsewhere the calibration's
        shape scaled by how the run's measurements compare with it, else the mean marginal cost. Every size
        known takes part, up to n or not: a size's price does not depend on the largest one asked so far."""
        one = self.one
        measured = {s: m / one for s, m in sorted(self._medians.items()) if s >= 2 and one}
        ratios = [(c - 1.0) / (self.prior[s] - 1.0) for s, c in measured.items() if self.prior.get(s, 1.0) > 1.0]
        # A parallel server measures mostly the sizes of its plain steps (a token per busy slot): scaling
        # the whole calibration by them priced a batch of 9 at 1.54 single decodes where batches of 8 ran
        # at about 2.1. There the measured sizes replace the calibration's, the rest is interpolated.
        scale = statistics.median(ratios) if ratios and not self.interpolate else 1.0
        known = {s: 1.0 + (c - 1.0) * scale for s, c in self.prior.items() if s >= 2}
        known.update(measured)
        slopes = [(c - 1.0) / (s - 1) for s, c in known.items()]
        marginal = max(sum(slopes) / len(slopes), 0.0) if slopes else PRIOR_MARGINAL
        if self.interpolate and known:
            marks = sorted({1: 1.0, **known}.items())
            for (s0, c0), (s1, c1) in zip(marks, marks[1:], strict=False):
                for s in range(s0 + 1, s1):
                    known[s] = c0 + (c1 - c0) * (s - s0) / (s1 - s0)
            top, c_top = marks[-1]
            if len(marks) >= 2:  # past the largest known size: the last segment's slope
                s_prev, c_prev = marks[-2]
                slope = max((c_top - c_prev) / (top - s_prev), 0.0)
                for s in range(top + 1, n + 1):
                    known[s] = c_top + slope * (s - top)
        floor = 1.0  # monotone: a bigger batch costs at least what a smaller one does, and where the
        rise = self.MIN_RISE * (marginal or PRIOR_MARGINAL)  # figures fall, a token more at least `rise`
        for s in range(2, n + 1):
            c = known.get(s, 1.0 + marginal * (s - 1))
            floor = c if c > floor else floor + rise
            self._relative[s] = floor


def step_speedup(expected: float, k: int, draft_cost: float, costs: BatchCosts, fixed: float = 0.0) -> float:
    """E(K) / (K c_d + c_v(K+1) + fixed): one step's tokens per unit of time, over a plain decode's
    (`fixed`: a cost the step pays whatever K, in target tokens)."""
    return expected / (k * draft_cost + costs.relative(k + 1) + fixed)


# Drafting must be predicted to beat a plain decode by this much: the estimates are noisy,
# and a wrong "it pays" costs a verification batch while a wrong "it does not" costs little.
MIN_GAIN = 1.05


# P(the first K drafted tokens are all accepted) below which drafting a K-th token is not priced
NEGLIGIBLE = 1e-4


def best_length(
    acc: Acceptance, costs: BatchCosts, k_max: int, draft_cost: float = 0.0, min_gain: float = MIN_GAIN,
    fixed: float = 0.0,
) -> tuple[int, float]:
    """(K, predicted speedup over a plain decode) maximising E(K) / (K c_d + c_v(K+1) + fixed); K = 0, a
    plain decode (1.0), unless some K is predicted to beat it by `min_gain`."""
    best_k, best = 0, min_gain
    expected = 1.0
    for k, p in enumerate(acc.p_run(k_max), start=1):
        if p < NEGLIGIBLE:  # a longer draft adds less than this to E(K) per token and costs a token's verification:
            break  # it cannot be worth more (the lookup's 64 positions were priced every step, drafting or not)
        expected += p
        value = step_speedup(expected, k, draft_cost, costs, fixed)
        if value > best:
            best_k, best = k, value
    return (best_k, best) if best_k else (0, 1.0)


def perfect_speedup(costs: BatchCosts, k_max: int, draft_cost: float = 0.0) -> tuple[int, float]:
    """The best any drafter of this cost could do: every token accepted, at the best K."""
    return max(((k, step_speedup(k + 1, k, draft_cost, costs)) for k in range(1, k_max + 1)),
               key=lambda kv: kv[1], default=(0, 1.0))  # fmt: skip
