"""The n-gram (prompt lookup) drafter and the adaptive draft length, without models."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_cli.engine.drafters import DraftRequest, NgramDrafter, Outcome, Proposal
from specdec_cli.engine.drafters.policies import AdaptiveLength
from specdec_cli.engine.sampling import SamplerSettings

GREEDY = SamplerSettings()
RNG = np.random.default_rng(0)


def lookup(context: list[int], k: int, n_min: int = 2, n_max: int = 4) -> list[int]:
    d = NgramDrafter(n_min, n_max)
    d.begin(context)
    return d.lookup(k)


def reference(context: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    """Brute force: longest n first, then the latest earlier occurrence, copy (overlapping) k tokens."""
    end = len(context)
    for n in range(n_max, n_min - 1, -1):
        if end <= n:
            continue
        key = context[end - n :]
        for start in range(end - n - 1, -1, -1):
            if context[start : start + n] == key:
                ext = list(context)
                for j in range(k):
                    ext.append(ext[start + n + j])
                return ext[end:]
    return []


def test_longest_match_wins_over_a_more_recent_shorter_one() -> None:
    #           [5 6 7] 8 ...        [6 7] 9 ...          5 6 7 <- end
    context = [5, 6, 7, 8, 1, 2, 3, 6, 7, 9, 4, 5, 6, 7]
    assert lookup(context, 2) == [8, 1]  # the 3-gram "5 6 7", not the later 2-gram "6 7"


def test_most_recent_match_among_equal_lengths() -> None:
    context = [1, 2, 30, 31, 1, 2, 40, 41, 1, 2]
    assert lookup(context, 2) == [40, 41]


def test_no_match_gives_an_empty_draft() -> None:
    assert lookup([1, 2, 3, 4, 5, 6], 4) == []
    assert lookup([7, 7], 3, n_min=2) == []  # the suffix itself is not a match
    d = NgramDrafter(2, 4)
    d.begin([1, 2, 3])
    p = d.propose(DraftRequest([1, 2, 3], 4, GREEDY, RNG, frozenset()))
    assert p.tokens == [] and p.dists == []


def test_match_at_the_very_end_keeps_copying_its_own_output() -> None:
    # "a b a b": the match ends right where the suffix starts; the copy runs on into the draft.
    assert lookup([9, 1, 2, 1, 2], 5) == [1, 2, 1, 2, 1]
    assert lookup([3, 3, 3], 4, n_min=1, n_max=2) == [3, 3, 3, 3]


def test_shorter_n_is_tried_when_longer_fails() -> None:
    assert lookup([4, 1, 2, 8, 9, 2], 2, n_min=1, n_max=3) == [8, 9]
    assert lookup([4, 1, 2, 8, 9, 2], 2, n_min=2, n_max=3) == []


def test_sync_extends_or_rebuilds_the_index() -> None:
    d = NgramDrafter(2, 2)
    d.begin([1, 2, 3])
    d.sync([1, 2, 3, 1, 2])  # grew: extended
    assert d.lookup(1) == [3]
    d.sync([5, 2, 3, 9, 2, 3])  # rewritten (a new chat turn): rebuilt from scratch
    assert d.lookup(2) == [9, 2]


def test_propose_returns_point_masses_and_stops_after_a_stop_token() -> None:
    d = NgramDrafter(2, 4)
    ctx = [1, 2, 3, 99, 5, 1, 2]
    d.begin(ctx)
    p = d.propose(DraftRequest(ctx, 4, GREEDY, RNG, frozenset({99})))
    drafted, dists = p.tokens, p.dists
    assert drafted == [3, 99]
    assert [(list(q.ids), list(q.probs)) for q in dists] == [([3], [1.0]), ([99], [1.0])]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=0, max_size=40),
    st.integers(1, 6),
    st.integers(1, 3),
    st.integers(0, 2),
)
def test_lookup_matches_brute_force(context: list[int], k: int, n_min: int, extra: int) -> None:
    n_max = n_min + extra
    d = NgramDrafter(n_min, n_max)
    half = len(context) // 2
    d.begin(context[:half])
    d.sync(context)  # built incrementally, as during generation
    assert d.lookup(k) == reference(context, k, n_min, n_max)


class Fixed:
    """A drafter that proposes `n` tokens (never more than asked), to drive AdaptiveLength."""

    name = "fixed"
    free = False

    def __init__(self) -> None:
        self.n: int | None = None

    def begin(self, prompt: list[int]) -> None: ...

    def propose(self, req: DraftRequest) -> Proposal:
        n = req.k if self.n is None else min(self.n, req.k)
        return Proposal(list(range(n)), [], req.k, "fixed")

    def accept(self, outcome: Outcome) -> None: ...

    def decode_seconds(self) -> float:
        return 0.0


def test_draft_length_schedule() -> None:
    inner = Fixed()
    s = AdaptiveLength(inner, 2, 4)

    def step(asked: int, drafted: int, accepted: int) -> None:
        inner.n = drafted
        p = s.propose(DraftRequest([], asked, GREEDY, RNG, frozenset()))
        s.accept(Outcome([], p, accepted, 0.0))

    assert s.k == 4
    step(4, 4, 1)  # a rejection: down
    assert s.k == 3
    step(3, 3, 0)
    step(2, 2, 0)  # never below draft-min
    assert s.k == 2
    step(2, 2, 2)  # fully accepted: up
    assert s.k == 3
    step(3, 1, 1)  # stopped short on its own and accepted: no news
    step(3, 0, 0)  # nothing drafted: no news
    assert s.k == 3
    step(3, 3, 3)
    step(4, 4, 4)  # never above draft-max
    assert s.k == 4
    step(4, 4, 1)
    assert s.k == 3
    step(2, 2, 2)  # capped by the loop (room, --max-tokens) and accepted whole: K goes up from K, not from 2
    assert s.k == 4


def test_cost_gate_verifies_only_what_pays() -> None:
    from specdec_cli.engine.drafters.gate import CostGate

    g = CostGate()
    assert g.choose(4) > 0  # optimistic prior: drafting gets tried
    for _ in range(30):  # a batch of b costs b single decodes: nothing can pay
        for b in (1, 2, 5):
            g.observe_cost(b, 0.01 * b)
    assert abs(g.costs.relative(3) - 3.0) < 1e-9  # an unseen size follows the measured marginal cost
    assert g.choose(4) == 0
    cheap = CostGate()
    for _ in range(30):  # batches nearly free and proposals always right: verify them all
        cheap.observe_cost(1, 0.01)
        cheap.observe_cost(5, 0.011)
        cheap.propose(0, [7, 8, 9, 10])
        cheap.score([7, 8, 9, 10])
    assert cheap.choose(4) == 4
    wrong = CostGate()
    for _ in range(30):  # shadow scoring: proposals that are always wrong stop being verified
        wrong.observe_cost(1, 0.01)
        wrong.observe_cost(5, 0.03)  # a batch of 5 costs 3 single decodes, as on a CPU
        wrong.propose(0, [7, 8, 9, 10])
        wrong.score([1, 2, 3, 4])
    assert wrong.choose(4) == 0


def test_cost_gate_scores_each_position_once_it_is_known() -> None:
    from specdec_cli.engine.drafters.gate import MISS, CostGate

    g = CostGate()
    g.propose(2, [5, 6, 7])
    g.score([0, 0])  # nothing known yet
    table = g.shadow.tables[MISS]  # proposed before any first token was known right
    assert table.tries == []
    g.score([0, 0, 5])  # the first token is right, two still unknown: position 0 counts now
    assert table.tries == [1.0] and table.hits == [1.0]
    g.score([0, 0, 5, 6, 1])  # decided: two right, the third wrong; position 0 is not counted again
    assert table.tries == [1.0, 1.0, 1.0] and table.hits == [1.0, 1.0, 0.0]
    assert g.shadow.last_ok  # ... and its first token was right: the next proposal is in the other regime
    g.score([0, 0, 5, 6, 1, 9])  # a decided proposal is gone
    assert table.tries == [1.0, 1.0, 1.0]
