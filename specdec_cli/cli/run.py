"""`specdec run`: generate once, with live acceptance stats."""

from __future__ import annotations

from typing import Annotated

import typer

from specdec_cli.cli.options import (
    DrafterOptions,
    DraftOptions,
    JsonOpt,
    MaxTokensOpt,
    ModelOptions,
    NgramOptions,
    RuntimeOptions,
    SamplingOptions,
    SystemOpt,
    generate_kwargs,
    load,
    placement_note,
    with_options,
)
from specdec_cli.cli.output import Output, read_prompt
from specdec_cli.engine.settings import NONE
from specdec_cli.errors import ExitCode, RpcError

ChatOpt = Annotated[
    bool | None,
    typer.Option(
        "--chat/--raw",
        help="Apply the target's chat template (default when it has one), or feed the prompt as is.",
        show_default=False,
    ),
]


@with_options
def run(
    prompt: Annotated[
        str | None, typer.Argument(help="The prompt; - or a pipe reads it from stdin.", show_default=False)
    ] = None,
    *,
    models: ModelOptions,
    drafting: DrafterOptions,
    draft: DraftOptions,
    ngram: NgramOptions,
    sampling: SamplingOptions,
    runtime: RuntimeOptions,
    max_tokens: MaxTokensOpt = 256,
    chat: ChatOpt = None,
    system: SystemOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Generate once, with live acceptance stats."""
    from specdec_cli.api import GenerateOptions

    out = Output(json_out)
    with out.errors():
        options = GenerateOptions(
            max_tokens=max_tokens, system=system, chat=chat, **generate_kwargs(sampling, draft, drafting.fixed_k)
        ).validate()
        text = read_prompt(prompt)
        with load(models, runtime, ngram, drafting.kind) as spec:
            gen = spec.start(text, options)
            title = f"speculation ({spec.drafter} drafter)" if spec.drafter != NONE else NONE.label
            renderer = out.generation(title + placement_note(spec), heads=spec.heads is not None)
            renderer.start()
            interrupted = False
            try:
                for ev in gen.events():
                    renderer.event(ev, gen.stats)
            except KeyboardInterrupt:
                interrupted = True
            renderer.finish(gen.generation, gen.stats)
            if gen.error:
                raise RpcError(f"{gen.error}: the output ends there")
    if interrupted:
        raise typer.Exit(ExitCode.INTERRUPTED)
