"""From options to loaded models and a tokenized prompt; shared by run and chat.

Nothing here prints: the CLI decides what the user sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specdec_cli import pairs, registry
from specdec_cli.engine import chat
from specdec_cli.engine.drafters import Drafter, ModelDrafter, NgramDrafter
from specdec_cli.engine.model import Model, check_gguf_file
from specdec_cli.errors import IncompatiblePairError, SpecdecError


class UsageProblem(SpecdecError):
    """Options that contradict each other (exit code 2)."""

    exit_code = 2


MODEL = "model"
NGRAM = "ngram"
DRAFTERS = (MODEL, NGRAM)


@dataclass(frozen=True)
class ModelChoice:
    target: Path
    draft: Path | None
    pair: str | None
    draft_max: int | None  # the pair's recommended K, when a pair was used
    drafter: str | None = MODEL  # MODEL (needs `draft`), NGRAM, or None: the target alone


def choose_models(
    target: Path | None,
    draft: Path | None,
    pair: str | None,
    no_draft: bool,
    models_toml: Path | None = None,
    drafter: str = MODEL,
) -> ModelChoice:
    if pair and (target or draft):
        raise UsageProblem("--pair cannot be combined with --target/--draft")
    if draft and no_draft:
        raise UsageProblem("--draft and --no-draft contradict each other")
    if drafter == NGRAM:
        if no_draft:
            raise UsageProblem("--drafter ngram and --no-draft contradict each other")
        if draft:
            raise UsageProblem("--drafter ngram uses no draft model: drop --draft")
    if target or draft:
        if not target:
            raise UsageProblem("--draft needs --target (the model whose output you want)")
        if drafter == NGRAM:
            return ModelChoice(check_gguf_file(target), None, None, None, NGRAM)
        if not draft and not no_draft:
            raise UsageProblem("--target needs --draft DRAFT, --drafter ngram, or --no-draft to run it alone")
        d = check_gguf_file(draft) if draft else None
        return ModelChoice(check_gguf_file(target), d, None, None, MODEL if d else None)
    reg = registry.load(models_toml)
    entry = reg.get(pair) if pair else reg.default_pair()
    t = registry.resolve(entry.target, entry.name, "target")
    if drafter == NGRAM:
        return ModelChoice(t, None, entry.name, None, NGRAM)
    d = None if no_draft else registry.resolve(entry.draft, entry.name, "draft")
    return ModelChoice(t, d, entry.name, entry.draft_max, MODEL if d else None)


def check_pair(target: Path, draft: Path) -> pairs.Verdict:
    """Compare vocabularies only (fast): refuse an incompatible pair before loading weights."""
    with Model(target, vocab_only=True) as t, Model(draft, vocab_only=True) as d:
        verdict = pairs.check(t.vocab_info(), d.vocab_info())
    if not verdict.ok:
        first = verdict.first_difference()
        detail = f"; the first differing token is {first}" if first else ""
        raise IncompatiblePairError(
            f"{target.name} and {draft.name} cannot speculate together: {verdict.reason}{detail}. "
            f"Run `specdec pair-check {target} {draft}` for details, or choose a draft from the same model family"
        )
    return verdict


@dataclass
class LoadedPair:
    target: Model
    draft: Model | None
    ngram: tuple[int, int] | None = None  # (n_min, n_max) for the n-gram drafter

    @property
    def drafter_kind(self) -> str | None:
        return NGRAM if self.ngram else MODEL if self.draft is not None else None

    def drafter(self) -> Drafter | None:
        """A fresh drafter for one generation (None: the target alone)."""
        if self.ngram:
            return NgramDrafter(*self.ngram)
        return ModelDrafter(self.draft) if self.draft is not None else None

    def close(self) -> None:
        self.target.close()
        if self.draft is not None:
            self.draft.close()


def load_pair(
    choice: ModelChoice,
    *,
    n_ctx: int,
    n_threads: int | None,
    gpu_layers: int,
    draft_gpu_layers: int,
    ngram: tuple[int, int] = (2, 4),
) -> LoadedPair:
    if choice.draft is not None and choice.draft.resolve() != choice.target.resolve():
        check_pair(choice.target, choice.draft)
    target = Model(choice.target, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=gpu_layers)
    draft = None
    try:
        if choice.draft is not None:
            draft = Model(choice.draft, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=draft_gpu_layers)
    except BaseException:
        target.close()
        raise
    return LoadedPair(target, draft, ngram if choice.drafter == NGRAM else None)


def chat_messages(prompt: str, system: str | None, history: Sequence[dict[str, str]] = ()) -> list[dict[str, str]]:
    messages: list[dict[str, str]] = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.extend(history)
    messages.append({"role": "user", "content": prompt})
    return messages


def tokenize_prompt(model: Model, prompt: str, *, use_chat: bool | None, system: str | None) -> tuple[list[int], bool]:
    """Tokens for the prompt, and whether the chat template was applied.

    use_chat None means: the template when the model has one, raw otherwise.
    """
    template = model.info().chat_template
    if use_chat is None:
        use_chat = template is not None
    if not use_chat:
        if system:
            raise UsageProblem("--system needs the chat template; it cannot be used with --raw")
        return model.tokenize(prompt, add_special=True, parse_special=True), False
    return tokenize_chat(model, template, chat_messages(prompt, system)), True


def tokenize_chat(model: Model, template: str | None, messages: Sequence[dict[str, str]]) -> list[int]:
    """The conversation through the chat template, ready to generate the assistant's turn."""
    sp = model.special_texts()
    text = chat.render(template, messages, bos_token=sp.bos_text, eos_token=sp.eos_text)
    # Templates that write the BOS text themselves must not get a second BOS.
    add_special = not (sp.add_bos and sp.bos_text and text.startswith(sp.bos_text))
    return model.tokenize(text, add_special=add_special, parse_special=True)
