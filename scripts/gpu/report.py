"""The stamp and the report of scripts/gpu-check.sh (standard library only: it runs before anything is installed).

    python scripts/gpu/report.py stamp RAW_DIR --mode device|rehearse [--manifest .gpu/manifest.json] [--root DIR]
    python scripts/gpu/report.py set RAW_DIR KEY VALUE      (VALUE is JSON when it parses as JSON, else text)
    python scripts/gpu/report.py report RAW_DIR [OUT_DIR]

`stamp` writes RAW_DIR/stamp.json: the GPU (name, memory, driver, compute capability), the CUDA versions
(the driver's, nvcc's), the CPU and its cores, the commit the bundle was made from, the date. `set` records
one fact of the run in RAW_DIR/meta.json (the CMake flags, the build's time, ...). `report` reads what
gpu-check.sh left in RAW_DIR (steps.tsv, runs.tsv and runs/, probe.json, identity-*.json, tools/, bench.json)
and writes OUT_DIR (RAW_DIR unless given)/gpu-check.json (everything, machine-readable: docs can be generated
from it) and OUT_DIR/summary.md (tables).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any


def sh(*cmd: str) -> str | None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def first(text: str | None) -> str | None:
    return text.splitlines()[0] if text else None


def stamp(out: Path, args: list[str]) -> None:
    def opt(name: str) -> str | None:
        return args[args.index(name) + 1] if name in args else None

    gpus = []
    q = sh("nvidia-smi", "--query-gpu=name,memory.total,driver_version,compute_cap", "--format=csv,noheader")
    for line in (q or "").splitlines():
        name, mem, driver, cc = (x.strip() for x in (line.split(",") + ["", "", ""])[:4])
        gpus.append({"name": name, "memory": mem, "driver": driver, "compute_cap": cc})
    smi = sh("nvidia-smi") or ""
    m = re.search(r"CUDA Version:\s*([\d.]+)", smi)
    nvcc = sh("nvcc", "--version") or ""
    n = re.search(r"release ([\d.]+), (V[\d.]+)", nvcc)
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    cpu = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    mem = re.search(r"^MemTotal:\s*(\d+) kB", Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else "", re.M)
    manifest = read_json(Path(opt("--manifest") or "/nonexistent")) or {}
    root = opt("--root") or "."
    git = sh("git", "-C", root, "rev-parse", "HEAD")
    data = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "mode": opt("--mode") or "device",
        "gpus": gpus,
        "gpu": gpus[0]["name"] if gpus else None,
        "gpu_memory": gpus[0]["memory"] if gpus else None,
        "driver": gpus[0]["driver"] if gpus else None,
        "compute_cap": gpus[0]["compute_cap"] if gpus else None,
        "cuda_driver_version": m.group(1) if m else None,
        "nvcc": f"{n.group(1)} ({n.group(2)})" if n else None,
        "cpu": cpu.group(1).strip() if cpu else platform.processor() or None,
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": round(int(mem.group(1)) / 2**20, 1) if mem else None,
        "python": platform.python_version(),
        "cmake": first(sh("cmake", "--version")),
        "gcc": first(sh("gcc", "--version")),
        "commit": manifest.get("commit") or git,
        "dirty": manifest.get("dirty"),
        "bundle_made": manifest.get("made"),
        "bundle_bytes": manifest.get("bytes"),
        "git_head_here": git,
        "llama_cpp_python": manifest.get("llama_cpp_python"),
        "patches_sha256_16": manifest.get("patches_sha256_16"),
    }
    (out / "stamp.json").write_text(json.dumps(data, indent=1))
    print(f"{data['gpu'] or 'no GPU'} {data['gpu_memory'] or ''} driver {data['driver']} CUDA {data['cuda_driver_version']} "
          f"nvcc {data['nvcc']} | {data['cpu']}, {data['cores']} cores | commit {(data['commit'] or '?')[:7]}"
          + (" (uncommitted changes)" if data["dirty"] else ""))


def set_fact(out: Path, key: str, value: str) -> None:
    path = out / "meta.json"
    meta = read_json(path) or {}
    try:
        meta[key] = json.loads(value)
    except ValueError:
        meta[key] = value
    path.write_text(json.dumps(meta, indent=1))


def tsv(path: Path, fields: list[str]) -> list[dict[str, str]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    return [dict(zip(fields, (line.split("\t") + [""] * len(fields))[: len(fields)], strict=True)) for line in lines if line]


def err_summary(path: Path) -> tuple[int, str | None]:
    try:
        lines = [x.strip() for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return 0, None
    for rx in (r"^error", r"warn|exact|note", r"error|traceback|segmentation|killed|abort"):
        keep = [x for x in lines if re.search(rx, x, re.I)]
        if keep:
            return len(lines), keep[0]
    return len(lines), lines[-1] if lines else None


def runs(out: Path) -> list[dict[str, Any]]:
    rows = []
    base: dict[str, list[int]] = {}
    for r in tsv(out / "runs.tsv", ["name", "pair", "label", "rc", "seconds", "n", "cmd"]):
        d = read_json(out / "runs" / f"{r['name']}.json")
        n_err, first_err = err_summary(out / "runs" / f"{r['name']}.err")
        s = (d or {}).get("stats", {}) if isinstance(d, dict) else {}
        row: dict[str, Any] = {
            "name": r["name"], "pair": r["pair"], "label": r["label"], "rc": int(r["rc"]) if r["rc"].lstrip("-").isdigit() else r["rc"],
            "seconds": float(r["seconds"] or 0), "max_tokens": int(r["n"]) if r["n"].isdigit() else None, "cmd": r["cmd"],
            "ok": isinstance(d, dict) and "token_ids" in d,
            "tokens_per_second": s.get("tokens_per_second"), "drafted": s.get("drafted"), "accepted": s.get("accepted"),
            "acceptance_rate": s.get("acceptance_rate"), "tokens_per_step": s.get("tokens_per_step"),
            "n_tokens": d.get("n_tokens") if isinstance(d, dict) else None,
            "stop_reason": d.get("stop_reason") if isinstance(d, dict) else None,
            "kernels": (d.get("models") or {}).get("kernels") if isinstance(d, dict) else None,
            "exact": (d.get("models") or {}).get("exact") if isinstance(d, dict) else None,
            "gpu_layers": (d.get("models") or {}).get("gpu_layers") if isinstance(d, dict) else None,
            "drafter": (d.get("settings") or {}).get("drafter") if isinstance(d, dict) else None,
            "drafters": s.get("drafters"), "notes": s.get("notes"),
            "stderr_lines": n_err, "stderr_first": first_err,
            "token_ids": d.get("token_ids") if isinstance(d, dict) else None,
        }
        if r["label"] == "no-draft" and row["ok"]:
            base[r["pair"]] = d["token_ids"]
        rows.append(row)
    order = {p: i for i, p in reversed(list(enumerate(r["pair"] for r in rows)))}
    rows.sort(key=lambda r: order[r["pair"]])  # stable: each pair's runs together, in the order they ran
    for row in rows:
        ref, ids = base.get(row["pair"]), row["token_ids"]
        if ref is None or ids is None:
            row["same_ids"] = None
        else:
            m = min(len(ref), len(ids))
            row["same_ids"] = ref[:m] == ids[:m]
            row["compared"] = m
    return rows


def identity(out: Path) -> dict[str, Any]:
    res = {}
    for path in sorted(out.glob("identity-*.json")):
        d = read_json(path)
        key = path.stem.removeprefix("identity-")
        if not isinstance(d, dict):
            res[key] = {"ok": False}
            continue
        rows = [r for r in d.get("results", []) if r.get("config") != "target" and r.get("category") != "all"]
        same = [r["category"] for r in rows if r.get("identical")]
        res[key] = {
            "ok": True, "prompts": len(rows), "identical": len(same), "identical_prompts": same,
            "kernels": (d.get("models") or {}).get("kernels"),
            "config": rows[0]["config"] if rows else None,
            "max_tokens": (d.get("settings") or {}).get("max_tokens"),
            "tps_median": {r["category"]: r.get("tps_median") for r in rows},
            "acceptance_rate": {r["category"]: r.get("acceptance_rate") for r in rows},
        }
    return res


def tools(out: Path) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for path in sorted((out / "tools").glob("llama-bench-*.json")):
        d = read_json(path)
        res[path.stem] = [
            {"model": Path(x.get("model_filename", "")).name, "fa": x.get("flash_attn"), "n_gen": x.get("n_gen"),
             "n_prompt": x.get("n_prompt"),
             "n_gpu_layers": x.get("n_gpu_layers"), "avg_ts": x.get("avg_ts"), "stddev_ts": x.get("stddev_ts"),
             "backends": x.get("backends"), "gpu_info": x.get("gpu_info")}
            for x in d or [] if isinstance(x, dict)
        ]
    for path in sorted((out / "tools").glob("spec-*.txt")):
        text = path.read_text(errors="replace")
        rec: dict[str, Any] = {}
        for key, rx in (("decoded", r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s"),
                        ("n_drafted", r"n_drafted\s*=\s*(\d+)"), ("n_accept", r"n_accept\s*=\s*(\d+)"),
                        ("accept", r"accept\s*=\s*([\d.]+)%")):
            ms = re.findall(rx, text)
            if ms:
                rec[key] = ms[-1]
        if "decoded" in rec:
            n, secs, tps = rec.pop("decoded")
            rec.update(tokens=int(n), seconds=float(secs), tokens_per_second=float(tps))
        for k in ("n_drafted", "n_accept"):
            if k in rec:
                rec[k] = int(rec[k])
        if "accept" in rec:
            rec["accept"] = float(rec["accept"]) / 100
        res[path.stem] = rec
    return res


def bench(out: Path) -> dict[str, Any] | None:
    d = read_json(out / "bench.json")
    if not isinstance(d, dict):
        return None
    return {"models": d.get("models"), "costs": d.get("costs"), "settings": d.get("settings"),
            "results": d.get("results")}


def fmt(x: Any, nd: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def kern(k: Any) -> str:
    if not isinstance(k, dict):
        return "-"
    draft = k.get("draft")
    return f"{k.get('target')}/{'-' if draft is None else draft}"


def report(out: Path, dest: Path) -> None:
    st = read_json(out / "stamp.json") or {}
    meta = read_json(out / "meta.json") or {}
    steps = tsv(out / "steps.tsv", ["step", "rc", "seconds", "note"])
    probe = [p for name in ("probe.json", "probe-inv.json") for p in (read_json(out / name) or [])
             if isinstance(p, dict)]  # llama.cpp's kernels, then patch 0008's (GGML_CUDA_BATCH_INVARIANT=1)
    rs = runs(out)
    ident = identity(out)
    batched = read_json(out / "batched.json")
    tl = tools(out)
    bn = bench(out)
    ht = read_json(out / "host-time.json")
    gs = read_json(out / "graph-shapes.json")  # graph_shapes.py: CUDA graphs across batch shapes
    streams = [p for name in ("streams-inv.json", "streams.json") for p in (read_json(out / name) or [])
               if isinstance(p, dict)]  # several sequences in one batch: patch 0008's kernels, then stock
    combined = {"stamp": st, "meta": meta, "steps": steps, "probe": probe, "streams": streams,
                "runs": [{k: v for k, v in r.items() if k != "token_ids"} for r in rs],
                "identity": ident, "batched": batched, "tools": tl, "bench": bn,
                "host_time": ({k: ht.get(k) for k in ("medians", "llama_cpp", "versus_llama_cpp", "ahead_over_not",
                                                     "bursts_over_not", "runs_over_not", "parts")}
                              if isinstance(ht, dict) else None),
                "graph_shapes": gs}
    (dest / "gpu-check.json").write_text(json.dumps(combined, indent=1))

    md = [f"# gpu-check ({st.get('mode', '?')})", ""]
    md.append(f"{st.get('gpu') or 'no GPU'} ({st.get('gpu_memory') or '-'}, compute {st.get('compute_cap') or '-'}), driver "
              f"{st.get('driver') or '-'}, CUDA {st.get('cuda_driver_version') or '-'}, nvcc {st.get('nvcc') or '-'} · "
              f"{st.get('cpu')}, {st.get('cores')} cores · commit {(st.get('commit') or '?')[:7]}"
              f"{' (uncommitted changes)' if st.get('dirty') else ''} · {st.get('date')}")
    if meta:
        md += ["", "| fact | value |", "|---|---|"]
        md += [f"| {k} | `{json.dumps(v) if not isinstance(v, str) else v}` |" for k, v in meta.items()]
    md += ["", "## Steps", "", "| step | rc | seconds | note |", "|---|---|---|---|"]
    md += [f"| {s['step']} | {s['rc']} | {s['seconds']} | {s['note']} |" for s in steps]
    if probe:
        md += ["", "## Probe: batch vs one token at a time (`=` bit-identical widths, `x` not), c(b) = batch of b / one token", "",
               "| kernels | model | fa | prefix | widths | equal | max abs diff | argmax same | ms/token | c(5) | c(9) | c(17) | c(64) |",
               "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for p in probe:
            if "error" in p:
                md.append(f"| {p.get('label') or 'stock'} | {p['model']} | - | - | {p['error']} | | | | | | | | |")
                continue
            rows = p.get("rows", {})
            eq = "".join("=" if r["equal"] else "x" for r in rows.values())
            worst = max((r["maxdiff"] for r in rows.values()), default=0.0)
            am = f"{sum(r['argmax_same'] for r in rows.values())}/{sum(int(b) for b in rows)}"
            c = p.get("c") or {}
            widths = f"{min(map(int, rows))}-{max(map(int, rows))}" if rows else "-"
            md.append(f"| {p.get('label') or 'stock'} | {p['model']} | {p['fa']} | {p['prefix']} | {widths} | "
                      f"{sum(r['equal'] for r in rows.values())}/{len(rows)} `{eq}` | {worst:.3g} | {am} | "
                      f"{fmt(p.get('ms_one') or None, 2)} | {fmt(c.get('5'), 2)} | {fmt(c.get('9'), 2)} | "
                      f"{fmt(c.get('17'), 2)} | {fmt(c.get('64'), 2)} |")
    if streams:
        md += ["", "## Several sequences in one batch against each alone (`=` bit-identical, `x` not)", "",
               "| kernels | model | tokens per sequence: result |", "|---|---|---|"]
        for p in streams:
            rows = p.get("rows") or {}
            md.append(f"| {p.get('label')} | {p.get('model')} | "
                      f"{p.get('error') or ' '.join(k + ':' + ('=' if v['equal'] else 'x') for k, v in rows.items())} |")
    if rs:
        md += ["", "## specdec run (ids: token ids equal the pair's `--no-draft` run's)", "",
               "| pair | run | rc | s | tok/s | drafted | accepted | kernels target/draft | GPU layers target/draft | ids | stderr |",
               "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rs:
            ids = "-" if r["same_ids"] is None else ("same" if r["same_ids"] else "DIFFER")
            if r["same_ids"] is not None and r.get("compared") != len(r["token_ids"] or []):
                ids += f" (first {r['compared']})"
            err = (r["stderr_first"] or "").replace("|", "/")[:140]
            md.append(f"| {r['pair']} | {r['label']} | {r['rc']} | {r['seconds']:.0f} | {fmt(r['tokens_per_second'])} | "
                      f"{fmt(r['drafted'])} | {fmt(r['accepted'])} | {kern(r['kernels'])} | {kern(r['gpu_layers'])} | {ids} | "
                      f"{r['stderr_lines']} line(s){': ' + err if err else ''} |")
    if ident:
        md += ["", "## Greedy identity: prompts whose output equals the target alone's", ""]
        for k, v in ident.items():
            if not v.get("ok"):
                md.append(f"- {k}: no result")
                continue
            md.append(f"- {k} ({v['config']}, {v['max_tokens']} tokens, kernels {kern(v['kernels'])}): "
                      f"**{v['identical']} of {v['prompts']}** identical")
    if isinstance(batched, dict):
        md += ["", "## Four requests at once through the batch engine, against the target alone", ""]
        md += [f"- drafter {k}: **{r['same']} of {batched['prompts']}** identical, {r['tokens']} tokens in {r['seconds']} s, "
               f"drafted {r['drafted']}, target kernels {r.get('kernels', 'as above')}, greedy argmax in the graph for "
               f"slots {r.get('graph_argmax_slots', 'as above')}{'; errors: ' + '; '.join(r['errors']) if r['errors'] else ''}"
               for k, r in batched.get("runs", {}).items()]
        if batched.get("bursts_over_steps"):
            md.append(f"- no draft, seconds a step a call over in bursts, alternating pairs: {batched['bursts_over_steps']}")
    if tl:
        md += ["", "## llama.cpp's tools (`-inv`: GGML_CUDA_BATCH_INVARIANT=1)", "",
               "| tool | model | fa | test | tok/s | accept |", "|---|---|---|---|---|---|"]
        for k, v in tl.items():
            if isinstance(v, list):
                md += [f"| {k} | {x['model']} | {x['fa']} | {'pp' + str(x['n_prompt']) if x.get('n_prompt') else 'tg' + str(x['n_gen'])} | "
                       f"{fmt(x['avg_ts'])} ± {fmt(x['stddev_ts'])} | |" for x in v]
            else:
                md.append(f"| {k} | | | | {fmt(v.get('tokens_per_second'))} | {fmt(v.get('accept'), 2)} "
                          f"({v.get('n_accept', '-')}/{v.get('n_drafted', '-')}) |")
    if bn and bn.get("results"):
        md += ["", "## specdec bench", "", "| config | category | tok/s (median) | speedup | acceptance | identical |",
               "|---|---|---|---|---|---|"]
        for r in bn["results"]:
            md.append(f"| {r.get('config')} | {r.get('category')} | {fmt(r.get('tps_median'))} | {fmt(r.get('speedup'), 2)} | "
                      f"{fmt(r.get('acceptance_rate'), 2)} | {fmt(r.get('identical'))} |")
    if isinstance(ht, dict) and ht.get("medians"):
        md += ["", "## Host time per step (outside llama_decode), benchmarks.host_time", "",
               "| config | host ms/step | decode ms/step | tok/s |", "|---|---|---|---|"]
        md += [f"| {k} | {fmt(v.get('host_ms_per_step'), 3)} | {fmt(v.get('decode_ms_per_step'), 2)} | "
               f"{fmt(v.get('tokens_per_second'))} |" for k, v in ht["medians"].items()]
        md += [f"- {k}: {fmt(v)}" for k, v in (ht.get("llama_cpp") or {}).items()]
        md += [f"- {k} / {v['beside']}, each repeat's: {', '.join(fmt(x, 3) for x in v['repeats'])}"
               for k, v in (ht.get("versus_llama_cpp") or {}).items()]
        if ht.get("ahead_over_not") is not None:
            md += [f"- target alone, decodes queued ahead / in bursts (median of pairs): {fmt(ht['ahead_over_not'], 3)}"]
        if ht.get("bursts_over_not") is not None:
            md += [f"- target alone, in bursts / a token a call, neither ahead (median of pairs): {fmt(ht['bursts_over_not'], 3)}"]
    if isinstance(gs, dict):
        md += ["", f"## CUDA graphs across batch shapes ({gs.get('target')}, graph_shapes.py)", "",
               "| pattern | shape | ms a call, graphs (A, A) | without | without / with | llama.cpp's key "
               "(patch 0013 off) | its / patch 0013's | not parked (patch 0014 off) | its / patch 0014's "
               "| rebuilt each call | a built graph reused (not parked) |",
               "|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, shapes in (gs.get("patterns") or {}).items():
            md += [f"| {name} | {n} | {' / '.join(fmt(x, 3) for x in r['ms_graphs'])} | {fmt(r['ms_no_graphs'], 3)} | "
                   f"{fmt(r['off_over_on'], 3)} | {fmt(r.get('ms_node_key'), 3)} | {fmt(r.get('node_key_over_on'), 3)} | "
                   f"{fmt(r.get('ms_unparked'), 3)} | {fmt(r.get('unparked_over_on'), 3)} | {fmt(r.get('ms_rebuilt'), 3)} | "
                   f"{shapes.get('graph_reused', '-')} ({shapes.get('graph_reused_unparked', '-')}) |"
                   for n, r in shapes.items() if isinstance(r, dict)]
        many = gs.get("many_shapes")
        if isinstance(many, dict):  # after more shapes than patch 0013 keeps captured graphs for
            steady = many.get("ms_1_steady") or {}
            md += ["", f"One-token calls after {many.get('shapes')} shapes in turn (three calls each), ms a call "
                   "(the same run's steady ones): " + ", ".join(
                       f"{label} {fmt(ms, 3)} ({fmt(steady.get(label), 3)})" for label, ms in many["ms_1"].items())]
    (dest / "summary.md").write_text("\n".join(md) + "\n")


def main() -> None:
    cmd, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    if cmd == "stamp":
        stamp(out, sys.argv[3:])
    elif cmd == "set":
        set_fact(out, sys.argv[3], sys.argv[4])
    elif cmd == "report":
        dest = Path(sys.argv[3]) if len(sys.argv) > 3 else out
        dest.mkdir(parents=True, exist_ok=True)
        report(out, dest)
    else:
        sys.exit(f"unknown command {cmd!r}: stamp, set or report")


if __name__ == "__main__":
    main()
