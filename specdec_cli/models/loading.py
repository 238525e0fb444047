"""From options to loaded models: which files (a pair from models.toml, or paths), checked, then loaded.

Nothing here prints: the CLI decides what the user sees.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec_cli import pairs
from specdec_cli.engine.drafters.pool import vocab_fingerprint
from specdec_cli.engine.gguf import check_gguf_file
from specdec_cli.engine.heads import Heads
from specdec_cli.engine.model import Model
from specdec_cli.engine.protocol import LoadedModel, ModelOpener
from specdec_cli.engine.rpc import Placement
from specdec_cli.engine.settings import HEADS, MODEL, NGRAM, NONE
from specdec_cli.errors import ConfigError, IncompatiblePairError, ModelFileError, UsageError
from specdec_cli.models import registry


@dataclass(frozen=True)
class ModelChoice:
    target: Path
    draft: Path | None
    pair: str | None
    draft_max: int | None  # the pair's recommended K, when a pair was used
    heads: Path | None = None  # Medusa heads for the target (engine/heads.py): --heads, or the pair's

def is_pair_name(name: str | os.PathLike[str]) -> bool:
    """A models.toml pair name given where a path is expected (no such file, a known name)."""
    text = os.fspath(name)
    if os.path.exists(text) or os.sep in text or text.endswith(".gguf"):
        return False
    try:
        return text in registry.load().pairs
    except ConfigError:
        return False


def choose_models(
    target: Path | None,
    draft: Path | None,
    pair: str | None,
    no_draft: bool,
    drafter: str = MODEL,
    heads: Path | None = None,
) -> ModelChoice:
    """Which files to load for these options (nothing is loaded or downloaded here). The heads file is
    `heads`, else the pair's (kept unless the target runs alone: a request may ask for any drafter)."""
    choice = _choose_models(target, draft, pair, no_draft, drafter)
    heads = heads or (registry.load().get(choice.pair).heads if choice.pair else None)
    if drafter == HEADS and heads is None:
        raise UsageError("--drafter heads needs --heads FILE: train heads for the target with `specdec heads train`")
    if heads is None or drafter == NONE:
        return choice
    if not heads.is_file():
        raise ModelFileError(f"no heads file at {heads}: train one with `specdec heads train`")
    return dataclasses.replace(choice, heads=heads)


def _choose_models(
    target: Path | None,
    draft: Path | None,
    pair: str | None,
    no_draft: bool,
    drafter: str,
) -> ModelChoice:
    if pair and (target or draft):
        raise UsageError("--pair cannot be combined with --target/--draft")
    if draft and no_draft:
        raise UsageError("--draft and --no-draft contradict each other")
    if drafter in (NGRAM, HEADS) and draft:
        raise UsageError(f"--drafter {drafter} uses no draft model: drop --draft")
    if target or draft:
        if not target:
            raise UsageError("--draft needs --target (the model whose output you want)")
        if drafter == MODEL and not draft and not no_draft:
            raise UsageError(
                "--drafter model needs --draft DRAFT; without one use --drafter auto or ngram, or --no-draft"
            )
        d = check_gguf_file(draft) if draft else None
        return ModelChoice(check_gguf_file(target), d, None, None)
    reg = registry.load()
    entry = reg.get(pair) if pair else reg.default_pair()
    t = registry.resolve(entry.target, entry.name, "target")
    if drafter in (NGRAM, HEADS, NONE) or no_draft:
        return ModelChoice(t, None, entry.name, None)
    if entry.draft is None:
        if drafter == MODEL:
            raise UsageError(f"pair {entry.name!r} has no draft model (it drafts with its heads): use --drafter auto or heads")
        return ModelChoice(t, None, entry.name, None)
    return ModelChoice(t, registry.resolve(entry.draft, entry.name, "draft"), entry.name, entry.draft_max)


# How every model file is opened: llama.cpp's `Model`. The one seam for a fake (tests/fakes.py's
# `FakeGGUF`), so that the API, the CLI and the server can be tested without real weights.
def open_llama(path: str | os.PathLike[str], *, placement: Placement | None = None, **kw: Any) -> LoadedModel:
    """A GGUF through llama.cpp: here, or with its layers on RPC servers (`placement`)."""
    if placement is not None and placement.endpoints and not kw.get("vocab_only"):
        from specdec_cli.engine.rpc_model import PlacedModel

        return PlacedModel(path, placement=placement, **kw)
    return Model(path, **kw)


