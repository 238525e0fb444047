"""Request bodies as OpenAI sends them (pydantic, strict types, unknown fields ignored as OpenAI does)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from specdec_cli.engine.settings import DrafterKind

MAX_STOPS = 4


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class Part(_Body):
    """A content part. Only text parts can be read; the others are named in the 400 (`refusal`)."""

    type: str
    text: str | None = None


class Function(_Body):
    name: str
    arguments: str = ""


class ToolCall(_Body):
    """A call in an assistant message of the history (the client ran tools, maybe with another server)."""

    id: str | None = None
    type: str = "function"
    function: Function


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[Part] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def text(self) -> str:
        """The message as the template gets it: text parts joined, an assistant's tool calls as JSON lines."""
        text = "".join(p.text or "" for p in self.content) if isinstance(self.content, list) else self.content or ""
        calls = [json.dumps({"name": c.function.name, "arguments": _arguments(c.function.arguments)})
                 for c in self.tool_calls or ()]  # fmt: skip
        return "\n".join(t for t in (text, *calls) if t)


def _arguments(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


class StreamOptions(_Body):
    include_usage: bool = False


class Speculative(_Body):
    """specdec's extension: how to speculate for this request. Ranges are checked once, by
    `GenerateOptions.validate` (engine/settings.py), as for every front end; types are checked here."""

    draft_max: int | None = None
    drafter: DrafterKind | None = Field(default=None, strict=False)  # its value, as JSON carries it


class ResponseFormat(_Body):
    type: str


class _Common(_Body):
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # extension (llama.cpp's)
    min_p: float | None = None  # extension (llama.cpp's)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    speculative: Speculative | None = None
    # Fields that would change the answer, refused (`refusal`) unless they ask for what is done anyway
    frequency_penalty: float | None = Field(default=None, strict=False)
    presence_penalty: float | None = Field(default=None, strict=False)
    logit_bias: dict[str, float] | None = Field(default=None, strict=False)

    def refusal(self) -> tuple[str, str] | None:
        """(field, why) for the first field asking for what this server does not do: a 400, never a silent
        answer that ignores it. Fields that do not change the answer (user, metadata, store, prediction,
        parallel_tool_calls, ...) are ignored, as OpenAI ignores fields it does not know."""
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name):
                return name, f"{name} is not supported (the sampler has no penalties): leave it out or send 0"
        if self.logit_bias:
            return "logit_bias", "logit_bias is not supported: leave it out or send {}"
        return None

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None  # the older name of tools
    function_call: str | dict[str, Any] | None = None  # the older name of tool_choice
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    modalities: list[str] | None = None

    def refusal(self) -> tuple[str, str] | None:
        for i, m in enumerate(self.messages):
            for j, part in enumerate(m.content if isinstance(m.content, list) else ()):
                if part.type != "text" or part.text is None:
                    return (f"messages.{i}.content.{j}", f"{part.type!r} content parts are not supported: this "
                            "server's models read text only (send text parts or a string)")  # fmt: skip
        for name in ("tool_choice", "function_call"):
            choice = getattr(self, name)
            if choice is not None and choice not in ("auto", "none"):
                return name, (f"{name} {json.dumps(choice)} is not supported: specdec does not call tools (with "
                              '"auto", the default, the model answers in text and tools are not shown to it)')
        if self.response_format is not None and self.response_format.type != "text":
            return "response_format", (f"response_format {self.response_format.type!r} is not supported: "
                                       "specdec does not constrain the output (ask for JSON in the prompt)")
        if self.logprobs or self.top_logprobs:
            return "logprobs", "logprobs are not supported: leave logprobs and top_logprobs out"
        if self.modalities is not None and set(self.modalities) - {"text"}:
            return "modalities", "only the text modality is supported"
        return super().refusal()

    def conversation(self) -> list[dict[str, str]]:
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


class CompletionRequest(_Common):
    prompt: str | list[str]
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None

    def refusal(self) -> tuple[str, str] | None:
        if self.logprobs is not None:
            return "logprobs", "logprobs are not supported: leave logprobs out"
        if self.suffix:
            return "suffix", "suffix (insertion) is not supported: leave it out"
        if self.best_of not in (None, 1):
            return "best_of", "best_of must be 1 (one loaded pair generates one choice)"
        return super().refusal()

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else "".join(self.prompt)
