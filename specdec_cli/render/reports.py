"""Reports: pair-check (with the probe), and the bench table and its progress bar."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from specdec_cli.render import no_color, pct, rate, visible

if TYPE_CHECKING:
    from specdec_cli.bench.core import Costs, Summary
    from specdec_cli.pairs import PairReport
    from specdec_cli.pairs.probe import HeadsProbeResult, ProbeResult

# ---------------------------------------------------------------- pair-check
VERDICT_STYLE = {
    "compatible": "bold green",
    "compatible (padded)": "bold yellow",
    "compatible (different tokenizers)": "bold yellow",
    "incompatible": "bold red",
}


def _b(x: bytes) -> str:
    return repr(x.decode("utf-8", "replace"))


def _mb(n: int) -> str:
    return f"{n / 1024 / 1024:,.0f} MB"


def pair_report(report: PairReport, probe: ProbeResult | None = None, console: Console | None = None,
                heads: HeadsProbeResult | None = None) -> None:  # fmt: skip
    """The pair-check report, on stdout."""
    console = console or Console(highlight=False, no_color=no_color())
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
        table.add_row(row[0], Text(visible(row[1])), Text(visible(row[2]), style="" if same else "bold red"))
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
    if v.cross is not None:
        c = v.cross
        console.print(
            f"across tokenizers: {c.intersection:,} of the draft's {c.draft_vocab:,} token texts are target tokens; "
            f"{c.probe_share:.0%} of the probe texts' target tokens lie in that intersection; "
            f"modes: {', '.join(c.modes)} (both lossless)"
        )
    if probe is not None:
        probe_table(console, probe)
    if heads is not None:
        heads_probe_table(console, heads)
    console.print(Text.assemble("verdict: ", (v.verdict, VERDICT_STYLE[v.verdict]), f" ({v.reason})"), soft_wrap=True)


def probe_table(console: Console, probe: ProbeResult) -> None:
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


def heads_probe_table(console: Console, probe: HeadsProbeResult) -> None:
    chain = ", ".join(f"{c:.0%}" for c in probe.chain)
    console.print(f"heads: all of the first j guesses right {chain} (j = 1..{len(probe.chain)}) over "
                  f"{probe.n_positions} positions; a guess costs {probe.guess_cost:.3f} target tokens")  # fmt: skip
    t = Table(title="heads: predicted speedup by draft length K", title_justify="left", header_style="bold")
    for col in ("K", "verify cost", "tokens/step", "predicted speedup"):
        t.add_column(col, justify="right")
    for row in probe.predictions:
        style = "bold" if row.k == probe.recommended_k else None
        t.add_row(str(row.k), f"{row.verify_cost:.2f}", f"{row.tokens_per_step:.2f}", f"{row.speedup:.2f}x", style=style)
    console.print(t)
    console.print(f"heads, K = {probe.recommended_k}: predicted {probe.predicted_speedup:.2f}x, measured "
                  f"{probe.measured_speedup:.2f}x ({probe.measured_acceptance:.0%} accepted, {probe.spec_tps:.1f} vs "
                  f"{probe.base_tps:.1f} tokens/s target alone)")  # fmt: skip
    if probe.predicted_speedup < 1.0:
        console.print("the heads cannot make this target faster here: a verified token costs more than their "
                      "guesses add; `auto` leaves them alone", style="yellow")  # fmt: skip


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


def bench_report(
    summaries: list[Summary],
    *,
    greedy: bool,
    costs: Costs | None = None,
    k_max: int = 8,
    console: Console | None = None,
) -> None:
    """The bench table (`bench.Summary` rows) and acceptance by draft position."""
    if console is None:
        console = Console(highlight=False, no_color=no_color())
        if not console.is_terminal:
            console = Console(highlight=False, no_color=no_color(), width=180)
    t = Table(title="specdec bench", title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    cols = ["config", "prompts", "tok/s (min-max)", "speedup", "predicted", "oracle", "same" if greedy else None]
    cols += ["accept", "tok/pass"]
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
        row: list[str | Text] = [
            s.config,
            s.category,
            f"{s.tps_median:.1f} ({s.tps_min:.1f}-{s.tps_max:.1f})",
            "-" if s.speedup is None else f"{s.speedup:.2f}x",
            "-" if s.predicted is None else f"{s.predicted:.2f}x",
            "-" if s.oracle is None else f"{s.oracle:.2f}x",
        ]
        if greedy:
            row.append(same)
        row += [
            rate(s.acceptance_rate),
            "-" if s.tokens_per_step is None else f"{s.tokens_per_step:.2f}",
        ]
        row += [
            f"{100 * s.split[k]:.0f}%" if s.split else "-"
            for k in ("target_decode", "draft_decode", "sampling", "other")
        ]
        row.append("-" if s.overhead_fraction is None else f"{100 * s.overhead_fraction:.1f}%")
        t.add_row(*row)
    console.print(t)
    if costs is not None:
        k, best = costs.perfect(k_max)
        verify = ", ".join(f"c({b})={costs.verify.relative(b):.2f}" for b in (2, 3, 5, k_max + 1) if b <= k_max + 1)
        console.print(
            f"measured costs: one target token {costs.target_ms:.1f} ms, {verify}, draft token {costs.draft:.2f}; "
            f"limit: a perfect drafter at K={k} gives {best:.2f}x",
            highlight=False,
        )
        console.print(
            "predicted = the speedup model on each run's own steps and these costs; oracle = the same proposals, "
            "verifying only the prefix the target accepted",
            style="dim",
        )
    console.print(
        "time split: target / draft = inside llama_decode; maths = sampling, verification, n-gram lookup; "
        "overhead = share of generation time outside llama_decode",
        style="dim",
    )
    shown = set()
    for s in summaries:
        if s.accepted_by_position and s.config not in shown and s.category == summaries[-1].category:
            shown.add(s.config)
            pos = " ".join(f"{i}:{pct(r)}" for i, r in enumerate(s.accepted_by_position, start=1))
            console.print(f"{s.config}: acceptance by draft position {pos}", highlight=False)
