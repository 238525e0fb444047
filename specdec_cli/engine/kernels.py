"""Which kernels a model computes with, where (the GPU's layers), and the load-time check that exact mode's are
batch-invariant.

Speculative verification decodes K+1 tokens in one batch; the output is the target's own only if a token's
logits do not depend on what else the batch holds. The kernel sets (`Model.kernels`):

- `FAST`: llama.cpp's own choice (repacked weights, flash attention): a draft's, which only proposes.
- `INVARIANT`: exact mode on a build with specdec's patches (patches/llama.cpp/, applied by scripts/setup.sh)
  and GGML_CPU_BATCH_INVARIANT=1 (engine/native.py sets it): repacked weights, computed row by row (llama.cpp
  computes them in groups of 4 rows from 4 rows on, another summation order), and flash attention, every
  query row over its cells in fixed chunks (llama.cpp's switches to a tiled kernel for 64+ queries and to a
  split-KV reduction for one query over 512+ cells: other summation orders). Checked at load by `probe`.
  Process-wide with the variable: llamafile's sgemm computes one token with its batches' sums (float weights;
  llama.cpp sends one token to vec_dot), and one token's matrix products split rows per thread.
- `REFERENCE`: exact mode where the build is not patched, the model is on RPC servers, or the
  probe failed: repacked weights and flash attention off. On the CPU these are probed too: a stock build's
  llamafile sgemm computes one token of F32, F16 or Q8_0-family weights in another order than a batch.
- `GPU`: exact mode with layers on a GPU, probed at every width a verification or a server step uses, after a
  short and a long prefix (`batch_equals_single_after`). Stock llama.cpp's CUDA kernels fail it (they pick
  other matrix-product and attention kernels, and other reduction splits, by the number of tokens in the
  batch): exact mode there ends `INEXACT`. specdec's patch 0008 (GGML_CUDA_BATCH_INVARIANT=1, engine/native.py)
  computes batches of up to its width (`native.cuda_invariant_width`) row by row: the probe then takes the
  widths up to it, and every decode of the target stays within it, prompts and server steps included
  (`Model.exact_width`).
- `INEXACT`: exact mode where the probe failed and no other kernel set is left to try (the CPU's reference
  kernels, a GPU's): the target must decode alone (no drafts, one sequence at a time: api.py), which is
  exactly how it decodes without specdec.
- `FAST` on a target: `--kernels fast` (`KernelChoice.FAST`): llama.cpp's own kernels, not probed, with
  drafts: llama.cpp's speed; greedy output may differ from the target alone where two tokens' logits are
  within the kernels' rounding differences (rare), and sampling keeps the distribution of the batched
  logits, not of single-token ones.

The tiled K-quant matmul is off for the whole process (engine/native.py). docs/design.md#the-kernels.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from specdec_cli.engine import native
from specdec_cli.engine.settings import MAX_DRAFT, InvalidSetting

Model = Any  # engine/model.py's Model, which imports this module (a loaded model with `n_threads`)

FAST = "fast"
INVARIANT = "invariant"
REFERENCE = "reference"
INEXACT = "inexact"
GPU = "gpu"

# What `specdec` prints and the results files carry for each set.
DESCRIPTIONS = {
    FAST: "llama.cpp's fast kernels (repacked weights, flash attention)",
    INVARIANT: "batch-invariant kernels (repacked weights row by row, flash attention in fixed chunks)",
    REFERENCE: "reference kernels (repacked weights and flash attention off)",
    INEXACT: "kernels that compute a batch differently from one token at a time: the target decodes alone",
    GPU: "GPU kernels, probed: a batch computes as single tokens on this model",
}

PROBE_TEXT = "The quick brown fox jumps over the lazy dog, and then it runs away into the woods. " * 4
# Batch sizes the probe compares with single tokens: 12, past the 4 rows where llama.cpp's repacked GEMM takes
# over and over an odd remainder; 64, a prompt's (flash attention's tiled kernel takes 64 queries and more; a
# stock build's Q4_K_M reference kernels passed at 12 tokens and failed from 16).
PROBE_SIZES = (12, 64)
# On a GPU the kernels change with the batch's width at many points (matrix-vector kernels up to 8 columns with
# warps chosen by width, tiled kernels with splits chosen by tile count, attention kernels by query count), so
# the probe takes every width a verification uses (1 to MAX_DRAFT + 1: width 1 against itself catches a
# nondeterministic kernel) and a server step's (up to n_batch), after a short prefix and a long one (attention
# splits follow the cache's length).
GPU_PROBE_WIDTHS = (*range(1, MAX_DRAFT + 2), 96, 128, 192, 256)
GPU_PROBE_PREFIXES = (64, 1024)


def gpu_probe_widths() -> tuple[int, ...]:
    """The widths the GPU probe takes: all of `GPU_PROBE_WIDTHS` on a stock build; on one with patch 0008's
    kernels on, those up to the width they cover (and that width), which is all a GPU model's decodes use. A
    width below a verification's widest (GGML_CUDA_BATCH_INVARIANT_MAX set under MAX_DRAFT + 1) is probed at
    every width, and fails: the target then decodes alone."""
    limit = native.cuda_invariant_width()
    if limit is None or limit < MAX_DRAFT + 1:
        return GPU_PROBE_WIDTHS
    return tuple(sorted({w for w in GPU_PROBE_WIDTHS if w <= limit} | {limit}))


def patched_build() -> bool:
    """Whether this llama.cpp build has all of specdec's kernel patches (on or off): its system info names
    BATCH_INVARIANT_FA (patch 0003) and, in a build with llamafile's sgemm, BATCH_INVARIANT_SGEMM (0004);
    a stock build names neither."""
    info = native.system_info() or ""
    return "BATCH_INVARIANT_FA" in info and ("LLAMAFILE = 1" not in info or "BATCH_INVARIANT_SGEMM" in info)


def invariant_build() -> bool:
    """Whether this build has specdec's batch-invariant kernels and they are on (GGML_CPU_BATCH_INVARIANT=1:
    its system info says BATCH_INVARIANT = 1)."""
    return patched_build() and "BATCH_INVARIANT = 1" in (native.system_info() or "")


def choose(exact: bool, local: bool = True, n_gpu_layers: int = 0, vocab_only: bool = False) -> tuple[str, str | None]:
    """The kernel set a model asks for (`local`: not on RPC servers), and a warning when exact mode must fall
    back to the reference ones."""
    if vocab_only:
        return REFERENCE, None  # no context, no kernels
    if not exact:
        return FAST, None
    if not local:
        return REFERENCE, None  # on RPC servers: their own check (engine/rpc.py)
    if n_gpu_layers > 0 and native.gpu_devices():
        return GPU, None  # probed once loaded (`probe`)
    if invariant_build():
        return INVARIANT, None
    info = native.system_info() or ""
    why = ("GGML_CPU_BATCH_INVARIANT is not 1" if "BATCH_INVARIANT = 0" in info
           else "this llama.cpp build predates specdec's current kernel patches (scripts/setup.sh builds them)"
           if "BATCH_INVARIANT = 1" in info
           else "this llama.cpp build has no batch-invariant kernels (scripts/setup.sh builds one)")  # fmt: skip
    return REFERENCE, f"{why}: exact mode runs the slower reference kernels"


def settle(model: Model, why: str | None, reopen: Callable[[], None]) -> tuple[str, str | None]:
    """The kernel set a freshly loaded `model` keeps, and the line it carries: invariant ones are probed, and
    where they fail (after a second try with Q4_0's GEMM off: patch 0002's switch is process-wide, and off is
    the safe side for every model) `reopen` loads it again with the reference ones; those are probed on a CPU
    that fell back to them (`why`), and a GPU's kernels always are; a failed probe there leaves the target
    decoding alone (INEXACT). Other sets (a draft's; RPC servers', which engine/rpc.py checks) stay as chosen."""
    if model.kernels == INVARIANT and not probe(model) and not (q4_0_gemm_off() and probe(model)):
        model.kernels, why = REFERENCE, probe_failed(model.path)  # before `reopen`: the context reads it
        reopen()
    if model.kernels == REFERENCE and why and not probe(model):
        return INEXACT, inexact(model.path)
    if model.kernels == GPU and not probe(model):
        return INEXACT, gpu_inexact(model.path)  # the same kernels, decoding alone
    return model.kernels, why


def probe_failed(path: Path) -> str:
    """The line a model loaded with the reference kernels after a failed probe carries."""
    return (f"{path.name}: this build's repacked weights compute a batch of tokens differently from one token "
            "at a time: exact mode runs the slower reference kernels")  # fmt: skip


def inexact(path: Path) -> str:
    """The line a target carries when no kernel set of this build computes a batch as single tokens."""
    return (f"{path.name}: this llama.cpp build computes a batch of tokens differently from one token at a time, "
            "even with the reference kernels (llamafile's sgemm without specdec's patch?): drafts and parallel "
            "requests would change the output, so the target decodes alone, one request at a time "
            "(scripts/setup.sh builds kernels that keep a batch exact)")  # fmt: skip


ALL_LAYERS = 999  # more than any model has: llama.cpp puts every layer (and the output layer) there

FAST_NOTE = ("--kernels fast: the target computes with llama.cpp's own kernels, not probed: drafted output may "
             "differ from the target alone in rare tokens (where two tokens' logits are within rounding)")  # fmt: skip


def gpu_layers(asked: int | None, param: str, on_rpc: bool = False) -> int:
    """The layers a model puts on the GPU: all of them where this build found a GPU (as Ollama and LM Studio
    do) unless `asked`, none elsewhere. Asking for some where there is no GPU is refused, not run on the CPU
    in silence. On RPC servers (`on_rpc`) the count means their layers (engine/rpc.py: 0 = all)."""
    if asked is not None and asked < 0:
        raise InvalidSetting(param, asked, ">= 0 (leave it out: every layer on the GPU where there is one)")
    if on_rpc:
        return asked or 0
    if asked is None:
        return ALL_LAYERS if native.gpu_devices() else 0
    if asked > 0 and not native.gpu_devices():
        raise InvalidSetting(param, asked, "0 where llama.cpp has no GPU",
                             hint="this build found none: scripts/setup.sh builds for an NVIDIA GPU where it finds "
                                  "one and a CUDA toolkit; docs/gpu.md")  # fmt: skip
    return asked


def gpu_inexact(path: Path) -> str:
    """The line a GPU target carries when the probe found its batches computed differently from single tokens."""
    why = ("specdec's batch-invariant CUDA kernels do not cover this model (float weights, a mixture of experts?)"
           if native.cuda_invariant_width() else "this build lacks specdec's batch-invariant CUDA kernels "
           "(scripts/setup.sh builds them)")  # fmt: skip
    return (f"{path.name}: on this GPU llama.cpp computes a batch of tokens differently from one token at a time "
            f"({why}), so drafts could change the output: exact mode decodes the target alone, one request at a "
            "time. `--kernels fast` drafts at llama.cpp's speed, with output that may differ from the target alone "
            "in rare tokens (docs/gpu.md)")  # fmt: skip


def _verdicts() -> Path:
    from specdec_cli.models.packaged import cache_dir

    return cache_dir() / "kernels.json"


def _key(path: Path, threads: int, kernel_set: str, gemm: bool | None = None) -> str:
    st = path.stat()
    if kernel_set == INVARIANT and (q4_0_gemm() if gemm is None else gemm):
        kernel_set += "+q4_0-gemm"  # patch 0002's switch on: another kernel for Q4_0 weights, another verdict
    if kernel_set == GPU:  # the GPU's model decides its kernels; the thread count does not
        kernel_set += "|" + ",".join(d.description for d in native.gpu_devices())
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}|{native.build_id()}|threads={threads}|{kernel_set}"


def q4_0_gemm() -> bool:
    """Whether Q4_0's repacked weights keep llama.cpp's GEMM in batch-invariant mode (patch 0002's switch)."""
    switch = native.q4_0_gemm_switch()
    return bool(switch is not None and switch.value)


def q4_0_gemm_off() -> bool:
    """Turn patch 0002's Q4_0 GEMM off for the process (every Q4_0 model then goes row by row, which is batch-
    invariant by construction, only slower on prompts): where a model failed the probe with it on. False
    where it was not on."""
    switch = native.q4_0_gemm_switch()
    if switch is None or not switch.value:
        return False
    switch.value = False
    return True


def _read() -> dict[str, bool]:
    try:
        data = json.loads(_verdicts().read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, bool)} if isinstance(data, dict) else {}


