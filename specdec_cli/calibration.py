"""Starting cost estimates for the auto drafter: a few decodes, cached per model file and machine.

The auto drafter decides from c_v(b), the cost of verifying b tokens, and c_d,
the draft's cost per token (engine/estimates.py). It measures both while it
runs, and its own measurements win; but its first decisions need a starting
point, and a draft model that cannot pay should not be loaded into a cache and
tried first. So the first time a target (and draft) file is used on this
machine with this many threads, `calibrate` times single decodes and batches
of 2..k_max+1 (2-3 seconds for the packaged models) and keeps the result in
the cache directory (`calibration.json`). `SPECDEC_CALIBRATE=0` turns it off.

It also measures how often a same-vocabulary draft's greedy next token is the
target's over a short fixed text (`PROBE_TEXT`, both models reading it in one
batch): the draft model's starting acceptance. Without it the auto drafter
started every draft at a guessed 80% worth two observations, so one early miss
paused a draft that agrees 98% of the time (the F32 pair), and the few retries
a paused draft gets took whole workloads to win it back.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specdec_cli.engine import native
from specdec_cli.engine.costs import batch_costs, draft_token_seconds, sizes_for
from specdec_cli.engine.drafters.auto import CALIBRATED_WEIGHT, AutoState
from specdec_cli.engine.estimates import Acceptance, BatchCosts
from specdec_cli.engine.native import usable_cores
from specdec_cli.engine.protocol import LoadedModel
from specdec_cli.models.packaged import cache_dir

VERSION = 2  # 2: the draft's agreement
# A parallel server calibrates batches of up to --parallel x (this + 1) tokens; bigger ones (a long pool
# draft beside other slots) are priced by the slope of the last measured sizes.
PARALLEL_CALIBRATED_K = 8
# One generation calibrates batches of up to this + 1; longer lookup drafts (up to MAX_DRAFT) are priced by
# the mean slope of those sizes until the run has timed their own. On 2026-11-24's Xeon the slope priced a
# batch of 65 at 10.75 single decodes of the F32 target where it measured 9.96 (38.79 against 35.73 on the
# default pair): a little high, and calibrating up to 65 took 7.0 s against 3.6 s (6.9 against 3.0).
CALIBRATED_K = 16
BASE_TEXT = "The quick brown fox jumps over the lazy dog. " * 4
# Prose, a list and code, about 130 tokens in SmolLM2's: agreement on human text is below agreement along a
# model's own output (61% against 82% for the default pair's Q2_K draft, 96% against 98% for the F32
# pair's), so a starting value from it errs on the side of caution.
PROBE_TEXT = (
    "The old lighthouse keeper climbed the stairs every evening at dusk. He checked the lamp, wiped the glass "
    "and wrote the weather in his logbook.\n\nTo rename a file in Python:\n1. Import the os module.\n2. Call "
    "os.rename(old, new).\n3. Handle FileNotFoundError if the file may be missing.\n\n```python\ndef "
    "area(radius):\n    \"\"\"Return the area of a circle.\"\"\"\n    return 3.14159 * radius ** 2\n```\n\n"
    "In short, small steps done every day add up to a great deal over a year."
)


@dataclass(frozen=True)
class Calibration:
    target_one: float  # seconds for one single-token target decode
    relative: dict[int, float]  # c_v(b) for b = 1..max
    draft_one: float | None  # seconds for one single-token draft decode
    draft_relative: dict[int, float] = field(default_factory=dict)  # the draft's c(b), b = 2..slots (parallel)
    draft_agreement: float | None = None  # P(the draft's greedy token is the target's), PROBE_TEXT; same vocabulary only


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


def _key(
    target: LoadedModel, draft: LoadedModel | None, threads: int | None, max_batch: int, draft_batch: int = 1,
    same_vocab: bool = True,
) -> str:
    batch = f"b={max_batch}" + (f",d={draft_batch}" if draft_batch > 1 else "") + ("" if same_vocab else ",cross")
    parts = [f"v{VERSION}", _cpu(), f"threads={threads or usable_cores()}", batch, _file_key(target.path),
             f"kernels={target.kernels}", f"build={native.build_id()}"]  # costs of this build's kernels
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


def agreement(target: LoadedModel, draft: LoadedModel, ids: Sequence[int]) -> float:
    """The share of positions of `ids` (at most a batch) after which the draft's argmax is the target's:
    each model reads them in one batch from an empty cache, logits at every row."""
    target.rollback(0)
    draft.rollback(0)
    ours = target.decode(ids, n_logits=len(ids)).argmax(axis=1)  # a new array: the view is reused below
    theirs = draft.decode(ids, n_logits=len(ids)).argmax(axis=1)
    target.rollback(0)
    draft.rollback(0)
    return float(np.mean(ours == theirs))


def calibrate(
    target: LoadedModel, draft: LoadedModel | None, threads: int | None, max_batch: int, draft_batch: int = 1,
    same_vocab: bool = True,
) -> Calibration | None:
    """Cached starting costs for this pair on this machine; None when turned off. `draft_batch` > 1
    (a parallel server) also measures the draft's batches of up to that many tokens; with `same_vocab`
    (the draft reads the target's token ids), the draft's agreement with the target."""
    if os.environ.get("SPECDEC_CALIBRATE", "1") == "0":
        return None
    key = _key(target, draft, threads, max_batch, draft_batch, same_vocab)
    cached = _read().get(key)
    if cached:
        try:
            return Calibration(
                float(cached["target_one"]),
                {int(b): float(c) for b, c in cached["relative"].items()},
                None if cached.get("draft_one") is None else float(cached["draft_one"]),
                {int(b): float(c) for b, c in cached.get("draft_relative", {}).items()},
                None if cached.get("draft_agreement") is None else float(cached["draft_agreement"]),
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
    draft_agreement = None
    if draft is not None:
        draft.rollback(0)
        fits = min(target.n_batch, draft.n_batch, target.n_ctx, draft.n_ctx)
        probe_ids = target.tokenize(PROBE_TEXT, add_special=True, parse_special=False)[:fits]
        if same_vocab and len(probe_ids) > 1:
            draft_agreement = agreement(target, draft, probe_ids)
    native.release_compute_threads()  # a parallel server calibrates on its main thread, then steps on another
    cal = Calibration(one, relative, draft_one, draft_relative, draft_agreement)
    data = _read()
    data[key] = {"target_one": one, "relative": relative, "draft_one": draft_one, "draft_relative": draft_relative,
                 "draft_agreement": draft_agreement}  # fmt: skip
    tmp = _store().with_suffix(f".{os.getpid()}.tmp")  # a process's own: two calibrating at once (a test worker
    try:  # beside another, two runs) must not write one file
        _store().parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(_store())
    except OSError:
        tmp.unlink(missing_ok=True)  # a read-only cache only costs the next run a calibration
    return cal


def starting_state(
    target: LoadedModel, draft: LoadedModel | None, threads: int | None, max_batch: int, same_vocab: bool = True
) -> AutoState:
    """The auto drafter's estimates before a run has measured anything: the calibration's, if any. One
    generation's sizes are priced as the run measures them (the calibration scaled by how they compare)."""
    return parallel_starting_state(target, draft, threads, max_batch, interpolate=False, same_vocab=same_vocab)[0]


def parallel_starting_state(
    target: LoadedModel, draft: LoadedModel | None, threads: int | None, max_batch: int, draft_batch: int = 1,
    interpolate: bool = True, same_vocab: bool = True,
) -> tuple[AutoState, BatchCosts]:
    """The starting estimates, and the draft's batch costs (rounds that draft for several slots at once).
    `interpolate`: the target's sizes between calibrated ones are interpolated (a parallel server's sparse
    sizes), not priced by the calibration scaled to what the run measures (one generation's). The draft
    model's acceptance starts from its measured agreement, worth `CALIBRATED_WEIGHT` observations."""
    state = AutoState()
    draft_costs = BatchCosts(interpolate=True)
    cal = calibrate(target, draft, threads, max_batch, draft_batch, same_vocab)
    if cal is not None:
        if cal.draft_agreement is not None:
            state.model = Acceptance(prior=cal.draft_agreement, weight=CALIBRATED_WEIGHT)
        state.costs = BatchCosts(cal.relative, cal.target_one, interpolate=interpolate)
        if cal.draft_one is not None:
            state.calibrated_draft(cal.draft_one)
        draft_costs = BatchCosts(cal.draft_relative, cal.draft_one, interpolate=True)
    return state, draft_costs
