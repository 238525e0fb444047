"""`specdec chat`: talk to a loaded pair, turn by turn."""

from __future__ import annotations

import sys
from pathlib import Path

from specdec_cli.cli.options import (
    DrafterOptions,
    DraftOptions,
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
from specdec_cli.cli.output import Output
from specdec_cli.engine.settings import HEADS, NGRAM, NONE


@with_options
def chat(
    *,
    models: ModelOptions,
    drafting: DrafterOptions,
    draft: DraftOptions,
    ngram: NgramOptions,
    sampling: SamplingOptions,
    runtime: RuntimeOptions,
    max_tokens: MaxTokensOpt = 512,
    system: SystemOpt = None,
) -> None:
    """Talk to a target/draft pair, turn by turn (/help inside lists the commands)."""
    from platformdirs import user_data_dir

    from specdec_cli.api import GenerateOptions
    from specdec_cli.chat_session import ChatSession
    from specdec_cli.cli import repl

    out = Output()
    with out.errors():
        options = GenerateOptions(max_tokens=max_tokens, **generate_kwargs(sampling, draft, drafting.fixed_k)).validate()
        with load(models, runtime, ngram, drafting.kind) as spec:
            session = ChatSession(spec, options, system=system)
            c = spec.choice
            draft_name = (
                f"none ({NONE.label})"
                if spec.drafter == NONE
                else c.draft.name
                if c.draft
                else f"{NGRAM.label} (no draft model)"
            )
            if c.heads is not None and spec.drafter != NONE:
                draft_name += f", {HEADS.label} {c.heads.name}"
            out.err.write(
                f"specdec chat: target {c.target.name}, draft {draft_name}{placement_note(spec)}. "
                "/help for commands, /exit or Ctrl-D to leave.\n"
            )
            reader = repl.LineReader(sys.stdin, Path(user_data_dir("specdec")) / "chat_history")
            repl.Repl(session, sys.stdout, out.err, reader).run()