OPENER: ModelOpener = open_llama


# check_pair's verdicts in this process, by the two files' identities (llama.cpp's opener only): a server, a bench
# or a test process loads the same pair again and again, and each check opens both vocabularies
_VERDICTS: dict[tuple[tuple[str, int, int], ...], pairs.Verdict] = {}


def _identity(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


def check_pair(target: Path, draft: Path, opener: ModelOpener | None = None) -> pairs.Verdict:
    """Compare vocabularies only (fast): refuse an incompatible pair before loading weights."""
    open_model = opener or OPENER
    known = open_model is open_llama and target.is_file() and draft.is_file()
    key = (_identity(target), _identity(draft)) if known else None
    verdict = _VERDICTS.get(key) if key is not None else None
    if verdict is None:
        verdict = _check_vocabularies(target, draft, open_model)
        if key is not None:
            _VERDICTS[key] = verdict
    if not verdict.ok:
        first = verdict.first_difference()
        detail = f"; the first differing token is {first}" if first else ""
        raise IncompatiblePairError(
            f"{target.name} and {draft.name} cannot speculate together: {verdict.reason}{detail}. "
            f"Run `specdec pair-check {target} {draft}` for details, or choose a draft from the same model family"
        )
    return verdict


def _check_vocabularies(target: Path, draft: Path, open_model: ModelOpener) -> pairs.Verdict:
    t = open_model(target, vocab_only=True)
    try:
        d = open_model(draft, vocab_only=True)
        try:
            verdict = pairs.check(t.vocab_info(), d.vocab_info())
            if not verdict.ok:
                verdict = pairs.cross_check(t, d, verdict)
        finally:
            d.close()
    finally:
        t.close()
    return verdict


def load_heads(choice: ModelChoice, target: LoadedModel) -> Heads | None:
    """The choice's heads file, checked against the loaded target (its vocabulary and width): a file for
    another target is one line (ModelFileError), as a foreign pool file is."""
    if choice.heads is None:
        return None
    return Heads.load(choice.heads, vocab_fingerprint(target.vocab_info().texts), target.n_embd)


@dataclass(frozen=True)
class Loader:
    """How a pair's models are opened (kept, so a model lost with its RPC server can be opened again)."""

    choice: ModelChoice
    n_ctx: int
    n_threads: int | None
    gpu_layers: int = 0
    draft_gpu_layers: int = 0
    n_seq: int = 1
    opener: ModelOpener | None = None
    placement: Placement | None = None  # the target's RPC servers (engine/rpc.py)
    draft_placement: Placement | None = None
    exact: bool = True  # the target's kernels probed (engine/kernels.py); False: `--kernels fast`

    def target(self) -> LoadedModel:
        open_model = self.opener or OPENER
        return open_model(self.choice.target, n_ctx=self.n_ctx, n_threads=self.n_threads, n_gpu_layers=self.gpu_layers,
                          n_seq=self.n_seq, placement=self.placement, exact=self.exact)  # fmt: skip

    def draft(self, cross: bool) -> LoadedModel:
        assert self.choice.draft is not None
        open_model = self.opener or OPENER
        # drafting across tokenizers is per request (engine/drafters/cross.py): a parallel draft is one stream
        return open_model(self.choice.draft, n_ctx=self.n_ctx, n_threads=self.n_threads,
                          n_gpu_layers=self.draft_gpu_layers, n_seq=1 if cross else self.n_seq,
                          unified=self.n_seq > 1, placement=self.draft_placement, exact=False)  # fmt: skip


def load_pair(loader: Loader) -> tuple[LoadedModel, LoadedModel | None, bool, Heads | None]:
    """Both models (and the heads, when the choice names a file), or none: a draft or heads file that fails
    to load frees what was loaded.

    The flag says whether the draft has a different tokenizer (it drafts across them). `loader.opener`
    opens the files (default: `OPENER`, llama.cpp).
    """
    choice = loader.choice
    cross = False
    if choice.draft is not None and choice.draft.resolve() != choice.target.resolve():
        cross = check_pair(choice.target, choice.draft, loader.opener).verdict == pairs.CROSS
    target = loader.target()
    draft = None
    try:
        draft = loader.draft(cross) if choice.draft is not None else None
        heads = load_heads(choice, target)
    except BaseException:
        target.close()
        if draft is not None:
            draft.close()
        raise
    return target, draft, cross, heads
