"""`specdec heads train`: Medusa heads for a target, trained here on its own outputs (heads_training.py)."""

from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Annotated

import typer

from specdec_cli.cli.ngram_cache import TEXT_SUFFIXES
from specdec_cli.cli.options import JsonOpt, ModelOptions, RuntimeOptions, with_options
from specdec_cli.cli.output import Output

app = typer.Typer(
    name="heads",
    help="Medusa heads: a drafter read from the target's own hidden state, for targets without a draft model.",
    no_args_is_help=True,
)


@app.command("train")
@with_options
def train(
    *,
    models: ModelOptions,
    runtime: RuntimeOptions,
    out_file: Annotated[
        Path | None,
        typer.Option("--out", help="The heads file to write (default: TARGET.heads.gguf in this folder).",
                     show_default=False),
    ] = None,
    source: Annotated[
        Path | None,
        typer.Option("--from", help="A folder of your own text files: passages of them are continued by the "
                     "target and trained on too (plain text, no chat template).", show_default=False),
    ] = None,
    prompts: Annotated[int, typer.Option("--prompts", help="Built-in prompts to answer (at most 240).")] = 160,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", help="Tokens the target writes per text.")] = 192,
    n_heads: Annotated[int, typer.Option("--n-heads", help="Heads: tokens drafted per step at most.")] = 3,
    epochs: Annotated[int, typer.Option("--epochs", help="Passes over the training texts.")] = 8,
    vocab: Annotated[int, typer.Option("--vocab", help="Draftable tokens at most (the most frequent).")] = 4096,
    parallel: Annotated[int, typer.Option("--parallel", help="Texts generated at once, in one batch.")] = 8,
    results: Annotated[
        Path | None,
        typer.Option("--results", help="Also write a results file (JSON): what --json prints, stamped with the "
                     "date, commit, CPU, threads and the target's sha256.", show_default=False),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Train Medusa heads for a target on its own greedy answers, on this machine; then
    `specdec run --heads FILE` (or `heads = "FILE"` in a models.toml pair)."""
    from specdec_cli import api, heads_training
    from specdec_cli.engine.native import usable_cores
    from specdec_cli.engine.settings import MAX_PARALLEL, NONE, check_load
    from specdec_cli.errors import UsageError
    from specdec_cli.models import loading
    from specdec_cli.render.training import epoch_line, estimate_line, result_table, train_progress

    out = Output(json_out)
    with out.errors():
        for name, value, lo, hi in (("--prompts", prompts, 0, len(heads_training.PROMPTS)), ("--max-tokens", max_tokens, 8, 2048),
                                    ("--n-heads", n_heads, 1, 8), ("--epochs", epochs, 1, 1000),
                                    ("--vocab", vocab, 16, 1 << 20), ("--parallel", parallel, 1, MAX_PARALLEL)):  # fmt: skip
            if not lo <= value <= hi:
                raise UsageError(f"{name} must be from {lo} to {hi}, got {value}")
        if source is not None and not source.is_dir():
            raise UsageError(f"--from {source}: not a folder")
        if models.draft is not None:
            raise UsageError("heads are trained for the target alone: drop --draft")
        choice = loading.choose_models(models.target, None, models.pair, no_draft=True, drafter=NONE)
        dest = out_file or Path(f"{choice.target.stem}.heads.gguf")
        for path in (dest, results):
            if path is not None and not path.parent.is_dir():
                raise UsageError(f"{path}: no folder {path.parent}")
        if results is not None:
            from specdec_cli.bench import stamp

            stamp.started()
        n_ctx = heads_training.PASSAGE_TOKENS + max_tokens + 512  # room for a chat-templated prompt
        check_load(n_ctx=n_ctx, n_threads=runtime.threads, parallel=parallel)
        plan = heads_training.Plan(prompts, max_tokens, n_heads, vocab, epochs, parallel)
        spec = api.load(choice.target, drafter=None, n_ctx=n_ctx, n_threads=runtime.threads, parallel=parallel,
                        pool_mb=0, verbose=runtime.verbose, n_gpu_layers=runtime.gpu_layers)  # fmt: skip
        try:
            texts, chat = [], []
            per_subject = len(heads_training.TEMPLATES)  # a subject's texts are held out together
            for i, p in enumerate(heads_training.PROMPTS[:prompts]):
                texts.append(heads_training.Text(list(spec.tokenize(p).ids), i // per_subject))
                chat.append(True)
            if source is not None:
                files = sorted(p for p in source.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
                first = len(heads_training.PROMPTS)  # a file's passages are one group
                for n, ids in heads_training.file_passages(spec.target, files, limit=max(prompts, 40)):
                    texts.append(heads_training.Text(ids, first + n))
                    chat.append(False)
            if len(texts) < 2:
                raise UsageError("nothing to train on: give --prompts 2 or more, or a --from folder with text files")
            est = heads_training.estimate(spec.target, plan, len(texts), sum(len(t.prompt) for t in texts))
            out.note(estimate_line(est, len(texts), plan.n_tokens(len(texts))))
            seconds: dict[str, float] = {}
            totals = {"generate": plan.n_tokens(len(texts)), "read": 1, "fit": 1}
            with train_progress(totals, not json_out) as (advance, log):
                t0, made = time.perf_counter(), [0]

                def generated(n: int) -> None:
                    made[0] += n
                    advance("generate", made[0], None)

                heads_training.generate(spec, texts, plan, chat, generated)
                seconds["generate"] = time.perf_counter() - t0
                t0, total_read, read_so_far = time.perf_counter(), sum(len(t.prompt) + len(t.output) for t in texts), [0]

                def was_read(n: int) -> None:
                    read_so_far[0] += n
                    advance("read", read_so_far[0], total_read)

                hidden, labels = heads_training.read(spec.target, texts, n_heads, was_read)
                seconds["read"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                result = heads_training.fit(spec.target, hidden, labels, plan,
                                            lambda n, total: advance("fit", n, total),
                                            lambda ep: log(epoch_line(ep)), [t.group for t in texts])  # fmt: skip
                seconds["fit"] = time.perf_counter() - t0
        except KeyboardInterrupt:
            out.note("interrupted before an epoch was scored: no heads file written")
            raise typer.Exit(130) from None
        finally:
            spec.close()
        result.heads.save(dest)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kept = result.heads.settings
    payload = {"file": str(dest), "target": str(choice.target), "texts": len(texts),
               "tokens": sum(len(t.output) for t in texts), "n_heads": n_heads, "vocab": int(result.heads.subset.size),
               "epochs": [vars(e) for e in result.epochs], "kept_epoch": kept["kept_epoch"],
               "held_out_accuracy": kept["held_out_accuracy"], "held_out_run": kept["held_out_run"],
               "held_out_chain": kept["held_out_chain"], "interrupted": result.interrupted,
               "seconds": {k: round(v, 2) for k, v in seconds.items()},
               "estimate_seconds": round(est.total, 1), "peak_memory_mib": round(peak)}  # fmt: skip
    if results is not None:
        with out.errors():
            try:
                stamp.write(results, "heads-train", stamp.stamp(threads=runtime.threads or usable_cores(),
                                                                model_files={"target": choice.target}), payload)  # fmt: skip
            except OSError as exc:
                raise UsageError(f"cannot write --results {results}: {exc.strerror or exc}") from None

    def human() -> None:
        result_table(kept["held_out_accuracy"], kept["held_out_run"], kept["kept_epoch"], seconds, peak)
        use = f"--pair {choice.pair} " if choice.pair else f"--target {choice.target} "
        out.note(("interrupted: " if result.interrupted else "")
                 + f"wrote {dest}; use it with `specdec run {use}--heads {dest}` (auto drafts with the heads "
                 "where they pay) or `--drafter heads`")  # fmt: skip

    out.result(payload, human)
