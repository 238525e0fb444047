"""`Speculator`: a loaded target (and drafter) with their KV caches, what `api.load` returns: it starts
generations (one at a time, or several sharing each step's batch with `parallel`), keeps what the drafters
learned between them, and frees the models."""

from __future__ import annotations

import copy
import dataclasses
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from specdec_cli.comparison import Comparison
from specdec_cli.drafting import make_drafter
from specdec_cli.engine import kernels, prompting
from specdec_cli.engine.batch import BatchEngine, BatchJob
from specdec_cli.engine.batch.prompt_cache import PromptCache
from specdec_cli.engine.drafters.auto import AutoState
from specdec_cli.engine.drafters.cross import CrossVocab
from specdec_cli.engine.drafters.gate import CostGate
from specdec_cli.engine.drafters.pool import TokenPool, open_pool_file
from specdec_cli.engine.events import DRAFT, Step
from specdec_cli.engine.heads import Heads
from specdec_cli.engine.protocol import LoadedModel
from specdec_cli.engine.settings import (
    AUTO,
    DEFAULT_K,
    HEADS,
    MODEL,
    NGRAM,
    NONE,
    GenerateOptions,
    check_drafter,
)
from specdec_cli.engine.speculative import SpeculativeGenerator
from specdec_cli.errors import PoolFileError, UsageError
from specdec_cli.generation import Chunk, Generation, GenerationRun, Prompt, PromptTokens
from specdec_cli.models import loading
from specdec_cli.rpc_link import RpcLink


