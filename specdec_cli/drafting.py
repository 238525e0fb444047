"""Which drafter a generation gets: one fresh drafter per generation over the Speculator's shared models
(and so their caches), its auto drafter's state and its cost gate (api.py's `Speculator.start`)."""

from __future__ import annotations

import copy
from typing import Protocol

from specdec_cli.engine.drafters import Drafter, ModelDrafter, NgramDrafter
from specdec_cli.engine.drafters.auto import WINDOW, AutoDrafter, AutoState
from specdec_cli.engine.drafters.cross import CrossDrafter, CrossVocab
from specdec_cli.engine.drafters.gate import CostGate
from specdec_cli.engine.drafters.medusa import HeadsDrafter
from specdec_cli.engine.drafters.policies import compose
from specdec_cli.engine.drafters.pool import TokenPool
from specdec_cli.engine.heads import Heads
from specdec_cli.engine.protocol import LoadedModel
from specdec_cli.engine.settings import AUTO, HEADS, MODEL, NGRAM, GenerateOptions
from specdec_cli.models.loading import ModelChoice


class Speculator(Protocol):
    """What choosing a drafter reads of api.py's `Speculator` (a protocol: api.py imports this module)."""

    choice: ModelChoice
    target: LoadedModel
    draft: LoadedModel | None
    draft_broken: str | None
    cross: bool
    _cross_vocab: CrossVocab | None
    ngram: tuple[int, int]
    pool: TokenPool | None
    _gate: CostGate
    _heads_gate: CostGate
    _auto_start: AutoState | None
    heads: Heads | None

    def auto_state(self) -> AutoState: ...


def ngram_drafter(spec: Speculator, config: GenerateOptions) -> NgramDrafter:
    """The n-gram lookup, with the pool unless the run is seeded and sampled: its text must depend on
    the seed alone, not on what earlier requests left in the pool (with any drafts it stays exact)."""
    return NgramDrafter(*spec.ngram, pool=None if config.reproducible else spec.pool)


def reproducible_auto_state(spec: Speculator) -> AutoState:
    """For a seeded sampled run: the starting costs every time, learning nothing from timings."""
    spec.auto_state()
    assert spec._auto_start is not None
    state = copy.deepcopy(spec._auto_start)
    state.learn_costs = False
    return state


def make_drafter(spec: Speculator, kind: str, config: GenerateOptions) -> Drafter | None:
    """One fresh drafter per generation (the models, and so their caches, are shared)."""
    inner: Drafter
    if kind == AUTO:
        model: ModelDrafter | CrossDrafter | None = None
        if spec.draft is not None and not spec.draft_broken:
            model = model_drafter(spec, config, window=WINDOW)
        k = config.k_max
        state = reproducible_auto_state(spec) if config.reproducible else spec.auto_state()
        heads = HeadsDrafter(spec.heads) if spec.heads is not None else None
        return AutoDrafter(ngram_drafter(spec, config), model, k, state, spec.choice.draft_max, heads=heads)
    gate = spec._gate
    if kind == MODEL and spec.draft is not None:
        inner = model_drafter(spec, config)
    elif kind == NGRAM:
        inner = ngram_drafter(spec, config)
    elif kind == HEADS and spec.heads is not None:
        inner, gate = HeadsDrafter(spec.heads), spec._heads_gate
    else:
        return None
    # A seeded sampled run gets a new gate: which tokens it verifies must not depend on earlier runs.
    return compose(inner, config, gate=None if config.reproducible else gate)


def model_drafter(spec: Speculator, config: GenerateOptions, window: int | None = None) -> ModelDrafter | CrossDrafter:
    assert spec.draft is not None
    if not spec.cross:
        return ModelDrafter(spec.draft, config.draft_p_min, window=window)
    if spec._cross_vocab is None:
        spec._cross_vocab = CrossVocab.build(spec.target, spec.draft)
    # the window is in tokens; the cross drafter re-reads text: about 4 characters a token
    return CrossDrafter(spec.target, spec.draft, spec._cross_vocab, config.draft_p_min,
                        window=None if window is None else 4 * window)  # fmt: skip
