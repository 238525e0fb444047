"""What fair slots cost in aggregate tokens per second, measured in one process on one engine.

    .venv/bin/python -m benchmarks.fair_cost [--pair P] [--pairs 16] [--results PATH]

benchmarks/fair_slots.py compares two servers, and two server processes differ by more than their
settings: which slots their requests take follows each one's history, and their speed may follow the
order they started in. Here one `api.load(parallel=4)` runs every pair of runs, fair slots switched on and
off between them (`BatchEngine.set_fair`, ABBA). What the planner learns as it runs (measured costs, the
drafters' acceptance, how its drafting steps turned out against their prediction, how often the batch
grows) is kept per setting and swapped in with it, as two servers would each keep their own: one record
shared by both let one setting's history steer the other's drafts (the unfair setting's copying request
drafted its whole answer beside the plain stream's prompt after fair runs, and never in a run of its
own). A run: a request copying a passage it copied before (the auto drafter finds long runs of it in
the token pool), and a plain stream (`drafter: none`) that joins once it generates; the aggregate
completion tokens over the wall time from the first request to the last token. Then the same with the
copying request drafting nothing, where the settings should do the same work. Greedy: every text is
checked against the first run's.
"""

from __future__ import annotations

import argparse
import copy as copying
import math
import statistics
import sys
import threading
import time
from typing import Any

from benchmarks import record
from benchmarks.fair_slots import COPY_TOKENS, PASSAGES, PLAIN_TOKENS
from benchmarks.record import pair_files
from benchmarks.serve_bench import SUBJECTS
from specdec_cli import api
from specdec_cli.engine.batch.engine import BatchEngine
from specdec_cli.engine.batch.occupancy import Occupancy
from specdec_cli.engine.batch.realized import Realized
from specdec_cli.engine.drafters.auto import AutoState
from specdec_cli.engine.estimates import BatchCosts
from specdec_cli.engine.events import Step

Learned = tuple[AutoState, Realized, Occupancy, BatchCosts]


def learned(engine: BatchEngine) -> Learned:
    """What the engine's planner learns from the requests it runs, which each setting keeps for itself."""
    p = engine.planner
    return p.state, p.realized, p.occupancy, p.draft_costs


def install(engine: BatchEngine, kept: Learned) -> None:
    p = engine.planner
    engine.state = p.state = kept[0]
    p.realized, p.occupancy, p.draft_costs = kept[1:]


def one_run(spec: api.Speculator, copy: list[dict[str, str]], plain: list[dict[str, str]], drafter: str) -> dict[str, Any]:  # fmt: skip
    t0 = time.perf_counter()
    run = spec.start(copy, max_tokens=COPY_TOKENS, drafter=drafter)
    events = run.events()
    for ev in events:
        if isinstance(ev, Step):  # the copying request generates: the plain stream joins
            break
    out: dict[str, api.Generation] = {}
    joiner = threading.Thread(target=lambda: out.setdefault("plain", spec.generate(plain, max_tokens=PLAIN_TOKENS,
                                                                                   drafter="none")))  # fmt: skip
    joiner.start()
    for _ in events:
        pass
    joiner.join()
    wall = time.perf_counter() - t0
    copied, other = run.generation, out["plain"]
    return {"tokens_per_second": (len(copied.token_ids) + len(other.token_ids)) / wall,
            "texts": (copied.text, other.text), "copy_tokens_per_step": copied.stats.tokens_per_step}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default=None)
    ap.add_argument("--pairs", type=int, default=16, help="fair/no-fair pairs of runs per drafter setting")
    ap.add_argument("--threads", type=int, default=2)
    record.add_option(ap)
    args = ap.parse_args()
    target, draft = pair_files(args.pair)
    costs = record.calibrated(target, draft, args.threads)
    copy = [{"role": "user", "content": "Repeat this text exactly, word for word:\n\n" + " ".join(PASSAGES[:2])}]
    rows: list[dict[str, Any]] = []
    same = True
    with api.load(pair=args.pair, n_ctx=4096, n_threads=args.threads, parallel=4) as spec:
        engine = spec.batch_engine()
        records = {True: learned(engine), False: copying.deepcopy(learned(engine))}
        first: dict[int, tuple[str, str]] = {}
        for j in range(-1, args.pairs):  # j = -1: warm-up, its copy's answer goes to the token pool
            plain = [{"role": "user", "content": f"Write a short essay about {SUBJECTS[(40 + max(j, 0)) % len(SUBJECTS)]}."}]
            for drafter in ("auto", "none"):
                row: dict[str, Any] = {"pair": j, "drafter": drafter}
                for fair in ((True, False) if j % 2 == 0 else (False, True)):
                    engine.set_fair(fair)
                    install(engine, records[fair])
                    r = one_run(spec, copy, plain, drafter)
                    same = same and first.setdefault(j, r["texts"]) == r["texts"]
                    row["fair" if fair else "no-fair"] = {k: r[k] for k in ("tokens_per_second", "copy_tokens_per_step")}
                if j >= 0:
                    rows.append(row)
                    print(f"pair {j} {drafter}: fair / no-fair {row['fair']['tokens_per_second'] / row['no-fair']['tokens_per_second']:.3f}",
                          file=sys.stderr, flush=True)  # fmt: skip
        engine.set_fair(True)
        install(engine, records[True])
    for drafter in ("auto", "none"):
        ratios = [x["fair"]["tokens_per_second"] / x["no-fair"]["tokens_per_second"] for x in rows if x["drafter"] == drafter]
        print(f"{drafter}: fair / no-fair, geometric mean of {len(ratios)} pairs: {math.exp(statistics.fmean(map(math.log, ratios))):.3f}")
    record.save(args, "fair-cost", threads=args.threads, models={"target": target, "draft": draft},
                data={"settings": {"pair": args.pair or "default", "pairs": args.pairs, "copy_tokens": COPY_TOKENS,
                                   "plain_tokens": PLAIN_TOKENS, "parallel": 4},
                      "costs": costs, "rows": rows, "same_texts": same})  # fmt: skip


if __name__ == "__main__":
    main()
