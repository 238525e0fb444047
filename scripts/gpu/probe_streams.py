"""Several sequences in one batch against each sequence alone, through llama.cpp's C API: what specdec's server
asks of the kernels when concurrent requests share a step. The context keeps a KV stream per sequence (not
unified), as engine/model.py's does, so attention sees a dimension of streams that a single sequence's batch
lacks (stock CUDA then takes another attention kernel). Each sequence gets its own prefix length; then, for
each layout, every sequence's next tokens in one batch are compared bit for bit with the same tokens decoded
one at a time, that sequence alone.

    python scripts/gpu/probe_streams.py OUT.json model.gguf... [--ngl 99] [--label NAME]

Used by scripts/gpu-check.sh (with GGML_CUDA_BATCH_INVARIANT=1: patch 0008's kernels).
"""

from __future__ import annotations

import json
import sys

import llama_cpp as L
import numpy as np
from probe import option  # scripts/gpu/probe.py, beside this file (as gpu-check.sh runs both)

PREFIXES = (40, 100, 300, 700)  # one per sequence
LAYOUTS = ((1, 1, 1, 1), (2, 2, 2, 2), (5, 5, 5, 5), (1, 3, 2, 5), (9, 1, 1, 1))  # tokens per sequence in one batch


def run(ctx: object, batch: object, nv: int, entries: list[tuple[int, int, int, bool]]) -> list[np.ndarray]:
    """One llama_decode of (sequence, position, token, wants logits) rows: the logits rows asked for, copied."""
    batch.n_tokens = len(entries)  # type: ignore[attr-defined]
    for i, (seq, pos, tok, out) in enumerate(entries):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0] = tok, pos, 1, seq  # type: ignore[attr-defined]
        batch.logits[i] = out  # type: ignore[attr-defined]
    assert L.llama_decode(ctx, batch) == 0
    rows = [i for i, e in enumerate(entries) if e[3]]
    return [np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(nv,)).copy() for i in rows]


def main() -> None:
    args = sys.argv[1:]
    out_path = args.pop(0)
    ngl = int(option(args, "--ngl", "99"))
    label = option(args, "--label", "")
    L.llama_backend_init()
    results: list[dict] = []
    n_seq = len(PREFIXES)
    for path in args:
        name = path.rsplit("/", 1)[-1]
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = ngl
        model = L.llama_model_load_from_file(path.encode(), mp)
        if not model:
            results.append({"model": name, "label": label, "error": "failed to load"})
            continue
        nv = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 1024 * n_seq, 512, 512, n_seq
        cp.kv_unified = False
        cp.flash_attn_type = 1
        cp.no_perf = True
        ctx = L.llama_init_from_model(model, cp)
        mem = L.llama_get_memory(ctx)
        batch = L.llama_batch_init(512, 0, 1)
        rng = np.random.default_rng(2)
        ids = [rng.integers(100, nv - 100, 1024).tolist() for _ in range(n_seq)]

        def decode(entries: list[tuple[int, int, int, bool]]) -> list[np.ndarray]:
            return run(ctx, batch, nv, entries)  # noqa: B023 (called inside this iteration only)

        for s, p in enumerate(PREFIXES):
            for start in range(0, p, 512):
                decode([(s, q, ids[s][q], False) for q in range(start, min(p, start + 512))])
        most = max(max(layout) for layout in LAYOUTS)
        alone = []
        for s, p in enumerate(PREFIXES):
            alone.append([decode([(s, p + j, ids[s][p + j], True)])[0] for j in range(most)])
            L.llama_memory_seq_rm(mem, s, p, -1)
        rows = {}
        for layout in LAYOUTS:
            entries = [(s, PREFIXES[s] + j, ids[s][PREFIXES[s] + j], True) for s in range(n_seq) for j in range(layout[s])]
            got = decode(entries)
            want = [alone[s][j] for s in range(n_seq) for j in range(layout[s])]
            diff = max(float(np.abs(g - w).max()) for g, w in zip(got, want, strict=True))
            rows["-".join(map(str, layout))] = {"equal": all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)),
                                                "maxdiff": diff}  # fmt: skip
            for s, p in enumerate(PREFIXES):
                L.llama_memory_seq_rm(mem, s, p, -1)
        results.append({"model": name, "label": label, "prefixes": PREFIXES, "rows": rows})
        eq = " ".join(f"{k}:{'=' if v['equal'] else 'x'}" for k, v in rows.items())
        print(f"{label + ' ' if label else ''}{name} {n_seq} sequences (tokens per sequence in one batch): {eq}", flush=True)
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        L.llama_model_free(model)


if __name__ == "__main__":
    main()
