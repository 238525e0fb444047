"""`specdec bench`: configurations of one pair measured side by side.

Every configuration runs every prompt, interleaved (repeat r runs prompt p under
each configuration in turn, the order rotated by r) so that drift in the
machine's speed spreads over all of them. One warm-up round is discarded.

Speed is tokens after the prompt is read divided by the time they took (the
prompt is read once per prompt, from a cache the configurations share). The
speedup of a configuration is its throughput over the target-only throughput on
the same prompts in the same run. With greedy decoding every configuration's
tokens are compared with the target alone's, token for token.

Time is split by where it went: inside the target's llama_decode, inside the
draft model's, in drafting and verification maths (sampling, the n-gram
lookup), and everything else (the loop, rollback, detokenizing).
`overhead_fraction` is the share of generation time outside llama_decode.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec_cli.api import GenerateOptions, PromptTokens, Speculator
from specdec_cli.bench.prompts import PROMPTS, BenchPrompt
from specdec_cli.engine.costs import batch_costs, draft_token_seconds, sizes_for
from specdec_cli.engine.estimates import BatchCosts, perfect_speedup
from specdec_cli.engine.events import Step
from specdec_cli.engine.settings import AUTO, DEFAULT_K, DRAFTERS, MODEL, NONE
from specdec_cli.engine.stats import Stats
from specdec_cli.errors import UsageError

TARGET_ONLY = "target"
BenchInputError = UsageError  # bad configurations, prompt files and options: exit 2


def category_groups(prompts: Sequence[BenchPrompt]) -> list[str]:
    """Each prompt category, then "all" when there are several."""
    cats = sorted({p.category for p in prompts})
    return [*cats, "all"] if len(cats) > 1 else cats


@dataclass(frozen=True)
class BenchConfig:
    """`target`, `model:K` / `ngram:K` (fixed K), `model:auto` / `ngram:auto` (adaptive K up to a maximum),
    `auto` / `auto:K` (the auto drafter, drafting at most K), `auto:no-heads` (the auto drafter without the
    heads --heads loaded: beside `auto`, what the heads add)."""

    name: str
    drafter: str | None
    k: int = 0
    adaptive: bool = False
    heads: bool = True  # the Speculator's heads, when it has some, are the drafters' to use


def parse_configs(text: str, model_k: int, ngram_k: int) -> list[BenchConfig]:
    out: list[BenchConfig] = []
    for raw in text.split(","):
        name = raw.strip()
        if not name:
            continue
        if name == TARGET_ONLY:
            out.append(BenchConfig(name, None))
            continue
        kind, _, arg = name.partition(":")
        if kind == AUTO and arg in ("", "no-heads"):
            out.append(BenchConfig(name, AUTO, DEFAULT_K[AUTO], True, heads=not arg))
            continue
        if kind not in DRAFTERS or not arg or (kind == AUTO and arg == "auto"):
            raise BenchInputError(
                f"unknown configuration {name!r}: use target, model:K, model:auto, ngram:K, ngram:auto, heads:K, heads:auto, "
                "auto, auto:K or auto:no-heads"
            )
        if arg == "auto":
            out.append(BenchConfig(name, kind, model_k if kind == MODEL else ngram_k, True))
        elif arg.isdigit() and int(arg) >= 1:
            out.append(BenchConfig(name, kind, int(arg), False))
        else:
            also = "" if kind == AUTO else " or auto"
            raise BenchInputError(f"in configuration {name!r}: K must be a whole number >= 1{also}")
    if not out:
        raise BenchInputError("--configs names no configuration")
    if len({c.name for c in out}) != len(out):
        raise BenchInputError("--configs names a configuration twice")
    return out


def load_prompts(path: Path | None, category: str | None = None) -> list[BenchPrompt]:
    """The built-in set, or a JSONL file of {"prompt": ..., "category"?: ..., "name"?: ...}."""
    if path is None:
        prompts = list(PROMPTS)
    else:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise BenchInputError(f"cannot read --prompts {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise BenchInputError(f"--prompts {path} is not UTF-8 text") from None
        prompts = []
        for i, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BenchInputError(f"{path}, line {i}: not JSON ({exc.msg})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
                raise BenchInputError(f'{path}, line {i}: expected an object with a non-empty "prompt" string')
            prompts.append(
                BenchPrompt(str(obj.get("category", "prompts")), str(obj.get("name", f"line-{i}")), obj["prompt"])
            )
        if not prompts:
            raise BenchInputError(f"--prompts {path} has no prompts")
    if category:
        prompts = [p for p in prompts if p.category == category]
        if not prompts:
            raise BenchInputError(f"no prompt in category {category!r}")
    return prompts


@dataclass
class RunRecord:
    config: str
    prompt: str
    category: str
    repeat: int
    token_ids: list[int]
    seconds: float  # generation, after the prompt is read
    stats: Stats
    model_units: float = 0.0  # what its steps cost by the speedup model, in single-token target decodes
    oracle_units: float = 0.0  # ... had each step verified exactly the prefix the target accepted


@dataclass
class Summary:
    config: str
    category: str
    runs: int
    tokens: int
    seconds: float
    tps_median: float
    tps_min: float
    tps_max: float
    speedup: float | None
    predicted: float | None  # the speedup model's figure for these steps, from the run's measured costs
    oracle: float | None  # the same drafter, verifying exactly the right prefix of each proposal
    identical: bool | None  # greedy: every run's tokens equal the target alone's
    acceptance_rate: float | None
    tokens_per_step: float | None  # None for llama.cpp's runs (it does not say)
    accepted_by_position: list[float]
    split: dict[str, float]  # fractions of generation time (empty for llama.cpp's runs)
    overhead_fraction: float | None

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        for key in ("seconds", "tps_median", "tps_min", "tps_max", "speedup", "predicted", "oracle",
                    "acceptance_rate", "tokens_per_step"):  # fmt: skip
            if d[key] is not None:
                d[key] = round(d[key], 4)
        d["accepted_by_position"] = [round(x, 4) for x in self.accepted_by_position]
        d["split"] = {k: round(v, 4) for k, v in self.split.items()}
        d["overhead_fraction"] = None if self.overhead_fraction is None else round(self.overhead_fraction, 4)
        return d


@dataclass(frozen=True)
class Costs:
    """This run's measured costs: c_v(b) of the target, c_d of the draft (in target decodes)."""

    target_one: float  # seconds
    verify: BatchCosts
    draft: float  # c_d; 0 without a draft model

    @property
    def target_ms(self) -> float:
        return self.target_one * 1000

    def perfect(self, k_max: int) -> tuple[int, float]:
        """A perfect free drafter at the best K: the most any drafter can give under these batch costs."""
        return perfect_speedup(self.verify, k_max)

    def as_dict(self, k_max: int) -> dict[str, Any]:
        k, best = self.perfect(k_max)
        return {
            "target_ms": round(self.target_one * 1000, 3),
            "verify": {b: round(self.verify.relative(b), 4) for b in range(1, k_max + 2)},
            "draft": round(self.draft, 4),
            "perfect_drafter": {"k": k, "speedup": round(best, 4)},
        }


