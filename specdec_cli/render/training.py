"""`specdec heads train` on the terminal: the estimate, one progress bar per phase, the epochs, the result."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from specdec_cli.heads_training import Epoch, Estimate

PHASES = ("generate", "read", "fit")
LABELS = {"generate": "generating answers", "read": "reading hidden states", "fit": "training the heads"}


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def estimate_line(est: Estimate, n_texts: int, n_tokens: int) -> str:
    return (f"{n_texts} texts, up to {n_tokens:,} tokens to generate: about {minutes(est.total)} on this machine "
            f"(generating {minutes(est.generate)}, reading hidden states {minutes(est.read)}, training "
            f"{minutes(est.fit)}; timed here just now). Ctrl-C while training keeps the best heads so far.")  # fmt: skip


@contextlib.contextmanager
def train_progress(totals: dict[str, int], enabled: bool
                   ) -> Iterator[tuple[Callable[[str, int, int | None], None], Callable[[str], None]]]:  # fmt: skip
    """Progress bars on stderr (a terminal only); yields `advance(phase, n, total)` (n done so far; total None
    leaves it) and `log(line)`, a line above the bars (on stderr without them; nothing when not `enabled`)."""
    if not enabled or not sys.stderr.isatty():
        yield (lambda _phase, _n, _total: None), (lambda line: print(line, file=sys.stderr) if enabled else None)
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("left"), TimeRemainingColumn(), console=Console(stderr=True)) as progress:  # fmt: skip
        tasks = {p: progress.add_task(LABELS[p], total=totals.get(p, 1), start=False) for p in PHASES}
        started: set[str] = set()

        def advance(phase: str, n: int, total: int | None = None) -> None:
            if phase not in started:
                progress.start_task(tasks[phase])
                started.add(phase)
            if total is not None:
                progress.update(tasks[phase], total=total)
            progress.update(tasks[phase], completed=n)

        yield advance, lambda line: progress.console.print(line, highlight=False)


def epoch_line(ep: Epoch) -> str:
    acc = " ".join(f"{a:.0%}" for a in ep.accuracy)
    kept = "  (best so far: kept)" if ep.best else ""
    return (f"epoch {ep.epoch}: held out, accuracy by head {acc}, {ep.run:.2f} tokens a draft adds "
            f"(loss {ep.loss:.3f}), {ep.seconds:.0f} s{kept}")  # fmt: skip


def result_table(accuracy: list[float], run: float, kept_epoch: int, seconds: dict[str, float],
                 peak_mib: float) -> None:  # fmt: skip
    t = Table(title=f"heads kept from epoch {kept_epoch}: held-out accuracy (the top guess is the target's token)",
              title_justify="left", box=None, header_style="bold", pad_edge=False)  # fmt: skip
    for k in range(len(accuracy)):
        t.add_column(f"head {k + 1} (token +{k + 2})", justify="right")
    t.add_column("tokens a draft adds", justify="right")
    t.add_row(*(f"{a:.1%}" for a in accuracy), f"{run:.2f}")
    err = Console(stderr=True, highlight=False)
    err.print(t)
    err.print("time: " + ", ".join(f"{LABELS[p]} {minutes(seconds[p])}" for p in PHASES if p in seconds)
              + f"; peak memory {peak_mib:,.0f} MiB")  # fmt: skip
