"""Batch vs single-token logits, and batch costs, through llama.cpp's C API (llama-cpp-python's ctypes),
independent of specdec: what a verification batch computes on this backend.

For each model and flash-attention setting: prefill P tokens in one batch, decode the next tokens one at a
time (the target alone), then roll back to P and decode b of them in one batch (a verification): are the b
rows' logits bit-identical to the single decodes? Also c(b) = time(batch of b) / time(one token).

    python scripts/gpu/probe.py OUT.json model.gguf... [--ngl 99] [--prefix 64,1500] [--threads 8]
        [--sizes 2,3,4,...|2-65] [--fa 0,1] [--label NAME]

--sizes: the batch widths compared (default the list below; "2-65" is every width from 2 to 65); costs are
timed at the default list's widths among them. --label tags the records (say, the kernels' switch).

OUT.json is rewritten after every measurement, so a run stopped by a timeout keeps what it measured.
Used by scripts/gpu-check.sh.
"""

from __future__ import annotations

import json
import sys
import time

import llama_cpp as L
import numpy as np

SIZES = (2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64)


class Session:
    """One llama.cpp context on a loaded model, with a reusable batch."""

    def __init__(self, model: object, n_vocab: int, fa: int, threads: int) -> None:
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 4096, 512, 512, 1
        cp.flash_attn_type = fa
        cp.n_threads = cp.n_threads_batch = threads
        cp.no_perf = True
        self.ctx = L.llama_init_from_model(model, cp)
        self.mem = L.llama_get_memory(self.ctx)
        self.batch = L.llama_batch_init(512, 0, 1)
        self.n_vocab = n_vocab

    def decode(self, toks: list[int], pos0: int, all_logits: bool = True) -> None:
        batch = self.batch
        batch.n_tokens = len(toks)
        for i, t in enumerate(toks):
            batch.token[i] = t
            batch.pos[i] = pos0 + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = all_logits or i == len(toks) - 1
        rc = L.llama_decode(self.ctx, batch)
        assert rc == 0, rc

    def logits(self, i: int) -> np.ndarray:
        return np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,)).copy()

    def free(self) -> None:
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)


def option(args: list[str], name: str, default: str) -> str:
    if name not in args:
        return default
    i = args.index(name)
    value = args[i + 1]
    del args[i:i + 2]
    return value


def main() -> None:
    args = sys.argv[1:]
    out_path = args.pop(0)
    ngl = int(option(args, "--ngl", "99"))
    prefixes = [int(x) for x in option(args, "--prefix", "64,1500").split(",")]
    threads = int(option(args, "--threads", "8"))
    spec = option(args, "--sizes", "")
    if "-" in spec:
        lo, hi = (int(x) for x in spec.split("-"))
        sizes = tuple(range(lo, hi + 1))
    else:
        sizes = tuple(int(x) for x in spec.split(",")) if spec else SIZES
    timed = tuple(b for b in sizes if b in SIZES)
    fas = [int(x) for x in option(args, "--fa", "0,1").split(",")]
    label = option(args, "--label", "")
    models = [a for a in args if a.endswith(".gguf")]
    L.llama_backend_init()
    results: list[dict] = []

    def save() -> None:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)

    for path in models:
        name = path.rsplit("/", 1)[-1]
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = ngl
        model = L.llama_model_load_from_file(path.encode(), mp)
        if not model:
            print(f"{path}: failed to load", flush=True)
            results.append({"model": name, "error": "failed to load"})
            save()
            continue
        vocab = L.llama_model_get_vocab(model)
        nv = L.llama_vocab_n_tokens(vocab)
        for fa in fas:
            s = Session(model, nv, fa, threads)
            ids = np.random.default_rng(1).integers(100, nv - 100, 2048).tolist()
            for P in prefixes:
                L.llama_memory_clear(s.mem, True)
                for start in range(0, P, 512):
                    s.decode(ids[start:min(P, start + 512)], start, all_logits=False)
                single = []
                for j in range(max(sizes)):
                    s.decode([ids[P + j]], P + j)
                    single.append(s.logits(0))
                single_rows = np.stack(single)
                rows = {}
                for b in sizes:
                    L.llama_memory_seq_rm(s.mem, 0, P, -1)
                    s.decode(ids[P:P + b], P)
                    bl = np.stack([s.logits(i) for i in range(b)])
                    rows[b] = {
                        "equal": bool(np.array_equal(bl, single_rows[:b])),
                        "maxdiff": float(np.abs(bl - single_rows[:b]).max()),
                        "argmax_same": int((bl.argmax(1) == single_rows[:b].argmax(1)).sum()),
                        "finite": bool(np.isfinite(bl).all()),
                    }
                times = {}
                if P == prefixes[0]:
                    for b in (1, *timed):
                        ts = []
                        for _ in range(15):
                            L.llama_memory_seq_rm(s.mem, 0, P, -1)
                            t = time.perf_counter()
                            s.decode(ids[P:P + b], P)
                            L.llama_synchronize(s.ctx)
                            ts.append(time.perf_counter() - t)
                        times[b] = float(np.median(ts[3:]))
                rec = {"model": name, "label": label, "fa": fa, "prefix": P, "ngl": ngl, "rows": rows,
                       "ms_one": times.get(1, 0) * 1e3,
                       "c": {b: times[b] / times[1] for b in times} if times else {}}
                results.append(rec)
                eq = "".join("=" if rows[b]["equal"] else "x" for b in sizes)
                worst = max(r["maxdiff"] for r in rows.values())
                print(f"{label + ' ' if label else ''}{rec['model']} fa={fa} P={P}: batch==single at widths "
                      f"{sizes[0]}-{sizes[-1]}: {eq} ({sum(r['equal'] for r in rows.values())}/{len(rows)}) max|diff| {worst:.3g}"
                      + (f"; one token {rec['ms_one']:.2f} ms; c(b) " + " ".join(f"{b}:{c:.2f}" for b, c in rec["c"].items())
                         if times else ""), flush=True)
                save()
            s.free()
        L.llama_model_free(model)


if __name__ == "__main__":
    main()