def measure_costs(spec: Speculator, prompt: PromptTokens, k_max: int) -> Costs:
    """Single-token and batch decode times of the target (every batch size up to 9, a few above: 2 to 65
    would take a minute on the default pair), and the draft's per-token time (median of repeats)."""
    base = prompt.ids[: max(1, min(len(prompt.ids), spec.n_ctx - k_max - 2))]
    probe = (base * (k_max + 1))[: k_max + 1]
    one, relative = batch_costs(spec.target, base, probe, k_max + 1, sizes=sizes_for(k_max + 1))
    d = 0.0
    if spec.draft is not None:  # in the draft's own tokens of the same text (its tokenizer may differ)
        d_base = spec.draft_tokens(base)
        d = draft_token_seconds(spec.draft, d_base[:-1] or d_base, d_base[-1]) / one
    spec.target.rollback(0)
    if spec.draft is not None:
        spec.draft.rollback(0)
    return Costs(one, BatchCosts(relative, one, interpolate=True), d)  # the sizes between, interpolated


def step_units(step: Step, costs: Costs) -> tuple[float, float]:
    """(model cost, oracle cost) of one step, in single-token target decodes."""
    d = costs.draft * len(step.drafted) if step.drafter == MODEL else 0.0
    return d + costs.verify.relative(len(step.drafted) + 1), d + costs.verify.relative(step.n_accepted + 1)


@dataclass
class BenchResult:
    configs: list[BenchConfig]
    prompts: list[BenchPrompt]
    greedy: bool
    records: list[RunRecord] = field(default_factory=list)
    costs: Costs | None = None

    def summaries(self) -> list[Summary]:
        out = []
        for cat in category_groups(self.prompts):
            base = self._aggregate(TARGET_ONLY, cat)
            for c in self.configs:
                s = self._aggregate(c.name, cat)
                if s is None:
                    continue
                if base is not None and base.tokens and s.tokens:
                    s.speedup = (s.tokens / s.seconds) / (base.tokens / base.seconds)
                out.append(s)
        return out

    def _identical(self, config: str, cat: str) -> bool | None:
        if not self.greedy or config == TARGET_ONLY:
            return None
        ref = {r.prompt: r.token_ids for r in self.records if r.config == TARGET_ONLY and r.repeat == 0}
        if not ref:
            return None
        runs = [r for r in self.records if r.config == config and (cat == "all" or r.category == cat)]
        return all(r.token_ids == ref[r.prompt] for r in runs)

    def _aggregate(self, config: str, cat: str) -> Summary | None:
        runs = [r for r in self.records if r.config == config and (cat == "all" or r.category == cat)]
        if not runs:
            return None
        total = Stats()
        for r in runs:
            total.merge(r.stats)
        tokens = sum(len(r.token_ids) for r in runs)
        seconds = sum(r.seconds for r in runs)
        units = sum(r.model_units for r in runs)
        oracle = sum(r.oracle_units for r in runs)
        tps = [len(r.token_ids) / r.seconds for r in runs if r.seconds > 0]
        decode = total.t_target + total.t_draft
        split = {
            "target_decode": total.t_target / seconds,
            "draft_decode": total.t_draft / seconds,
            "sampling": total.t_sample / seconds,
            "other": max(0.0, seconds - decode - total.t_sample) / seconds,
        }
        return Summary(
            config=config,
            category=cat,
            runs=len(runs),
            tokens=tokens,
            seconds=seconds,
            tps_median=statistics.median(tps),
            tps_min=min(tps),
            tps_max=max(tps),
            speedup=None,
            predicted=tokens / units if units else None,
            oracle=tokens / oracle if oracle else None,
            identical=self._identical(config, cat),
            acceptance_rate=total.acceptance_rate,
            tokens_per_step=total.tokens_per_step,
            accepted_by_position=total.accepted_by_position,
            split=split,
            overhead_fraction=max(0.0, 1.0 - decode / seconds),
        )