def _write(key: str, verdict: bool) -> None:
    path = _verdicts()
    data = _read()
    data[key] = verdict
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)  # a read-only cache: probe again next time


def batch_equals_single(model: Model, sizes: tuple[int, ...] = PROBE_SIZES) -> bool | None:
    """Decode the first n tokens of the probe text in one batch for each n of `sizes`, and the longest one a
    token at a time, from an empty cache: bit-identical logits? None when the logits are not finite (damaged
    weights, which the generation reports): no verdict on the kernels. Costs max(sizes) + len(sizes)
    decodes; leaves the cache empty."""
    ids = model.tokenize(PROBE_TEXT, add_special=True, parse_special=False)[: min(max(sizes), model.n_batch, model.n_ctx)]
    batches = []
    for n in sorted({min(n, len(ids)) for n in sizes}):
        model.reset()
        batches.append(np.array(model.decode(ids[:n], n_logits=n), copy=True))
    model.reset()
    single = np.stack([np.array(model.decode([t])[0], copy=True) for t in ids])
    model.reset()
    native.release_compute_threads()  # generations step on threads of their own (generation.py)
    if not (all(np.isfinite(b).all() for b in batches) and np.isfinite(single).all()):
        return None
    return all(np.array_equal(b, single[: len(b)]) for b in batches)


