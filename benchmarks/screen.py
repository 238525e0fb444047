"""What `specdec run` leaves on a terminal, captured for the README (a command, not a test).

    .venv/bin/python -m benchmarks.screen [--pair P] [--prompt TEXT] [-n 64] [--compare] [--svg docs/images/run.svg]

The README's is the default pair's (the F32 target, where both drafters are used and so both colours show)
with `--compare`: the same prompt through the target alone after it, and the line that compares them.

Runs one generation through the renderer `specdec run` uses on a terminal (coloured tokens, then the
summary that stays on screen: the stats table, acceptance by draft position, what auto chose, why it
stopped) with stdout and stderr on one recording console (`--width` columns), as they share a terminal.
The text is written as a terminal soft-wraps it, which the picture does not: keep it under the width.
The results file keeps the screen as plain text and the run's numbers; `--svg` also writes it as a
picture with its colours (Rich's SVG export).
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

from rich.console import Console

from benchmarks import record
from specdec_cli import api
from specdec_cli.comparison import Comparison
from specdec_cli.render.generation import LiveRenderer

PROMPT = "Summarise in two sentences: the Eiffel Tower was built for the 1889 World's Fair in Paris and was the tallest structure in the world until 1930."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default=None)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--svg", type=Path, default=None)
    ap.add_argument("--width", type=int, default=120)
    ap.add_argument("--compare", action="store_true", help="as `specdec run --compare`")
    record.add_option(ap)
    args = ap.parse_args()
    costs = record.calibrated(*record.pair_files(args.pair), args.threads)  # before the run: nothing else runs
    console = Console(file=io.StringIO(), width=args.width, force_terminal=True, color_system="truecolor", record=True,
                      highlight=False)  # fmt: skip
    with api.load(pair=args.pair, n_threads=args.threads) as spec:
        run = spec.start(args.prompt, max_tokens=args.max_tokens)
        title = f"speculation ({spec.drafter} drafter)"
        renderer = LiveRenderer(console, console, live_panel=False, title=title)
        pair = f" --pair {args.pair}" if args.pair else ""
        compare = " --compare" if args.compare else ""
        console.print(f"$ specdec run {args.prompt!r}{pair} -n {args.max_tokens}{compare}", style="dim")
        renderer.start()
        for ev in run.events():
            renderer.event(ev, run.stats)
        renderer.finish(run.generation, run.stats)
        g, files = run.generation, {"target": spec.choice.target, "draft": spec.choice.draft}
        comparison = Comparison(g, spec.target_alone(args.prompt, max_tokens=args.max_tokens)) if args.compare else None
        if comparison is not None:
            renderer.compared(comparison)
    screen = console.export_text(clear=False)
    if args.svg is not None:
        args.svg.parent.mkdir(parents=True, exist_ok=True)
        console.save_svg(str(args.svg), title="specdec run")
    print(screen)
    record.save(args, "screen", threads=args.threads, models=files, data={
        "settings": {"pair": args.pair or "default", "prompt": args.prompt, "max_tokens": args.max_tokens,
                     "width": args.width},
        "costs": costs, "screen": screen, "svg": str(args.svg) if args.svg else None,
        "generation": g.to_json(), "comparison": comparison.to_json() if comparison else None})  # fmt: skip


if __name__ == "__main__":
    main()
