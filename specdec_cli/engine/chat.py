"""Apply a GGUF's own chat template (Jinja) the way llama-cpp-python does."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from specdec_cli.errors import SpecdecError, UnsupportedModelError


def render(
    template: str | None,
    messages: Sequence[Mapping[str, str]],
    *,
    bos_token: str,
    eos_token: str,
    add_generation_prompt: bool = True,
) -> str:
    if not template:
        raise UnsupportedModelError(
            "this model has no chat template in its GGUF metadata (a base model?): pass --raw to feed the prompt as is"
        )
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> Any:
        raise SpecdecError(f"the model's chat template refused the conversation: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    try:
        return env.from_string(template).render(
            messages=[dict(m) for m in messages],
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
        )
    except TemplateError as exc:
        raise SpecdecError(f"the model's chat template failed ({exc}); pass --raw to skip it") from None
