"""Generation settings: every default written once, every value checked once (no numpy here,
so that `--help` stays fast).

The CLI, the Python API and the server all build a `GenerationConfig` and call
`validate()`; nothing else checks these values again. A bad value raises
`UsageError` (a `SpecdecError` and a `ValueError`), whose message names the
command-line option, so the CLI can print it as is and exit 2.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from specdec_cli.errors import UsageError


class DrafterKind(enum.StrEnum):
    """Who drafts, named once for the CLI (`--drafter`), the API, the server (`speculative.drafter`) and
    the stats (a StrEnum equals its value: flags, requests and JSON carry the plain strings). NONE runs
    the target alone; AUTO chooses between the others and a plain decode every step from measured
    costs (engine/auto.py)."""

    AUTO = "auto"
    MODEL = "model"
    NGRAM = "ngram"
    NONE = "none"

    @property
    def label(self) -> str:
        """What the terminal calls it (the legend: "accepted from the draft model")."""
        return {"auto": "auto", "model": "draft model", "ngram": "n-gram lookup", "none": "target alone"}[self]


AUTO, MODEL, NGRAM, NONE = DrafterKind.AUTO, DrafterKind.MODEL, DrafterKind.NGRAM, DrafterKind.NONE
DRAFTERS = (AUTO, MODEL, NGRAM)
DEFAULT_DRAFTER = AUTO

# Defaults measured with `specdec bench` (README, "Drafters and draft length");
# for AUTO the most it drafts (the cost model picks K below it every step).
DEFAULT_K: dict[str, int] = {AUTO: 8, MODEL: 4, NGRAM: 8}
DEFAULT_NGRAM = (2, 4)
DEFAULT_P_MIN = 0.0
DEFAULT_MAX_TOKENS = 256
DEFAULT_CTX = 4096
MAX_DRAFT = 64  # a verification batch of K+1 rows; past this no drafter pays for itself
MAX_SEED = 2**64 - 1  # numpy's SeedSequence takes any non-negative int; we keep it to 64 bits


@dataclass(frozen=True)
class SamplerSettings:
    """temperature <= 0 means greedy (argmax of the raw logits, no masks).

    These are the defaults everywhere (CLI, API, server): llama.cpp's, greedy.
    `validate_sampler` below checks a value.
    """

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True)
class GenerationConfig:
    max_tokens: int = DEFAULT_MAX_TOKENS
    draft_max: int = DEFAULT_K[MODEL]
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    seed: int | None = None
    adaptive: bool = False  # let the draft length follow acceptance between draft_min and draft_max
    draft_min: int = 1
    draft_p_min: float = 0.0  # model drafter: stop drafting below this top probability

    @property
    def reproducible(self) -> bool:
        """A seeded sampled run: its text must depend on the seed only, so no decision may use timings.

        (A greedy run is the target's argmax whatever the drafter decides.)
        """
        return self.seed is not None and not self.sampler.greedy

    def validate(self) -> GenerationConfig:
        if self.max_tokens < 1:
            raise UsageError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if not 1 <= self.draft_max <= MAX_DRAFT:
            raise UsageError(
                f"--draft-max must be from 1 to {MAX_DRAFT}, got {self.draft_max} (--no-draft runs the target alone)"
            )
        if not 1 <= self.draft_min <= self.draft_max:
            raise UsageError(f"--draft-min must be in [1, --draft-max={self.draft_max}], got {self.draft_min}")
        if not (0.0 <= self.draft_p_min < 1.0):  # written so that NaN fails it
            raise UsageError(f"--draft-p-min must be in [0, 1), got {self.draft_p_min}")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise UsageError(
                f"--seed must be a whole number from 0 to 2^64-1, got {self.seed} (leave it out for a random seed)"
            )
        validate_sampler(self.sampler)
        return self


def validate_sampler(s: SamplerSettings) -> None:
    # Each test is written as "what is allowed", so that NaN (which fails every
    # comparison) is refused: a NaN temperature would make every probability NaN,
    # and min(1, p / nan) is 1, which accepts anything.
    if not (math.isfinite(s.temperature) and s.temperature >= 0):
        raise UsageError(f"--temp must be a finite number >= 0 (0 = greedy), got {s.temperature}")
    if not s.top_k >= 0:
        raise UsageError(f"--top-k must be >= 0 (0 = off), got {s.top_k}")
    if not 0.0 < s.top_p <= 1.0:
        raise UsageError(f"--top-p must be in (0, 1], got {s.top_p}")
    if not 0.0 <= s.min_p < 1.0:
        raise UsageError(f"--min-p must be in [0, 1), got {s.min_p}")


def validate_ngram(n_min: int, n_max: int) -> tuple[int, int]:
    if not 1 <= n_min <= n_max:
        raise UsageError(f"need 1 <= --ngram-min <= --ngram-max, got {n_min} and {n_max}")
    return n_min, n_max


MAX_PARALLEL = 64


def validate_parallel(parallel: int) -> int:
    if not 1 <= parallel <= MAX_PARALLEL:
        raise UsageError(f"--parallel must be from 1 to {MAX_PARALLEL}, got {parallel}")
    return parallel


def validate_runtime(n_ctx: int, n_threads: int | None) -> None:
    if not 8 <= n_ctx <= 2**31 - 1:
        raise UsageError(f"--ctx-size must be from 8 to 2^31-1, got {n_ctx}")
    if n_threads is not None and n_threads < 1:
        raise UsageError(f"--threads must be >= 1, got {n_threads}")


_S = SamplerSettings()


@dataclass(frozen=True)
class GenerateOptions:
    """What one generation may change; the defaults are the CLI's."""

    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = _S.temperature
    top_k: int = _S.top_k
    top_p: float = _S.top_p
    min_p: float = _S.min_p
    seed: int | None = None
    draft_max: int | None = None  # None: the pair's recommendation, else the drafter's default
    draft_min: int = 1
    adaptive: bool = True
    draft_p_min: float = 0.0
    drafter: str | None = None  # None: the Speculator's; "none" runs the target alone
    system: str | None = None
    chat: bool | None = None  # None: the chat template when the model has one

    def sampler(self) -> SamplerSettings:
        return SamplerSettings(self.temperature, self.top_k, self.top_p, self.min_p)

    def validate(self) -> GenerateOptions:
        """Check every value now (the CLI does, before loading any model)."""
        self.config(self.draft_max if self.draft_max is not None else max(1, self.draft_min))
        if self.drafter is not None:
            check_drafter(self.drafter)
        return self

    def config(self, draft_max: int) -> GenerationConfig:
        return GenerationConfig(
            max_tokens=self.max_tokens,
            draft_max=draft_max,
            sampler=self.sampler(),
            seed=self.seed,
            adaptive=self.adaptive,
            draft_min=self.draft_min if self.draft_max is not None else min(self.draft_min, draft_max),
            draft_p_min=self.draft_p_min,
        ).validate()


def check_drafter(kind: str) -> DrafterKind:
    try:
        return DrafterKind(kind)
    except ValueError:
        raise UsageError(f"unknown drafter {kind!r}: choose one of {', '.join(DrafterKind)}") from None
