"""Request bodies as OpenAI sends them (pydantic, strict types, unknown fields ignored as OpenAI does)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from specdec_cli.engine.settings import DrafterKind

MAX_STOPS = 4


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(_Body):
    type: Literal["text"]
    text: str


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class StreamOptions(_Body):
    include_usage: bool = False


class Speculative(_Body):
    """specdec's extension: how to speculate for this request. Ranges are checked once, by
    `GenerateOptions.validate` (engine/settings.py), as for every front end; types are checked here."""

    draft_max: int | None = None
    drafter: DrafterKind | None = Field(default=None, strict=False)  # its value, as JSON carries it


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

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = None

    def conversation(self) -> list[dict[str, str]]:
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


class CompletionRequest(_Common):
    prompt: str | list[str]
    echo: bool = False

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else "".join(self.prompt)
