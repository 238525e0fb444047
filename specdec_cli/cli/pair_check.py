"""`specdec pair-check`: can these two models speculate together, and how fast would they be?"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specdec_cli.cli.options import JsonOpt, RuntimeOptions, with_options
from specdec_cli.cli.output import Output, usage_error
from specdec_cli.errors import ExitCode


@with_options
def pair_check(
    target: Annotated[Path | None, typer.Argument(help="Target GGUF file.", show_default=False)] = None,
    draft: Annotated[Path | None, typer.Argument(help="Draft GGUF file.", show_default=False)] = None,
    pair: Annotated[str | None, typer.Option(help="A named pair from models.toml instead of two paths.")] = None,
    probe: Annotated[
        bool,
        typer.Option(
            "--probe",
            help="Run both models on built-in prompts: measure acceptance and costs, predict the speedup per K, "
            "recommend K, and check it.",
        ),
    ] = False,
    heads: Annotated[
        Path | None,
        typer.Option("--heads", help="With --probe, also probe these Medusa heads for the target (`specdec heads "
                     "train`): their acceptance by position, cost, predicted and measured speedup.", show_default=False),
    ] = None,
    *,
    runtime: RuntimeOptions,
    json_out: JsonOpt = False,
) -> None:
    """Can these two models speculate together, and how fast would they be?

    Exit code 0 for "compatible", "compatible (padded)" and "compatible (different tokenizers)", 1 for
    "incompatible".
    """
    if pair and (target or draft):
        raise usage_error("give either TARGET DRAFT or --pair NAME, not both")
    if not pair and not (target and draft):
        raise usage_error("give TARGET and DRAFT paths, or --pair NAME")
    if heads is not None and not probe:
        raise usage_error("--heads is probed: add --probe")

    from specdec_cli import pairs
    from specdec_cli.engine import native
    from specdec_cli.engine.settings import check_load
    from specdec_cli.models import loading

    out = Output(json_out)
    native.set_verbose(runtime.verbose)
    with out.errors():
        check_load(n_ctx=runtime.ctx_size, n_threads=runtime.threads)
        choice = loading.choose_models(target, draft, pair, no_draft=False)
        assert choice.draft is not None
        report = pairs.inspect_pair(choice.target, choice.draft, runtime.ctx_size)
        probe_result = heads_result = None
        if probe and report.verdict.ok:
            from specdec_cli import api
            from specdec_cli.pairs import probe as probe_mod

            with api.load(
                choice.target,
                choice.draft,
                n_ctx=min(runtime.ctx_size, 2048),
                n_threads=runtime.threads,
                verbose=runtime.verbose,
                heads=heads,
                **runtime.load_kwargs(),
            ) as spec:
                probe_result = probe_mod.run_probe(spec)
                if heads is not None:
                    heads_result = probe_mod.run_heads_probe(spec)

    def human() -> None:
        from specdec_cli.render.reports import pair_report

        pair_report(report, probe_result, heads=heads_result)

    out.result(report.as_dict(probe_result, heads_result), human)
    if not report.fits:
        available = report.memory_available / 2**20 if report.memory_available else 0
        out.warning(
            f"running both needs about {report.memory_needed / 2**20:,.0f} MB at --ctx-size {runtime.ctx_size}, "
            f"more than the {available:,.0f} MB available"
        )
    if probe and not report.verdict.ok:
        out.warning("--probe skipped: the pair is incompatible")
    raise typer.Exit(ExitCode.OK if report.verdict.ok else ExitCode.ERROR)
