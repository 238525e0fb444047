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

import json
import os
import re
import statistics
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec_cli import runner
from specdec_cli.engine.drafters import Drafter, ModelDrafter, NgramDrafter
from specdec_cli.engine.sampling import SamplerSettings
from specdec_cli.engine.speculative import GenerationConfig, SpeculativeGenerator
from specdec_cli.engine.stats import Stats
from specdec_cli.errors import SpecdecError
from specdec_cli.prompts import PROMPTS, BenchPrompt

TARGET_ONLY = "target"


class BenchInputError(SpecdecError):
    exit_code = 2


def category_groups(prompts: Sequence[BenchPrompt]) -> list[str]:
    """Each prompt category, then "all" when there are several."""
    cats = sorted({p.category for p in prompts})
    return [*cats, "all"] if len(cats) > 1 else cats


@dataclass(frozen=True)
class BenchConfig:
    """`target`, `model:K` / `ngram:K` (fixed K), `model:auto` / `ngram:auto` (adaptive K up to a maximum)."""

    name: str
    drafter: str | None
    k: int = 0
    adaptive: bool = False


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
        if kind not in runner.DRAFTERS or not arg:
            raise BenchInputError(
                f"unknown configuration {name!r}: use target, model:K, model:auto, ngram:K or ngram:auto"
            )
        if arg == "auto":
            out.append(BenchConfig(name, kind, model_k if kind == runner.MODEL else ngram_k, True))
        elif arg.isdigit() and int(arg) >= 1:
            out.append(BenchConfig(name, kind, int(arg), False))
        else:
            raise BenchInputError(f"in configuration {name!r}: K must be a whole number >= 1 or auto")
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
    identical: bool | None  # greedy: every run's tokens equal the target alone's
    acceptance_rate: float | None
    tokens_per_step: float | None  # None for llama.cpp's runs (it does not say)
    accepted_by_position: list[float]
    split: dict[str, float]  # fractions of generation time (empty for llama.cpp's runs)
    overhead_fraction: float | None

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        for key in ("seconds", "tps_median", "tps_min", "tps_max", "speedup", "acceptance_rate", "tokens_per_step"):
            if d[key] is not None:
                d[key] = round(d[key], 4)
        d["accepted_by_position"] = [round(x, 4) for x in self.accepted_by_position]
        d["split"] = {k: round(v, 4) for k, v in self.split.items()}
        d["overhead_fraction"] = None if self.overhead_fraction is None else round(self.overhead_fraction, 4)
        return d


@dataclass
class BenchResult:
    configs: list[BenchConfig]
    prompts: list[BenchPrompt]
    greedy: bool
    records: list[RunRecord] = field(default_factory=list)

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
            identical=self._identical(config, cat),
            acceptance_rate=total.acceptance_rate if total.drafted else None,
            tokens_per_step=total.tokens_per_step,
            accepted_by_position=total.accepted_by_position,
            split=split,
            overhead_fraction=max(0.0, 1.0 - decode / seconds),
        )


def make_drafter(cfg: BenchConfig, pair: runner.LoadedPair, ngram: tuple[int, int]) -> Drafter | None:
    if cfg.drafter == runner.MODEL:
        if pair.draft is None:
            raise BenchInputError(f"configuration {cfg.name} needs a draft model: give --draft or --pair")
        return ModelDrafter(pair.draft)
    if cfg.drafter == runner.NGRAM:
        return NgramDrafter(*ngram)
    return None


def run_one(
    pair: runner.LoadedPair,
    cfg: BenchConfig,
    tokens: Sequence[int],
    *,
    max_tokens: int,
    sampler: SamplerSettings,
    seed: int | None,
    draft_p_min: float,
    ngram: tuple[int, int],
) -> tuple[list[int], float, Stats]:
    gen_cfg = GenerationConfig(
        max_tokens=max_tokens,
        draft_max=max(cfg.k, 1),
        adaptive=cfg.adaptive,
        draft_p_min=draft_p_min if cfg.drafter == runner.MODEL else 0.0,
        sampler=sampler,
        seed=seed,
    )
    gen = SpeculativeGenerator(pair.target, make_drafter(cfg, pair, ngram), tokens, gen_cfg)
    stats = Stats()
    for ev in gen.events():
        stats.observe(ev)
    res = gen.result
    return res.token_ids, res.wall_seconds - stats.t_prefill, stats


