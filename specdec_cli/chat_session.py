"""A multi-turn conversation over a loaded pair; no terminal code here.

KV-cache reuse comes from the API: each turn renders the whole conversation
through the chat template, and both models keep the common prefix of what
their caches already hold, so only the new turn is evaluated and time to first
token does not grow with the conversation.

Near the context limit the oldest turns are dropped (the system prompt is kept)
before a reply starts; the caches follow through the same common-prefix sync.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from specdec_cli.api import GenerateOptions, Generation, PromptTokens, Speculator
from specdec_cli.engine import prompting
from specdec_cli.engine.events import Event
from specdec_cli.engine.settings import NONE, PARAMS, InvalidSetting, Param
from specdec_cli.engine.speculative import prompt_fits
from specdec_cli.engine.stats import Stats
from specdec_cli.errors import ContextError, RpcError, UnsupportedModelError, UsageError

# /set KEY -> the parameter (`engine.settings.PARAMS`): the key is its flag without dashes (`/set temp 0.7`)
SETTABLE: dict[str, Param] = {p.key: p for p in PARAMS.values() if p.settable}
_TYPES = {f.name: f.type for f in dataclasses.fields(GenerateOptions)}


def _parse(param: str, text: str) -> Any:
    """A value typed after /set, read as the parameter's type (`none` clears an optional one)."""
    kind = _TYPES[param]
    if "None" in kind and text == "none":
        return None
    return float(text) if kind.startswith("float") else int(text)


@dataclass
class Turn:
    user: str
    assistant: str
    stop_reason: str
    stats: dict[str, Any]


@dataclass
class ChatSession:
    spec: Speculator
    options: GenerateOptions
    system: str | None = None
    draft_on: bool = True
    history: list[dict[str, str]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    totals: Stats = field(default_factory=Stats)
    dropped_turns: int = 0
    last: Generation | None = None
    last_stats: Stats = field(default_factory=Stats)
    last_dropped: int = 0

    def __post_init__(self) -> None:
        info = self.spec.target.info()
        if not info.chat_template:
            raise UnsupportedModelError(
                f"{info.path.name} has no chat template in its metadata (a base model?): "
                "chat needs one; use `specdec run --raw PROMPT` to continue text instead"
            )

    @property
    def has_drafter(self) -> bool:
        return self.spec.drafter != NONE

    # ------------------------------------------------------------ settings
    def set(self, key: str, value: str) -> str:
        """Change one setting from text; raises UsageError with a user-facing message."""
        if key not in SETTABLE:
            raise UsageError(f"unknown setting {key!r}; settable: {', '.join(SETTABLE)}")
        name = SETTABLE[key].name
        try:
            parsed = _parse(name, value)
        except ValueError:
            raise UsageError(f"{key} needs a number, got {value!r}") from None
        options = dataclasses.replace(self.options, **{name: parsed})
        try:
            options.validate()
        except InvalidSetting as exc:  # named as the user typed it
            raise UsageError(exc.named(PARAMS[exc.param].key if exc.param in PARAMS else exc.param)) from None
        self.options = options
        return f"{key} = {parsed}"

    def reset(self) -> None:
        self.history.clear()
        self.turns.clear()
        self.totals = Stats()
        self.dropped_turns = 0

    # --------------------------------------------------------------- turns
    def _tokens(self, user: str) -> PromptTokens:
        return self.spec.tokenize(prompting.chat_messages(user, self.system, self.history))

    def prompt_tokens(self, user: str, reserve: int) -> tuple[PromptTokens, int]:
        """The conversation's tokens with room for `reserve` new ones; drops the oldest turns if needed."""
        n_ctx = self.spec.n_ctx
        dropped = 0
        tokens = self._tokens(user)
        while len(tokens.ids) + reserve > n_ctx and self.history:
            del self.history[:2]  # the oldest user/assistant exchange
            dropped += 1
            tokens = self._tokens(user)
        if not prompt_fits(len(tokens.ids), n_ctx):
            raise ContextError(
                f"this message alone is {len(tokens.ids)} tokens with the system prompt; --ctx-size is {n_ctx}"
            )
        self.dropped_turns += dropped
        return tokens, dropped

    def reply(self, user: str, should_stop: Callable[[], bool] | None = None) -> Iterator[Event]:
        """Stream one reply; afterwards `self.last` holds it and the turn is in the history."""
        reserve = min(self.options.max_tokens, max(16, self.spec.n_ctx // 4))
        tokens, self.last_dropped = self.prompt_tokens(user, reserve)
        drafter = None if self.draft_on else NONE
        run = self.spec.start(tokens, self.options, cancel=should_stop, drafter=drafter)
        try:
            yield from run.events()
        finally:
            gen = run.generation
            self.last, self.last_stats = gen, run.stats
            self.history.append({"role": "user", "content": user})
            self.history.append({"role": "assistant", "content": gen.text})
            self.turns.append(Turn(user, gen.text, gen.stop_reason, gen.stats.as_dict()))
            self.totals.merge(run.stats)
        if run.error:  # an RPC server stopped answering: the reply so far is kept, and the user is told
            raise RpcError(f"{run.error}: the reply ends there")

    def summary(self) -> dict[str, Any]:
        o = self.options
        return {
            "system": self.system,
            "messages": self.history,
            "turns": [dataclasses.asdict(t) for t in self.turns],
            "settings": {
                **o.as_dict(),
                "drafter": self.spec.drafter if self.draft_on and self.has_drafter else None,
            },
            "totals": self.totals.summary().as_dict(),
            "dropped_turns": self.dropped_turns,
        }
