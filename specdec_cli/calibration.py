"""Starting cost estimates for the auto drafter: a few decodes, cached per model file and machine.

The auto drafter decides from c_v(b), the cost of verifying b tokens, and c_d,
the draft's cost per token (engine/estimates.py). It measures both while it
runs, and its own measurements win; but its first decisions need a starting
point, and a draft model that cannot pay should not be loaded into a cache and
tried first. So the first time a target (and draft) file is used on this
machine with this many threads, `calibrate` times single decodes and batches
of 2..k_max+1 (2-3 seconds for the packaged models) and keeps the result in
the cache directory (`calibration.json`). `SPECDEC_CALIBRATE=0` turns it off.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

from specdec_cli.engine import native
from specdec_cli.engine.costs import batch_costs, draft_token_seconds
from specdec_cli.engine.drafters.auto import AutoState
from specdec_cli.engine.estimates import BatchCosts
from specdec_cli.engine.native import usable_cores
from specdec_cli.engine.protocol import LoadedModel
from specdec_cli.models.packaged import cache_dir

VERSION = 1
BASE_TEXT = "The quick brown fox jumps over the lazy dog. " * 4


DENSE = 9  # batch sizes up to this are all measured; above it (a parallel server's batches), a few
SPARSE = (12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


@dataclass(frozen=True)
class Calibration:
    target_one: float  # seconds for one single-token target decode
    relative: dict[int, float]  # c_v(b) for b = 1..max
    draft_one: float | None  # seconds for one single-token draft decode
    draft_relative: dict[int, float] = field(default_factory=dict)  # the draft's c(b), b = 2..slots (parallel)


def sizes_for(max_batch: int) -> list[int]:
    """The batch sizes calibration measures: every one up to DENSE, then a few, then max_batch."""
    sizes = list(range(2, min(max_batch, DENSE) + 1))
    sizes += [b for b in SPARSE if DENSE < b < max_batch]
    return sizes + ([max_batch] if max_batch > DENSE else [])


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _file_key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{int(st.st_mtime)}"


def _key(target: LoadedModel, draft: LoadedModel | None, threads: int | None, max_batch: int, draft_batch: int = 1) -> str:
    batch = f"b={max_batch}" + (f",d={draft_batch}" if draft_batch > 1 else "")
    parts = [f"v{VERSION}", _cpu(), f"threads={threads or usable_cores()}", batch, _file_key(target.path)]
    if target.placement is not None:  # on RPC servers: their costs, not this machine's
        parts.append(target.placement.describe())
    if draft is not None:
        parts.append(_file_key(draft.path))
        if draft.placement is not None:
            parts.append(draft.placement.describe())
    return "|".join(parts)


def _store() -> Path:
    return cache_dir() / "calibration.json"


def _read() -> dict[str, dict]:
    try:
        data = json.loads(_store().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def calibrate(
    target: LoadedModel, draft: LoadedModel | None, threads: int | None, max_batch: int, draft_batch: int = 1
) -> Calibration | None:
    """Cached starting costs for this pair on this machine; None when turned off. `draft_batch` > 1
    (a parallel server) also measures the draft's batches of up to that many tokens."""
    if os.environ.get("SPECDEC_CALIBRATE", "1") == "0":
        return None
    key = _key(target, draft, threads, max_batch, draft_batch)
    cached = _read().get(key)
    if cached:
        try:
            return Calibration(
                float(cached["target_one"]),
                {int(b): float(c) for b, c in cached["relative"].items()},
                None if cached.get("draft_one") is None else float(cached["draft_one"]),
                {int(b): float(c) for b, c in cached.get("draft_relative", {}).items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            pass  # an old or damaged entry: measure again
    room = target.n_ctx - max_batch - 1
    text = BASE_TEXT * (1 + max_batch // 40)
    base = target.tokenize(text, add_special=True, parse_special=False)[: max(room, 0)]
    if len(base) < max_batch:
        return None  # a context this small leaves no room to measure: start from the defaults
    probe = base[-max_batch:]
    one, relative = batch_costs(target, base, probe, max_batch, repeats=5, sizes=sizes_for(max_batch))
    draft_one = None
    draft_relative: dict[int, float] = {}
    if draft is not None:  # in the draft's own tokens of the same text (its tokenizer may differ)
        d_base = draft.tokenize(text, add_special=True, parse_special=False)[: max(room, 1)]
        draft_one = draft_token_seconds(draft, d_base[:-1], d_base[-1])
        if draft_batch > 1 and len(d_base) > draft_batch:
            d_probe = d_base[-draft_batch:]
            _, draft_relative = batch_costs(draft, d_base[:-draft_batch], d_probe, draft_batch, repeats=5)
            draft_relative.pop(1, None)
    target.rollback(0)
    if draft is not None:
        draft.rollback(0)
    native.release_compute_threads()  # a parallel server calibrates on its main thread, then steps on another
    cal = Calibration(one, relative, draft_one, draft_relative)
    data = _read()
    data[key] = {"target_one": one, "relative": relative, "draft_one": draft_one, "draft_relative": draft_relative}
    try:
        _store().parent.mkdir(parents=True, exist_ok=True)
        tmp = _store().with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(_store())
    except OSError:
        pass  # a read-only cache only costs the next run a calibration
    return cal


def starting_state(target: LoadedModel, draft: LoadedModel | None, threads: int | None, max_batch: int) -> AutoState:
    """The auto drafter's estimates before a run has measured anything: the calibration's, if any. One
    generation's sizes are priced as the run measures them (the calibration scaled by how they compare)."""
    return parallel_starting_state(target, draft, threads, max_batch, interpolate=False)[0]


def parallel_starting_state(
    target: LoadedModel, draft: LoadedModel | None, threads: int | None, max_batch: int, draft_batch: int = 1,
    interpolate: bool = True,
) -> tuple[AutoState, BatchCosts]:
    """The starting estimates, and the draft's batch costs (rounds that draft for several slots at once).
    `interpolate`: the target's sizes between calibrated ones are interpolated (a parallel server's sparse
    sizes), not priced by the calibration scaled to what the run measures (one generation's)."""
    state = AutoState()
    draft_costs = BatchCosts(interpolate=True)
    cal = calibrate(target, draft, threads, max_batch, draft_batch)
    if cal is not None:
        state.costs = BatchCosts(cal.relative, cal.target_one, interpolate=interpolate)
        state.draft_token_seconds = cal.draft_one
        draft_costs = BatchCosts(cal.draft_relative, cal.draft_one, interpolate=True)
    return state, draft_costs
