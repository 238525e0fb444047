"""`specdec bench`: configurations of one pair measured side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specdec_cli.cli.options import (
    DraftOptions,
    JsonOpt,
    MaxTokensOpt,
    ModelOptions,
    NgramOptions,
    RuntimeOptions,
    SamplingOptions,
    generate_kwargs,
    load,
    with_options,
)
from specdec_cli.cli.output import Output
from specdec_cli.engine.settings import AUTO, DEFAULT_K, HEADS, MODEL, NGRAM


@with_options
def bench(
    ctx: typer.Context,
    *,
    models: ModelOptions,
    draft: DraftOptions,
    ngram: NgramOptions,
    sampling: SamplingOptions,
    runtime: RuntimeOptions,
    configs: Annotated[
        str,
        typer.Option(
            "--configs",
            help="Comma-separated configurations: target (alone), model:K or ngram:K (fixed K), "
            "model:auto or ngram:auto (adaptive K up to --draft-max / --ngram-draft-max), auto or auto:K "
            "(the auto drafter: n-gram, draft model or nothing each step, from measured costs).",
        ),
    ] = "target,model:1,model:2,model:4,model:auto,ngram:auto,auto",
    prompts: Annotated[
        Path | None,
        typer.Option("--prompts", help='JSONL file, one {"prompt": ..., "category": ..., "name": ...} per line.'),
    ] = None,
    category: Annotated[str | None, typer.Option(help="Only the prompts of this category.")] = None,
    repeats: Annotated[int, typer.Option(help="Runs of every prompt under every configuration.")] = 2,
    warmup: Annotated[int, typer.Option(help="Warm-up rounds (discarded).")] = 1,
    max_tokens: MaxTokensOpt = 128,
    ngram_draft_max: Annotated[
        int, typer.Option("--ngram-draft-max", help="K limit of ngram:auto.")
    ] = DEFAULT_K[NGRAM],
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
    results: Annotated[
        Path | None,
        typer.Option(
            "--results",
            help="Also write a results file (JSON) to this path: the table, every run's raw numbers and the "
            "measured costs, stamped with the date, commit, CPU, threads, llama.cpp build and the models' sha256 "
            "(the docs' tables are rendered from such files).",
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Measure configurations of one pair side by side: speed, speedup, acceptance, where the time goes."""
    from specdec_cli.api import GenerateOptions
    from specdec_cli.bench import core, external
    from specdec_cli.engine.native import usable_cores
    from specdec_cli.errors import UsageError

    out = Output(json_out)
    with out.errors():
        options = GenerateOptions(max_tokens=max_tokens, **generate_kwargs(sampling, draft)).validate()
        if repeats < 1 or warmup < 0:
            raise UsageError("--repeats must be >= 1 and --warmup >= 0")
        if ngram_draft_max < 1:
            raise UsageError(f"--ngram-draft-max must be >= 1, got {ngram_draft_max}")
        prompt_set = core.load_prompts(prompts, category)
        cfgs = core.parse_configs(configs, draft.draft_max or DEFAULT_K[MODEL], ngram_draft_max)
        if llama_cpp_bin is not None and (runtime.rpc or runtime.draft_rpc):
            raise UsageError("--llama-cpp-bin with --rpc: an RPC server serves one client at a time, and specdec "
                             "holds it during the bench; compare with llama-server over RPC with "
                             "benchmarks/rpc_latency.py")  # fmt: skip
        if llama_cpp_bin is not None and sampling.temperature > 0:
            raise UsageError("--llama-cpp-bin compares greedy runs: use --temp 0")
        n_external = len(external.llama_cpp_configs(llama_cpp_bin, cfgs)) if llama_cpp_bin else 0
        for option, path in (("--plot", plot), ("--results", results)):
            if path is not None and not path.parent.is_dir():
                raise UsageError(f"cannot write {option} {path}: no folder {path.parent}")
        if results is not None:
            from specdec_cli.bench import stamp

            stamp.started()
        needs_draft = any(c.drafter == MODEL for c in cfgs)
        if needs_draft and models.target and not models.draft:
            raise UsageError("model configurations need a draft model: give --draft or --pair")
        # --target alone is enough for target and ngram configurations: the draft is not loaded then.
        kind = MODEL if needs_draft else AUTO if any(c.drafter == AUTO for c in cfgs) else NGRAM
        if kind != AUTO and any(c.drafter == HEADS for c in cfgs):
            kind = HEADS if kind == NGRAM else kind  # heads configurations need the heads file (--heads)
        with load(models, runtime, ngram, kind) as spec:
            if draft.draft_max is None and spec.choice.draft_max:
                cfgs = core.parse_configs(configs, spec.choice.draft_max, ngram_draft_max)
            total = len(prompt_set) * (len(cfgs) + n_external) * repeats
            with out.progress(total) as advance:
                result = core.run_bench(
                    spec, prompt_set, cfgs, repeats=repeats, warmup=warmup, options=options, on_run=advance
                )
                runs = []
                if llama_cpp_bin is not None:
                    threads = spec.n_threads or usable_cores()
                    runs = external.run_llama_cpp(
                        llama_cpp_bin, spec, prompt_set, cfgs,
                        repeats=repeats, max_tokens=max_tokens, threads=threads, on_run=advance,
                    )  # fmt: skip
            models_json = spec.models
            files = {"target": spec.choice.target, "draft": spec.choice.draft, "heads": spec.choice.heads}
            threads_used = spec.n_threads or usable_cores()
        summaries = result.summaries()
        if runs:
            summaries = core.by_category(summaries + external.summarise_external(runs, result.records, prompt_set))
        if plot is not None:
            from specdec_cli.bench.plot import plot as write_plot

            write_plot(summaries, plot)

    def human() -> None:
        from specdec_cli.render.reports import bench_report

        bench_report(summaries, greedy=result.greedy, costs=result.costs, k_max=k_max)
        if plot is not None:
            out.note(f"plot written to {plot}")

    settings = {
        "configs": [c.__dict__ for c in cfgs],
        "prompts": len(prompt_set),
        "repeats": repeats,
        "warmup": warmup,
        **options.as_dict(),
        "ngram": list(ngram.sizes),
        "threads": runtime.threads,
        "ctx_size": runtime.ctx_size,
    }
    k_max = max(c.k for c in cfgs)
    payload = {
        "models": models_json,
        "settings": settings,
        "costs": result.costs.as_dict(k_max) if result.costs else None,
        "results": [s.as_dict() for s in summaries],
    }
    if results is not None:
        with out.errors():
            try:
                stamp.write(results, "bench", stamp.stamp(threads=threads_used, model_files=files, argv=_command_line(ctx)),
                            {**payload, "runs": core.raw_runs(result.records, runs)})  # fmt: skip
            except OSError as exc:
                raise UsageError(f"cannot write --results {results}: {exc.strerror or exc}") from None
    out.result(payload, human)



def _command_line(ctx: typer.Context) -> list[str]:
    """This command as it was given: the options set on the command line, under their long flags."""
    words = ctx.command_path.split()
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name or "")
        if source is None or source.name != "COMMANDLINE":
            continue
        value = ctx.params.get(param.name or "")
        flag = max(param.opts, key=len) if param.opts else ""
        if getattr(param, "is_flag", False):
            words.append(flag if value else (param.secondary_opts or [flag])[0])
        elif param.param_type_name == "argument":
            words.append(str(value))
        else:
            words += [flag, str(getattr(value, "value", value))]
    return words
