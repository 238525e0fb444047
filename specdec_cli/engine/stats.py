"""Acceptance statistics that add up: every emitted token is counted once.

drafted  = tokens proposed by the drafter, over all steps
accepted = drafted tokens the target accepted and that were used (<= drafted)
emitted  = accepted draft tokens + tokens the target chose = n_tokens
tokens per pass = (emitted + end-of-generation tokens) / steps: the pass that chose the end token
           produced it though it is not text (a plain run reads 1.00, not n / (n + 1))

`Stats` aggregates events; `Stats.summary(wall_seconds)` is the one place that
turns them into the figures a user sees (`RunStats`: generation time is the
wall time less the prompt prefill, tokens/s is tokens over generation time).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from specdec_cli.engine.events import DRAFT, DrafterDropped, Prefill, Step


@dataclass(frozen=True)
class Seconds:
    prefill: float
    draft_decode: float
    target_decode: float
    sampling: float
    other: float


@dataclass(frozen=True)
class RunStats:
    """The `stats` of `specdec run --json`, field for field (and of the API's `Generation.stats`)."""

    drafted: int
    accepted: int
    acceptance_rate: float | None  # None where nothing was drafted (no rate to give)
    steps: int
    tokens_per_step: float
    accepted_by_position: tuple[float, ...]
    emitted_from_draft: int
    emitted_from_target: int
    tokens_per_second: float
    wall_seconds: float
    seconds: Seconds
    # Which drafter each step verified: {"model"|"ngram"|"heads": {"steps", "drafted", "accepted"}, "plain": {...}}.
    drafters: dict[str, dict[str, int]] = field(default_factory=dict)
    predicted_speedup: float | None = None  # the auto drafter's mean prediction over its steps
    notes: tuple[str, ...] = ()  # the auto drafter's reasons, in order ("... paused", "... resumed")

    @property
    def generation_seconds(self) -> float:
        """Time after the prompt was read: what tokens/s divides by."""
        return max(0.0, self.wall_seconds - self.seconds.prefill)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Seconds):
                out[f.name] = {g.name: round(getattr(v, g.name), 6) for g in fields(v)}
            elif isinstance(v, tuple):
                out[f.name] = [round(x, 6) if isinstance(x, float) else x for x in v]
            elif isinstance(v, dict):
                out[f.name] = {k: dict(row) for k, row in v.items()}
            elif isinstance(v, float):
                out[f.name] = round(v, 3 if f.name in ("tokens_per_second", "predicted_speedup") else 6)
            else:
                out[f.name] = v
        return out


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
    by_drafter: dict[str, list[int]] = field(default_factory=dict)  # name -> [steps chosen, drafted, accepted]
    plain_steps: int = 0  # steps that verified nothing (a plain one-token decode)
    ended_on_eog: int = 0  # runs whose last step chose the end-of-generation token (not emitted)
    predicted: list[float] = field(default_factory=list)  # the auto drafter's prediction per step
    notes: list[str] = field(default_factory=list)
    last_choice: str | None = None  # the drafter the latest step verified (None: a plain decode)

    @staticmethod
    def of(events: Iterable[Prefill | Step | DrafterDropped]) -> Stats:
        stats = Stats()
        for ev in events:
            stats.observe(ev)
        return stats

    def observe(self, ev: Prefill | Step | DrafterDropped) -> None:
        if isinstance(ev, Step):
            self.add(ev)
        elif isinstance(ev, Prefill):
            self.t_prefill += ev.t_target + ev.t_draft

    def add(self, step: Step) -> None:
        self.steps += 1
        if step.k:  # a step capped to k=0 by --max-tokens or the context is not a K change
            self.current_k = step.k
        self.drafted += len(step.drafted)
        self.accepted += step.n_accepted
        self._count_positions(len(step.drafted), step.n_accepted)
        if step.drafter is not None:
            row = self.by_drafter.setdefault(step.drafter, [0, 0, 0])
            row[0] += 1
            row[1] += len(step.drafted)
            row[2] += step.n_accepted
        else:
            self.plain_steps += 1
        if step.predicted_speedup is not None:
            self.predicted.append(step.predicted_speedup)
            self.last_choice = step.drafter
        if step.note:
            self.notes.append(step.note)
        if step.stop == "eos":
            self.ended_on_eog += 1
        for tok in step.emitted:
            if tok.source == DRAFT:
                self.emitted_from_draft += 1
            else:
                self.emitted_from_target += 1
        self.t_draft += step.t_draft
        self.t_target += step.t_target
        self.t_sample += step.t_sample
        self.t_other += step.t_other

    def _count_positions(self, n_drafted: int, n_accepted: int) -> None:
        while len(self.drafted_at) < n_drafted:
            self.drafted_at.append(0)
            self.accepted_at.append(0)
        for i in range(n_drafted):
            self.drafted_at[i] += 1
            if i < n_accepted:
                self.accepted_at[i] += 1

    def merge(self, other: Stats) -> None:
        """Add another run's totals (a chat session sums its replies, bench sums its runs)."""
        self.predicted += other.predicted
        self.notes += other.notes
        for name in ("drafted", "accepted", "steps", "emitted_from_draft", "emitted_from_target", "plain_steps",
                     "ended_on_eog"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("t_draft", "t_target", "t_sample", "t_other", "t_prefill"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        while len(self.drafted_at) < len(other.drafted_at):
            self.drafted_at.append(0)
            self.accepted_at.append(0)
        for i, (d, a) in enumerate(zip(other.drafted_at, other.accepted_at, strict=True)):
            self.drafted_at[i] += d
            self.accepted_at[i] += a
        for name, row in other.by_drafter.items():
            mine = self.by_drafter.setdefault(name, [0, 0, 0])
            for i, x in enumerate(row):
                mine[i] += x

    @property
    def emitted(self) -> int:
        return self.emitted_from_draft + self.emitted_from_target

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted; None where nothing was drafted (the terminal shows "-")."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_step(self) -> float:
        """Tokens per target pass, the end-of-generation token included (see the module's docstring)."""
        return (self.emitted + self.ended_on_eog) / self.steps if self.steps else 0.0

    @property
    def accepted_by_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at, strict=True)]

    @property
    def generation_seconds(self) -> float:
        """The sum of the steps' times (a chat session's total; one run uses its wall clock)."""
        return self.t_draft + self.t_target + self.t_sample + self.t_other

    def summary(self, wall_seconds: float | None = None) -> RunStats:
        """The user-facing figures; `wall_seconds` is the whole run, prompt included.

        Without it (a session of several runs) the wall time is the sum of the steps and prefills.
        """
        wall = wall_seconds if wall_seconds is not None else self.generation_seconds + self.t_prefill
        gen = max(0.0, wall - self.t_prefill)
        return RunStats(
            drafted=self.drafted,
            accepted=self.accepted,
            acceptance_rate=self.acceptance_rate,
            steps=self.steps,
            tokens_per_step=self.tokens_per_step,
            accepted_by_position=tuple(self.accepted_by_position),
            emitted_from_draft=self.emitted_from_draft,
            emitted_from_target=self.emitted_from_target,
            tokens_per_second=self.emitted / gen if gen > 0 else 0.0,
            wall_seconds=wall,
            seconds=Seconds(self.t_prefill, self.t_draft, self.t_target, self.t_sample, self.t_other),
            drafters=self.drafter_table(),
            predicted_speedup=sum(self.predicted) / len(self.predicted) if self.predicted else None,
            notes=tuple(self.notes),
        )

    def drafter_table(self) -> dict[str, dict[str, int]]:
        table = {name: {"steps": r[0], "drafted": r[1], "accepted": r[2]} for name, r in sorted(self.by_drafter.items())}
        table["plain"] = {"steps": self.plain_steps, "drafted": 0, "accepted": 0}
        return table
