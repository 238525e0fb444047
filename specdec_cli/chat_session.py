"""A multi-turn conversation over a target/draft pair; no terminal code here.

KV-cache reuse comes from the engine: each turn renders the whole conversation
through the chat template, and both models' `prefill` keep the common prefix of
what their caches already hold, so only the new turn is evaluated and time to
first token does not grow with the conversation.

Near the context limit the oldest turns are dropped (the system prompt is kept)
before a reply starts; the caches follow through the same common-prefix sync.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from specdec_cli import runner
from specdec_cli.engine.events import DrafterDropped, Prefill, Result, Step
from specdec_cli.engine.speculative import GenerationConfig, SpeculativeGenerator
from specdec_cli.engine.stats import Stats
from specdec_cli.errors import ContextError, UnsupportedModelError

SETTABLE = ("temp", "top_k", "top_p", "min_p", "seed", "draft_max")


@dataclass
class Turn:
    user: str
    assistant: str
    stop_reason: str
    stats: dict[str, Any]


@dataclass
class ChatSession:
    pair: runner.LoadedPair
    config: GenerationConfig
    system: str | None = None
    draft_on: bool = True
    history: list[dict[str, str]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    totals: Stats = field(default_factory=Stats)
    dropped_turns: int = 0

    def __post_init__(self) -> None:
        info = self.pair.target.info()
        if not info.chat_template:
            raise UnsupportedModelError(
                f"{info.path.name} has no chat template in its metadata (a base model?): "
                "chat needs one; use `specdec run --raw PROMPT` to continue text instead"
            )
        self.template = info.chat_template

    # ------------------------------------------------------------ settings
    def set(self, key: str, value: str) -> str:
        """Change one setting from text; raises ValueError with a user-facing message."""
        s = self.config.sampler
        try:
            if key == "temp":
                s = dataclasses.replace(s, temperature=float(value))
            elif key == "top_k":
                s = dataclasses.replace(s, top_k=int(value))
            elif key == "top_p":
                s = dataclasses.replace(s, top_p=float(value))
            elif key == "min_p":
                s = dataclasses.replace(s, min_p=float(value))
            elif key == "seed":
                cfg = dataclasses.replace(self.config, seed=None if value == "none" else int(value))
                self.config = cfg
                return f"seed = {cfg.seed}"
            elif key == "draft_max":
                cfg = dataclasses.replace(self.config, draft_max=int(value))
                cfg.validate()
                self.config = cfg
                return f"draft_max = {cfg.draft_max}"
            else:
                raise ValueError(f"unknown setting {key!r}; settable: {', '.join(SETTABLE)}")
        except ValueError as exc:
            if "could not convert" in str(exc) or "invalid literal" in str(exc):
                raise ValueError(f"{key} needs a number, got {value!r}") from None
            raise
        s.validate()
        self.config = dataclasses.replace(self.config, sampler=s)
        return f"{key} = {value}"

    def reset(self) -> None:
        self.history.clear()
        self.turns.clear()
        self.totals = Stats()
        self.dropped_turns = 0

    # --------------------------------------------------------------- turns
    def _messages(self, user: str) -> list[dict[str, str]]:
        return runner.chat_messages(user, self.system, self.history)

    def _tokens(self, user: str) -> list[int]:
        return runner.tokenize_chat(self.pair.target, self.template, self._messages(user))

    def prompt_tokens(self, user: str, reserve: int) -> tuple[list[int], int]:
        """The conversation's tokens with room for `reserve` new ones; drops the oldest turns if needed."""
        n_ctx = self.pair.target.n_ctx
        dropped = 0
        tokens = self._tokens(user)
        while len(tokens) + reserve > n_ctx and self.history:
            del self.history[:2]  # the oldest user/assistant exchange
            dropped += 1
            tokens = self._tokens(user)
        if len(tokens) >= n_ctx:
            raise ContextError(
                f"this message alone is {len(tokens)} tokens with the system prompt; --ctx-size is {n_ctx}"
            )
        self.dropped_turns += dropped
        return tokens, dropped

    def reply(
        self, user: str, should_stop: Callable[[], bool] | None = None
    ) -> Iterator[Prefill | Step | DrafterDropped]:
        """Stream one reply; afterwards `self.last` holds the result and the turn is in the history."""
        reserve = min(self.config.max_tokens, max(16, self.pair.target.n_ctx // 4))
        tokens, dropped = self.prompt_tokens(user, reserve)
        self.last_dropped = dropped
        drafter = self.pair.drafter() if self.draft_on else None
        gen = SpeculativeGenerator(self.pair.target, drafter, tokens, self.config, should_stop=should_stop)
        stats = Stats()
        try:
            for ev in gen.events():
                stats.observe(ev)
                yield ev
        finally:
            res: Result = gen.result
            if not res.stop_reason:
                res.stop_reason = "interrupted"
            gen_seconds = res.wall_seconds - stats.t_prefill
            self.last = res
            self.last_stats = stats
            self.history.append({"role": "user", "content": user})
            self.history.append({"role": "assistant", "content": res.text})
            self.turns.append(Turn(user, res.text, res.stop_reason, stats.as_dict(res.wall_seconds, gen_seconds)))
            self.totals.merge(stats)

    def summary(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "messages": self.history,
            "turns": [dataclasses.asdict(t) for t in self.turns],
            "settings": {
                "temperature": self.config.sampler.temperature,
                "top_k": self.config.sampler.top_k,
                "top_p": self.config.sampler.top_p,
                "min_p": self.config.sampler.min_p,
                "seed": self.config.seed,
                "draft_max": self.config.draft_max,
                "max_tokens": self.config.max_tokens,
                "drafter": self.pair.drafter_kind if self.draft_on else None,
            },
            "totals": self.totals.as_dict(
                self.totals.generation_seconds + self.totals.t_prefill, self.totals.generation_seconds
            ),
            "dropped_turns": self.dropped_turns,
        }