def run_one(
    spec: Speculator, cfg: BenchConfig, prompt: PromptTokens, options: GenerateOptions, costs: Costs | None = None
) -> RunRecord:
    """One configuration on one prompt, through the API (prompt name, category and repeat left blank)."""
    heads = spec.heads
    if not cfg.heads:
        spec.heads = None  # this run's drafter is made without them (drafting.py): restored below
    try:
        run = spec.start(
            prompt,
            options,
            drafter=cfg.drafter or NONE,
            draft_max=max(cfg.k, 1),
            adaptive=cfg.adaptive,
            draft_p_min=options.draft_p_min if cfg.drafter in (MODEL, AUTO) else 0.0,
        )
        units = oracle = 0.0
        for ev in run.events():
            if costs is not None and isinstance(ev, Step):
                u, o = step_units(ev, costs)
                units, oracle = units + u, oracle + o
    finally:
        spec.heads = heads
    g = run.generation
    return RunRecord(cfg.name, "", "", 0, g.token_ids, g.stats.generation_seconds, run.stats, units, oracle)


def run_bench(
    spec: Speculator,
    prompts: list[BenchPrompt],
    configs: list[BenchConfig],
    *,
    repeats: int,
    warmup: int,
    options: GenerateOptions,
    on_run: Callable[[str], None] | None = None,
) -> BenchResult:
    result = BenchResult(configs, prompts, options.greedy)
    tokenized = [spec.tokenize(p.text) for p in prompts]
    result.costs = measure_costs(spec, tokenized[0], max(c.k for c in configs) if configs else 1)
    for p, toks in zip(prompts, tokenized, strict=True):
        if len(toks.ids) + options.max_tokens > spec.n_ctx:
            raise BenchInputError(
                f"prompt {p.name!r} is {len(toks.ids)} tokens: with --max-tokens {options.max_tokens} it needs "
                f"--ctx-size >= {len(toks.ids) + options.max_tokens}"
            )
    # Every run is a first ask: the token pool keeps what it held at the start (empty, or --ngram-cache's), or
    # each prompt's later runs would be drafted from its earlier ones (the lookup at a repeat's speed).
    remember, spec.remember = spec.remember, False
    try:
        for _ in range(warmup):
            for cfg in configs:
                run_one(spec, cfg, tokenized[0], _for(cfg, options))
        for rep in range(repeats):
            for pi, (p, toks) in enumerate(zip(prompts, tokenized, strict=True)):
                shift = (rep + pi) % len(configs)
                for cfg in configs[shift:] + configs[:shift]:
                    rec = run_one(spec, cfg, toks, _for(cfg, options), result.costs)
                    result.records.append(dataclasses.replace(rec, prompt=p.name, category=p.category, repeat=rep))
                    if on_run is not None:
                        on_run(f"{cfg.name} / {p.name}")
    finally:
        spec.remember = remember
    return result


def _for(cfg: BenchConfig, options: GenerateOptions) -> GenerateOptions:
    """The shared options, with a draft-min no larger than this configuration's K."""
    return dataclasses.replace(options, draft_min=min(options.draft_min, max(cfg.k, 1)))


def raw_runs(records: Sequence[RunRecord], external: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """Every run's own numbers, for a results file: the summaries are derived from these."""
    out = [{"config": r.config, "prompt": r.prompt, "category": r.category, "repeat": r.repeat,
            "tokens": len(r.token_ids), "seconds": round(r.seconds, 5), "steps": r.stats.steps,
            "drafted": r.stats.drafted, "accepted": r.stats.accepted} for r in records]  # fmt: skip
    out += [{"config": e.config, "category": e.category, "tokens": e.n_tokens, "seconds": round(e.seconds, 5),
             "drafted": e.drafted, "accepted": e.accepted} for e in external]  # fmt: skip
    return out


def by_category(summaries: list[Summary]) -> list[Summary]:
    """Rows grouped by category, in the order categories first appear (a stable sort)."""
    order = {c: i for i, c in enumerate(dict.fromkeys(s.category for s in summaries))}
    return sorted(summaries, key=lambda s: order[s.category])
