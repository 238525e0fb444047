"""Patch 0014 (patches/llama.cpp/0014-graph-park.patch): a graph of a few tokens stays built, with a scheduler
of its own, when the batch's shape changes, and a later batch of its shape takes it back instead of building it
again. The same graphs computed by the same kernels: a decode's tokens must not change, whichever graph it took,
and the graphs must be taken back. Each run is a process of its own, since llama.cpp reads LLAMA_GRAPH_PARK
when it makes a context."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import THREADS

# Decodes of random shapes (one token up to past the parking limit of 32), each rolled back to a random point,
# as speculative steps are: every row's greedy token and llama.cpp's count of graphs reused, as JSON.
CHILD = """
import json, random, sys
from specdec_cli.engine import native
from specdec_cli.engine.model import Model

rng = random.Random(7)
tops_all = []
with Model(sys.argv[1], n_ctx=1024, n_threads=int(sys.argv[2])) as m:
    prompt = m.tokenize("Write a long story about a robot who learns to paint.", add_special=True,
                        parse_special=False)
    m.prefill(prompt[:-1])
    nxt = prompt[-1]
    for _ in range(80):
        n = rng.choice([1, 1, 2, 3, 5, 5, 9, 40])
        tops = m.decode_argmax([nxt] + [rng.randrange(1000) for _ in range(n - 1)], n)
        tops_all.append([int(t) for t in tops])
        keep = rng.randrange(1, n + 1)
        m.rollback(len(m.tokens) - keep)
        nxt = tops[keep - 1]
        if len(m.tokens) > 700:
            m.rollback(len(prompt) - 1)
    reused = native.bindings().llama_perf_context(m._ctx).n_reused
print(json.dumps({"tops": tops_all, "reused": reused}))
"""


def _decode(model: Path, park: str) -> dict:
    env = {**os.environ, "LLAMA_GRAPH_PARK": park}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(model), str(THREADS)], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_parked_graphs_give_the_same_tokens_and_are_taken_back(smol_path: Path) -> None:
    """Parking on (8 graphs, the default), on with room for two (graphs evicted all the time) and off: the same
    greedy tokens at every row of every decode; parking reuses a built graph on most changes of shape, llama.cpp
    alone only where two decodes in a row have the same shape."""
    on, tight, off = (_decode(smol_path, park) for park in ("8", "2", "0"))
    assert on["tops"] == off["tops"] and tight["tops"] == off["tops"]
    assert on["reused"] > tight["reused"] > off["reused"]
    assert on["reused"] >= 55, on["reused"]  # of 80: the shapes of up to 32 tokens, once each is built
