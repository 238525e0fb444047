"""`specdec models`: the pairs table, one pair's details, and download progress."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from specdec_cli.models.hub import human_bytes
from specdec_cli.render import no_color

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from specdec_cli.models.registry import PairStatus

def _size(gb: float | None, path: Path | None) -> str:
    if path is not None:
        return f"{path.stat().st_size / 1e9:.2f} GB"
    return f"~{gb:g} GB" if gb else "?"


def models_table(entries: list[PairStatus], *, default: str | None, files: list[Path], user_file: Path) -> None:
    """`specdec models list`: one row per pair, on stdout."""
    console = Console(highlight=False, no_color=no_color())
    if not console.is_terminal:
        console = Console(highlight=False, no_color=no_color(), width=160)
    t = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False)
    for col in ("name", "target", "draft", "size (target + draft)", "on disk"):
        t.add_column(col, no_wrap=col != "draft" and col != "target", overflow="fold")
    for e in entries:
        name = Text(e.pair.name + (" (default)" if e.pair.name == default else ""))
        d = e.pair.draft
        size = _size(e.pair.target.size_gb, e.target_path) + (f" + {_size(d.size_gb, e.draft_path)}" if d else "")
        state = Text(e.state, style="green" if e.state == "yes" else "yellow" if e.state != "no" else "")
        t.add_row(name, e.pair.target.short(), d.short() if d else "(heads only)", size, state)
    console.print(t)
    shown = ", ".join(str(f) for f in files)
    console.print(f"from {shown}; your pairs go in {user_file}", style="dim")
    console.print("`specdec models pull NAME` downloads a pair; `specdec models show NAME` tells more.", style="dim")


def model_show(e: PairStatus, *, default: str | None) -> None:
    """`specdec models show NAME`, on stdout."""
    console = Console(highlight=False, no_color=no_color(), soft_wrap=True)
    p = e.pair
    console.print(Text(p.name + ("  (default)" if p.name == default else ""), style="bold"))
    console.print(p.description)
    if p.notes:
        console.print(Text(p.notes, style="dim"))
    console.print(f"recommended draft-max: {p.draft_max}    defined in: {p.origin}")
    if p.heads:
        console.print(f"heads: {p.heads}" + ("" if p.heads.is_file() else "  (not there yet: `specdec heads train`)"))
    for role, src, path, url in (
        ("target", p.target, e.target_path, e.target_url),
        *([("draft", p.draft, e.draft_path, e.draft_url)] if p.draft else []),
    ):
        console.print(Text(f"{role}: {src.describe()}", style="bold"))
        if url:
            console.print(f"  url: {url}")
        console.print(f"  size: {_size(src.size_gb, path)}")
        if src.unverified:
            console.print(Text(f"  unverified: {src.unverified}", style="yellow"))
        if path is not None:
            console.print(f"  on disk: {path}")
        elif src.requantize:
            console.print("  on disk: not yet (built from the packaged model on first use, no network needed)")
        else:
            kept = e.partial.get(role, 0)
            extra = f" ({human_bytes(kept)} of an interrupted download kept; `pull` resumes it)" if kept else ""
            console.print(f"  on disk: no{extra}")
    console.print(f"state: {e.state}")


class DownloadProgress:
    """A `hub.ProgressSink`: a Rich bar per file on a terminal, one line per file otherwise."""

    def __init__(self, err: IO[str] | None = None) -> None:
        self.console = Console(file=err or sys.stderr, highlight=False)
        self.progress: Progress | None = None
        self.task: TaskID | None = None
        self.label = ""

    def start(self, label: str, total: int | None, done: int) -> None:
        self.finish()
        self.label = label
        if not self.console.is_terminal:
            resume = f", resuming at {human_bytes(done)}" if done else ""
            size = f" ({human_bytes(total)}{resume})" if total else ""
            self.console.print(f"{label}{size} ...")
            return
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.progress.start()
        self.task = self.progress.add_task(label, total=total, completed=done)

    def advance(self, n: int) -> None:
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, advance=n)

    def finish(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def note(self, message: str) -> None:
        self.finish()
        self.console.print(message, style="dim")
