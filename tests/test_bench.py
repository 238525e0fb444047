"""bench's pieces without models: configuration parsing, summaries, llama.cpp's output, the report, the plot."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from specdec_cli.bench import core as bench
from specdec_cli.bench import external
from specdec_cli.bench.plot import plot
from specdec_cli.bench.prompts import BenchPrompt
from specdec_cli.engine.events import DRAFT, TARGET, EmittedToken, Step
from specdec_cli.engine.stats import Stats
from specdec_cli.errors import SpecdecError
from specdec_cli.render.reports import bench_report


def test_parse_configs() -> None:
    cfgs = bench.parse_configs("target, model:3,model:auto,ngram:auto,ngram:2", model_k=5, ngram_k=8)
    assert [(c.name, c.drafter, c.k, c.adaptive) for c in cfgs] == [
        ("target", None, 0, False),
        ("model:3", "model", 3, False),
        ("model:auto", "model", 5, True),
        ("ngram:auto", "ngram", 8, True),
        ("ngram:2", "ngram", 2, False),
    ]
    for bad in ("model", "model:0", "ngram:x", "eagle:2", "", "target,target"):
        with pytest.raises(bench.BenchInputError):
            bench.parse_configs(bad, 4, 8)


def _stats(drafted: int, accepted: int, target_s: float) -> Stats:
    st = Stats()
    emitted = tuple([EmittedToken(1, "a", DRAFT)] * accepted + [EmittedToken(2, "b", TARGET)])
    st.add(Step(0, drafted, tuple(range(drafted)), accepted, emitted, 0.0, target_s, 0.001, 0.0))
    return st


def test_summaries_speedup_identity_and_split() -> None:
    prompts = [BenchPrompt("a", "p1", "x"), BenchPrompt("b", "p2", "y")]
    res = bench.BenchResult(
        [bench.BenchConfig("target", None), bench.BenchConfig("ngram:2", "ngram", 2)], prompts, True
    )
    for p, cat in (("p1", "a"), ("p2", "b")):
        res.records.append(bench.RunRecord("target", p, cat, 0, [2], 0.1, _stats(0, 0, 0.099)))
    res.records.append(bench.RunRecord("ngram:2", "p1", "a", 0, [1, 2], 0.1, _stats(2, 1, 0.09)))
    res.records.append(bench.RunRecord("ngram:2", "p2", "b", 0, [9, 9], 0.1, _stats(2, 1, 0.09)))
    rows = {(s.config, s.category): s for s in res.summaries()}
    assert set(rows) == {(c, g) for c in ("target", "ngram:2") for g in ("a", "b", "all")}
    s = rows[("ngram:2", "a")]
    assert s.speedup == pytest.approx((2 / 0.1) / (1 / 0.1))
    assert s.identical is False  # [1, 2] != [2]
    assert rows[("target", "a")].identical is None
    assert s.acceptance_rate == 0.5
    assert sum(s.split.values()) == pytest.approx(1.0)
    assert s.overhead_fraction == pytest.approx(0.1)
    buf = io.StringIO()
    bench_report(res.summaries(), greedy=True, console=Console(file=buf, width=160))
    out = buf.getvalue()
    assert "NO" in out and "2.00x" in out and "ngram:2: acceptance by draft position 1:100% 2:0%" in out


def test_llama_cpp_output_and_command(tmp_path: Path) -> None:
    out = (
        "encoded   20 tokens in    0.100 seconds, speed:  200.0 t/s\n"
        "decoded   45 tokens in    0.749 seconds, speed:   60.055 t/s\n"
        "n_drafted    = 32\nn_accept     = 5\n"
    )
    assert external.parse_llama_cpp(out) == (45, 0.749, 32, 5)
    with pytest.raises(SpecdecError):
        external.parse_llama_cpp("segmentation fault")
    cmd = external.llama_cpp_command(
        tmp_path, bench.BenchConfig("model:3", "model", 3), Path("t.gguf"), Path("d.gguf"), "hi",
        max_tokens=32, threads=2, ctx=1024,
    )  # fmt: skip
    assert cmd[0].endswith("llama-speculative-simple")
    joined = " ".join(cmd)
    for part in ("-md d.gguf", "--spec-draft-n-max 3", "--temp 0", "-fa off", "--no-repack", "--spec-draft-p-min 0"):
        assert part in joined


def test_prompts_file_and_plot(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "one", "category": "c1"}\n\n{"prompt": "two", "name": "second"}\n')
    got = bench.load_prompts(f)
    assert [(p.category, p.name, p.text) for p in got] == [("c1", "line-1", "one"), ("prompts", "second", "two")]
    assert [p.name for p in bench.load_prompts(f, "c1")] == ["line-1"]
    prompts = [BenchPrompt("a", "p1", "x")]
    res = bench.BenchResult(
        [bench.BenchConfig("target", None), bench.BenchConfig("ngram:2", "ngram", 2)], prompts, True
    )
    res.records.append(bench.RunRecord("target", "p1", "a", 0, [2], 0.1, _stats(0, 0, 0.09)))
    res.records.append(bench.RunRecord("ngram:2", "p1", "a", 0, [1, 2], 0.1, _stats(2, 1, 0.09)))
    png = tmp_path / "out.png"
    plot(res.summaries(), png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_run_is_a_first_ask_the_pool_keeps_what_it_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt runs under every configuration and repeat: with the token pool recording them, its later
    runs would be drafted from its earlier ones (a lookup configuration at a repeat's speed). The pool keeps
    what it held at the start (here one text of its own), and what the API records is back on afterwards."""
    from specdec_cli import api
    from specdec_cli.engine.settings import GenerateOptions
    from tests.fakes import open_fake

    monkeypatch.setenv("SPECDEC_CALIBRATE", "0")
    with api.load(open_model=open_fake, n_ctx=1024, drafter="ngram") as spec:
        assert spec.pool is not None
        spec.pool.add(list(range(30)))
        held = len(spec.pool)
        prompts = [BenchPrompt("a", "p1", "Write a line about the sea.")]
        cfgs = bench.parse_configs("target,ngram:auto", model_k=4, ngram_k=16)
        res = bench.run_bench(spec, prompts, cfgs, repeats=2, warmup=1, options=GenerateOptions(max_tokens=48))
        assert len(spec.pool) == held and spec.remember
        lookup = [r for r in res.records if r.config == "ngram:auto"]
        assert len(lookup) == 2 and all(r.stats.accepted == 0 for r in lookup)  # nothing to copy from
        spec.generate("Write a line about the sea.", max_tokens=48)
        assert len(spec.pool) > held
