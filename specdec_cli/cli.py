"""The `specdec` command line: parse options, call the engine, hand events to render."""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from specdec_cli import __version__
from specdec_cli.cli_common import usage_error as _usage
from specdec_cli.cli_common import user_errors

app = typer.Typer(
    name="specdec",
    help="Lossless speculative decoding for local GGUF models: faster, with exactly the target's output.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"specdec {__version__}")
        raise typer.Exit()


def _add_subcommands() -> None:
    from specdec_cli import cli_models

    app.add_typer(cli_models.app)


_add_subcommands()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """Lossless speculative decoding for local GGUF models."""


def _read_prompt(prompt: str | None) -> str:
    if prompt is None or prompt == "-":
        if prompt is None and sys.stdin.isatty():
            raise _usage("give a PROMPT, or pipe one on stdin (use - to read stdin explicitly)")
        text = sys.stdin.read()
        if not text.strip():
            raise _usage("the prompt read from stdin is empty")
        return text.rstrip("\n")
    return prompt


TargetOpt = Annotated[
    Path | None, typer.Option(help="Target GGUF file: the model whose output you get.", rich_help_panel="Models")
]
DraftOpt = Annotated[
    Path | None, typer.Option(help="Draft GGUF file (same vocabulary, smaller).", rich_help_panel="Models")
]
PairOpt = Annotated[str | None, typer.Option(help="A named pair from models.toml.", rich_help_panel="Models")]
NoDraftOpt = Annotated[
    bool, typer.Option("--no-draft", help="Run the target alone (the baseline).", rich_help_panel="Models")
]
TempOpt = Annotated[float, typer.Option("--temp", help="Temperature; 0 = greedy.", rich_help_panel="Sampling")]
TopKOpt = Annotated[
    int, typer.Option("--top-k", help="Keep the k most likely tokens (0 = off).", rich_help_panel="Sampling")
]
TopPOpt = Annotated[
    float, typer.Option("--top-p", help="Nucleus sampling threshold (1 = off).", rich_help_panel="Sampling")
]
MinPOpt = Annotated[
    float,
    typer.Option(
        "--min-p", help="Drop tokens below min-p x the top probability (0 = off).", rich_help_panel="Sampling"
    ),
]
SeedOpt = Annotated[int | None, typer.Option(help="Seed for a reproducible sampled run.", rich_help_panel="Sampling")]
MaxTokensOpt = Annotated[
    int, typer.Option("-n", "--max-tokens", help="Stop after this many tokens.", rich_help_panel="Sampling")
]
# Defaults (README, "Drafters and draft length"): K and adaptive K chosen from `specdec bench`
# runs; --draft-p-min is off until measured.
DEFAULT_K = {"model": 4, "ngram": 8}
DEFAULT_P_MIN = 0.0
DEFAULT_NGRAM = (2, 4)


class DrafterKind(enum.StrEnum):
    model = "model"
    ngram = "ngram"


DrafterOpt = Annotated[
    DrafterKind,
    typer.Option(
        "--drafter",
        help="model: the draft model proposes; ngram: copy what followed the latest match of the last "
        "tokens in the prompt and output (no draft model needed).",
        rich_help_panel="Speculation",
    ),
]
DraftMaxOpt = Annotated[
    int | None,
    typer.Option(
        "-k",
        "--draft-max",
        help=f"Most tokens drafted per step (default: the pair's, else {DEFAULT_K['model']}; ngram {DEFAULT_K['ngram']}).",
        rich_help_panel="Speculation",
    ),
]
DraftMinOpt = Annotated[
    int, typer.Option("--draft-min", help="Fewest tokens the adaptive schedule drafts.", rich_help_panel="Speculation")
]
FixedKOpt = Annotated[
    bool,
    typer.Option(
        "--fixed-k",
        help="Draft --draft-max tokens every step, instead of raising K after fully accepted drafts and "
        "lowering it after rejections.",
        rich_help_panel="Speculation",
    ),
]
DraftPMinOpt = Annotated[
    float,
    typer.Option(
        "--draft-p-min",
        help="Draft model: stop a draft where its top token's probability is below this (0 = off).",
        rich_help_panel="Speculation",
    ),
]
NgramMinOpt = Annotated[
    int, typer.Option("--ngram-min", help="Shortest n-gram the ngram drafter matches.", rich_help_panel="Speculation")
]
NgramMaxOpt = Annotated[
    int,
    typer.Option("--ngram-max", help="Longest n-gram the ngram drafter tries first.", rich_help_panel="Speculation"),
]
CtxOpt = Annotated[
    int, typer.Option("--ctx-size", help="Context window in tokens, for each model.", rich_help_panel="Runtime")
]
ThreadsOpt = Annotated[int | None, typer.Option(help="CPU threads (default: all cores).", rich_help_panel="Runtime")]
GpuOpt = Annotated[int, typer.Option(help="Target layers to offload to a GPU.", rich_help_panel="Runtime")]
DraftGpuOpt = Annotated[int, typer.Option(help="Draft layers to offload to a GPU.", rich_help_panel="Runtime")]
SystemOpt = Annotated[str | None, typer.Option(help="System prompt (with the chat template).")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", help="Show llama.cpp's own log.")]


@dataclasses.dataclass(frozen=True)
class SpecOptions:
    """The speculation options run and chat share, checked once."""

    drafter: str
    draft_max: int | None
    draft_min: int
    fixed_k: bool
    draft_p_min: float
    ngram_min: int
    ngram_max: int

    def validate(self) -> None:
        if self.draft_min < 1:
            raise _usage(f"--draft-min must be >= 1, got {self.draft_min}")
        if self.draft_max is not None and self.draft_min > self.draft_max:
            raise _usage(f"--draft-min ({self.draft_min}) is larger than --draft-max ({self.draft_max})")
        if not 0 <= self.draft_p_min < 1:
            raise _usage(f"--draft-p-min must be in [0, 1), got {self.draft_p_min}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise _usage(f"need 1 <= --ngram-min <= --ngram-max, got {self.ngram_min} and {self.ngram_max}")

    def k(self, pair_k: int | None) -> int:
        if self.draft_max is not None:
            return self.draft_max
        if self.drafter == "ngram":
            return DEFAULT_K["ngram"]
        return pair_k or DEFAULT_K["model"]

    def config(self, pair_k: int | None, **kw: Any) -> Any:
        from specdec_cli.engine.speculative import GenerationConfig

        k = self.k(pair_k)
        return GenerationConfig(
            draft_max=k,
            draft_min=min(self.draft_min, k),
            adaptive=not self.fixed_k,
            draft_p_min=self.draft_p_min,
            **kw,
        )

    def settings(self, k: int, has_drafter: bool) -> dict[str, Any]:
        return {
            "drafter": self.drafter if has_drafter else None,
            "draft_max": k if has_drafter else 0,
            "draft_min": self.draft_min,
            "adaptive_k": not self.fixed_k,
            "draft_p_min": self.draft_p_min,
            "ngram": [self.ngram_min, self.ngram_max] if self.drafter == "ngram" else None,
        }


def _validate(
    temp: float,
    draft_max: int | None,
    max_tokens: int,
    ctx_size: int,
    top_k: int,
    top_p: float,
    min_p: float,
    threads: int | None,
) -> None:
    """Plain values first: one clear line, exit 2."""
    if not (math.isfinite(temp) and temp >= 0):  # NaN fails every comparison: test what is allowed
        raise _usage(f"--temp must be a finite number >= 0 (0 = greedy), got {temp}")
    if draft_max is not None and draft_max < 1:
        raise _usage(f"--draft-max must be >= 1, got {draft_max} (use --no-draft to run the target alone)")
    if max_tokens < 1:
        raise _usage(f"--max-tokens must be >= 1, got {max_tokens}")
    if ctx_size < 8:
        raise _usage(f"--ctx-size must be >= 8, got {ctx_size}")
    if top_k < 0 or not 0 < top_p <= 1 or not 0 <= min_p < 1:
        raise _usage("--top-k must be >= 0, --top-p in (0, 1], --min-p in [0, 1)")
    if threads is not None and threads < 1:
        raise _usage(f"--threads must be >= 1, got {threads}")


@app.command()
def run(
    prompt: Annotated[
        str | None, typer.Argument(help="The prompt; - or a pipe reads it from stdin.", show_default=False)
    ] = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    pair: PairOpt = None,
    no_draft: NoDraftOpt = False,
    temp: TempOpt = 0.0,
    top_k: TopKOpt = 40,
    top_p: TopPOpt = 0.95,
    min_p: MinPOpt = 0.05,
    seed: SeedOpt = None,
    max_tokens: MaxTokensOpt = 256,
    drafter: DrafterOpt = DrafterKind.model,
    draft_max: DraftMaxOpt = None,
    draft_min: DraftMinOpt = 1,
    fixed_k: FixedKOpt = False,
    draft_p_min: DraftPMinOpt = DEFAULT_P_MIN,
    ngram_min: NgramMinOpt = DEFAULT_NGRAM[0],
    ngram_max: NgramMaxOpt = DEFAULT_NGRAM[1],
    ctx_size: CtxOpt = 4096,
    threads: ThreadsOpt = None,
    gpu_layers: GpuOpt = 0,
    draft_gpu_layers: DraftGpuOpt = 0,
    chat: Annotated[
        bool | None,
        typer.Option(
            "--chat/--raw",
            help="Apply the target's chat template (default when it has one), or feed the prompt as is.",
            show_default=False,
        ),
    ] = None,
    system: SystemOpt = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print one JSON object with the text and the stats.")
    ] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Generate once, with live acceptance stats."""
    _validate(temp, draft_max, max_tokens, ctx_size, top_k, top_p, min_p, threads)
    spec = SpecOptions(drafter.value, draft_max, draft_min, fixed_k, draft_p_min, ngram_min, ngram_max)
    spec.validate()
    text = _read_prompt(prompt)

    from specdec_cli import runner
    from specdec_cli.engine import model as model_mod
    from specdec_cli.engine.sampling import SamplerSettings
    from specdec_cli.engine.speculative import SpeculativeGenerator
    from specdec_cli.engine.stats import Stats
    from specdec_cli.render import make_renderer

    model_mod.set_verbose(verbose)
    renderer = make_renderer(
        json_out, title=f"speculation ({drafter.value} drafter)" if not no_draft else "target alone"
    )
    loaded = None
    with user_errors(renderer.abort):
        choice = runner.choose_models(target, draft, pair, no_draft, drafter=spec.drafter)
        k = spec.k(choice.draft_max)
        loaded = runner.load_pair(
            choice,
            n_ctx=ctx_size,
            n_threads=threads,
            gpu_layers=gpu_layers,
            draft_gpu_layers=draft_gpu_layers,
            ngram=(ngram_min, ngram_max),
        )
        tokens, used_chat = runner.tokenize_prompt(loaded.target, text, use_chat=chat, system=system)
        sampler = SamplerSettings(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p)
        config = spec.config(choice.draft_max, max_tokens=max_tokens, sampler=sampler, seed=seed)
        gen = SpeculativeGenerator(loaded.target, loaded.drafter(), tokens, config)
        stats = Stats()
        renderer.start()
        interrupted = False
        try:
            for ev in gen.events():
                stats.observe(ev)
                renderer.event(ev, stats)
        except KeyboardInterrupt:
            interrupted = True
            gen.result.stop_reason = "interrupted"
        result = gen.result
        gen_seconds = result.wall_seconds - (stats.t_prefill if result.prefill else 0.0)
        payload = {
            "text": result.text,
            "token_ids": result.token_ids,
            "n_tokens": len(result.token_ids),
            "stop_reason": result.stop_reason,
            "n_prompt_tokens": result.n_prompt,
            "models": {
                "target": str(choice.target),
                "draft": str(choice.draft) if choice.draft else None,
                "pair": choice.pair,
            },
            "settings": {
                "temperature": temp,
                "top_k": top_k,
                "top_p": top_p,
                "min_p": min_p,
                "seed": seed,
                "max_tokens": max_tokens,
                **spec.settings(k, loaded.drafter_kind is not None),
                "ctx_size": ctx_size,
                "threads": threads,
                "chat_template": used_chat,
                "system": system,
            },
            "stats": stats.as_dict(result.wall_seconds, gen_seconds),
        }
        renderer.finish(result, stats, payload)
        loaded.close()
        if interrupted:
            raise typer.Exit(130)


def main() -> None:
    """Entry point: Click's own usage errors (unknown option, bad type) become one line too."""
    from specdec_cli.render import error_line

    try:
        rv = app(prog_name="specdec", standalone_mode=False)
    except typer.TyperException as exc:  # Click's UsageError and friends
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        error_line(exc.format_message() + hint)
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(1)
    sys.exit(rv if isinstance(rv, int) else 0)


@app.command("pair-check")
def pair_check(
    target: Annotated[Path | None, typer.Argument(help="Target GGUF file.", show_default=False)] = None,
    draft: Annotated[Path | None, typer.Argument(help="Draft GGUF file.", show_default=False)] = None,
    pair: Annotated[str | None, typer.Option(help="A named pair from models.toml instead of two paths.")] = None,
    ctx_size: Annotated[
        int, typer.Option("--ctx-size", help="Context size for the memory estimate (and the probe).")
    ] = 4096,
    probe: Annotated[
        bool,
        typer.Option(
            "--probe",
            help="Run both models on built-in prompts: measure acceptance and costs, predict the speedup per K, recommend K, and check it.",
        ),
    ] = False,
    threads: Annotated[int | None, typer.Option(help="CPU threads for --probe.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="Show llama.cpp's own log.")] = False,
) -> None:
    """Can these two models speculate together, and how fast would they be?

    Exit code 0 for "compatible" and "compatible (padded)", 1 for "incompatible".
    """
    if ctx_size < 8:
        raise _usage(f"--ctx-size must be >= 8, got {ctx_size}")
    if pair and (target or draft):
        raise _usage("give either TARGET DRAFT or --pair NAME, not both")
    if not pair and not (target and draft):
        raise _usage("give TARGET and DRAFT paths, or --pair NAME")

    import dataclasses
    import json

    from rich.console import Console

    from specdec_cli import pairs, render, runner
    from specdec_cli.engine import model as model_mod

    model_mod.set_verbose(verbose)
    with user_errors():
        if pair:
            choice = runner.choose_models(None, None, pair, False)
            assert choice.draft is not None
            t_path, d_path = choice.target, choice.draft
        else:
            assert target and draft
            t_path, d_path = model_mod.check_gguf_file(target), model_mod.check_gguf_file(draft)
        report = pairs.inspect_pair(t_path, d_path, ctx_size)
        probe_result = None
        if probe and report.verdict.ok:
            from specdec_cli import probe as probe_mod

            probe_result = probe_mod.run_probe(t_path, d_path, n_ctx=min(ctx_size, 2048), n_threads=threads)

    def plain(x: Any) -> Any:
        if isinstance(x, bytes):
            return x.decode("utf-8", "replace")
        if isinstance(x, (list, tuple)):
            return [plain(i) for i in x]
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        return x

    if json_out:
        payload = plain(dataclasses.asdict(report))
        payload["verdict"] = report.verdict.verdict
        payload["reason"] = report.verdict.reason
        payload["fits_in_memory"] = report.fits
        payload["probe"] = plain(dataclasses.asdict(probe_result)) if probe_result else None
        typer.echo(json.dumps(payload, ensure_ascii=False))
    else:
        render.pair_report(Console(highlight=False, no_color=render.no_color()), report, probe_result)
    if not report.fits:
        render.warning(
            f"running both needs about {report.memory_needed / 2**20:,.0f} MB at --ctx-size {ctx_size}, "
            f"more than the {report.memory_available / 2**20 if report.memory_available else 0:,.0f} MB available"
        )
    if probe and not report.verdict.ok:
        render.warning("--probe skipped: the pair is incompatible")
    raise typer.Exit(0 if report.verdict.ok else 1)


@app.command()
def chat(
    target: TargetOpt = None,
    draft: DraftOpt = None,
    pair: PairOpt = None,
    no_draft: NoDraftOpt = False,
    temp: TempOpt = 0.0,
    top_k: TopKOpt = 40,
    top_p: TopPOpt = 0.95,
    min_p: MinPOpt = 0.05,
    seed: SeedOpt = None,
    max_tokens: MaxTokensOpt = 512,
    drafter: DrafterOpt = DrafterKind.model,
    draft_max: DraftMaxOpt = None,
    draft_min: DraftMinOpt = 1,
    fixed_k: FixedKOpt = False,
    draft_p_min: DraftPMinOpt = DEFAULT_P_MIN,
    ngram_min: NgramMinOpt = DEFAULT_NGRAM[0],
    ngram_max: NgramMaxOpt = DEFAULT_NGRAM[1],
    ctx_size: CtxOpt = 4096,
    threads: ThreadsOpt = None,
    gpu_layers: GpuOpt = 0,
    draft_gpu_layers: DraftGpuOpt = 0,
    system: SystemOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Talk to a target/draft pair, turn by turn (/help inside lists the commands)."""
    _validate(temp, draft_max, max_tokens, ctx_size, top_k, top_p, min_p, threads)
    spec = SpecOptions(drafter.value, draft_max, draft_min, fixed_k, draft_p_min, ngram_min, ngram_max)
    spec.validate()

    from platformdirs import user_data_dir

    from specdec_cli import repl, runner
    from specdec_cli.chat_session import ChatSession
    from specdec_cli.engine import model as model_mod
    from specdec_cli.engine.sampling import SamplerSettings

    model_mod.set_verbose(verbose)
    stdin, out, err = sys.stdin, sys.stdout, sys.stderr
    with user_errors():
        choice = runner.choose_models(target, draft, pair, no_draft, drafter=spec.drafter)
        loaded = runner.load_pair(
            choice,
            n_ctx=ctx_size,
            n_threads=threads,
            gpu_layers=gpu_layers,
            draft_gpu_layers=draft_gpu_layers,
            ngram=(ngram_min, ngram_max),
        )
        try:
            config = spec.config(
                choice.draft_max,
                max_tokens=max_tokens,
                sampler=SamplerSettings(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p),
                seed=seed,
            )
            session = ChatSession(loaded, config, system=system)
            draft_name = (
                choice.draft.name
                if choice.draft
                else "n-gram lookup (no draft model)"
                if loaded.ngram
                else "none (target alone)"
            )
            err.write(
                f"specdec chat: target {choice.target.name}, draft {draft_name}. /help for commands, /exit or Ctrl-D to leave.\n"
            )
            reader = repl.LineReader(stdin, Path(user_data_dir("specdec")) / "chat_history")
            repl.Repl(session, out, err, reader).run()
        finally:
            loaded.close()


@app.command()
def bench(
    target: TargetOpt = None,
    draft: DraftOpt = None,
    pair: PairOpt = None,
    configs: Annotated[
        str,
        typer.Option(
            "--configs",
            help="Comma-separated configurations: target (alone), model:K or ngram:K (fixed K), "
            "model:auto or ngram:auto (adaptive K up to --draft-max / --ngram-draft-max).",
        ),
    ] = "target,model:1,model:2,model:4,model:auto,ngram:auto",
    prompts: Annotated[
        Path | None,
        typer.Option("--prompts", help='JSONL file, one {"prompt": ..., "category": ..., "name": ...} per line.'),
    ] = None,
    category: Annotated[str | None, typer.Option(help="Only the prompts of this category.")] = None,
    repeats: Annotated[int, typer.Option(help="Runs of every prompt under every configuration.")] = 2,
    warmup: Annotated[int, typer.Option(help="Warm-up rounds (discarded).")] = 1,
    max_tokens: MaxTokensOpt = 128,
    draft_max: Annotated[
        int | None, typer.Option("--draft-max", help="K limit of model:auto (default: the pair's, else 4).")
    ] = None,
    ngram_draft_max: Annotated[int, typer.Option("--ngram-draft-max", help="K limit of ngram:auto.")] = DEFAULT_K[
        "ngram"
    ],
    draft_p_min: DraftPMinOpt = DEFAULT_P_MIN,
    ngram_min: NgramMinOpt = DEFAULT_NGRAM[0],
    ngram_max: NgramMaxOpt = DEFAULT_NGRAM[1],
    temp: TempOpt = 0.0,
    top_k: TopKOpt = 40,
    top_p: TopPOpt = 0.95,
    min_p: MinPOpt = 0.05,
    seed: SeedOpt = None,
    ctx_size: CtxOpt = 2048,
    threads: ThreadsOpt = None,
    llama_cpp_bin: Annotated[
        Path | None,
        typer.Option(
            "--llama-cpp-bin",
            help="Folder with llama.cpp's llama-speculative-simple and llama-lookup "
            "(scripts/build-llama-cpp-tools.sh): run them on the same pair, prompts and K, after specdec's runs.",
        ),
    ] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Write a PNG: acceptance by position, tokens/s against K.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Measure configurations of one pair side by side: speed, speedup, acceptance, where the time goes."""
    _validate(temp, draft_max, max_tokens, ctx_size, top_k, top_p, min_p, threads)
    if repeats < 1 or warmup < 0:
        raise _usage("--repeats must be >= 1 and --warmup >= 0")
    spec = SpecOptions("model", draft_max, 1, False, draft_p_min, ngram_min, ngram_max)
    spec.validate()
    if ngram_draft_max < 1:
        raise _usage(f"--ngram-draft-max must be >= 1, got {ngram_draft_max}")

    import json

    from specdec_cli import bench as bench_mod
    from specdec_cli import render, runner
    from specdec_cli.engine import model as model_mod
    from specdec_cli.engine.sampling import SamplerSettings

    model_mod.set_verbose(verbose)
    with user_errors():
        prompt_set = bench_mod.load_prompts(prompts, category)
        # --target alone is enough for target and ngram configurations.
        drafter = "ngram" if (target and not draft) else "model"
        choice = runner.choose_models(target, draft, pair, False, drafter=drafter)
        cfgs = bench_mod.parse_configs(configs, spec.k(choice.draft_max), ngram_draft_max)
        if any(c.drafter == "model" for c in cfgs):
            if choice.draft is None:
                raise bench_mod.BenchInputError("model configurations need a draft model: give --draft or --pair")
        else:
            choice = dataclasses.replace(choice, draft=None, drafter=None)  # do not load it
        loaded = runner.load_pair(
            choice, n_ctx=ctx_size, n_threads=threads, gpu_layers=0, draft_gpu_layers=0, ngram=(ngram_min, ngram_max)
        )
        if llama_cpp_bin is not None and temp > 0:
            raise bench_mod.BenchInputError("--llama-cpp-bin compares greedy runs: use --temp 0")
        n_external = len(bench_mod.llama_cpp_configs(llama_cpp_bin, cfgs)) if llama_cpp_bin else 0
        if plot is not None and not plot.parent.is_dir():
            raise bench_mod.BenchInputError(f"cannot write --plot {plot}: no folder {plot.parent}")
        try:
            sampler = SamplerSettings(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p)
            total = len(prompt_set) * (len(cfgs) + n_external) * repeats
            with render.bench_progress(total, enabled=not json_out) as advance:
                result = bench_mod.run_bench(
                    loaded,
                    prompt_set,
                    cfgs,
                    repeats=repeats,
                    warmup=warmup,
                    max_tokens=max_tokens,
                    sampler=sampler,
                    seed=seed,
                    draft_p_min=draft_p_min,
                    ngram=(ngram_min, ngram_max),
                    on_run=advance,
                )
                external = []
                if llama_cpp_bin is not None:
                    external = bench_mod.run_llama_cpp(
                        llama_cpp_bin,
                        loaded,
                        choice.target,
                        choice.draft,
                        prompt_set,
                        cfgs,
                        repeats=repeats,
                        max_tokens=max_tokens,
                        threads=threads or max(1, os.cpu_count() or 1),
                        on_run=advance,
                    )
        finally:
            loaded.close()
        summaries = result.summaries()
        if external:
            summaries += bench_mod.summarise_external(external, result.records, prompt_set)
            order = {c: i for i, c in enumerate(dict.fromkeys(s.category for s in summaries))}
            summaries.sort(key=lambda s: order[s.category])
        if plot is not None:
            bench_mod.plot(summaries, plot)
    if json_out:
        payload = {
            "models": {"target": str(choice.target), "draft": str(choice.draft) if choice.draft else None},
            "settings": {
                "configs": [c.__dict__ for c in cfgs],
                "prompts": len(prompt_set),
                "repeats": repeats,
                "warmup": warmup,
                "max_tokens": max_tokens,
                "temperature": temp,
                "top_k": top_k,
                "top_p": top_p,
                "min_p": min_p,
                "seed": seed,
                "draft_p_min": draft_p_min,
                "ngram": [ngram_min, ngram_max],
                "threads": threads,
                "ctx_size": ctx_size,
            },
            "results": [s.as_dict() for s in summaries],
        }
        typer.echo(json.dumps(payload))
    else:
        render.bench_report(summaries, greedy=result.greedy)
        if plot is not None:
            sys.stderr.write(f"plot written to {plot}\n")
