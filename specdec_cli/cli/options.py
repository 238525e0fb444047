"""Options every command shares, defined once.

An option group is a frozen dataclass whose fields are Typer options. A
command names a group as one parameter (`sampling: SamplingOptions`) and
`@with_options` expands it into the group's options for Typer, then builds
the dataclass again before the command runs. So `run`, `chat`, `bench`,
`pair-check` and `serve` take exactly the same `--temp`, `--draft-max`,
`--threads`, ... with the same help and defaults, and the defaults come from
the engine (`engine.settings`, `SamplerSettings`).

Values are not checked here: the engine checks them (`UsageError`), once.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from specdec_cli.engine.settings import (
    DEFAULT_BURST_MS,
    DEFAULT_CTX,
    DEFAULT_KERNELS,
    DEFAULT_NGRAM,
    DEFAULT_POOL_MB,
    NGRAM,
    NONE,
    PARAMS,
    DrafterKind,
    GenerateOptions,
    KernelChoice,
    check_drafter,
)

if TYPE_CHECKING:
    from specdec_cli.api import Speculator

F = TypeVar("F", bound=Callable[..., Any])
_O = GenerateOptions()


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    target: Annotated[
        Path | None, typer.Option(help="Target GGUF file: the model whose output you get.", rich_help_panel="Models")
    ] = None
    draft: Annotated[
        Path | None,
        typer.Option(help="Draft GGUF file: a smaller model (another tokenizer works too: drafted across tokenizers).",
                     rich_help_panel="Models"),
    ] = None
    pair: Annotated[str | None, typer.Option(help="A named pair from models.toml.", rich_help_panel="Models")] = None
    heads: Annotated[
        Path | None,
        typer.Option(help="Medusa heads file for the target (made by `specdec heads train`): --drafter heads "
                     "drafts with them, and auto weighs them against the other drafters.", rich_help_panel="Models"),
    ] = None


@dataclasses.dataclass(frozen=True)
class DrafterOptions:
    drafter: Annotated[
        str,
        typer.Option(
            "--drafter",
            metavar="KIND",
            help="auto: each step, verify the n-gram proposal, a draft-model draft or nothing, whichever the "
            "costs measured so far say is fastest (never slower than the target alone by more than its "
            "retry budget); model: the draft model proposes; ngram: copy what followed the latest match of "
            "the last tokens in the prompt and output (no draft model needed); heads: Medusa heads guess from "
            "the target's hidden state (--heads); none: the target alone (as --no-draft).",
            rich_help_panel="Speculation",
        ),
    ] = DrafterKind.AUTO
    no_draft: Annotated[
        bool, typer.Option("--no-draft", help="Run the target alone (the baseline).", rich_help_panel="Models")
    ] = False
    fixed_k: Annotated[
        bool,
        typer.Option(
            "--fixed-k",
            help="Draft --draft-max tokens every step, instead of raising K after fully accepted drafts and "
            "lowering it after rejections.",
            rich_help_panel="Speculation",
        ),
    ] = False

    @property
    def kind(self) -> str:
        """The API's drafter name: --no-draft is "none" (and contradicts --drafter ngram)."""
        if self.no_draft and self.drafter == NGRAM:
            from specdec_cli.errors import UsageError

            raise UsageError("--drafter ngram and --no-draft contradict each other")
        return NONE if self.no_draft else check_drafter(self.drafter)


def _opt(name: str, *short: str, panel: str) -> Any:
    """The Typer option for a generation parameter: its flag and help come from `engine.settings.PARAMS`."""
    p = PARAMS[name]
    return typer.Option(*short, p.flag, help=p.help, rich_help_panel=panel)


@dataclasses.dataclass(frozen=True)
class DraftOptions:
    draft_max: Annotated[int | None, _opt("draft_max", "-k", panel="Speculation")] = _O.draft_max
    draft_min: Annotated[int, _opt("draft_min", panel="Speculation")] = _O.draft_min
    draft_p_min: Annotated[float, _opt("draft_p_min", panel="Speculation")] = _O.draft_p_min


