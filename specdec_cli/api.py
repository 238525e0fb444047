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

import os
from collections.abc import Sequence
from pathlib import Path

from specdec_cli.engine import kernels as kernels_mod
from specdec_cli.engine import native
from specdec_cli.engine.drafters.pool import TokenPool
from specdec_cli.engine.protocol import ModelOpener
from specdec_cli.engine.settings import (
    DEFAULT_BURST_MS,
    DEFAULT_CTX,
    DEFAULT_DRAFTER,
    DEFAULT_KERNELS,
    DEFAULT_NGRAM,
    DEFAULT_POOL_MB,
    DEFAULT_PROMPT_CACHE_MB,
    NONE,
    GenerateOptions,
    KernelChoice,
    check_drafter,
    check_kernels,
    check_load,
)
from specdec_cli.generation import Chunk, Generation, GenerationRun, Message, Prompt, PromptTokens
from specdec_cli.models import loading
from specdec_cli.rpc_link import placements
from specdec_cli.speculator import Speculator

__all__ = ["Chunk", "GenerateOptions", "Generation", "GenerationRun", "Message", "Prompt", "PromptTokens",
           "Speculator", "load"]


def load(
    target: str | os.PathLike[str] | None = None,
    draft: str | os.PathLike[str] | None = None,
    *,
    pair: str | None = None,
    drafter: str | None = DEFAULT_DRAFTER,
    n_ctx: int = DEFAULT_CTX,
    n_threads: int | None = None,
    n_gpu_layers: int | None = None,
    draft_gpu_layers: int | None = None,
    kernels: str = DEFAULT_KERNELS,
    ngram: tuple[int, int] = DEFAULT_NGRAM,
    verbose: bool = False,
    parallel: int = 1,
    open_model: ModelOpener | None = None,
    pool_mb: float = DEFAULT_POOL_MB,
    prompt_cache_mb: float = DEFAULT_PROMPT_CACHE_MB,
    burst_ms: float = DEFAULT_BURST_MS,
    ngram_cache: str | os.PathLike[str] | None = None,
    rpc: str | Sequence[str] | None = None,
    draft_rpc: str | Sequence[str] | None = None,
    tensor_split: Sequence[float] | None = None,
    heads: str | os.PathLike[str] | None = None,
) -> Speculator:
    """Load a target and its drafter.

    `target`/`draft` are GGUF paths, or `target` is a pair name from models.toml
    (`pair=` works too); nothing at all means the default pair. `drafter` is
    "auto" (each step, the n-gram lookup, the draft model or a plain decode,
    whichever the measured costs favour), "model" (the draft model proposes),
    "ngram" (prompt lookup, no draft model), "heads" (Medusa heads read the target's hidden state: `heads`
    names their file, `specdec heads train` makes one; auto uses them too), or None/"none" (the target alone).

    `parallel` > 1 gives each model that many sequences of `n_ctx` tokens, and
    `start`/`generate`/`stream` may then be called from as many threads at once:
    their generations share each step's target batch (engine/batch/), each one
    token-for-token what it would be alone (greedy; sampling keeps the target's
    distribution, and a seeded sampled generation is decoded without drafts).

    `pool_mb` bounds the token pool: earlier prompts and outputs the n-gram lookup (and so `auto`) drafts
    from, shared by every generation of this Speculator (0: none; engine/drafters/pool.py). `ngram_cache`
    is a file the pool is read from now (when it exists) and saved to at `close()`, atomically.
    `prompt_cache_mb` bounds the host memory that keeps slots' caches for prompts that come back when
    `parallel` > 1 (0: none; engine/batch/prompt_cache.py).

    `burst_ms`: a generation of the target alone, greedy (and alone in the batch where `parallel` > 1), decodes
    its tokens in bursts of up to this many milliseconds, each burst one call into llama.cpp with nothing of
    Python's between its decodes, and hands them on together: the same tokens, faster where a token takes a few
    milliseconds; the first token comes alone. 0: one token at a time. Where the target's logits are on a GPU the
    target alone queues each decode ahead instead (docs/design.md#host-time); the batched lone stream bursts.
    A greedy generation with a draft model (`parallel` 1) makes its steps in runs alike: several speculative steps,
    draft and verification, in one call, up to this long (engine/draft_runs.py).

    `rpc` ("HOST:PORT,..." or a list): the target's layers go to those llama.cpp RPC servers
    (`specdec rpc-server`), split by their free memory or by `tensor_split` (one share per server); the
    draft stays here unless `draft_rpc` names servers for it. A server that stops answering mid-generation
    ends that generation with what it produced (`stop_reason` "rpc", `error` says which server); the next
    generation connects again, or raises `RpcError` while the server is still away.

    `n_gpu_layers` / `draft_gpu_layers`: layers on the GPU; None puts all of them there where this llama.cpp
    build found a GPU, none elsewhere (asking for some where there is no GPU raises `InvalidSetting`).
    `kernels`: "exact" (the target's kernels are probed to compute a batch as single tokens, else it decodes
    alone: on a GPU, where the build lacks specdec's batch-invariant CUDA kernels or they do not cover the
    model) or "fast" (llama.cpp's own kernels with drafts: its speed, and output that may differ from the
    target alone in rare tokens; `models["exact"]` says which). docs/gpu.md.

    `open_model` opens the model files (default: llama.cpp; tests pass a fake, tests/fakes.py).
    """
    check_load(n_ctx=n_ctx, n_threads=n_threads, parallel=parallel, ngram=ngram, pool_mb=pool_mb,
               prompt_cache_mb=prompt_cache_mb, burst_ms=burst_ms)
    kind = check_drafter(NONE if drafter is None else drafter)
    exact = check_kernels(kernels) == KernelChoice.EXACT
    if target is not None and draft is None and pair is None and loading.is_pair_name(target):
        pair, target = str(target), None
    choice = loading.choose_models(
        Path(target) if target is not None else None,
        Path(draft) if draft is not None else None,
        pair,
        no_draft=kind == NONE,
        drafter=kind,
        heads=Path(heads) if heads is not None else None,
    )
    warnings = []
    cores = native.usable_cores()
    if n_threads is None:
        n_threads, busy = native.default_threads()
        if busy is not None:
            warnings.append(busy)
    elif n_threads > cores:
        # More threads than cores only adds contention (measured: 10 tokens in 120 s at 1000 threads).
        warnings.append(f"--threads {n_threads} is more than the {cores} cores this process may use: using {cores}")
        n_threads = cores
    native.set_verbose(verbose)
    placement, draft_placement = placements(rpc, draft_rpc, tensor_split, has_draft=choice.draft is not None)
    n_gpu_layers = kernels_mod.gpu_layers(n_gpu_layers, "n_gpu_layers", on_rpc=placement is not None)
    draft_gpu_layers = kernels_mod.gpu_layers(draft_gpu_layers, "draft_gpu_layers", on_rpc=draft_placement is not None)
    loader = loading.Loader(choice, n_ctx, n_threads, n_gpu_layers, draft_gpu_layers, parallel, open_model,
                            placement, draft_placement, exact=exact)  # fmt: skip
    t, d, cross, the_heads = loading.load_pair(loader)
    if t.kernels == kernels_mod.INEXACT:
        parallel = 1  # sequences batched together would change each other's logits; its warning says so
    pool = TokenPool(int(pool_mb * (1 << 20)), n_min=ngram[0]) if pool_mb > 0 else None
    spec = Speculator(choice, t, d, drafter=kind, ngram=ngram, n_threads=n_threads, cross=cross, parallel=parallel,
                      pool=pool, loader=loader, heads=the_heads, prompt_cache_bytes=int(prompt_cache_mb * (1 << 20)),
                      burst_seconds=burst_ms / 1000)  # fmt: skip
    if ngram_cache is not None:
        try:
            spec.open_pool_file(ngram_cache)
        except BaseException:
            spec._close_models()
            raise
    if cross and parallel > 1 and d is not None:
        spec.notes.append("with --parallel, a draft with another tokenizer is not used: the n-gram lookup drafts")
    spec.warnings = [*warnings, *t.warnings, *(d.warnings if d is not None else [])]
    if not exact:
        spec.notes.append(kernels_mod.FAST_NOTE)
    if cross and d is not None:
        spec.notes.append(
            f"{d.name} has a different tokenizer from {t.name}: drafting across tokenizers "
            "(greedy drafts are re-tokenized as text; sampled drafts come from the shared tokens)"
        )
    return spec

