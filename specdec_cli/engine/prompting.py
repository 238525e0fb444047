"""A prompt as tokens: a string raw or through the model's chat template (templates.py), or messages.

Special tokens come from the template only: control-token text inside a message is tokenized as
plain text (specials.py), so a user cannot forge a system turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specdec_cli.engine import specials, templates
from specdec_cli.engine.protocol import LoadedModel
from specdec_cli.errors import UsageError

ROLES = ("system", "user", "assistant", "tool")  # "tool": a tool's result, in a history from a client that ran tools


def chat_messages(prompt: str, system: str | None, history: Sequence[Mapping[str, str]] = ()) -> list[dict[str, str]]:
    messages: list[dict[str, str]] = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.extend(dict(m) for m in history)
    messages.append({"role": "user", "content": prompt})
    return messages


def check_messages(messages: Any) -> list[dict[str, str]]:
    """A list of {"role", "content"} with known roles and string contents, or a UsageError."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise UsageError("messages must be a non-empty list of {'role': ..., 'content': ...}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("content"), str) or m.get("role") not in ROLES:
            raise UsageError(f"message {i} needs a role ({', '.join(ROLES)}) and a string content")
        out.append({"role": str(m["role"]), "content": str(m["content"])})
    return out


def tokenize_prompt(model: LoadedModel, prompt: str, *, use_chat: bool | None, system: str | None) -> tuple[list[int], bool]:
    """Tokens for the prompt, and whether the chat template was applied.

    use_chat None means: the template when the model has one, raw otherwise.
    """
    template = model.info().chat_template
    if use_chat is None:
        use_chat = template is not None
    if not use_chat:
        if system:
            raise UsageError("--system needs the chat template; it cannot be used with --raw")
        return model.tokenize(prompt, add_special=True, parse_special=True), False
    return tokenize_chat(model, template, chat_messages(prompt, system)), True


def tokenize_chat(model: LoadedModel, template: str | None, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """The conversation through the chat template, ready to generate the assistant's turn.

    Special tokens come from the template only: control-token text inside a
    message is tokenized as plain text (engine/specials.py).
    """
    sp = model.special_texts()
    safe = specials.defang(messages, model.control_texts())
    text = templates.render(template, safe.messages, bos_token=sp.bos_text, eos_token=sp.eos_text, source=model.name)
    # Templates that write the BOS text themselves must not get a second BOS.
    add_special = not (sp.add_bos and sp.bos_text and text.startswith(sp.bos_text))
    if not safe.changed:
        return model.tokenize(text, add_special=add_special, parse_special=True)
    ids = model.tokenize("", add_special=True, parse_special=False) if add_special else []
    for piece, parse_special in safe.pieces(text):
        ids += model.tokenize(piece, add_special=False, parse_special=parse_special)
    return ids
