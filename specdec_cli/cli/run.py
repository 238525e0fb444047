"""`specdec run`: generate once, with live acceptance stats."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

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

if TYPE_CHECKING:
    from specdec_cli.api import GenerateOptions, Generation, Speculator
    from specdec_cli.comparison import Comparison

ChatOpt = Annotated[
    bool | None,
    typer.Option(
        "--chat/--raw",
        help="Apply the target's chat template (default when it has one), or feed the prompt as is.",
        show_default=False,
    ),
]

CompareOpt = Annotated[
    bool,
    typer.Option(
        "--compare",
        help="Then run the same prompt through the target alone and end with one line: same text (greedy: "
        "token for token; sampled: not compared), tokens/s of each and the ratio.",
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
    compare: CompareOpt = False,
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
            renderer = out.generation(title + placement_note(spec), heads=spec.heads is not None, compare=compare)
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
            if compare:
                renderer.compared(None if interrupted else against_target(out, spec, text, options, gen.generation))
    if interrupted:
        raise typer.Exit(ExitCode.INTERRUPTED)


def against_target(out: Output, spec: Speculator, prompt: str, options: GenerateOptions, g: Generation) -> Comparison | None:
    """The same prompt and settings through the target alone, after the run (`--compare`); None where the run
    already was the target alone (nothing to compare) or the comparison was interrupted."""
    from specdec_cli.comparison import Comparison

    if g.settings.get("drafter") is None:
        out.note("compare: this run was the target alone: nothing to compare")
        return None
    try:
        with out.status("compare: the same prompt through the target alone..."):
            alone = spec.target_alone(prompt, options)
    except KeyboardInterrupt:
        return None
    return Comparison(g, alone)