def batch_equals_single_after(model: Model, prefixes: tuple[int, ...], widths: tuple[int, ...]) -> bool | None:
    """After each prefix of the probe text (repeated to length), decode the next w tokens in one batch for each
    width w, and the widest one a token at a time: bit-identical logits? None when the logits are not finite.
    Widths past n_batch, and prefixes past what the context holds beside the widest batch, are cut to fit.
    Costs, per prefix, one prefill, max(widths) single decodes and one batch per width; leaves the cache empty."""
    widths = tuple(sorted({min(w, model.n_batch) for w in widths}))
    text = model.tokenize(PROBE_TEXT, add_special=False, parse_special=False)
    bos = model.tokenize("", add_special=True, parse_special=False)
    finite = True
    try:
        for prefix in sorted({max(0, min(p, model.n_ctx - widths[-1] - len(bos))) for p in prefixes}):
            need = len(bos) + prefix + widths[-1]
            ids = (bos + text * (need // max(1, len(text)) + 1))[:need]
            head, tail = ids[: len(bos) + prefix], ids[len(bos) + prefix :]
            model.reset()
            if head:
                model.prefill(head)
            single = np.stack([np.array(model.decode([t])[0], copy=True) for t in tail])
            finite = finite and bool(np.isfinite(single).all())
            for w in widths:
                model.rollback(len(head))
                batch = model.decode(tail[:w], n_logits=w)
                finite = finite and bool(np.isfinite(batch).all())
                if finite and not np.array_equal(batch, single[:w]):
                    return False
    finally:
        model.reset()
        native.release_compute_threads()
    return True if finite else None


def probe(model: Model) -> bool:
    """Whether `model`, loaded with its kernel set, computes a batch as it computes single tokens.
    The verdict is kept per file, build, thread count and kernel set (cache dir, kernels.json): the probe
    runs once. SPECDEC_KERNEL_PROBE=always runs it at every load."""
    key = _key(model.path, model.n_threads, model.kernels)
    always = os.environ.get("SPECDEC_KERNEL_PROBE") == "always"
    if not always:
        known = _read().get(key)
        if known is not None:
            return known
    if model.kernels == GPU:
        verdict = batch_equals_single_after(model, GPU_PROBE_PREFIXES, gpu_probe_widths())
    else:
        verdict = batch_equals_single(model)
    if verdict is None:
        return True  # damaged weights: the generation says so (ModelOutputError), not a kernel warning
    _write(key, verdict)
    return verdict


def expected(path: Path, threads: int, gpu_layers: int = 0) -> str:
    """The kernels an exact model of `path` on this machine computes with, in another process of this build (a
    server a benchmark started): the probe's kept verdict, where it ran, decides."""
    kernels, _ = choose(True, n_gpu_layers=gpu_layers)
    verdicts = _read()
    if kernels == GPU and verdicts.get(_key(path, threads, GPU)) is False:
        return INEXACT
    if kernels == INVARIANT and verdicts.get(_key(path, threads, INVARIANT)) is False and not (
        q4_0_gemm() and verdicts.get(_key(path, threads, INVARIANT, gemm=False)) is not False
    ):  # with Q4_0's GEMM on, a model that failed goes row by row (engine/model.py): that verdict decides
        kernels = REFERENCE
    if kernels == REFERENCE and verdicts.get(_key(path, threads, REFERENCE)) is False:
        kernels = INEXACT
    return kernels
