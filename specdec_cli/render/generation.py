"""Generated text and its statistics: token colouring, the live panel, summaries.

On a terminal, tokens the target accepted from the draft are coloured
DRAFT_STYLE and tokens the target chose itself are left in the terminal's
default colour, as the legend says.

The live panel sits on stderr below the text. Because both streams share the
screen, the line being generated is shown inside the live area and written to
stdout once it is complete, so stdout receives the exact text while the user
still sees every token as it arrives.
"""

from __future__ import annotations

import json
import sys
import time
from typing import IO, TYPE_CHECKING

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from specdec_cli.engine.events import DRAFT, DrafterDropped, Event, Prefill, Step
from specdec_cli.engine.settings import HEADS, MODEL, NGRAM
from specdec_cli.engine.stats import RunStats, Stats
from specdec_cli.render import no_color, one_line, pct, rate, visible, warning

if TYPE_CHECKING:
    from specdec_cli.api import Generation
    from specdec_cli.comparison import Comparison

DRAFT_STYLE = "bold green"  # accepted from the draft model
NGRAM_STYLE = "bold cyan"  # accepted from the n-gram lookup
HEADS_STYLE = "bold magenta"  # accepted from the Medusa heads
TARGET_STYLE = ""
STOP_REASONS = {
    "eos": "end of generation token",
    "length": "--max-tokens reached",
    "context": "context full (--ctx-size)",
    "interrupted": "interrupted",
    "rpc": "an RPC server stopped answering",
}


def legend(heads: bool = False) -> Text:
    """The colours' meanings; the heads' colour only where heads are loaded (`heads`)."""
    t = Text("legend: ")
    t.append(f"accepted from {MODEL.label}", style=DRAFT_STYLE)
    t.append("  ")
    t.append(f"accepted from {NGRAM.label}", style=NGRAM_STYLE)
    t.append("  ")
    if heads:
        t.append(f"accepted from {HEADS.label}", style=HEADS_STYLE)
        t.append("  ")
    t.append("chosen by target", style=TARGET_STYLE or None)
    return t


def styled_token(text: str, source: str, drafter: str | None = None) -> Text:
    """A token for the terminal: coloured by who chose it, control characters made visible."""
    text = visible(text)
    if source != DRAFT:
        return Text(text, style=TARGET_STYLE)
    return Text(text, style=NGRAM_STYLE if drafter == NGRAM else HEADS_STYLE if drafter == HEADS else DRAFT_STYLE)


def choices(stats: Stats) -> Text | None:
    """What the auto drafter chose, step by step, and what it predicted (None for a fixed drafter)."""
    if not stats.predicted:
        return None
    parts = [f"{name} {row[0]}" for name, row in sorted(stats.by_drafter.items())] + [f"plain {stats.plain_steps}"]
    mean = sum(stats.predicted) / len(stats.predicted)
    last = f"; last step: {stats.last_choice or 'plain'} at {stats.predicted[-1]:.2f}x"
    return Text(f"auto chose: {', '.join(parts)} steps; predicted {mean:.2f}x the target alone{last}")


def stats_table(stats: Stats, *, tokens_per_second: float, title: str = "speculation") -> Table:
    t = Table(title=title, title_justify="left", show_header=True, header_style="bold", box=None, pad_edge=False)
    for col in ("drafted", "accepted", "accept %", "tokens/pass", "steps", "tokens/s", "K"):
        t.add_column(col, justify="right")
    t.add_row(
        str(stats.drafted),
        str(stats.accepted),
        rate(stats.acceptance_rate),
        f"{stats.tokens_per_step:.2f}",
        str(stats.steps),
        f"{tokens_per_second:.1f}",
        str(stats.current_k),
    )
    return t


def positions(rates: tuple[float, ...] | list[float]) -> str:
    return " ".join(f"{i}:{pct(r)}" for i, r in enumerate(rates, start=1))


def by_position(stats: Stats) -> Text:
    if not stats.drafted_at:
        return Text("acceptance by draft position: (nothing drafted)")
    return Text("acceptance by draft position: " + positions(stats.accepted_by_position))


def summary_text(g: Generation) -> str:
    """The plain, one-paragraph summary for pipes and NO_COLOR."""
    s = g.stats
    parts = [
        f"tokens {len(g.token_ids)}",
        f"drafted {s.drafted}",
        f"accepted {s.accepted}",
        f"acceptance {rate(s.acceptance_rate)}",
        f"tokens/pass {s.tokens_per_step:.2f}",
        f"steps {s.steps}",
        f"{s.tokens_per_second:.1f} tokens/s",
        f"stop: {STOP_REASONS.get(g.stop_reason, g.stop_reason)}",
    ]
    pos = positions(s.accepted_by_position)
    return ", ".join(parts) + (f"\nacceptance by draft position: {pos}" if pos else "")


