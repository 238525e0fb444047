"""The results file every benchmark command writes (what a stamp holds: specdec_cli/bench/stamp.py).

Each command takes `--results PATH`; without it the file goes to benchmarks/results/ (ignored by git).
The files that back the docs are kept in docs/results/, and benchmarks/report.py renders the docs'
tables from them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specdec_cli.bench import stamp


def add_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--results", type=Path, default=None, metavar="PATH",
                    help="write the results file (JSON, stamped) here; default: benchmarks/results/KIND-DATE.json")
    stamp.started()  # every benchmark adds the option as it starts: the stamp names the code it started with


def pair_files(pair: str | None) -> tuple[Path, Path]:
    """A pair's target and draft files (models.toml; None: the default pair)."""
    from specdec_cli.models import loading

    choice = loading.choose_models(None, None, pair, no_draft=False, drafter="model")
    assert choice.draft is not None
    return choice.target, choice.draft


def calibrated(target: str | os.PathLike[str], draft: str | os.PathLike[str] | None, threads: int,
               max_batch: int = 17) -> dict[str, Any]:  # fmt: skip
    """This machine's batch costs c(b) for the target and the draft's cost per token, in single-token
    target decodes, measured now as the auto drafter's calibration measures them (not read from its cache)."""
    from specdec_cli.calibration import BASE_TEXT
    from specdec_cli.engine import native
    from specdec_cli.engine.costs import batch_costs, draft_token_seconds, sizes_for
    from specdec_cli.engine.model import Model

    with Model(target, n_ctx=1024, n_threads=threads) as t:
        base = t.tokenize(BASE_TEXT * 2, add_special=True, parse_special=False)
        one, relative = batch_costs(t, base, base[-max_batch:], max_batch, sizes=sizes_for(max_batch))
    draft_cost = None
    if draft is not None:
        with Model(draft, n_ctx=1024, n_threads=threads, exact=False) as d:
            d_base = d.tokenize(BASE_TEXT * 2, add_special=True, parse_special=False)
            draft_cost = round(draft_token_seconds(d, d_base[:-1], d_base[-1]) / one, 4)
    native.release_compute_threads()  # a Speculator this process loads next steps on a thread of its own
    return {"target_ms": round(one * 1000, 3), "batch": {str(b): round(c, 4) for b, c in sorted(relative.items())},
            "draft": draft_cost}  # fmt: skip


def save(args: argparse.Namespace, kind: str, *, threads: int | None,
         models: Mapping[str, str | os.PathLike[str] | None], data: Mapping[str, Any]) -> Path:  # fmt: skip
    """Write the stamped results file and say where (stderr)."""
    path = args.results or stamp.default_path(kind)
    stamp.write(path, kind, stamp.stamp(threads=threads, model_files=models), data)
    print(f"results: {path}", file=sys.stderr)
    return path
