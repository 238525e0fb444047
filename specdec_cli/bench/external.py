"""llama.cpp's own C++ loop on the same pair, prompts and K: `llama-speculative-simple` and `llama-lookup`.

Built from the same sdist with the same flags by scripts/build-llama-cpp-tools.sh,
and run with the kernels and GPU layers specdec's models use (`target_kernels`), after specdec's runs. Their speed is their own
"decoded N tokens in S seconds" line.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specdec_cli.api import Speculator
from specdec_cli.bench.core import TARGET_ONLY, BenchConfig, BenchInputError, RunRecord, Summary, category_groups
from specdec_cli.bench.prompts import BenchPrompt
from specdec_cli.engine.kernels import GPU, INEXACT, INVARIANT, REFERENCE
from specdec_cli.engine.settings import MODEL, NGRAM
from specdec_cli.errors import SpecdecError

LLAMA_TOOLS: dict[str, str] = {MODEL: "llama-speculative-simple", NGRAM: "llama-lookup"}


def llama_cpp_configs(bin_dir: Path, configs: list[BenchConfig]) -> list[BenchConfig]:
    """The configurations llama.cpp's tools can run; their programs must exist (checked before any run)."""
    # llama-lookup has no adaptive K: ngram:auto would repeat its largest fixed-K run.
    wanted = [c for c in configs if c.drafter in LLAMA_TOOLS and not (c.drafter == NGRAM and c.adaptive)]
    for c in wanted:
        tool = bin_dir / LLAMA_TOOLS[c.drafter or ""]
        if not os.access(tool, os.X_OK):
            raise BenchInputError(f"--llama-cpp-bin: {tool} not found (scripts/build-llama-cpp-tools.sh builds it)")
    return wanted


@dataclass
class ExternalRun:
    config: str
    category: str
    n_tokens: int
    seconds: float
    drafted: int
    accepted: int


def target_kernels(kernel_set: str, gpu_layers: int = 0) -> tuple[list[str], dict[str, str]]:
    """A llama.cpp tool's flags and environment for the kernels and device specdec's target computes with
    (engine/kernels.py): its layers on the GPU (`-ngl`, 0 included: a tool's default may differ); on the CPU no
    tiled matmul, and repacked weights and flash attention where the batch-invariant kernels compute them (row
    by row, in fixed chunks), else neither; llamafile's sgemm on the same sums for one token as for a batch
    either way (the tools are built with specdec's patches, which the variable turns on). On a GPU, and with
    `--kernels fast`, llama.cpp's own choice (`-fa auto`), as specdec's target, with patch 0008's batch-invariant
    CUDA kernels where the target computes with them (GPU: exact mode's probe passed) and llama.cpp's own
    elsewhere. The serve benchmark's `llama-server exact` runs these too."""
    env = {"GGML_CPU_TILED_MM": "0", "GGML_CPU_BATCH_INVARIANT": "1",
           "GGML_CUDA_BATCH_INVARIANT": "1" if kernel_set == GPU else "0"}
    if kernel_set == INVARIANT:
        flags = ["-fa", "on"]
    elif kernel_set == REFERENCE or (kernel_set == INEXACT and not gpu_layers):  # a CPU's reference kernels
        flags = ["-fa", "off", "--no-repack"]
    else:
        flags = ["-fa", "auto"]
    return [*flags, "-ngl", str(gpu_layers)], env


def llama_cpp_command(
    bin_dir: Path,
    cfg: BenchConfig,
    target: Path,
    draft: Path | None,
    text: str,
    *,
    max_tokens: int,
    threads: int,
    ctx: int,
    kernel_set: str = REFERENCE,
    gpu_layers: tuple[int, int] = (0, 0),
) -> list[str]:
    """The same pair, prompt text, K and greedy settings, and the target's kernels and both models' GPU layers
    (`target_kernels`; the environment comes from it too, in `run_llama_cpp`)."""
    tool = bin_dir / LLAMA_TOOLS[cfg.drafter or ""]
    cmd = [str(tool), "-m", str(target), "-p", text, "-n", str(max_tokens), "--temp", "0", "-t", str(threads)]
    cmd += ["-c", str(ctx), "--spec-draft-n-max", str(cfg.k), *target_kernels(kernel_set, gpu_layers[0])[0]]
    if cfg.drafter == MODEL:
        assert draft is not None
        cmd += ["-md", str(draft), "--spec-type", "draft-simple", "-td", str(threads), "-ngld", str(gpu_layers[1])]
        cmd += ["--spec-draft-p-min", "0.75" if cfg.adaptive else "0"]  # llama.cpp's own adaptivity is p-min
    return cmd