class Speculator:
    """A loaded target (and draft) with their KV caches; see `api.load`."""

    def __init__(
        self,
        choice: loading.ModelChoice,
        target: LoadedModel,
        draft: LoadedModel | None,
        *,
        drafter: str,
        ngram: tuple[int, int],
        n_threads: int | None,
        cross: bool = False,
        parallel: int = 1,
        pool: TokenPool | None = None,
        loader: loading.Loader | None = None,
        heads: Heads | None = None,
        prompt_cache_bytes: int = 0,
        burst_seconds: float = 0.0,
    ) -> None:
        self.choice = choice
        self.burst_seconds = burst_seconds  # the target alone, greedy: bursts of decodes this long (api.load's burst_ms)
        self.prompt_cache_bytes = prompt_cache_bytes  # parallel > 1: slots' caches kept for prompts that come back
        self.heads = heads  # Medusa heads for the target (engine/heads.py), when a heads file was given
        self.parallel = parallel  # > 1: generations from several threads share each step's batch (engine/batch/)
        self._engine: BatchEngine | None = None
        self._engine_lock = threading.Lock()
        self.target = target
        self.draft = draft
        self.drafter = drafter  # the default kind for `generate`
        self.ngram = ngram
        self.pool = pool  # earlier prompts and outputs, for the n-gram lookup (engine/drafters/pool.py)
        self.remember = True  # False: generations read the pool, add nothing to it (bench: each run a first ask)
        self.pool_file: Path | None = None  # where the pool is saved at close (`--ngram-cache`)
        self._pool_stamp = ""  # the vocabulary's fingerprint, written with the pool (computed once: a whole vocabulary)
        self.n_threads = n_threads
        self.draft_broken: str | None = None  # set when the draft model produced non-finite logits
        self.warnings: list[str] = []  # about how it was loaded (threads capped, context past training length)
        self.notes: list[str] = []  # for the user, once (drafting across tokenizers)
        self.cross = cross  # the draft has a different tokenizer (engine/drafters/cross.py)
        self._cross_vocab: CrossVocab | None = None
        self._auto: AutoState | None = None  # what the auto drafter learned, kept across generations
        self._gate = CostGate()  # what --drafter ngram's cost gate learned, kept across generations
        self._heads_gate = CostGate()  # ... and --drafter heads's
        self._auto_start: AutoState | None = None  # the calibrated starting point, for seeded sampled runs
        self._lock = threading.Lock()
        self.rpc = RpcLink(self, loader)  # the models' RPC servers, if any: where, a lost one, reconnecting

    # ------------------------------------------------------------- facts
    @property
    def models(self) -> dict[str, Any]:
        c = self.choice
        out: dict[str, Any] = {"target": str(c.target), "draft": str(c.draft) if c.draft else None, "pair": c.pair}
        out["kernels"] = {"target": self.target.kernels, "draft": self.draft.kernels if self.draft else None}
        out["exact"] = self.exact
        out["gpu_layers"] = dict(zip(("target", "draft"), self.gpu_layers, strict=True))
        if c.heads is not None:
            out["heads"] = str(c.heads)
        if self.rpc.endpoints:
            out["where"] = self.rpc.where  # MiB of weights per RPC server (and "local": here)
        return out

    @property
    def gpu_layers(self) -> tuple[int, int]:
        """The target's and the draft's layers on the GPU, as loaded (llama.cpp's tools run the same: bench)."""
        loader = self.rpc.loader
        return (loader.gpu_layers, loader.draft_gpu_layers) if loader is not None else (0, 0)

    @property
    def exact(self) -> bool:
        """Whether greedy output is the target's alone, token for token: False with `kernels="fast"`, whose
        target's kernels were not probed (engine/kernels.py)."""
        return self.target.kernels != kernels.FAST

    @property
    def n_ctx(self) -> int:
        return self.target.n_ctx

    @property
    def tokens_evaluated(self) -> dict[str, int]:
        """Tokens each model has evaluated so far: shows what prefix reuse saved."""
        return {"target": self.target.decoded_tokens, "draft": self.draft.decoded_tokens if self.draft else 0}

    # ------------------------------------------------------------ prompts
    def tokenize(self, prompt: Prompt | PromptTokens, *, system: str | None = None, chat: bool | None = None) -> PromptTokens:
        """A string (the chat template applied when the model has one, unless chat=False), or messages."""
        self.rpc.ready()
        if isinstance(prompt, PromptTokens):
            return prompt
        if isinstance(prompt, str):
            ids, used = prompting.tokenize_prompt(self.target, prompt, use_chat=chat, system=system)
            return PromptTokens(ids, used)
        messages = prompting.check_messages(prompt)
        if chat is False:
            raise UsageError("a list of messages needs the chat template: drop chat=False or pass a string")
        if system:
            messages = [{"role": "system", "content": system}, *messages]
        return PromptTokens(prompting.tokenize_chat(self.target, self.target.info().chat_template, messages), True)

    # --------------------------------------------------------- generation
    def start(
        self,
        prompt: Prompt | PromptTokens,
        options: GenerateOptions | None = None,
        *,
        cancel: Callable[[], bool] | threading.Event | None = None,
        **overrides: Any,
    ) -> GenerationRun:
        """Begin a generation; keyword overrides are `GenerateOptions` fields."""
        self.rpc.ready()
        try:
            opts = dataclasses.replace(options or GenerateOptions(), **overrides)
        except TypeError as exc:
            raise UsageError(f"unknown generation option: {exc}") from None
        kind = self._kind(opts.drafter)
        k = opts.draft_max if opts.draft_max is not None else self._default_k(kind)
        config = opts.resolved(k)
        tokens = self.tokenize(prompt, system=opts.system, chat=opts.chat)
        run: GenerationRun
        if self.parallel > 1:
            job = BatchJob(tokens.ids, config, kind, should_stop=lambda: run._should_stop(), k_max=config.k_max)
            run = GenerationRun(job, self._settings(opts, kind, config, tokens.used_chat), cancel, models=self.models,
                                on_draft_dropped=self._draft_dropped, on_finished=self._remember,
                                endpoints=self.rpc.endpoints)  # fmt: skip
            self.batch_engine().submit(job)
            return run
        gen = SpeculativeGenerator(self.target, make_drafter(self, kind, config), tokens.ids, config,
                                   should_stop=lambda: run._should_stop(), burst_seconds=self.burst_seconds)  # fmt: skip
        run = GenerationRun(gen, self._settings(opts, kind, config, tokens.used_chat), cancel, models=self.models,
                            lock=self._lock, n_cached=self.target.common_prefix(gen.prompt),
                            on_draft_dropped=self._draft_dropped, on_finished=self._remember,
                            endpoints=self.rpc.endpoints)  # fmt: skip
        return run

    def generate(self, prompt: Prompt | PromptTokens, options: GenerateOptions | None = None, **kw: Any) -> Generation:
        """Generate to the end and return the `Generation` (keywords as `start`'s)."""
        run = self.start(prompt, options, **kw)
        for _ in run.events():
            pass
        return run.generation

    def compare(self, prompt: Prompt | PromptTokens, options: GenerateOptions | None = None, **kw: Any) -> Comparison:
        """Generate (keywords as `start`'s), then the same through the target alone: same text (greedy), and
        tokens/s of each (`run --compare`)."""
        return Comparison(self.generate(prompt, options, **kw), self.target_alone(prompt, options, **kw))

    def target_alone(self, prompt: Prompt | PromptTokens, options: GenerateOptions | None = None, **kw: Any) -> Generation:
        """The same generation with no drafter, adding nothing to the token pool (a drafter after it must not
        copy the baseline's output)."""
        remember, self.remember = self.remember, False
        try:
            return self.generate(prompt, options, **{**kw, "drafter": NONE})
        finally:
            self.remember = remember

    def stream(self, prompt: Prompt | PromptTokens, options: GenerateOptions | None = None, **kw: Any) -> Iterator[Chunk]:
        """Yield a `Chunk` per step that emitted text; the last one (empty text) carries the `Generation`."""
        run = self.start(prompt, options, **kw)
        for ev in run.events():
            if isinstance(ev, Step) and ev.emitted:
                yield Chunk(
                    "".join(t.text for t in ev.emitted),
                    tuple(t.id for t in ev.emitted),
                    tuple(t.source == DRAFT for t in ev.emitted),
                )
        yield Chunk("", generation=run.generation)

    # ------------------------------------------------------------ helpers
    def _remember(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        if self.pool is not None and self.remember:
            self.pool.add([*prompt, *output])

    def _draft_dropped(self, reason: str) -> None:
        self.draft_broken = reason  # later generations start without the draft model

    def _kind(self, requested: str | None) -> str:
        kind = check_drafter(requested or self.drafter)
        if kind == MODEL and self.draft is None:
            raise UsageError("the model drafter needs a draft model: load one (draft=... or a pair), or use 'ngram'")
        if kind == MODEL and self.draft_broken:
            return NONE
        if kind == HEADS and self.heads is None:
            raise UsageError("the heads drafter needs a heads file: load one (heads=... or a pair's), or use 'ngram'")
        if self.target.kernels == kernels.INEXACT:
            return NONE  # no drafts to verify: its warning said so at load (engine/kernels.py)
        return kind

    def draft_tokens(self, ids: Sequence[int]) -> list[int]:
        """The same text in the draft's tokens: `ids` themselves unless the draft has its own tokenizer."""
        assert self.draft is not None
        if not self.cross:
            return list(ids)
        return self.draft.tokenize(self.target.detokenize(ids), add_special=True, parse_special=False)

    def auto_state(self) -> AutoState:
        """The auto drafter's estimates: calibrated costs to start (calibration.py), then the runs' own."""
        if self._auto is None:
            from specdec_cli.calibration import CALIBRATED_K, starting_state

            draft = self.draft if self.draft is not None and not self.draft_broken else None
            self._auto = starting_state(self.target, draft, self.n_threads, CALIBRATED_K + 1,
                                        same_vocab=not self.cross)
            self._auto_start = copy.deepcopy(self._auto)
        return self._auto

    def batch_engine(self) -> BatchEngine:
        """The engine that steps this Speculator's generations together (parallel > 1), started on first use."""
        with self._engine_lock:
            if self._engine is None:
                from specdec_cli.calibration import PARALLEL_CALIBRATED_K, parallel_starting_state

                draft = None if self.cross or self.draft_broken else self.draft
                k = PARALLEL_CALIBRATED_K
                state, draft_costs = parallel_starting_state(self.target, draft, self.n_threads,
                                                             self.parallel * (k + 1), self.parallel)  # fmt: skip
                local = getattr(self.target, "placement", None) is None  # not on RPC servers: each copy a round trip
                cache = PromptCache(self.prompt_cache_bytes) if self.prompt_cache_bytes and local else None
                self._engine = BatchEngine(self.target, draft, state, ngram=self.ngram, pool=self.pool, heads=self.heads,
                                           model_k_max=self.choice.draft_max, draft_costs=draft_costs,
                                           prompt_cache=cache, burst_seconds=self.burst_seconds)  # fmt: skip
            return self._engine

    def _default_k(self, kind: str) -> int:
        if kind == MODEL and self.choice.draft_max:
            return self.choice.draft_max
        if kind == HEADS and self.heads is not None:
            return self.heads.n_heads
        return DEFAULT_K.get(kind, DEFAULT_K[MODEL])

    def _settings(self, o: GenerateOptions, kind: str, config: GenerateOptions, used_chat: bool) -> dict[str, Any]:
        """The settings a generation reports (`--json`): its parameters as resolved, and the pair's."""
        drafting = kind != NONE
        return {
            **o.as_dict(),
            "drafter": kind if drafting else None,
            "draft_max": config.k_max if drafting else 0,
            "draft_max_model": self._model_cap(kind, config.k_max),
            "adaptive_k": o.adaptive,
            "ngram": list(self.ngram) if kind in (NGRAM, AUTO) else None,
            "ctx_size": self.target.n_ctx,
            "threads": self.n_threads,
            "chat_template": used_chat,
            "system": o.system,
        }

    def _model_cap(self, kind: str, k_max: int) -> int | None:
        """The most tokens the draft model drafts a step: auto's n-gram copies go to `k_max`, its model drafts
        stop at the pair's `draft_max`; None where no draft model drafts."""
        if kind == MODEL:
            return k_max
        if kind == AUTO and self.draft is not None and not self.draft_broken:
            return min(k_max, self.choice.draft_max or k_max)
        return None

    # ------------------------------------------------------------ cleanup
    def open_pool_file(self, path: str | os.PathLike[str]) -> int:
        """Read a pool saved by an earlier run (none yet: it is created at `close`); tokens read."""
        self.pool_file, self._pool_stamp, n = open_pool_file(self.pool, path, self.target.vocab_info().texts)
        return n

    def close(self) -> None:
        """Free both models (and the RPC connections); save the token pool to its `ngram_cache` file."""
        self.rpc.close()
        try:
            if self.pool is not None and self.pool_file is not None:
                try:
                    self.pool.save(self.pool_file, self._pool_stamp)
                except OSError as exc:
                    raise PoolFileError(f"could not save the token pool to {self.pool_file}: {exc.strerror or exc}") from None
        finally:
            self._close_models()

    def _close_models(self) -> None:
        if self._engine is not None:
            self._engine.close()
        self.target.close()
        if self.draft is not None:
            self.draft.close()

    def __enter__(self) -> Speculator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