def exactness(g: Generation) -> str | None:
    """The line a run whose text may not be the target's alone ends with (`--kernels fast`); None otherwise."""
    if g.models.get("exact", True):
        return None
    return "kernels fast: not checked for exactness: this text may differ from the target alone in rare tokens"


class Renderer:
    """Receives engine events; prints nothing to stdout but the text (or one JSON object)."""

    def start(self) -> None: ...

    def event(self, ev: Event, stats: Stats) -> None: ...

    def finish(self, g: Generation, stats: Stats) -> None: ...

    def compared(self, c: Comparison | None) -> None:
        """`--compare`'s line after the summary (None: the run was interrupted, nothing was compared)."""
        if c is not None:
            self._line(c.line(), "" if c.same_text or not c.greedy else "bold red")

    def _line(self, text: str, style: str) -> None: ...

    def abort(self) -> None:
        """Tear down live displays before an error message is printed."""


class JsonRenderer(Renderer):
    def __init__(self, out: IO[str] | None = None, err: IO[str] | None = None, hold: bool = False) -> None:
        """`hold`: the object waits for `compared` (`--compare` adds its `comparison`)."""
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.held: Generation | None = None
        self.hold = hold

    def event(self, ev: Event, stats: Stats) -> None:
        if isinstance(ev, DrafterDropped):
            warning(ev.reason, self.err)

    def finish(self, g: Generation, stats: Stats) -> None:
        if self.hold:
            self.held = g
        else:
            self._write(g.to_json())

    def compared(self, c: Comparison | None) -> None:
        if self.held is not None:
            self._write({**self.held.to_json(), "comparison": None if c is None else c.to_json()})

    def _write(self, obj: dict[str, object]) -> None:
        self.out.write(json.dumps(obj, ensure_ascii=False) + "\n")
        self.out.flush()


class PlainRenderer(Renderer):
    """Pipes and NO_COLOR: plain text streamed to stdout (exact on a pipe), plain summary on stderr."""

    def __init__(self, out: IO[str] | None = None, err: IO[str] | None = None) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.notes: list[str] = []
        self.show = visible if self.out.isatty() else str  # NO_COLOR on a terminal still escapes

    def event(self, ev: Event, stats: Stats) -> None:
        if isinstance(ev, DrafterDropped):
            self.out.flush()
            warning(ev.reason, self.err)
        elif isinstance(ev, Step):
            for tok in ev.emitted:
                self.out.write(self.show(tok.text))
            self.out.flush()
            if ev.note:
                self.notes.append(ev.note)  # after the text: stderr and stdout often share a terminal

    def finish(self, g: Generation, stats: Stats) -> None:
        self.out.write("\n")
        self.out.flush()
        self.err.write(summary_text(g) + "\n")
        chosen = choices(stats)
        if chosen is not None:
            self.err.write(chosen.plain + "\n")
        for note in self.notes:
            self.err.write(f"auto: {note}\n")
        if (line := exactness(g)) is not None:
            self.err.write(line + "\n")
        self.err.flush()

    def _line(self, text: str, style: str) -> None:
        self.err.write(text + "\n")
        self.err.flush()


