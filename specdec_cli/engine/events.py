"""Plain events the engine yields; the CLI renders them, `stats` aggregates them."""

from __future__ import annotations

from dataclasses import dataclass, field

DRAFT = "draft"  # a drafted token the target accepted
TARGET = "target"  # a token the target chose itself (residual, bonus, or plain)


@dataclass(frozen=True)
class EmittedToken:
    id: int
    text: str  # decoded incrementally: a split UTF-8 character shows on its last token
    source: str  # DRAFT or TARGET


@dataclass(frozen=True)
class Prefill:
    n_prompt: int
    t_target: float
    t_draft: float


@dataclass(frozen=True)
class Step:
    """One target pass: verify `drafted` (possibly empty) and emit tokens."""

    index: int
    k: int  # draft length the drafter was allowed this step
    drafted: tuple[int, ...]
    n_accepted: int  # drafted tokens accepted and consumed (<= len(drafted))
    emitted: tuple[EmittedToken, ...]
    t_draft: float  # seconds inside the draft model's llama_decode
    t_target: float  # seconds inside the target's llama_decode
    t_sample: float  # drafting and verification maths outside llama_decode (sampling, n-gram lookup)
    t_other: float  # everything else in the step: rollback, detokenizing, the loop itself
    stop: str | None = None  # set on the step that ended generation
    drafter: str | None = None  # which drafter proposed `drafted` ("model", "ngram"), None for a plain step
    predicted_speedup: float | None = None  # what the auto drafter's cost model expected of its choice
    note: str | None = None  # the auto drafter's reason, when its choice changed (e.g. a draft model paused)


@dataclass(frozen=True)
class DrafterDropped:
    """The drafter was taken out for the rest of the run; the target goes on alone."""

    reason: str


Event = Prefill | Step | DrafterDropped


@dataclass
class Transcript:
    """The engine's running record of one generation (mutable: the loop appends to it). The API turns it
    into the one public result, `generation.Generation`; the server sends that inside `worker.Done`."""

    text: str
    token_ids: list[int]
    stop_reason: str  # "eos", "length", "context", "interrupted"
    n_prompt: int
    steps: list[Step] = field(default_factory=list)
    wall_seconds: float = 0.0
    prefill: Prefill | None = None