def run_bench(
    pair: runner.LoadedPair,
    prompts: list[BenchPrompt],
    configs: list[BenchConfig],
    *,
    repeats: int,
    warmup: int,
    max_tokens: int,
    sampler: SamplerSettings,
    seed: int | None,
    draft_p_min: float,
    ngram: tuple[int, int],
    on_run: Callable[[str], None] | None = None,
) -> BenchResult:
    result = BenchResult(configs, prompts, sampler.greedy)
    tokenized = [runner.tokenize_prompt(pair.target, p.text, use_chat=None, system=None)[0] for p in prompts]
    for p, toks in zip(prompts, tokenized, strict=True):
        if len(toks) + max_tokens > pair.target.n_ctx:
            raise BenchInputError(
                f"prompt {p.name!r} is {len(toks)} tokens: with --max-tokens {max_tokens} it needs "
                f"--ctx-size >= {len(toks) + max_tokens}"
            )
    kw: dict[str, Any] = dict(max_tokens=max_tokens, sampler=sampler, seed=seed, draft_p_min=draft_p_min, ngram=ngram)
    for _ in range(warmup):
        for cfg in configs:
            run_one(pair, cfg, tokenized[0], **kw)
    for rep in range(repeats):
        for pi, (p, toks) in enumerate(zip(prompts, tokenized, strict=True)):
            shift = (rep + pi) % len(configs)
            for cfg in configs[shift:] + configs[:shift]:
                ids, secs, stats = run_one(pair, cfg, toks, **kw)
                result.records.append(RunRecord(cfg.name, p.name, p.category, rep, ids, secs, stats))
                if on_run is not None:
                    on_run(f"{cfg.name} / {p.name}")
    return result


# ------------------------------------------------- llama.cpp's own C++ loop
LLAMA_TOOLS = {runner.MODEL: "llama-speculative-simple", runner.NGRAM: "llama-lookup"}


def llama_cpp_configs(bin_dir: Path, configs: list[BenchConfig]) -> list[BenchConfig]:
    """The configurations llama.cpp's tools can run; their programs must exist (checked before any run)."""
    # llama-lookup has no adaptive K: ngram:auto would repeat its largest fixed-K run.
    wanted = [c for c in configs if c.drafter in LLAMA_TOOLS and not (c.drafter == runner.NGRAM and c.adaptive)]
    for c in wanted:
        tool = bin_dir / LLAMA_TOOLS[c.drafter or ""]
        if not os.access(tool, os.X_OK):
            raise BenchInputError(f"--llama-cpp-bin: {tool} not found (scripts/build-llama-cpp-tools.sh builds it)")
    return wanted


@dataclass
class ExternalRun:
    config: str
    category: str
    n_tokens: int
    seconds: float
    drafted: int
    accepted: int


def llama_cpp_command(
    bin_dir: Path,
    cfg: BenchConfig,
    target: Path,
    draft: Path | None,
    text: str,
    *,
    max_tokens: int,
    threads: int,
    ctx: int,
) -> list[str]:
    """The same pair, prompt text, K and greedy settings, and the same kernels (no repacking, no flash attention)."""
    tool = bin_dir / LLAMA_TOOLS[cfg.drafter or ""]
    cmd = [str(tool), "-m", str(target), "-p", text, "-n", str(max_tokens), "--temp", "0", "-t", str(threads)]
    cmd += ["-c", str(ctx), "-fa", "off", "--no-repack", "--spec-draft-n-max", str(cfg.k)]
    if cfg.drafter == runner.MODEL:
        assert draft is not None
        cmd += ["-md", str(draft), "--spec-type", "draft-simple", "-td", str(threads)]
        cmd += ["--spec-draft-p-min", "0.75" if cfg.adaptive else "0"]  # llama.cpp's own adaptivity is p-min
    return cmd


def parse_llama_cpp(output: str) -> tuple[int, float, int, int]:
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", output)
    d = re.search(r"n_drafted\s*=\s*(\d+)", output)
    a = re.search(r"n_accept\s*=\s*(\d+)", output)
    if not (m and d and a):
        raise SpecdecError("could not read llama.cpp's speed from its output: " + output.strip()[-300:])
    return int(m.group(1)), float(m.group(2)), int(d.group(1)), int(a.group(1))


