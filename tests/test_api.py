"""The Python API: the contract in its docstring and docs/api.md, on the packaged models."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from specdec_cli import api
from specdec_cli.engine.events import Prefill, Step
from specdec_cli.engine.model import Model
from specdec_cli.errors import SpecdecError, UsageError
from tests.conftest import THREADS, wrap

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Name three rivers in Europe."


def api_snippets() -> list[tuple[str, str]]:
    """Every ```python example of docs/api.md and the README that uses the API (not a server's client, not a
    generated signature)."""
    blocks = []
    for page in (ROOT / "docs" / "api.md", ROOT / "README.md"):
        blocks += [(page.name, b) for b in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
                   if "from specdec_cli import api" in b]  # fmt: skip
    return blocks


@pytest.mark.parametrize(("page", "snippet"), api_snippets())
def test_the_docs_api_examples_run_as_written(page: str, snippet: str) -> None:
    proc = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()


def test_generate_matches_specdec_run_json(smol_path: Path, smol_q2k_path: Path) -> None:
    """The same generation through `python -c` and through the CLI: same tokens, same stats fields."""
    code = (
        "import json; from specdec_cli import api\n"
        f"with api.load({str(smol_path)!r}, {str(smol_q2k_path)!r}, n_ctx=1024, n_threads={THREADS}) as s:\n"
        f"    g = s.generate({PROMPT!r}, max_tokens=24)\n"
        "    print(json.dumps({'ids': g.token_ids, 'stats': sorted(g.stats.as_dict()), 'why': g.stop_reason}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    via_api = json.loads(proc.stdout)
    cli = subprocess.run(
        [sys.executable, "-m", "specdec_cli", "run", PROMPT, "--target", str(smol_path), "--draft",
         str(smol_q2k_path), "-n", "24", "--ctx-size", "1024", "--threads", str(THREADS), "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    via_cli = json.loads(cli.stdout)
    assert via_api["ids"] == via_cli["token_ids"]
    assert via_api["why"] == via_cli["stop_reason"]
    assert via_api["stats"] == sorted(via_cli["stats"])


def test_stream_equals_generate_and_marks_draft_tokens(smol: Model, smol_q2k: Model) -> None:
    spec = wrap(smol, smol_q2k)
    whole = spec.generate(PROMPT, max_tokens=40)
    chunks = list(spec.stream(PROMPT, max_tokens=40))
    final = chunks[-1].generation
    assert final is not None and all(c.generation is None for c in chunks[:-1])
    assert "".join(c.text for c in chunks) == whole.text == final.text
    assert [t for c in chunks for t in c.token_ids] == whole.token_ids
    from_draft = sum(f for c in chunks for f in c.from_draft)
    assert from_draft == final.stats.emitted_from_draft > 0
    assert final.stats.emitted_from_draft + final.stats.emitted_from_target == len(final.token_ids)


def test_a_conversation_evaluates_only_its_new_tokens(smol: Model, smol_q2k: Model) -> None:
    spec = wrap(smol, smol_q2k)
    first = [{"role": "user", "content": PROMPT}]
    g1 = spec.generate(first, max_tokens=24)
    second = [*first, {"role": "assistant", "content": g1.text}, {"role": "user", "content": "And three lakes?"}]
    ids = spec.tokenize(second).ids
    cached = smol.common_prefix(ids)
    assert cached > len(ids) // 2  # the first turn is still in the cache
    before = spec.tokens_evaluated["target"]
    run = spec.start(second, max_tokens=8)
    for ev in run.events():
        if isinstance(ev, Prefill):
            # Prefill evaluated only what the cache did not hold (the last prompt token opens the first step).
            assert spec.tokens_evaluated["target"] - before == len(ids) - 1 - cached
    # The answer is the one a fresh start gives.
    fresh = wrap(smol, smol_q2k)
    smol.rollback(0)
    smol_q2k.rollback(0)
    assert fresh.generate(second, max_tokens=8).token_ids == run.generation.token_ids


def test_cancel_from_another_thread_keeps_the_caches_usable(smol: Model, smol_q2k: Model) -> None:
    spec = wrap(smol, smol_q2k)
    expected = spec.generate(PROMPT, max_tokens=48).token_ids
    stop = threading.Event()
    run = spec.start(PROMPT, max_tokens=48, cancel=stop)
    n_steps = 0
    for ev in run.events():
        if isinstance(ev, Step):
            n_steps += 1
            if n_steps == 2:
                setter = threading.Thread(target=stop.set)
                setter.start()
                setter.join()
    g = run.generation
    assert g.stop_reason == "interrupted" and len(g.steps) == 2
    assert 0 < len(g.token_ids) < len(expected)
    assert g.token_ids == expected[: len(g.token_ids)]
    # Caches consistent: the next call gives exactly what it gives from scratch.
    assert spec.generate(PROMPT, max_tokens=48).token_ids == expected
    # run.cancel() does the same.
    run2 = spec.start(PROMPT, max_tokens=48)
    for ev in run2.events():
        if isinstance(ev, Step):
            run2.cancel()
    assert run2.generation.stop_reason == "interrupted" and len(run2.generation.steps) == 1


def test_one_generation_at_a_time(smol: Model, smol_q2k: Model) -> None:
    spec = wrap(smol, smol_q2k)
    outer = spec.stream(PROMPT, max_tokens=8)
    next(outer)
    with pytest.raises(UsageError, match="one generation at a time"):
        spec.generate(PROMPT, max_tokens=4)
    list(outer)
    assert spec.generate(PROMPT, max_tokens=4).token_ids


def test_bad_values_are_usage_errors(smol: Model, smol_q2k: Model) -> None:
    spec = wrap(smol, smol_q2k)
    # the API names its own keywords, never a command-line flag
    for kw, needle in [({"temperature": float("nan")}, "^temperature must be"), ({"max_tokens": 0}, "^max_tokens must be"),
                       ({"seed": -1}, "^seed must be"), ({"drafter": "magic"}, "^drafter must be one of auto, model"),
                       ({"colour": 1}, "unknown generation option")]:  # fmt: skip
        with pytest.raises(UsageError, match=needle):
            spec.generate(PROMPT, **kw)
    with pytest.raises(UsageError, match="needs a role"):
        spec.generate([{"role": "user"}])
    with pytest.raises(ValueError):  # UsageError is a ValueError too
        spec.generate(PROMPT, top_p=0.0)


def test_close_and_failed_loads_free_the_models(
    smol_path: Path, smol_q2k_path: Path, truncated_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with api.load(smol_path, smol_q2k_path, n_ctx=256, n_threads=THREADS) as spec:
        assert spec.generate("Hi", max_tokens=2).token_ids
        target, draft = spec.target, spec.draft
    assert target._model is None and target._ctx is None
    assert draft is not None and draft._model is None

    # A draft that fails to load frees the target it had loaded.
    opened: list[Model] = []
    real_init = Model.__init__

    def tracking_init(self: Model, *a: object, **kw: object) -> None:
        opened.append(self)
        real_init(self, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Model, "__init__", tracking_init)
    from specdec_cli import pairs

    monkeypatch.setattr("specdec_cli.models.loading.check_pair",
                        lambda t, d, opener=None: pairs.Verdict(pairs.COMPATIBLE, "skipped"))
    with pytest.raises(SpecdecError):
        api.load(smol_path, truncated_gguf, n_ctx=256)
    assert len(opened) == 2 and all(m._model is None for m in opened)

    # A context that cannot be created frees its model.
    opened.clear()
    monkeypatch.setattr(Model, "_init_context", lambda self, *a: (_ for _ in ()).throw(MemoryError("no room")))
    with pytest.raises(MemoryError):
        api.load(smol_path, drafter="ngram")
    assert len(opened) == 1 and opened[0]._model is None


def test_a_seeded_sampled_run_repeats_whatever_the_timings(smol: Model, smol_q2k: Model) -> None:
    """The auto drafter's choices change which random numbers a sampled run draws; with a seed they
    must not depend on timings or on what earlier runs taught it, or the same seed gives new text."""
    spec = wrap(smol, smol_q2k, drafter="auto")
    kw = {"max_tokens": 32, "temperature": 0.9, "seed": 11}
    first = spec.generate("Write a line about the sea.", **kw).token_ids

    def learn_that_drafting_pays() -> None:  # as timings on an idle machine and a lucky run might teach it
        state = spec.auto_state()
        for _ in range(20):
            for b in range(1, 10):
                state.costs.observe(b, 0.01 * (1 + 0.05 * (b - 1)))
            state.model.observe(4, 4)
            # the whole window of draft timings: the load's calibration of the real draft, slow on a busy
            # machine, must not outvote them (it kept the model from drafting, and this test from testing)
            state.draft_token_seconds = state.draft_samples.add(0.001)

    learn_that_drafting_pays()
    unseeded = spec.generate("Write a line about the sea.", max_tokens=32, temperature=0.9).stats.drafters
    assert unseeded.get("model", {}).get("steps", 0) > 0  # not vacuous: what it learned makes it draft
    learn_that_drafting_pays()
    assert spec.generate("Write a line about the sea.", **kw).token_ids == first
