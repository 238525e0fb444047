"""`specdec ngram-cache build`: a token pool from a folder of text, for `--ngram-cache` (as llama.cpp's static
n-gram cache is built from a corpus)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specdec_cli.cli.options import JsonOpt, ModelOptions, with_options
from specdec_cli.cli.output import Output

app = typer.Typer(
    name="ngram-cache",
    help="Token pools kept across runs (--ngram-cache FILE): build one from text files.",
    no_args_is_help=True,
)

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py", ".json", ".jsonl", ".toml", ".yaml", ".yml", ".csv", ".html", ".js",
                 ".ts", ".c", ".h", ".cpp", ".rs", ".go", ".java", ".sh")  # fmt: skip


@app.command("build")
@with_options
def build(
    *,
    file: Annotated[Path, typer.Argument(help="The pool file to write (replaced atomically).", show_default=False)],
    source: Annotated[Path, typer.Option("--from", help="A folder: every text file under it, one text each.")],
    models: ModelOptions,
    pool_mb: Annotated[
        float, typer.Option("--pool-mb", help="The pool's budget in MB; past it, the files read first (in name order) "
                            "are dropped.")
    ] = 64.0,
    json_out: JsonOpt = False,
) -> None:
    """Tokenize every text file under --from with the target's vocabulary and save them as a token pool."""
    from specdec_cli.engine.drafters.pool import TokenPool, vocab_fingerprint
    from specdec_cli.engine.settings import NONE, check_load
    from specdec_cli.errors import UsageError
    from specdec_cli.models import loading

    out = Output(json_out)
    with out.errors():
        check_load(n_ctx=8, n_threads=None, pool_mb=pool_mb)
        if not source.is_dir():
            raise UsageError(f"--from {source}: not a folder")
        if not file.parent.is_dir():
            raise UsageError(f"{file}: no folder {file.parent}")
        choice = loading.choose_models(models.target, None, models.pair, no_draft=True, drafter=NONE)
        files = sorted(p for p in source.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
        pool = TokenPool(int(pool_mb * (1 << 20)))
        model = loading.OPENER(choice.target, vocab_only=True)
        try:
            skipped = 0
            for p in files:
                try:
                    text = p.read_text(encoding="utf-8")
                except (UnicodeDecodeError, OSError):
                    skipped += 1  # not UTF-8 text (or unreadable): a pool holds text
                    continue
                pool.add(model.tokenize(text, add_special=False, parse_special=False))
            fingerprint = vocab_fingerprint(model.vocab_info().texts)
        finally:
            model.close()
        pool.save(file, fingerprint)

    payload = {"file": str(file), "model": str(choice.target), "files": len(files) - skipped, "skipped": skipped,
               "tokens": len(pool), "evicted": pool.evicted}  # fmt: skip
    out.result(payload, lambda: out.note(
        f"{file}: {len(pool)} tokens from {len(files) - skipped} files"
        + (f" ({skipped} not UTF-8 text, skipped)" if skipped else "")
        + (f"; {pool.evicted} oldest dropped to stay within --pool-mb" if pool.evicted else "")
        + f", for {choice.target.name}'s vocabulary"))  # fmt: skip