@dataclasses.dataclass(frozen=True)
class NgramOptions:
    ngram_min: Annotated[
        int,
        typer.Option("--ngram-min", help="Shortest n-gram the ngram drafter matches.", rich_help_panel="Speculation"),
    ] = DEFAULT_NGRAM[0]
    ngram_max: Annotated[
        int,
        typer.Option("--ngram-max", help="Longest n-gram the ngram drafter tries first.", rich_help_panel="Speculation"),
    ] = DEFAULT_NGRAM[1]
    pool_mb: Annotated[
        float,
        typer.Option("--pool-mb", help="Memory for the token pool: earlier prompts and outputs (requests, turns) "
                     "the n-gram lookup drafts from, oldest dropped first (0 = off).", rich_help_panel="Speculation"),
    ] = DEFAULT_POOL_MB
    ngram_cache: Annotated[
        Path | None,
        typer.Option("--ngram-cache", help="Keep the token pool across runs: read from FILE now (if it exists) and "
                     "saved back at exit, atomically.", rich_help_panel="Speculation"),
    ] = None

    @property
    def sizes(self) -> tuple[int, int]:
        return (self.ngram_min, self.ngram_max)


@dataclasses.dataclass(frozen=True)
class SamplingOptions:
    temperature: Annotated[float, _opt("temperature", panel="Sampling")] = _O.temperature
    top_k: Annotated[int, _opt("top_k", panel="Sampling")] = _O.top_k
    top_p: Annotated[float, _opt("top_p", panel="Sampling")] = _O.top_p
    min_p: Annotated[float, _opt("min_p", panel="Sampling")] = _O.min_p
    seed: Annotated[int | None, _opt("seed", panel="Sampling")] = _O.seed


@dataclasses.dataclass(frozen=True)
class RuntimeOptions:
    ctx_size: Annotated[
        int, typer.Option("--ctx-size", help="Context window in tokens, for each model.", rich_help_panel="Runtime")
    ] = DEFAULT_CTX
    threads: Annotated[
        int | None, typer.Option(help="CPU threads (default: all cores).", rich_help_panel="Runtime")
    ] = None
    gpu_layers: Annotated[
        int | None,
        typer.Option(help="Target layers on the GPU (default: all where llama.cpp was built for a GPU and finds one; "
                     "else 0).", rich_help_panel="Runtime"),
    ] = None
    draft_gpu_layers: Annotated[
        int | None, typer.Option(help="Draft layers on the GPU (default: all where there is one, else 0).",
                                 rich_help_panel="Runtime"),
    ] = None
    kernels: Annotated[
        str,
        typer.Option(help=f"{' or '.join(KernelChoice)}: {KernelChoice.EXACT} checks that the target computes a "
                     "batch as single tokens (else it decodes alone, as on a GPU build without specdec's CUDA kernels); "
                     f"{KernelChoice.FAST} drafts with llama.cpp's own kernels, whose output may differ from the "
                     "target alone in rare tokens.", rich_help_panel="Runtime"),
    ] = DEFAULT_KERNELS
    burst_ms: Annotated[
        float,
        typer.Option("--burst-ms", metavar="MS", help="Greedy, the target alone (alone in the batch when serving) "
                     "or with a draft model (outside a batch of several slots): decode its tokens, or the draft "
                     "model's steps, in bursts of up to MS milliseconds, one call into llama.cpp each, and hand them "
                     "on together (the same tokens, less host time; the first comes alone). 0: one at a time.",
                     rich_help_panel="Runtime"),
    ] = DEFAULT_BURST_MS
    verbose: Annotated[
        bool, typer.Option("--verbose", help="Show llama.cpp's own log.", rich_help_panel="Runtime")
    ] = False
    rpc: Annotated[
        str | None,
        typer.Option("--rpc", metavar="HOST:PORT[,...]", help="Put the target's layers on these llama.cpp RPC "
                     "servers (`specdec rpc-server` on each machine); the draft stays here.",
                     rich_help_panel="Distributed"),
    ] = None
    draft_rpc: Annotated[
        str | None,
        typer.Option("--draft-rpc", metavar="HOST:PORT[,...]", help="Put the draft model's layers on these RPC "
                     "servers too (default: local).", rich_help_panel="Distributed"),
    ] = None
    tensor_split: Annotated[
        str | None,
        typer.Option("--tensor-split", metavar="SHARES", help="The target's layers per --rpc server, as shares "
                     "(3,1: three quarters on the first); default: by each server's free memory.",
                     rich_help_panel="Distributed"),
    ] = None

    def load_kwargs(self) -> dict[str, Any]:
        """The API's arguments for where the models run and with which kernels (RPC ones too)."""
        return {"n_gpu_layers": self.gpu_layers, "draft_gpu_layers": self.draft_gpu_layers,
                "kernels": self.kernels, "burst_ms": self.burst_ms, **self.rpc_kwargs()}  # fmt: skip

    def rpc_kwargs(self) -> dict[str, Any]:
        """The API's RPC arguments for these options (nothing when --rpc and --draft-rpc are not given)."""
        from specdec_cli.engine.rpc import parse_split

        split = parse_split(self.tensor_split)
        if not (self.rpc or self.draft_rpc or split):
            return {}
        return {"rpc": self.rpc, "draft_rpc": self.draft_rpc, "tensor_split": split or None}


