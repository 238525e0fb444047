"""All terminal output: token colouring, the live stats panel, summaries, JSON.

stdout carries the generated text (or one JSON object) and nothing else; the
legend, the live panel and the summary go to stderr. On a terminal, tokens the
target accepted from the draft are coloured DRAFT_STYLE and tokens the target
chose itself are left in the terminal's default colour, as the legend says.

The live panel sits on stderr below the text. Because both streams share the
screen, the line being generated is shown inside the live area and written to
stdout once it is complete, so stdout receives the exact text while the user
still sees every token as it arrives.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from specdec_cli.engine.events import DRAFT, DrafterDropped, Prefill, Result, Step
from specdec_cli.engine.stats import Stats
from specdec_cli.hub import human_bytes

DRAFT_STYLE = "bold green"
TARGET_STYLE = ""
STOP_REASONS = {
    "eos": "end of generation token",
    "length": "--max-tokens reached",
    "context": "context full (--ctx-size)",
    "interrupted": "interrupted",
}


def no_color() -> bool:
    return bool(os.environ.get("NO_COLOR"))


def legend() -> Text:
    t = Text("legend: ")
    t.append("accepted from draft", style=DRAFT_STYLE)
    t.append("  ")
    t.append("chosen by target", style=TARGET_STYLE or None)
    return t


def styled_token(text: str, source: str) -> Text:
    return Text(text, style=DRAFT_STYLE if source == DRAFT else TARGET_STYLE)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def stats_table(stats: Stats, *, tokens_per_second: float, title: str = "speculation") -> Table:
    t = Table(title=title, title_justify="left", show_header=True, header_style="bold", box=None, pad_edge=False)
    for col in ("drafted", "accepted", "accept %", "tokens/pass", "steps", "tokens/s", "K"):
        t.add_column(col, justify="right")
    t.add_row(
        str(stats.drafted),
        str(stats.accepted),
        _pct(stats.acceptance_rate) if stats.drafted else "-",
        f"{stats.tokens_per_step:.2f}",
        str(stats.steps),
        f"{tokens_per_second:.1f}",
        str(stats.current_k),
    )
    return t


def by_position(stats: Stats) -> Text:
    if not stats.drafted_at:
        return Text("acceptance by draft position: (nothing drafted)")
    t = Text("acceptance by draft position: ")
    for i, rate in enumerate(stats.accepted_by_position, start=1):
        t.append(f"{i}:{_pct(rate)} ")
    return t


def summary_text(result: Result, stats: Stats, tokens_per_second: float) -> str:
    """The plain, one-paragraph summary for pipes and NO_COLOR."""
    parts = [
        f"tokens {len(result.token_ids)}",
        f"drafted {stats.drafted}",
        f"accepted {stats.accepted}",
        f"acceptance {_pct(stats.acceptance_rate) if stats.drafted else '-'}",
        f"tokens/pass {stats.tokens_per_step:.2f}",
        f"steps {stats.steps}",
        f"{tokens_per_second:.1f} tokens/s",
        f"stop: {STOP_REASONS.get(result.stop_reason, result.stop_reason)}",
    ]
    pos = " ".join(f"{i}:{_pct(r)}" for i, r in enumerate(stats.accepted_by_position, start=1))
    line = ", ".join(parts)
    return line + (f"\nacceptance by draft position: {pos}" if pos else "")


class Renderer:
    """Receives engine events; prints nothing to stdout but the text."""

    def start(self) -> None: ...

    def event(self, ev: Prefill | Step | DrafterDropped, stats: Stats) -> None: ...

    def finish(self, result: Result, stats: Stats, payload: dict[str, Any]) -> None: ...

    def abort(self) -> None:
        """Tear down live displays before an error message is printed."""


class JsonRenderer(Renderer):
    def __init__(self, out: IO[str] | None = None) -> None:
        self.out = out or sys.stdout

    def event(self, ev: Prefill | Step | DrafterDropped, stats: Stats) -> None:
        if isinstance(ev, DrafterDropped):
            warning(ev.reason)

    def finish(self, result: Result, stats: Stats, payload: dict[str, Any]) -> None:
        self.out.write(json.dumps(payload, ensure_ascii=False) + "\n")
        self.out.flush()


class PlainRenderer(Renderer):
    """Pipes and NO_COLOR: plain text streamed to stdout, plain summary on stderr."""

    def __init__(self, out: IO[str] | None = None, err: IO[str] | None = None) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr

    def event(self, ev: Prefill | Step | DrafterDropped, stats: Stats) -> None:
        if isinstance(ev, DrafterDropped):
            self.out.flush()
            warning(ev.reason, self.err)
        elif isinstance(ev, Step):
            for tok in ev.emitted:
                self.out.write(tok.text)
            self.out.flush()

    def finish(self, result: Result, stats: Stats, payload: dict[str, Any]) -> None:
        self.out.write("\n")
        self.out.flush()
        self.err.write(summary_text(result, stats, payload["stats"]["tokens_per_second"]) + "\n")
        self.err.flush()


class LiveRenderer(Renderer):
    """Coloured tokens and a live stats panel (stderr) on a terminal."""

    REFRESH_SECONDS = 0.1

    def __init__(self, out: Console, err: Console, *, live_panel: bool = True, title: str = "speculation") -> None:
        self.title = title
        self.out = out
        self.err = err
        self.live_panel = live_panel
        self.line = Text()
        self.live: Live | None = None
        self._last_refresh = 0.0
        self._t0 = time.perf_counter()
        self._stats = Stats()

    def _renderable(self) -> Group:
        elapsed = max(time.perf_counter() - self._t0, 1e-9)
        tps = self._stats.emitted / elapsed
        items: list[Any] = []
        if self.out_is_err_screen:
            items.append(self.line)
        items.append(stats_table(self._stats, tokens_per_second=tps, title=self.title))
        items.append(by_position(self._stats))
        return Group(*items)

    @property
    def out_is_err_screen(self) -> bool:
        """Both streams on one terminal: the partial line lives in the live area."""
        return self.live_panel and self.out.is_terminal

    def _start_live(self) -> None:
        # A fresh Live each time: a restarted one remembers its old height and
        # would erase the lines just written to stdout above it.
        self.live = Live(self._renderable(), console=self.err, transient=True, auto_refresh=False)
        self.live.start()

    def start(self) -> None:
        self.err.print(legend())
        if self.live_panel:
            self._start_live()

    def _write_out(self, text: Text) -> None:
        if self.live is not None:
            self.live.stop()
        self.out.print(text, end="", soft_wrap=True, highlight=False)
        self.out.file.flush()
        if self.live is not None:
            self._start_live()

    def event(self, ev: Prefill | Step | DrafterDropped, stats: Stats) -> None:
        self._stats = stats
        if isinstance(ev, Prefill):
            self._t0 = time.perf_counter()
            return
        if isinstance(ev, DrafterDropped):
            if self.live is not None:
                self.live.stop()
            self.err.print(f"Warning: {ev.reason}", style="yellow", highlight=False, markup=False)
            if self.live is not None:
                self._start_live()
            return
        for tok in ev.emitted:
            piece = styled_token(tok.text, tok.source)
            if not self.out_is_err_screen:
                self._write_out(piece)
                continue
            if "\n" in tok.text:
                head, _, tail = tok.text.rpartition("\n")
                done = self.line + styled_token(head + "\n", tok.source)
                self.line = styled_token(tail, tok.source)
                self._write_out(done)
            else:
                self.line.append_text(piece)
        now = time.perf_counter()
        if self.live is not None and (now - self._last_refresh >= self.REFRESH_SECONDS or ev.stop):
            self.live.update(self._renderable(), refresh=True)
            self._last_refresh = now

    def abort(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def finish(self, result: Result, stats: Stats, payload: dict[str, Any]) -> None:
        self._stats = stats
        if self.live is not None:
            self.live.stop()
            self.live = None
        self.out.print(self.line, end="", soft_wrap=True, highlight=False)
        self.out.print()
        self.out.file.flush()
        tps = payload["stats"]["tokens_per_second"]
        self.err.print(stats_table(stats, tokens_per_second=tps, title=self.title))
        self.err.print(by_position(stats))
        self.err.print(f"stop: {STOP_REASONS.get(result.stop_reason, result.stop_reason)}", highlight=False)


def make_renderer(
    json_mode: bool, out: IO[str] | None = None, err: IO[str] | None = None, title: str = "speculation"
) -> Renderer:
    out = out or sys.stdout
    err = err or sys.stderr
    if json_mode:
        return JsonRenderer(out)
    if no_color() or not out.isatty():
        return PlainRenderer(out, err)
    out_console = Console(file=out, highlight=False)
    err_console = Console(file=err, highlight=False)
    return LiveRenderer(out_console, err_console, live_panel=err.isatty(), title=title)


def error_line(message: str, err: IO[str] | None = None) -> None:
    (err or sys.stderr).write(f"Error: {message}\n")


# ---------------------------------------------------------------- pair-check
VERDICT_STYLE = {"compatible": "bold green", "compatible (padded)": "bold yellow", "incompatible": "bold red"}


def _b(x: bytes) -> str:
    return repr(x.decode("utf-8", "replace"))


def _mb(n: int) -> str:
    return f"{n / 1024 / 1024:,.0f} MB"


def pair_report(console: Console, report: Any, probe: Any | None = None) -> None:
    """The pair-check report (a `pairs.PairReport`, optionally a `probe.ProbeResult`)."""
    t, d = report.target, report.draft
    table = Table(title="pair-check", title_justify="left", header_style="bold")
    table.add_column("")
    table.add_column("target")
    table.add_column("draft")
    rows = [
        ("file", Path(t.path).name, Path(d.path).name),
        ("architecture", t.architecture, d.architecture),
        ("size label", t.size_label or "?", d.size_label or "?"),
        ("file size", _mb(t.file_size), _mb(d.file_size)),
        ("quantization", t.quantization, d.quantization),
        ("vocab type", t.vocab_type, d.vocab_type),
        ("vocab size", f"{t.n_vocab:,}", f"{d.n_vocab:,}"),
        ("BOS / EOS / EOT ids", f"{t.bos} / {t.eos} / {t.eot}", f"{d.bos} / {d.eos} / {d.eot}"),
        ("add BOS / add EOS", f"{t.add_bos} / {t.add_eos}", f"{d.add_bos} / {d.add_eos}"),
        ("chat template", "yes" if t.has_chat_template else "no", "yes" if d.has_chat_template else "no"),
    ]
    for row in rows:
        same = row[1] == row[2] or row[0] in ("file", "file size", "quantization", "size label")
        table.add_row(row[0], Text(row[1]), Text(row[2], style="" if same else "bold red"))
    console.print(table)

    v = report.verdict
    console.print(f"chat templates equal: {'yes' if report.templates_equal else 'no'}")
    console.print(f"token ids with different text: {v.differing_ids:,}")
    for i, a, b in v.first_differences:
        console.print(f"  id {i}: target {_b(a)}  draft {_b(b)}", highlight=False, markup=False)
    sd = report.special_differences
    console.print(f"special/control tokens that differ: {len(sd):,}")
    for i, a, b in sd[:5]:
        console.print(f"  id {i}: target {_b(a)}  draft {_b(b)}", highlight=False, markup=False)

    rt = Table(title="tokenization round trip (same text -> same ids?)", title_justify="left", header_style="bold")
    for col in ("probe", "same ids", "target ids", "draft ids", "first difference at"):
        rt.add_column(col)
    for r in report.round_trips:
        rt.add_row(
            r.probe,
            Text("yes", style="green") if r.same else Text("no", style="red"),
            str(r.n_target),
            str(r.n_draft),
            "-" if r.first_mismatch is None else str(r.first_mismatch),
        )
    console.print(rt)

    avail = "unknown" if report.memory_available is None else _mb(report.memory_available)
    console.print(
        f"memory to run both at --ctx-size {report.ctx_size}: {_mb(report.memory_needed)} "
        f"(weights + KV caches); available: {avail}"
    )
    if probe is not None:
        probe_table(console, probe)
    console.print(Text.assemble("verdict: ", (v.verdict, VERDICT_STYLE[v.verdict]), f" ({v.reason})"), soft_wrap=True)


def probe_table(console: Console, probe: Any) -> None:
    console.print(
        f"probe: per-token acceptance {probe.acceptance:.0%} over {probe.n_tokens} tokens; "
        f"draft token costs {probe.draft_cost:.2f} target tokens; target token {probe.target_ms:.1f} ms"
    )
    t = Table(title="predicted speedup by draft length K", title_justify="left", header_style="bold")
    for col in ("K", "verify cost", "tokens/step", "predicted speedup"):
        t.add_column(col, justify="right")
    for row in probe.predictions:
        style = "bold" if row.k == probe.recommended_k else None
        t.add_row(
            str(row.k), f"{row.verify_cost:.2f}", f"{row.tokens_per_step:.2f}", f"{row.speedup:.2f}x", style=style
        )
    console.print(t)
    console.print(
        f"recommended K = {probe.recommended_k}: predicted {probe.predicted_speedup:.2f}x, "
        f"measured {probe.measured_speedup:.2f}x ({probe.measured_acceptance:.0%} accepted, "
        f"{probe.spec_tps:.1f} vs {probe.base_tps:.1f} tokens/s target alone)"
    )
    if probe.predicted_speedup < 1.0:
        console.print(
            "no draft length makes this pair faster than the target alone here: the draft is not "
            "cheap enough for its acceptance rate; use --no-draft, or a smaller draft",
            style="yellow",
        )


def warning(message: str, err: IO[str] | None = None) -> None:
    (err or sys.stderr).write(f"Warning: {message}\n")


# ---------------------------------------------------------------------- chat
class ChatRenderer:
    """Streams one reply with the same colouring as `run` (no live panel)."""

    def __init__(self, out: IO[str], colour: Console | None) -> None:
        self.out = out
        self.colour = colour

    def step(self, ev: Step) -> None:
        for tok in ev.emitted:
            if self.colour is not None:
                self.colour.print(styled_token(tok.text, tok.source), end="", soft_wrap=True, highlight=False)
            else:
                self.out.write(tok.text)
        self.out.flush()

    def end(self) -> None:
        self.out.write("\n")
        self.out.flush()


def make_chat_renderer(out: IO[str]) -> ChatRenderer:
    colour = None if (no_color() or not out.isatty()) else Console(file=out, highlight=False)
    return ChatRenderer(out, colour)


def reply_summary(result: Result, stats: Stats, tokens_per_second: float) -> str:
    acc = _pct(stats.acceptance_rate) if stats.drafted else "-"
    stop = (
        ""
        if result.stop_reason in ("eos", "")
        else f", stopped: {STOP_REASONS.get(result.stop_reason, result.stop_reason)}"
    )
    return (
        f"[{len(result.token_ids)} tokens, {tokens_per_second:.1f} tokens/s, acceptance {acc}, "
        f"{stats.tokens_per_step:.2f} tokens/pass{stop}]"
    )


def session_stats(stats: Stats, turns: int) -> str:
    tps = stats.tokens_per_second()
    pos = " ".join(f"{i}:{_pct(r)}" for i, r in enumerate(stats.accepted_by_position, start=1)) or "(nothing drafted)"
    return (
        f"session: {turns} {'reply' if turns == 1 else 'replies'}, {stats.emitted} tokens, drafted {stats.drafted}, accepted {stats.accepted} "
        f"({_pct(stats.acceptance_rate) if stats.drafted else '-'}), {stats.tokens_per_step:.2f} tokens/pass, "
        f"{tps:.1f} tokens/s\nacceptance by draft position: {pos}"
    )


# --------------------------------------------------------------------- bench
@contextlib.contextmanager
def bench_progress(total: int, *, enabled: bool = True) -> Iterator[Callable[[str], None]]:
    """A transient progress bar on stderr; yields the function that advances it."""
    if not enabled or not sys.stderr.isatty():
        yield lambda _label: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        task = progress.add_task("bench", total=total)

        def advance(label: str) -> None:
            progress.update(task, advance=1, description=f"bench {label}")

        yield advance


def bench_report(summaries: list[Any], *, greedy: bool, console: Console | None = None) -> None:
    """The bench table (`bench.Summary` rows) and acceptance by draft position."""
    if console is None:
        console = Console(highlight=False, no_color=no_color())
        if not console.is_terminal:
            console = Console(highlight=False, no_color=no_color(), width=140)
    t = Table(title="specdec bench", title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    cols = ["config", "prompts", "tok/s (min-max)", "speedup", "same" if greedy else None, "accept", "tok/pass"]
    cols += ["target", "draft", "maths", "other", "overhead"]
    for col in cols:
        if col is not None:
            t.add_column(col, justify="left" if col in ("config", "prompts") else "right", no_wrap=True)
    last_cat = None
    for s in summaries:
        if last_cat is not None and s.category != last_cat:
            t.add_section()
        last_cat = s.category
        same = (
            "-" if s.identical is None else Text("yes", style="green") if s.identical else Text("NO", style="bold red")
        )
        row: list[Any] = [
            s.config,
            s.category,
            f"{s.tps_median:.1f} ({s.tps_min:.1f}-{s.tps_max:.1f})",
            "-" if s.speedup is None else f"{s.speedup:.2f}x",
        ]
        if greedy:
            row.append(same)
        row += [
            "-" if s.acceptance_rate is None else _pct(s.acceptance_rate),
            "-" if s.tokens_per_step is None else f"{s.tokens_per_step:.2f}",
        ]
        row += [
            f"{100 * s.split[k]:.0f}%" if s.split else "-"
            for k in ("target_decode", "draft_decode", "sampling", "other")
        ]
        row.append("-" if s.overhead_fraction is None else f"{100 * s.overhead_fraction:.1f}%")
        t.add_row(*row)
    console.print(t)
    console.print(
        "time split: target / draft = inside llama_decode; maths = sampling, verification, n-gram lookup; "
        "overhead = share of generation time outside llama_decode",
        style="dim",
    )
    shown = set()
    for s in summaries:
        if s.accepted_by_position and s.config not in shown and s.category == summaries[-1].category:
            shown.add(s.config)
            pos = " ".join(f"{i}:{_pct(r)}" for i, r in enumerate(s.accepted_by_position, start=1))
            console.print(f"{s.config}: acceptance by draft position {pos}", highlight=False)


# --------------------------------------------------------------------- models


def _size(gb: float | None, path: Path | None) -> str:
    if path is not None:
        return f"{path.stat().st_size / 1e9:.2f} GB"
    return f"~{gb:g} GB" if gb else "?"


def models_table(entries: list[Any], *, default: str | None, files: list[Path], user_file: Path) -> None:
    """`specdec models list`: one row per pair (`cli_models.Entry`), on stdout."""
    console = Console(highlight=False, no_color=no_color())
    if not console.is_terminal:
        console = Console(highlight=False, no_color=no_color(), width=160)
    t = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False)
    for col in ("name", "target", "draft", "size (target + draft)", "on disk"):
        t.add_column(col, no_wrap=col != "draft" and col != "target", overflow="fold")
    for e in entries:
        name = Text(e.pair.name + (" (default)" if e.pair.name == default else ""))
        size = f"{_size(e.pair.target.size_gb, e.target_path)} + {_size(e.pair.draft.size_gb, e.draft_path)}"
        state = Text(e.state, style="green" if e.state == "yes" else "yellow" if e.state != "no" else "")
        t.add_row(name, e.pair.target.short(), e.pair.draft.short(), size, state)
    console.print(t)
    shown = ", ".join(str(f) for f in files)
    console.print(f"from {shown}; your pairs go in {user_file}", style="dim")
    console.print("`specdec models pull NAME` downloads a pair; `specdec models show NAME` tells more.", style="dim")


def model_show(e: Any, *, default: str | None) -> None:
    """`specdec models show NAME`, on stdout."""
    console = Console(highlight=False, no_color=no_color(), soft_wrap=True)
    p = e.pair
    console.print(Text(p.name + ("  (default)" if p.name == default else ""), style="bold"))
    console.print(p.description)
    if p.notes:
        console.print(Text(p.notes, style="dim"))
    console.print(f"recommended draft-max: {p.draft_max}    defined in: {p.origin}")
    for role, src, path, url in (
        ("target", p.target, e.target_path, e.target_url),
        ("draft", p.draft, e.draft_path, e.draft_url),
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
        self.progress: Any = None
        self.task: Any = None
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
        if self.progress is not None:
            self.progress.update(self.task, advance=n)

    def finish(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def note(self, message: str) -> None:
        self.finish()
        self.console.print(message, style="dim")
