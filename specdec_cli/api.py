"""The Python API: lossless two-model speculative decoding for GGUF models.

Every command (run, chat, bench, pair-check --probe, serve) generates through
`Speculator.start`, so stats, generation time and tokens/s are computed in one
place (`engine.stats`)::

    from specdec_cli import api

    with api.load() as spec:  # the default pair in models.toml; or load("t.gguf", "d.gguf")
        g = spec.generate("Name three rivers.", max_tokens=32)
        print(g.text, g.stats.acceptance_rate)
        for chunk in spec.stream([{"role": "user", "content": "And three lakes?"}]):
            print(chunk.text, end="")

Successive calls keep the common prefix of both models' KV caches, so a
conversation costs only its new tokens. Errors are the `SpecdecError` family
the CLI prints (`UsageError` for bad values is also a `ValueError`).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from specdec_cli.engine import native, prompting
from specdec_cli.engine import rpc as rpc_backend
from specdec_cli.engine.batch import BatchEngine, BatchJob
from specdec_cli.engine.drafters import Drafter, ModelDrafter, NgramDrafter
from specdec_cli.engine.drafters.auto import WINDOW, AutoDrafter, AutoState
from specdec_cli.engine.drafters.cross import CrossDrafter, CrossVocab
from specdec_cli.engine.drafters.gate import CostGate
from specdec_cli.engine.drafters.policies import compose
from specdec_cli.engine.drafters.pool import TokenPool, open_pool_file
from specdec_cli.engine.events import DRAFT, Step
from specdec_cli.engine.protocol import LoadedModel, ModelOpener
from specdec_cli.engine.settings import (
    AUTO,
    DEFAULT_CTX,
    DEFAULT_DRAFTER,
    DEFAULT_K,
    DEFAULT_NGRAM,
    DEFAULT_POOL_MB,
    MODEL,
    NGRAM,
    NONE,
    GenerateOptions,
    check_drafter,
    check_load,
)
from specdec_cli.engine.speculative import SpeculativeGenerator
from specdec_cli.errors import PoolFileError, RpcError, UsageError
from specdec_cli.generation import Chunk, Generation, GenerationRun, Message, Prompt, PromptTokens
from specdec_cli.models import loading

__all__ = ["Chunk", "GenerateOptions", "Generation", "GenerationRun", "Message", "Prompt", "PromptTokens",
           "Speculator", "load"]

class Speculator:
    """A loaded target (and draft) with their KV caches; see `load`."""

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
    ) -> None:
        self.choice = choice
        self._loader = loader  # to open a model again after its RPC server came back
        self.parallel = parallel  # > 1: generations from several threads share each step's batch (engine/batch/)
        self._engine: BatchEngine | None = None
        self._engine_lock = threading.Lock()
        self.target = target
        self.draft = draft
        self.drafter = drafter  # the default kind for `generate`
        self.ngram = ngram
        self.pool = pool  # earlier prompts and outputs, for the n-gram lookup (engine/drafters/pool.py)
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
        self._auto_start: AutoState | None = None  # the calibrated starting point, for seeded sampled runs
        self._lock = threading.Lock()
        self.rpc_lost: rpc_backend.Loss | None = None  # an RPC server stopped answering; the next start connects again
        self._rpc_lock = threading.Lock()  # one reconnect at a time
        self._loss_lock = threading.Lock()
        self._unlisten = rpc_backend.listen(self._on_rpc_lost) if self.endpoints else None

    # ------------------------------------------------------------- RPC servers
    @property
    def endpoints(self) -> tuple[str, ...]:
        """The RPC servers the models are on (none: both local)."""
        out: list[str] = []
        for m in (self.target, self.draft):
            place = m.placement if m is not None else None
            if place is not None:
                out += [e for e in place.endpoints if e not in out]
        return tuple(out)

    @property
    def where(self) -> dict[str, Any]:
        """Where each model runs: "local", or MiB of its weights per RPC server (and here)."""
        out: dict[str, Any] = {}
        for role, m in (("target", self.target), ("draft", self.draft)):
            if m is not None:
                out[role] = "local" if m.placement is None else {k: round(v, 1) for k, v in m.where.items()}
        return out

    def _on_rpc_lost(self, loss: rpc_backend.Loss) -> None:
        """From llama.cpp's dispatcher thread: a server stopped answering. Every model on RPC servers is
        abandoned and its connections cut (a live server then frees what it held for us); a batch engine's
        generations end; the next `start` connects again."""
        mine = self.endpoints
        if not set(loss.endpoints) & set(mine):
            return
        with self._loss_lock:  # not _rpc_lock: a reconnect holds it while it waits on this thread's listeners
            if self.rpc_lost is not None:
                return
            self.rpc_lost = loss
        for m in (self.target, self.draft):
            if m is not None and m.placement is not None:
                m.abandon()
        rpc_backend.cut_connections(mine)
        for e in mine:
            rpc_backend.retire(e)
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.fail_all(RpcError(loss.reason()))

    def _ready(self) -> None:
        """After a lost server: connect again before anything else uses the models."""
        if self.rpc_lost is not None:
            with self._rpc_lock:
                if self.rpc_lost is not None:
                    self._reconnect()

    def _reconnect(self) -> None:
        """After a lost server: connect again if every server answers (RpcError otherwise)."""
        loss, loader = self.rpc_lost, self._loader
        assert loss is not None and loader is not None
        for e in (loader.placement.endpoints if loader.placement else ()) + (
                loader.draft_placement.endpoints if loader.draft_placement else ()):  # fmt: skip
            try:
                rpc_backend.probe(e)
            except RpcError as exc:
                raise RpcError(f"{loss.reason()} during an earlier generation; now {exc}") from None
        if loader.placement is not None:
            self.target = loader.target()
        if self.draft is not None and loader.draft_placement is not None:
            self.draft = loader.draft(self.cross)
        self._auto = None if loader.draft_placement is not None else self._auto  # a new draft: calibrate again
        self.rpc_lost = None

    # ------------------------------------------------------------- facts
    @property
    def models(self) -> dict[str, Any]:
        c = self.choice
        out: dict[str, Any] = {"target": str(c.target), "draft": str(c.draft) if c.draft else None, "pair": c.pair}
        if self.endpoints:
            out["where"] = self.where  # MiB of weights per RPC server (and "local": here)
        return out

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
        self._ready()
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
        self._ready()
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
                                endpoints=self.endpoints)  # fmt: skip
            self.batch_engine().submit(job)
            return run
        gen = SpeculativeGenerator(self.target, self._make_drafter(kind, config), tokens.ids, config,
                                   should_stop=lambda: run._should_stop())  # fmt: skip
        run = GenerationRun(gen, self._settings(opts, kind, config, tokens.used_chat), cancel, models=self.models,
                            lock=self._lock, n_cached=self.target.common_prefix(gen.prompt),
                            on_draft_dropped=self._draft_dropped, on_finished=self._remember,
                            endpoints=self.endpoints)  # fmt: skip
        return run

    def generate(self, prompt: Prompt | PromptTokens, options: GenerateOptions | None = None, **kw: Any) -> Generation:
        run = self.start(prompt, options, **kw)
        for _ in run.events():
            pass
        return run.generation

    def stream(self, prompt: Prompt | PromptTokens, options: GenerateOptions | None = None, **kw: Any) -> Iterator[Chunk]:
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
        if self.pool is not None:
            self.pool.add([*prompt, *output])

    def _ngram(self, config: GenerateOptions) -> NgramDrafter:
        """The n-gram lookup, with the pool unless the run is seeded and sampled: its text must depend on
        the seed alone, not on what earlier requests left in the pool (with any drafts it stays exact)."""
        return NgramDrafter(*self.ngram, pool=None if config.reproducible else self.pool)

    def _draft_dropped(self, reason: str) -> None:
        self.draft_broken = reason  # later generations start without the draft model

    def _kind(self, requested: str | None) -> str:
        kind = check_drafter(requested or self.drafter)
        if kind == MODEL and self.draft is None:
            raise UsageError("the model drafter needs a draft model: load one (draft=... or a pair), or use 'ngram'")
        if kind == MODEL and self.draft_broken:
            return NONE
        return kind

    def draft_tokens(self, ids: Sequence[int]) -> list[int]:
        """The same text in the draft's tokens: `ids` themselves unless the draft has its own tokenizer."""
        assert self.draft is not None
        if not self.cross:
            return list(ids)
        return self.draft.tokenize(self.target.detokenize(ids), add_special=True, parse_special=False)

    def auto_state(self, k_max: int) -> AutoState:
        """The auto drafter's estimates: calibrated costs to start (calibration.py), then the runs' own."""
        if self._auto is None:
            from specdec_cli.calibration import starting_state

            draft = self.draft if self.draft is not None and not self.draft_broken else None
            self._auto = starting_state(self.target, draft, self.n_threads, max(k_max, DEFAULT_K[AUTO]) + 1)
            self._auto_start = copy.deepcopy(self._auto)
        return self._auto

    def batch_engine(self) -> BatchEngine:
        """The engine that steps this Speculator's generations together (parallel > 1), started on first use."""
        with self._engine_lock:
            if self._engine is None:
                from specdec_cli.calibration import parallel_starting_state

                draft = None if self.cross or self.draft_broken else self.draft
                k = DEFAULT_K[AUTO]
                state, draft_costs = parallel_starting_state(self.target, draft, self.n_threads,
                                                             self.parallel * (k + 1), self.parallel)  # fmt: skip
                self._engine = BatchEngine(self.target, draft, state, ngram=self.ngram, pool=self.pool,
                                           model_k_max=self.choice.draft_max, draft_costs=draft_costs)  # fmt: skip
            return self._engine

    def _reproducible_auto_state(self, k_max: int) -> AutoState:
        """For a seeded sampled run: the starting costs every time, learning nothing from timings."""
        self.auto_state(k_max)
        assert self._auto_start is not None
        state = copy.deepcopy(self._auto_start)
        state.learn_costs = False
        return state

    def _default_k(self, kind: str) -> int:
        if kind == MODEL and self.choice.draft_max:
            return self.choice.draft_max
        return DEFAULT_K.get(kind, DEFAULT_K[MODEL])

    def _make_drafter(self, kind: str, config: GenerateOptions) -> Drafter | None:
        """One fresh drafter per generation (the models, and so their caches, are shared)."""
        inner: Drafter
        if kind == AUTO:
            model: ModelDrafter | CrossDrafter | None = None
            if self.draft is not None and not self.draft_broken:
                model = self._model_drafter(config, window=WINDOW)
            k = config.k_max
            state = self._reproducible_auto_state(k) if config.reproducible else self.auto_state(k)
            return AutoDrafter(self._ngram(config), model, k, state, self.choice.draft_max)
        if kind == MODEL and self.draft is not None:
            inner = self._model_drafter(config)
        elif kind == NGRAM:
            inner = self._ngram(config)
        else:
            return None
        # A seeded sampled run gets a new gate: which tokens it verifies must not depend on earlier runs.
        return compose(inner, config, gate=None if config.reproducible else self._gate)

    def _model_drafter(self, config: GenerateOptions, window: int | None = None) -> ModelDrafter | CrossDrafter:
        assert self.draft is not None
        if not self.cross:
            return ModelDrafter(self.draft, config.draft_p_min, window=window)
        if self._cross_vocab is None:
            self._cross_vocab = CrossVocab.build(self.target, self.draft)
        # the window is in tokens; the cross drafter re-reads text: about 4 characters a token
        return CrossDrafter(self.target, self.draft, self._cross_vocab, config.draft_p_min,
                            window=None if window is None else 4 * window)  # fmt: skip

    def _settings(self, o: GenerateOptions, kind: str, config: GenerateOptions, used_chat: bool) -> dict[str, Any]:
        """The settings a generation reports (`--json`): its parameters as resolved, and the pair's."""
        drafting = kind != NONE
        return {
            **o.as_dict(),
            "drafter": kind if drafting else None,
            "draft_max": config.k_max if drafting else 0,
            "adaptive_k": o.adaptive,
            "ngram": list(self.ngram) if kind in (NGRAM, AUTO) else None,
            "ctx_size": self.target.n_ctx,
            "threads": self.n_threads,
            "chat_template": used_chat,
            "system": o.system,
        }

    # ------------------------------------------------------------ cleanup
    def open_pool_file(self, path: str | os.PathLike[str]) -> int:
        """Read a pool saved by an earlier run (none yet: it is created at `close`); tokens read."""
        self.pool_file, self._pool_stamp, n = open_pool_file(self.pool, path, self.target.vocab_info().texts)
        return n

    def close(self) -> None:
        if self._unlisten is not None:
            self._unlisten()
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