def run_llama_cpp(
    bin_dir: Path,
    pair: runner.LoadedPair,
    target: Path,
    draft: Path | None,
    prompts: list[BenchPrompt],
    configs: list[BenchConfig],
    *,
    repeats: int,
    max_tokens: int,
    threads: int,
    on_run: Callable[[str], None] | None = None,
) -> list[ExternalRun]:
    from specdec_cli.engine import chat

    runs: list[ExternalRun] = []
    wanted = llama_cpp_configs(bin_dir, configs)
    info = pair.target.info()
    sp = pair.target.special_texts()
    env = {**os.environ, "GGML_CPU_TILED_MM": "0"}
    for rep in range(repeats):
        for p in prompts:
            text = p.text
            if info.chat_template:  # the same rendered prompt specdec tokenizes
                text = chat.render(
                    info.chat_template, runner.chat_messages(p.text, None), bos_token=sp.bos_text, eos_token=sp.eos_text
                )
                if sp.add_bos and sp.bos_text and text.startswith(sp.bos_text):
                    text = text[len(sp.bos_text) :]
            for c in wanted:
                cmd = llama_cpp_command(
                    bin_dir, c, target, draft, text, max_tokens=max_tokens, threads=threads, ctx=pair.target.n_ctx
                )
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
                if proc.returncode != 0:
                    raise SpecdecError(
                        f"{Path(cmd[0]).name} failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}"
                    )
                n, secs, drafted, accepted = parse_llama_cpp(proc.stdout + proc.stderr)
                runs.append(ExternalRun(f"llama.cpp {c.name}", p.category, n, secs, drafted, accepted))
                if on_run is not None:
                    on_run(f"llama.cpp {c.name} / {p.name} ({rep + 1})")
    return runs


def summarise_external(runs: list[ExternalRun], records: list[RunRecord], prompts: list[BenchPrompt]) -> list[Summary]:
    out = []
    for cat in category_groups(prompts):
        base = [r for r in records if r.config == TARGET_ONLY and (cat == "all" or r.category == cat)]
        base_tps = sum(len(r.token_ids) for r in base) / sum(r.seconds for r in base) if base else None
        for name in dict.fromkeys(r.config for r in runs):
            rs = [r for r in runs if r.config == name and (cat == "all" or r.category == cat)]
            if not rs:
                continue
            tokens, seconds = sum(r.n_tokens for r in rs), sum(r.seconds for r in rs)
            tps = [r.n_tokens / r.seconds for r in rs if r.seconds > 0]
            drafted, accepted = sum(r.drafted for r in rs), sum(r.accepted for r in rs)
            out.append(
                Summary(
                    config=name,
                    category=cat,
                    runs=len(rs),
                    tokens=tokens,
                    seconds=seconds,
                    tps_median=statistics.median(tps),
                    tps_min=min(tps),
                    tps_max=max(tps),
                    speedup=(tokens / seconds) / base_tps if base_tps else None,
                    identical=None,
                    acceptance_rate=accepted / drafted if drafted else None,
                    tokens_per_step=None,
                    accepted_by_position=[],
                    split={},
                    overhead_fraction=None,
                )
            )
    return out


def plot(summaries: list[Summary], path: Path) -> None:
    """Acceptance by draft position per configuration, and tokens/s against K."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BenchInputError("--plot needs matplotlib: pip install 'specdec[plot]'") from None
    cat = summaries[-1].category  # "all" when there are several categories
    rows = [s for s in summaries if s.category == cat]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for s in rows:
        if s.accepted_by_position:
            xs = range(1, len(s.accepted_by_position) + 1)
            ax1.plot(xs, [100 * a for a in s.accepted_by_position], marker="o", label=s.config)
    ax1.set(title="acceptance by draft position", xlabel="position in the draft", ylabel="accepted (%)", ylim=(0, 100))
    if ax1.lines:
        ax1.legend(fontsize="small")
    base = next((s for s in rows if s.config == TARGET_ONLY), None)
    for kind in (runner.MODEL, runner.NGRAM, f"llama.cpp {runner.MODEL}", f"llama.cpp {runner.NGRAM}"):
        pts = sorted(
            (int(s.config.rsplit(":", 1)[1]), s.tokens / s.seconds)
            for s in rows
            if s.config.rsplit(":", 1)[0] == kind and s.config.rsplit(":", 1)[1].isdigit()
        )
        if pts:
            ax2.plot([k for k, _ in pts], [t for _, t in pts], marker="o", label=f"{kind}:K")
        for s in rows:
            if s.config == f"{kind}:auto":
                ax2.axhline(s.tokens / s.seconds, linestyle=":", color="grey")
                ax2.annotate(s.config, (1, s.tokens / s.seconds), fontsize="small")
    if base is not None:
        ax2.axhline(base.tokens / base.seconds, linestyle="--", color="black", label="target alone")
    ax2.set(title=f"tokens/s against K ({cat})", xlabel="K (tokens drafted per step)", ylabel="tokens/s")
    ax2.legend(fontsize="small")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise BenchInputError(f"cannot write --plot {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