class LiveRenderer(Renderer):
    """Coloured tokens and a live stats panel (stderr) on a terminal."""

    REFRESH_SECONDS = 0.1

    def __init__(self, out: Console, err: Console, *, live_panel: bool = True, title: str = "speculation",
                 heads: bool = False) -> None:  # fmt: skip
        self.title = title
        self.heads = heads
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
        items: list[RenderableType] = []
        if self.out_is_err_screen:
            items.append(self.line)
        items.append(stats_table(self._stats, tokens_per_second=tps, title=self.title))
        items.append(by_position(self._stats))
        chosen = choices(self._stats)
        if chosen is not None:
            items.append(chosen)
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
        self.err.print(legend(self.heads))
        if self.live_panel:
            self._start_live()

    def _write_out(self, text: Text) -> None:
        if self.live is not None:
            self.live.stop()
        self.out.print(text, end="", soft_wrap=True, highlight=False)
        self.out.file.flush()
        if self.live is not None:
            self._start_live()

    def _say(self, message: str, style: str = "yellow") -> None:
        if self.live is not None:
            self.live.stop()
        self.err.print(one_line(message), style=style, highlight=False, markup=False)
        if self.live is not None:
            self._start_live()

    def event(self, ev: Event, stats: Stats) -> None:
        self._stats = stats
        if isinstance(ev, Prefill):
            self._t0 = time.perf_counter()
            return
        if isinstance(ev, DrafterDropped):
            self._say(f"Warning: {ev.reason}")
            return
        if ev.note:
            self._say(f"auto: {ev.note}", style="dim")
        for tok in ev.emitted:
            piece = styled_token(tok.text, tok.source, ev.drafter)
            if not self.out_is_err_screen:
                self._write_out(piece)
                continue
            if "\n" in tok.text:
                head, _, tail = tok.text.rpartition("\n")
                done = self.line + styled_token(head + "\n", tok.source, ev.drafter)
                self.line = styled_token(tail, tok.source, ev.drafter)
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

    def finish(self, g: Generation, stats: Stats) -> None:
        self._stats = stats
        if self.live is not None:
            self.live.stop()
            self.live = None
        self.out.print(self.line, end="", soft_wrap=True, highlight=False)
        self.out.print()
        self.out.file.flush()
        self.err.print(stats_table(stats, tokens_per_second=g.stats.tokens_per_second, title=self.title))
        self.err.print(by_position(stats))
        chosen = choices(stats)
        if chosen is not None:
            self.err.print(chosen)
        self.err.print(f"stop: {STOP_REASONS.get(g.stop_reason, g.stop_reason)}", highlight=False)
        if (line := exactness(g)) is not None:
            self.err.print(line, style="yellow", highlight=False, markup=False)

    def _line(self, text: str, style: str) -> None:
        self.err.print(text, style=style or None, highlight=False, markup=False)


def make_renderer(
    json_mode: bool, out: IO[str] | None = None, err: IO[str] | None = None, title: str = "speculation",
    heads: bool = False, compare: bool = False,
) -> Renderer:
    out = out or sys.stdout
    err = err or sys.stderr
    if json_mode:
        return JsonRenderer(out, err, hold=compare)
    if no_color() or not out.isatty():
        return PlainRenderer(out, err)
    out_console = Console(file=out, highlight=False)
    err_console = Console(file=err, highlight=False)
    return LiveRenderer(out_console, err_console, live_panel=err.isatty(), title=title, heads=heads)


# ---------------------------------------------------------------------- chat
class ChatRenderer:
    """Streams one reply with the same colouring as `run` (no live panel)."""

    def __init__(self, out: IO[str], err: IO[str], colour: Console | None) -> None:
        self.out = out
        self.err = err
        self.colour = colour
        self.show = visible if out.isatty() else str

    def event(self, ev: Event) -> None:
        if isinstance(ev, DrafterDropped):
            self.out.flush()
            warning(ev.reason, self.err)
            return
        if not isinstance(ev, Step):
            return
        for tok in ev.emitted:
            if self.colour is not None:
                self.colour.print(styled_token(tok.text, tok.source, ev.drafter), end="", soft_wrap=True, highlight=False)
            else:
                self.out.write(self.show(tok.text))
        self.out.flush()

    def end(self) -> None:
        self.out.write("\n")
        self.out.flush()


def make_chat_renderer(out: IO[str], err: IO[str]) -> ChatRenderer:
    colour = None if (no_color() or not out.isatty()) else Console(file=out, highlight=False)
    return ChatRenderer(out, err, colour)


def reply_summary(g: Generation) -> str:
    s = g.stats
    acc = rate(s.acceptance_rate)
    stop = "" if g.stop_reason == "eos" else f", stopped: {STOP_REASONS.get(g.stop_reason, g.stop_reason)}"
    return (
        f"[{len(g.token_ids)} tokens, {s.tokens_per_second:.1f} tokens/s, acceptance {acc}, "
        f"{s.tokens_per_step:.2f} tokens/pass{stop}]"
    )


def session_stats(s: RunStats, turns: int) -> str:
    pos = positions(s.accepted_by_position) or "(nothing drafted)"
    n = s.emitted_from_draft + s.emitted_from_target
    return (
        f"session: {turns} {'reply' if turns == 1 else 'replies'}, {n} tokens, drafted {s.drafted}, "
        f"accepted {s.accepted} ({rate(s.acceptance_rate)}), "
        f"{s.tokens_per_step:.2f} tokens/pass, {s.tokens_per_second:.1f} tokens/s\n"
        f"acceptance by draft position: {pos}"
    )