def parse_llama_cpp(output: str) -> tuple[int, float, int, int]:
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", output)
    d = re.search(r"n_drafted\s*=\s*(\d+)", output)
    a = re.search(r"n_accept\s*=\s*(\d+)", output)
    if not (m and d and a):
        raise SpecdecError("could not read llama.cpp's speed from its output: " + output.strip()[-300:])
    return int(m.group(1)), float(m.group(2)), int(d.group(1)), int(a.group(1))


def run_llama_cpp(
    bin_dir: Path,
    spec: Speculator,
    prompts: list[BenchPrompt],
    configs: list[BenchConfig],
    *,
    repeats: int,
    max_tokens: int,
    threads: int,
    on_run: Callable[[str], None] | None = None,
) -> list[ExternalRun]:
    from specdec_cli.engine import prompting, templates

    runs: list[ExternalRun] = []
    wanted = llama_cpp_configs(bin_dir, configs)
    target, draft = spec.choice.target, spec.choice.draft
    info = spec.target.info()
    sp = spec.target.special_texts()
    layers = spec.gpu_layers
    env = {**os.environ, **target_kernels(spec.target.kernels, layers[0])[1]}
    for rep in range(repeats):
        for p in prompts:
            text = p.text
            if info.chat_template:  # the same rendered prompt specdec tokenizes
                text = templates.render(
                    info.chat_template, prompting.chat_messages(p.text, None), bos_token=sp.bos_text,
                    eos_token=sp.eos_text, source=spec.target.name,
                )  # fmt: skip
                if sp.add_bos and sp.bos_text and text.startswith(sp.bos_text):
                    text = text[len(sp.bos_text) :]
            for c in wanted:
                cmd = llama_cpp_command(
                    bin_dir, c, target, draft, text, max_tokens=max_tokens, threads=threads, ctx=spec.n_ctx,
                    kernel_set=spec.target.kernels, gpu_layers=layers,
                )
                proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env, timeout=600)
                if proc.returncode != 0:
                    raise SpecdecError(
                        f"{Path(cmd[0]).name} failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}"
                    )
                n, secs, drafted, accepted = parse_llama_cpp(proc.stdout + proc.stderr)
                runs.append(ExternalRun(f"llama.cpp {c.name}", p.category, n, secs, drafted, accepted))
                if on_run is not None:
                    on_run(f"llama.cpp {c.name} / {p.name} ({rep + 1})")
    return runs


def summarise_external(runs: list[ExternalRun], records: list[RunRecord], prompts: list[BenchPrompt]) -> list[Summary]:
    out = []
    for cat in category_groups(prompts):
        base = [r for r in records if r.config == TARGET_ONLY and (cat == "all" or r.category == cat)]
        base_tps = sum(len(r.token_ids) for r in base) / sum(r.seconds for r in base) if base else None
        for name in dict.fromkeys(r.config for r in runs):
            rs = [r for r in runs if r.config == name and (cat == "all" or r.category == cat)]
            if not rs:
                continue
            tokens, seconds = sum(r.n_tokens for r in rs), sum(r.seconds for r in rs)
            tps = [r.n_tokens / r.seconds for r in rs if r.seconds > 0]
            drafted, accepted = sum(r.drafted for r in rs), sum(r.accepted for r in rs)
            out.append(
                Summary(
                    config=name,
                    category=cat,
                    runs=len(rs),
                    tokens=tokens,
                    seconds=seconds,
                    tps_median=statistics.median(tps),
                    tps_min=min(tps),
                    tps_max=max(tps),
                    speedup=(tokens / seconds) / base_tps if base_tps else None,
                    predicted=None,
                    oracle=None,
                    identical=None,
                    acceptance_rate=accepted / drafted if drafted else None,
                    tokens_per_step=None,
                    accepted_by_position=[],
                    split={},
                    overhead_fraction=None,
                )
            )
    return out