def load(
    target: str | os.PathLike[str] | None = None,
    draft: str | os.PathLike[str] | None = None,
    *,
    pair: str | None = None,
    drafter: str | None = DEFAULT_DRAFTER,
    n_ctx: int = DEFAULT_CTX,
    n_threads: int | None = None,
    n_gpu_layers: int = 0,
    draft_gpu_layers: int = 0,
    ngram: tuple[int, int] = DEFAULT_NGRAM,
    verbose: bool = False,
    parallel: int = 1,
    open_model: ModelOpener | None = None,
    pool_mb: float = DEFAULT_POOL_MB,
    ngram_cache: str | os.PathLike[str] | None = None,
    rpc: str | Sequence[str] | None = None,
    draft_rpc: str | Sequence[str] | None = None,
    tensor_split: Sequence[float] | None = None,
) -> Speculator:
    """Load a target and its drafter.

    `target`/`draft` are GGUF paths, or `target` is a pair name from models.toml
    (`pair=` works too); nothing at all means the default pair. `drafter` is
    "auto" (each step, the n-gram lookup, the draft model or a plain decode,
    whichever the measured costs favour), "model" (the draft model proposes),
    "ngram" (prompt lookup, no draft model), or None/"none" (the target alone).

    `parallel` > 1 gives each model that many sequences of `n_ctx` tokens, and
    `start`/`generate`/`stream` may then be called from as many threads at once:
    their generations share each step's target batch (engine/batch/), each one
    token-for-token what it would be alone (greedy; sampling keeps the target's
    distribution, and a seeded sampled generation is decoded without drafts).

    `pool_mb` bounds the token pool: earlier prompts and outputs the n-gram lookup (and so `auto`) drafts
    from, shared by every generation of this Speculator (0: none; engine/drafters/pool.py). `ngram_cache`
    is a file the pool is read from now (when it exists) and saved to at `close()`, atomically.

    `rpc` ("HOST:PORT,..." or a list): the target's layers go to those llama.cpp RPC servers
    (`specdec rpc-server`), split by their free memory or by `tensor_split` (one share per server); the
    draft stays here unless `draft_rpc` names servers for it. A server that stops answering mid-generation
    ends that generation with what it produced (`stop_reason` "rpc", `error` says which server); the next
    generation connects again, or raises `RpcError` while the server is still away.

    `open_model` opens the model files (default: llama.cpp; tests pass a fake, tests/fakes.py).
    """
    check_load(n_ctx=n_ctx, n_threads=n_threads, parallel=parallel, ngram=ngram, pool_mb=pool_mb)
    kind = check_drafter(NONE if drafter is None else drafter)
    if target is not None and draft is None and pair is None and loading.is_pair_name(target):
        pair, target = str(target), None
    choice = loading.choose_models(
        Path(target) if target is not None else None,
        Path(draft) if draft is not None else None,
        pair,
        no_draft=kind == NONE,
        drafter=kind,
    )
    warnings = []
    cores = native.usable_cores()
    if n_threads is not None and n_threads > cores:
        # More threads than cores only adds contention (measured: 10 tokens in 120 s at 1000 threads).
        warnings.append(f"--threads {n_threads} is more than the {cores} cores this process may use: using {cores}")
        n_threads = cores
    native.set_verbose(verbose)
    placement = rpc_backend.Placement(rpc_backend.parse_endpoints(rpc), tuple(tensor_split or ())) if rpc else None
    if tensor_split and placement is None:
        raise UsageError("--tensor-split shares the target's layers between --rpc servers: give --rpc too")
    draft_placement = rpc_backend.Placement(rpc_backend.parse_endpoints(draft_rpc, "--draft-rpc")) if draft_rpc else None
    if draft_placement is not None and choice.draft is None:
        raise UsageError("--draft-rpc places the draft model, and this run has none: drop --draft-rpc")
    loader = loading.Loader(choice, n_ctx, n_threads, n_gpu_layers, draft_gpu_layers, parallel, open_model,
                            placement, draft_placement)  # fmt: skip
    t, d, cross = loading.load_pair(loader)
    pool = TokenPool(int(pool_mb * (1 << 20)), n_min=ngram[0]) if pool_mb > 0 else None
    spec = Speculator(choice, t, d, drafter=kind, ngram=ngram, n_threads=n_threads, cross=cross, parallel=parallel,
                      pool=pool, loader=loader)  # fmt: skip
    if ngram_cache is not None:
        try:
            spec.open_pool_file(ngram_cache)
        except BaseException:
            spec._close_models()
            raise
    if cross and parallel > 1 and d is not None:
        spec.notes.append("with --parallel, a draft with another tokenizer is not used: the n-gram lookup drafts")
    spec.warnings = [*warnings, *t.warnings, *(d.warnings if d is not None else [])]
    if cross and d is not None:
        spec.notes.append(
            f"{d.name} has a different tokenizer from {t.name}: drafting across tokenizers "
            "(greedy drafts are re-tokenized as text; sampled drafts come from the shared tokens)"
        )
    return spec