# Single options more than one command takes (each command picks its own default).
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
MaxTokensOpt = Annotated[int, _opt("max_tokens", "-n", panel="Sampling")]
SystemOpt = Annotated[str | None, typer.Option(help="System prompt (with the chat template).")]


def generate_kwargs(sampling: SamplingOptions, draft: DraftOptions, fixed_k: bool = False) -> dict[str, Any]:
    """The `GenerateOptions` fields these groups set (their fields are named as the parameters)."""
    return {**dataclasses.asdict(sampling), **dataclasses.asdict(draft), "adaptive": not fixed_k}


def load(
    models: ModelOptions, runtime: RuntimeOptions, ngram: NgramOptions, drafter: str, *, parallel: int = 1,
    prompt_cache_mb: float = 0.0,
) -> Speculator:
    from specdec_cli import api
    from specdec_cli.render import warning

    spec = api.load(
        models.target,
        models.draft,
        pair=models.pair,
        heads=models.heads,
        drafter=drafter,
        n_ctx=runtime.ctx_size,
        n_threads=runtime.threads,
        ngram=ngram.sizes,
        pool_mb=ngram.pool_mb,
        ngram_cache=ngram.ngram_cache,
        verbose=runtime.verbose,
        parallel=parallel,
        prompt_cache_mb=prompt_cache_mb,
        **runtime.load_kwargs(),
    )
    for message in spec.warnings:
        warning(message)
    for message in spec.notes:
        sys.stderr.write(f"Note: {message}\n")
    return spec


def placement_note(spec: Speculator) -> str:
    """Where the models run, for a title: "" when both are local."""
    if not spec.rpc.endpoints:
        return ""
    parts = []
    for role, where in spec.rpc.where.items():
        if where == "local":
            parts.append(f"{role} local")
        else:
            parts.append(f"{role} on " + ", ".join(f"{'here' if k == 'local' else k} {v:.0f} MiB"
                                                   for k, v in where.items()))  # fmt: skip
    return "; " + "; ".join(parts)


def with_options(fn: F) -> F:
    """Expand option-group parameters (dataclass-typed) into their fields for Typer."""
    sig = inspect.signature(fn, eval_str=True)
    hints = typing.get_type_hints(fn, include_extras=True)
    params: list[inspect.Parameter] = []
    groups: dict[str, tuple[type, list[str]]] = {}
    for p in sig.parameters.values():
        ann = hints.get(p.name, p.annotation)
        if isinstance(ann, type) and dataclasses.is_dataclass(ann):
            field_hints = typing.get_type_hints(ann, include_extras=True)
            names = []
            for f in dataclasses.fields(ann):
                params.append(
                    inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=field_hints[f.name])
                )
                names.append(f.name)
            groups[p.name] = (ann, names)
        else:
            params.append(p.replace(annotation=ann, kind=inspect.Parameter.KEYWORD_ONLY))
    seen = [p.name for p in params]
    if len(seen) != len(set(seen)):
        raise TypeError(f"{fn.__name__}: an option is defined twice ({seen})")

    @functools.wraps(fn)
    def wrapper(**kw: Any) -> Any:
        for name, (cls, names) in groups.items():
            kw[name] = cls(**{n: kw.pop(n) for n in names})
        return fn(**kw)

    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper  # type: ignore[return-value]
