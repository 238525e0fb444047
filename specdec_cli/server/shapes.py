"""What a response looks like in OpenAI's shape: the whole answer, the stream's chunks, usage.

Beside OpenAI's fields, a finished answer carries `speculative` (what the drafter did)
and llama-server's `timings`, so a client can see the speculation it got.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from specdec_cli.server.worker import Done


@dataclass(frozen=True)
class Shape:
    """One response's identity and kind: `chat.completion` or `text_completion`."""

    model: str
    chat: bool
    echo: str = ""  # completions' echo: the prompt, written before the answer
    ident: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.ident:
            object.__setattr__(self, "ident", ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24])

    @property
    def kind(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def _head(self, chunk: bool) -> dict[str, Any]:
        kind = f"{self.kind}.chunk" if chunk and self.chat else self.kind
        return {"id": self.ident, "object": kind, "created": self.created, "model": self.model}

    def whole(self, ev: Done) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": ev.finish_reason, "logprobs": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": ev.text}
        else:
            choice["text"] = self.echo + ev.text
        return {**self._head(False), "choices": [choice], **usage(ev)}

    def opening(self) -> str | None:
        """The first chunk, before any text: chat's role, completions' echoed prompt."""
        if self.chat:
            return self.chunk(None, None, role=True)
        return self.chunk(self.echo, None) if self.echo else None

    def chunk(self, delta: str | None, finish: str | None, role: bool = False) -> str:
        if self.chat:
            d: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if delta is not None:
                d["content"] = delta
            choice: dict[str, Any] = {"index": 0, "delta": d, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": 0, "text": delta or "", "finish_reason": finish, "logprobs": None}
        return json.dumps({**self._head(True), "choices": [choice]})

    def closing(self, ev: Done) -> str:
        return self.chunk(None, ev.finish_reason) if self.chat else self.chunk("", ev.finish_reason)

    def usage_chunk(self, ev: Done) -> str:
        return json.dumps({**self._head(True), "choices": [], **usage(ev)})


def usage(ev: Done) -> dict[str, Any]:
    g, s = ev.generation, ev.generation.stats
    counts = {"prompt_tokens": g.n_prompt_tokens, "completion_tokens": ev.completion_tokens,
              "total_tokens": g.n_prompt_tokens + ev.completion_tokens,
              "prompt_tokens_details": {"cached_tokens": ev.cached_tokens}}  # fmt: skip
    timings = {
        "cache_n": ev.cached_tokens,
        "prompt_n": g.n_prompt_tokens - ev.cached_tokens,
        "prompt_ms": round(s.seconds.prefill * 1000, 3),
        "predicted_n": ev.completion_tokens,
        "predicted_ms": round(s.generation_seconds * 1000, 3),
        "predicted_per_second": round(s.tokens_per_second, 3),
        "draft_n": s.drafted,
        "draft_n_accepted": s.accepted,
    }
    return {"usage": counts, "speculative": describe(ev), "timings": timings}


def describe(final: Done) -> dict[str, Any]:
    """The `speculative` block of a response."""
    s = final.generation.stats
    return {
        "drafter": final.generation.settings.get("drafter"),
        "draft_max": final.generation.settings.get("draft_max"),
        "drafted": s.drafted,
        "accepted": s.accepted,
        "acceptance_rate": None if s.acceptance_rate is None else round(s.acceptance_rate, 6),
        "tokens_per_step": round(s.tokens_per_step, 6),
        "steps": s.steps,
        "accepted_by_position": [round(x, 6) for x in s.accepted_by_position],
        "drafters": s.drafters,
        # False with --kernels fast: the text may differ from the target alone in rare tokens
        "exact": final.generation.models.get("exact", True),
    }
