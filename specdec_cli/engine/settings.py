"""Generation settings, written once: every parameter's name, default, help, flag and valid range.

`GenerateOptions` is the one settings type for sampling and speculation. The CLI's option groups
(help text and defaults), the Python API's keywords, chat's `/set`, the server's request fields and
bench all derive from `PARAMS` below, and `GenerateOptions.validate()` is the one check. A bad value
raises `InvalidSetting`, which names the *parameter* (`temperature must be ...`); each front end shows
it under its own name for it (`--temp` on the command line, `temp` after `/set`, the request field in
the server's error), so none rewrites another's message. No numpy here, so that `--help` stays fast.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specdec_cli.errors import UsageError


class DrafterKind(enum.StrEnum):
    """Who drafts, named once for the CLI (`--drafter`), the API, the server (`speculative.drafter`) and
    the stats (a StrEnum equals its value: flags, requests and JSON carry the plain strings). NONE runs
    the target alone; AUTO chooses between the others and a plain decode every step from measured
    costs (engine/drafters/auto.py)."""

    AUTO = "auto"
    MODEL = "model"
    NGRAM = "ngram"
    HEADS = "heads"
    NONE = "none"

    @property
    def label(self) -> str:
        """What the terminal calls it (the legend: "accepted from the draft model")."""
        return {"auto": "auto", "model": "draft model", "ngram": "n-gram lookup", "heads": "Medusa heads",
                "none": "target alone"}[self]


AUTO, MODEL, NGRAM, HEADS = DrafterKind.AUTO, DrafterKind.MODEL, DrafterKind.NGRAM, DrafterKind.HEADS
NONE = DrafterKind.NONE
DRAFTERS = (AUTO, MODEL, NGRAM, HEADS)
DEFAULT_DRAFTER = AUTO

class KernelChoice(enum.StrEnum):
    """Which kernels the target computes with, named once for the CLI (`--kernels`), the API and the server.
    EXACT: kernels probed to compute a batch of tokens as one token at a time, so drafting cannot change the
    output; where none pass (a GPU build without specdec's CUDA kernels), the target decodes alone
    (engine/kernels.py). FAST: llama.cpp's own kernels, with drafts, not probed: llama.cpp's speed, and output
    that may differ from the target alone where two tokens' logits are within rounding of each other."""

    EXACT = "exact"
    FAST = "fast"


DEFAULT_KERNELS = KernelChoice.EXACT


def check_kernels(choice: str) -> KernelChoice:
    try:
        return KernelChoice(choice)
    except ValueError:
        raise InvalidSetting("kernels", repr(choice), f"one of {', '.join(KernelChoice)}") from None


MAX_DRAFT = 64  # a verification batch of K+1 rows; past this no drafter pays for itself
# Defaults chosen with `specdec bench` and benchmarks/repeats.py (docs/benchmarks.md).
# For AUTO and NGRAM the most a lookup drafts: each step's length is priced (estimates.py) from the
# acceptance of its regime (drafters/gate.py); a word-for-word repeat of an earlier text may draft all 64.
DEFAULT_K: dict[str, int] = {AUTO: MAX_DRAFT, MODEL: 4, NGRAM: MAX_DRAFT, HEADS: 3}  # heads: as many as trained
DEFAULT_NGRAM = (2, 4)
DEFAULT_POOL_MB = 64.0  # the token pool of earlier prompts and outputs (about 900k tokens)
DEFAULT_PROMPT_CACHE_MB = 512.0  # slots' caches kept in host memory for requests that come back (engine/batch/)
DEFAULT_P_MIN = 0.0
DEFAULT_MAX_TOKENS = 256
DEFAULT_CTX = 4096
# A lone greedy generation without drafts decodes its tokens in bursts of up to this long, in one call into llama.cpp
# each (engine/greedy.py's greedy_run), handed on together: no Python between its decodes (docs/design.md#host-time)
DEFAULT_BURST_MS = 30.0
MAX_BURST_MS = 1000.0
MAX_SEED = 2**64 - 1  # numpy's SeedSequence takes any non-negative int; we keep it to 64 bits
MAX_PARALLEL = 64


class InvalidSetting(UsageError):
    """A parameter's value out of its range: names the parameter, and can name it as a front end does."""

    def __init__(self, param: str, value: Any, rule: str, hint: str = "") -> None:
        self.param, self.value, self.rule, self.hint = param, value, rule, hint
        super().__init__(self.named(param))
        self.http_param = param

    def named(self, name: str) -> str:
        """The message with the parameter called `name` (a flag, a /set key, a request field)."""
        got = "" if self.value is None else f", got {self.value}"
        return f"{name} must be {self.rule}{got}{f' ({self.hint})' if self.hint else ''}"


@dataclass(frozen=True)
class Param:
    """One parameter, described once. `ok` is written as "what is allowed", so that NaN (which fails
    every comparison) is refused: a NaN temperature would make every probability NaN, and
    min(1, p / nan) is 1, which accepts anything."""

    name: str  # the API keyword, the server's field, the JSON key
    flag: str  # the command line's option
    help: str
    rule: str | Callable[[Any], str]  # completes "NAME must be ..."; or made from the options being checked
    ok: Callable[[Any, Any], bool]  # (value, options) -> valid?
    hint: str = ""
    settable: bool = True  # chat's /set may change it

    @property
    def key(self) -> str:
        """chat's `/set` key: the flag without its dashes (`/set temp 0.7`, `/set draft_max 6`)."""
        return self.flag.lstrip("-").replace("-", "_")


def _finite_at_least(lo: float) -> Callable[[Any, Any], bool]:
    return lambda v, o: math.isfinite(v) and v >= lo


PARAMS: dict[str, Param] = {p.name: p for p in (
    Param("max_tokens", "--max-tokens", "Stop after this many tokens.", ">= 1", lambda v, o: v >= 1),
    Param("temperature", "--temp", "Temperature; 0 = greedy.", "a finite number >= 0 (0 = greedy)",
          _finite_at_least(0.0)),
    Param("top_k", "--top-k", "Keep the k most likely tokens (0 = off).", ">= 0 (0 = off)", lambda v, o: v >= 0),
    Param("top_p", "--top-p", "Nucleus sampling threshold (1 = off).", "in (0, 1]", lambda v, o: 0.0 < v <= 1.0),
    Param("min_p", "--min-p", "Drop tokens below min-p x the top probability (0 = off).", "in [0, 1)",
          lambda v, o: 0.0 <= v < 1.0),
    Param("seed", "--seed", "Seed for a reproducible sampled run.", "a whole number from 0 to 2^64-1",
          lambda v, o: v is None or 0 <= v <= MAX_SEED, hint="leave it out for a random seed"),
    Param("draft_max", "--draft-max",
          f"Most tokens drafted per step (default: the pair's, else {DEFAULT_K[MODEL]}; ngram and auto "
          f"{DEFAULT_K[NGRAM]}).", f"from 1 to {MAX_DRAFT}", lambda v, o: v is None or 1 <= v <= MAX_DRAFT,
          hint="drafter none runs the target alone"),
    Param("draft_min", "--draft-min", "Fewest tokens the adaptive schedule drafts.",
          lambda o: ">= 1" if o.draft_max is None else f"in [1, draft_max={o.draft_max}]",
          lambda v, o: 1 <= v and (o.draft_max is None or v <= o.draft_max), settable=False),
    Param("draft_p_min", "--draft-p-min",
          "Draft model: stop a draft where its top token's probability is below this (0 = off).", "in [0, 1)",
          lambda v, o: 0.0 <= v < 1.0, settable=False),
)}  # fmt: skip

# Parameters of loading (not of one generation), checked by `check_load`; their flags, for the CLI.
LOAD_FLAGS = {"n_ctx": "--ctx-size", "n_threads": "--threads", "parallel": "--parallel",
              "ngram": "--ngram-min/--ngram-max", "drafter": "--drafter", "pool_mb": "--pool-mb",
              "prompt_cache_mb": "--prompt-cache-mb", "burst_ms": "--burst-ms",
              "kernels": "--kernels", "n_gpu_layers": "--gpu-layers", "draft_gpu_layers": "--draft-gpu-layers"}  # fmt: skip


def flag(param: str) -> str:
    """The command line's name for a parameter."""
    p = PARAMS.get(param)
    return p.flag if p is not None else LOAD_FLAGS.get(param, param)


@dataclass(frozen=True)
class SamplerSettings:
    """The sampler's four numbers, as `engine.sampling` takes them (a view of `GenerateOptions`, whose
    defaults these are: llama.cpp's, greedy). temperature <= 0 means greedy (argmax of the raw logits)."""

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


_S = SamplerSettings()


@dataclass(frozen=True)
class GenerateOptions:
    """Everything one generation may set: sampling, speculation and the prompt's framing.

    The API resolves `draft_max=None` to the pair's recommendation or the drafter's default before the
    engine runs (`resolved`); the engine reads `k_max`.
    """

    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = _S.temperature
    top_k: int = _S.top_k
    top_p: float = _S.top_p
    min_p: float = _S.min_p
    seed: int | None = None
    draft_max: int | None = None  # None: the pair's recommendation, else the drafter's default
    draft_min: int = 1
    adaptive: bool = True  # let the draft length follow acceptance between draft_min and draft_max
    draft_p_min: float = DEFAULT_P_MIN  # model drafter: stop drafting below this top probability
    drafter: str | None = None  # None: the Speculator's; "none" runs the target alone
    system: str | None = None
    chat: bool | None = None  # None: the chat template when the model has one
    # someone reads the tokens as they come (a stream): with `parallel` > 1 and fair slots, while such a request's
    # prompt is read, requests that are not sit the step out (the server: every request that does not stream)
    interactive: bool = True

    @property
    def sampler(self) -> SamplerSettings:
        return SamplerSettings(self.temperature, self.top_k, self.top_p, self.min_p)

    @property
    def greedy(self) -> bool:
        return self.sampler.greedy

    @property
    def k_max(self) -> int:
        """The most tokens a step drafts: `draft_max`, or the model drafter's default when unresolved."""
        return self.draft_max if self.draft_max is not None else DEFAULT_K[MODEL]

    @property
    def reproducible(self) -> bool:
        """A seeded sampled run: its text must depend on the seed only, so no decision may use timings.

        (A greedy run is the target's argmax whatever the drafter decides.)
        """
        return self.seed is not None and not self.greedy

    def validate(self) -> GenerateOptions:
        """Check every value (the CLI does, before loading any model); raises `InvalidSetting`."""
        for p in PARAMS.values():
            value = getattr(self, p.name)
            if not p.ok(value, self):
                raise InvalidSetting(p.name, value, p.rule(self) if callable(p.rule) else p.rule, p.hint)
        if self.drafter is not None:
            check_drafter(self.drafter)
        return self

    def resolved(self, draft_max: int) -> GenerateOptions:
        """With the draft length the API chose (`draft_min` capped to it when it was not given)."""
        draft_min = self.draft_min if self.draft_max is not None else min(self.draft_min, draft_max)
        return dataclasses.replace(self, draft_max=draft_max, draft_min=draft_min).validate()

    def given(self, **values: Any) -> GenerateOptions:
        """These options with the values that are not None (a request's fields over the server's defaults)."""
        return dataclasses.replace(self, **{k: v for k, v in values.items() if v is not None})

    def as_dict(self) -> dict[str, Any]:
        """The parameters as JSON reports them (`--json`'s settings, chat's /save, bench)."""
        return {name: getattr(self, name) for name in PARAMS}


def check_drafter(kind: str) -> DrafterKind:
    try:
        return DrafterKind(kind)
    except ValueError:
        raise InvalidSetting("drafter", repr(kind), f"one of {', '.join(DrafterKind)}") from None


def check_load(*, n_ctx: int, n_threads: int | None, parallel: int = 1, ngram: tuple[int, int] = DEFAULT_NGRAM,
               pool_mb: float = DEFAULT_POOL_MB, prompt_cache_mb: float = DEFAULT_PROMPT_CACHE_MB,
               burst_ms: float = DEFAULT_BURST_MS) -> None:  # fmt: skip
    """The parameters of loading a pair (one place; the API calls it, the CLI before loading)."""
    if not 8 <= n_ctx <= 2**31 - 1:
        raise InvalidSetting("n_ctx", n_ctx, "from 8 to 2^31-1")
    if n_threads is not None and n_threads < 1:
        raise InvalidSetting("n_threads", n_threads, ">= 1")
    if not 1 <= parallel <= MAX_PARALLEL:
        raise InvalidSetting("parallel", parallel, f"from 1 to {MAX_PARALLEL}")
    if not 1 <= ngram[0] <= ngram[1]:
        raise InvalidSetting("ngram", f"{ngram[0]} and {ngram[1]}", "two sizes with 1 <= min <= max")
    if not (math.isfinite(pool_mb) and 0 <= pool_mb <= 1 << 20):
        raise InvalidSetting("pool_mb", pool_mb, "a number of megabytes from 0 (off) to 2^20")
    if not (math.isfinite(prompt_cache_mb) and 0 <= prompt_cache_mb <= 1 << 20):
        raise InvalidSetting("prompt_cache_mb", prompt_cache_mb, "a number of megabytes from 0 (off) to 2^20")
    if not (math.isfinite(burst_ms) and 0 <= burst_ms <= MAX_BURST_MS):
        raise InvalidSetting("burst_ms", burst_ms, f"a number of milliseconds from 0 (a token at a time) to {MAX_BURST_MS:g}")
