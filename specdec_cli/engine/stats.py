"""Acceptance statistics that add up: every emitted token is counted once.

drafted  = tokens proposed by the drafter, over all steps
accepted = drafted tokens the target accepted and that were used (<= drafted)
emitted  = accepted draft tokens + tokens the target chose = n_tokens
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specdec_cli.engine.events import DRAFT, DrafterDropped, Prefill, Step


@dataclass
class Stats:
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    emitted_from_draft: int = 0
    emitted_from_target: int = 0
    drafted_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    t_draft: float = 0.0
    t_target: float = 0.0
    t_sample: float = 0.0
    t_other: float = 0.0
    t_prefill: float = 0.0
    current_k: int = 0

    def observe(self, ev: Prefill | Step | DrafterDropped) -> None:
        if isinstance(ev, Step):
            self.add(ev)
        elif isinstance(ev, Prefill):
            self.add_prefill(ev)

    def add_prefill(self, ev: Prefill) -> None:
        self.t_prefill += ev.t_target + ev.t_draft

    def add(self, step: Step) -> None:
        self.steps += 1
        if step.k:  # a step capped to k=0 by --max-tokens or the context is not a K change
            self.current_k = step.k
        self.drafted += len(step.drafted)
        self.accepted += step.n_accepted
        for i in range(len(step.drafted)):
            if i >= len(self.drafted_at):
                self.drafted_at.append(0)
                self.accepted_at.append(0)
            self.drafted_at[i] += 1
            if i < step.n_accepted:
                self.accepted_at[i] += 1
        for tok in step.emitted:
            if tok.source == DRAFT:
                self.emitted_from_draft += 1
            else:
                self.emitted_from_target += 1
        self.t_draft += step.t_draft
        self.t_target += step.t_target
        self.t_sample += step.t_sample
        self.t_other += step.t_other

    def merge(self, other: Stats) -> None:
        """Add another run's totals (a chat session sums its replies)."""
        for name in (
            "drafted",
            "accepted",
            "steps",
            "emitted_from_draft",
            "emitted_from_target",
            "t_draft",
            "t_target",
            "t_sample",
            "t_other",
            "t_prefill",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for i, (d, a) in enumerate(zip(other.drafted_at, other.accepted_at, strict=True)):
            if i >= len(self.drafted_at):
                self.drafted_at.append(0)
                self.accepted_at.append(0)
            self.drafted_at[i] += d
            self.accepted_at[i] += a

    @property
    def emitted(self) -> int:
        return self.emitted_from_draft + self.emitted_from_target

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.emitted / self.steps if self.steps else 0.0

    @property
    def accepted_by_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at, strict=True)]

    @property
    def generation_seconds(self) -> float:
        return self.t_draft + self.t_target + self.t_sample + self.t_other

    def tokens_per_second(self, wall: float | None = None) -> float:
        secs = wall if wall is not None else self.generation_seconds
        return self.emitted / secs if secs > 0 else 0.0

    def as_dict(self, wall_seconds: float, generation_seconds: float | None = None) -> dict[str, Any]:
        """JSON stats; tokens/s counts generation time (after the prompt is read)."""
        gen = generation_seconds if generation_seconds is not None else wall_seconds
        return {
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 6),
            "steps": self.steps,
            "tokens_per_step": round(self.tokens_per_step, 6),
            "accepted_by_position": [round(x, 6) for x in self.accepted_by_position],
            "emitted_from_draft": self.emitted_from_draft,
            "emitted_from_target": self.emitted_from_target,
            "tokens_per_second": round(self.tokens_per_second(gen), 3),
            "wall_seconds": round(wall_seconds, 6),
            "seconds": {
                "prefill": round(self.t_prefill, 6),
                "draft_decode": round(self.t_draft, 6),
                "target_decode": round(self.t_target, 6),
                "sampling": round(self.t_sample, 6),
                "other": round(self.t_other, 6),
            },
        }
