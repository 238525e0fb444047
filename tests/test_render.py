"""Rendering is deterministic with a fixed-width Console on a StringIO: colours mean what the legend says."""

from __future__ import annotations

import io
import re

from rich.console import Console

from specdec_cli.api import Generation
from specdec_cli.engine.events import DRAFT, TARGET, EmittedToken, Prefill, Step, Transcript
from specdec_cli.engine.stats import Stats
from specdec_cli.render import generation as render

GREEN_BOLD = "\x1b[1;32m"


def console(buf: io.StringIO, terminal: bool = True) -> Console:
    return Console(file=buf, width=100, force_terminal=terminal, color_system="standard", highlight=False)


def make_steps() -> list[Step]:
    return [
        Step(
            0,
            3,
            (10, 11, 12),
            2,
            (EmittedToken(10, "Hello", DRAFT), EmittedToken(11, ",", DRAFT), EmittedToken(99, " wor", TARGET)),
            0.01,
            0.02,
            0.0005,
            0.001,
        ),
        Step(
            1,
            3,
            (13, 14, 15),
            3,
            (
                EmittedToken(13, "ld", DRAFT),
                EmittedToken(14, "!\n", DRAFT),
                EmittedToken(15, "Bye", DRAFT),
                EmittedToken(7, ".", TARGET),
            ),
            0.01,
            0.02,
            0.0005,
            0.001,
            "eos",
        ),
    ]


def feed(r: render.Renderer) -> tuple[Generation, Stats]:
    stats = Stats()
    result = Transcript(text="", token_ids=[], stop_reason="eos", n_prompt=3)
    r.start()
    ev0 = Prefill(3, 0.001, 0.001)
    stats.observe(ev0)
    r.event(ev0, stats)
    for s in make_steps():
        stats.observe(s)
        r.event(s, stats)
        for t in s.emitted:
            result.text += t.text
            result.token_ids.append(t.id)
    g = Generation(result.text, result.token_ids, "eos", 3, stats.summary(1.0), {}, {})
    return g, stats


def test_stats_add_up() -> None:
    _, stats = feed(render.Renderer())
    assert stats.drafted == 6 and stats.accepted == 5 and stats.steps == 2
    assert stats.emitted == 7 == stats.emitted_from_draft + stats.emitted_from_target
    assert stats.accepted_by_position == [1.0, 1.0, 0.5]


def styled_segments(ansi: str) -> list[tuple[bool, str]]:
    """(is draft-styled, text) runs of an ANSI string."""
    segs: list[tuple[bool, str]] = []
    style = ""
    for part in re.split(r"(\x1b\[[0-9;]*m)", ansi):
        if part.startswith("\x1b["):
            style = "" if part == "\x1b[0m" else part
        elif part:
            segs.append((style == GREEN_BOLD, part))
    return segs


def test_colours_follow_the_legend() -> None:
    out, err = io.StringIO(), io.StringIO()
    r = render.LiveRenderer(console(out), console(err), live_panel=False)
    result, stats = feed(r)
    r.finish(result, stats)
    segs = styled_segments(out.getvalue())
    draft_text = "".join(t for green, t in segs if green)
    target_text = "".join(t for green, t in segs if not green)
    # Exactly the accepted draft tokens are green; newlines carry no colour.
    assert draft_text == "Hello,ld!Bye"
    assert target_text.replace("\n", "") == " wor."
    legend = styled_segments(err.getvalue().splitlines()[0])
    assert (True, "accepted from draft model") in legend
    assert any(not green and "chosen by target" in t for green, t in legend)


def test_live_renderer_writes_exact_text_to_stdout() -> None:
    out, err = io.StringIO(), io.StringIO()
    r = render.LiveRenderer(console(out), console(err), live_panel=True)
    result, stats = feed(r)
    r.finish(result, stats)
    assert re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue()) == "Hello, world!\nBye.\n"
    summary = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", err.getvalue())
    assert "drafted" in summary and "1:100% 2:100% 3:50%" in summary


def test_no_color_plain_renderer() -> None:
    out, err = io.StringIO(), io.StringIO()
    r = render.PlainRenderer(out, err)
    result, stats = feed(r)
    r.finish(result, stats)
    assert out.getvalue() == "Hello, world!\nBye.\n"
    assert "\x1b" not in out.getvalue() + err.getvalue()
    assert "drafted 6, accepted 5, acceptance 83%" in err.getvalue()


def test_make_renderer_honours_no_color(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("NO_COLOR", "1")
    assert isinstance(render.make_renderer(False, Tty(), Tty()), render.PlainRenderer)
    monkeypatch.delenv("NO_COLOR")
    assert isinstance(render.make_renderer(False, Tty(), Tty()), render.LiveRenderer)
    assert isinstance(render.make_renderer(False, io.StringIO(), Tty()), render.PlainRenderer)
    assert isinstance(render.make_renderer(True, Tty(), Tty()), render.JsonRenderer)


def test_auto_choices_are_said_and_coloured_by_drafter() -> None:
    """An n-gram step, a plain step with a pause note, then a model step: the summary counts each choice,
    notes come after the text (stdout and stderr often share a terminal), colours follow the legend."""
    steps = [
        Step(0, 2, (10, 11), 2, (EmittedToken(10, "a", DRAFT), EmittedToken(11, "b", DRAFT),
             EmittedToken(12, "c", TARGET)), 0.0, 0.02, 0.0, 0.0, drafter="ngram", predicted_speedup=1.4),
        Step(1, 0, (), 0, (EmittedToken(13, "d", TARGET),), 0.0, 0.01, 0.0, 0.0, predicted_speedup=1.0,
             note="draft costs 0.90 target tokens: paused"),
        Step(2, 1, (14,), 1, (EmittedToken(14, "e", DRAFT), EmittedToken(15, "f", TARGET)), 0.01, 0.02, 0.0, 0.0,
             stop="eos", drafter="model", predicted_speedup=1.2),
    ]  # fmt: skip
    stats = Stats.of(steps)
    assert stats.drafter_table() == {
        "model": {"steps": 1, "drafted": 1, "accepted": 1},
        "ngram": {"steps": 1, "drafted": 2, "accepted": 2},
        "plain": {"steps": 1, "drafted": 0, "accepted": 0},
    }
    g = Generation("abcdef", [10, 11, 12, 13, 14, 15], "eos", 3, stats.summary(1.0), {}, {})
    assert g.stats.predicted_speedup is not None and abs(g.stats.predicted_speedup - 1.2) < 1e-9  # (1.4+1+1.2)/3
    assert g.stats.notes == ("draft costs 0.90 target tokens: paused",)

    out, err = io.StringIO(), io.StringIO()
    plain = render.PlainRenderer(out, err)
    for s in steps:
        plain.event(s, stats)
    plain.finish(g, stats)
    lines = err.getvalue().splitlines()
    assert "auto chose: model 1, ngram 1, plain 1 steps; predicted 1.20x the target alone; last step: model at 1.20x" in lines
    assert lines[-1] == "auto: draft costs 0.90 target tokens: paused"

    out = io.StringIO()
    live = render.LiveRenderer(console(out), console(io.StringIO()), live_panel=False)
    for s in steps:
        live.event(s, stats)
    live.abort()
    segs = re.findall(r"\x1b\[([0-9;]*)m([^\x1b]+)", out.getvalue())
    cyan = "".join(t for style, t in segs if style == "1;36")
    green = "".join(t for style, t in segs if style == "1;32")
    assert (cyan, green) == ("ab", "e")  # n-gram tokens cyan, draft-model tokens green, the rest plain
