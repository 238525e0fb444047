"""Batched exactness for scripts/gpu-check.sh: four greedy requests at once through the batch engine (`parallel`
4, as `specdec serve` runs them: a KV stream per slot, patch 0008's kernels per stream, and where the logits are on
the GPU a greedy sampler per slot in llama.cpp's graph) against the same prompts through the target alone, with no
draft (the plain steps, in bursts of several steps a call and a step a call, timed side by side) and with auto
(the planner's step, drafts in the shared batch).

    python scripts/gpu/batched.py OUT.json TARGET.gguf DRAFT.gguf MAX_TOKENS [THREADS]

Writes OUT.json: per drafter, how many of the four outputs equal the target alone's, the errors, the tokens and
seconds of the four together, the target's kernels and the slots whose greedy tokens came out of the graph, and
`bursts_over_steps`: the seconds of the four a step a call over in bursts, per alternating pair.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from specdec_cli import api

STEPS = "none, a step a call"  # --burst-ms 0: the plain steps one call each
PROMPTS = [
    "Write a long story about a robot who learns to paint, with many details.",
    "Explain how a refrigerator works, step by step.",
    "List ten facts about the Moon, one per line.",
    "Describe a busy market in a coastal town at dawn.",
]


def together(spec: api.Speculator, n: int, drafter: str) -> tuple[list[Any], list[str], float]:
    """The prompts as concurrent requests: the generations (None where one failed), the errors, the seconds."""
    out: list[Any] = [None] * len(PROMPTS)
    errors: list[str] = []

    def one(i: int) -> None:
        try:
            out[i] = spec.generate(PROMPTS[i], max_tokens=n, drafter=drafter)
        except Exception as exc:  # noqa: BLE001 - reported in the results
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out, errors, time.perf_counter() - t0


def run_record(gens: list[Any], ref: list[list[int]], errors: list[str], seconds: float) -> dict[str, Any]:
    """How many of the generations equal the target alone's, their errors, tokens, drafts and seconds."""
    return {
        "same": sum(1 for g, r in zip(gens, ref, strict=True) if g is not None and g.token_ids == r),
        "errors": errors,
        "tokens": sum(len(g.token_ids) for g in gens if g is not None),
        "drafted": sum(g.stats.drafted for g in gens if g is not None),
        "seconds": round(seconds, 3),
    }


def bursts_against_steps(par: api.Speculator, n: int, ref: list[list[int]], result: dict[str, Any]) -> None:
    """The plain steps in bursts (the default, patch 0011) against a step a call (`--burst-ms 0`), two
    alternating pairs after the first run: each run's outputs checked, the seconds of each side by side."""
    engine, ratios = par.batch_engine(), []
    for _ in range(2):
        seconds = {}
        for name, burst in ((STEPS, 0.0), ("none", par.burst_seconds)):
            engine.burst_seconds = burst
            gens, errors, seconds[name] = together(par, n, "none")
            record = run_record(gens, ref, errors, seconds[name])
            kept = result["runs"].setdefault(name, record)
            kept["same"], kept["errors"] = min(kept["same"], record["same"]), kept["errors"] + errors
        ratios.append(seconds[STEPS] / seconds["none"])
    engine.burst_seconds = par.burst_seconds
    result["bursts_over_steps"] = [round(r, 3) for r in ratios]
    print(f"batched, drafter none: seconds a step a call / in bursts, two pairs: {result['bursts_over_steps']}")


def main() -> None:
    dest, target, draft, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    threads = int(sys.argv[5]) if len(sys.argv) > 5 else None
    result: dict[str, Any] = {"prompts": len(PROMPTS), "max_tokens": n, "runs": {}}
    with api.load(target, drafter="none", n_ctx=1024, n_threads=threads) as solo:
        ref = [solo.generate(p, max_tokens=n).token_ids for p in PROMPTS]
    for drafter in ("none", "auto"):
        with api.load(target, None if drafter == "none" else draft, drafter=drafter, parallel=4, n_ctx=1024,
                      n_threads=threads) as par:  # fmt: skip
            gens, errors, seconds = together(par, n, drafter)
            argmax = getattr(par.target, "_argmax", None)
            result["runs"][drafter] = run_record(gens, ref, errors, seconds) | {
                "kernels": par.target.kernels,
                "graph_argmax_slots": None if argmax is None else sorted(argmax.chains),
            }
            if drafter == "none":
                bursts_against_steps(par, n, ref, result)
    for name, r in result["runs"].items():
        print(f"batched, 4 requests at once, drafter {name}: {r['same']} of {len(PROMPTS)} as the target alone, "
              f"{r['tokens']} tokens in {r['seconds']} s, drafted {r['drafted']}, kernels {r.get('kernels', '-')}, "
              f"graph argmax slots {r.get('graph_argmax_slots', '-')}"
              f"{', errors: ' + '; '.join(r['errors']) if r['errors'] else ''}")
    with open(dest, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
