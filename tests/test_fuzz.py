"""Fuzzing (hypothesis): mutated GGUF headers, small junk files and generated templates end cleanly.

"Cleanly" means: within a time limit, exit 0 or 1 with one `Error:` line, no
traceback, no signal (a crash in llama.cpp would show as a negative return code).
Model files run in a subprocess so that a crash fails the test instead of
killing the suite. Examples are derandomized: CI sees the same ones every run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec_cli.engine import templates
from specdec_cli.errors import SpecdecError
from tests.conftest import THREADS

ENV = {**os.environ, "SPECDEC_CALIBRATE": "0", "NO_COLOR": "1"}
RUN_SECONDS = 60
FILE_SETTINGS = settings(
    max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None
)


def run_cli(path: Path) -> subprocess.CompletedProcess[str]:
    args = ["run", "--raw", "hi", "--target", str(path), "--no-draft", "-n", "2", "--ctx-size", "64", "--threads", str(THREADS)]
    return subprocess.run([sys.executable, "-m", "specdec_cli", *args], capture_output=True, text=True,
                          timeout=RUN_SECONDS, env=ENV)  # fmt: skip


def assert_clean(proc: subprocess.CompletedProcess[str], what: str) -> None:
    err = proc.stderr.strip()
    assert proc.returncode in (0, 1), f"{what}: exit {proc.returncode} (a negative code is a crash)\n{err[-2000:]}"
    assert "Traceback" not in err and "internal error" not in err, f"{what}:\n{err[-2000:]}"
    if proc.returncode == 1:
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines and lines[-1].startswith("Error: ") and len(lines) == 1, f"{what}:\n{err[-2000:]}"


@pytest.fixture(scope="module")
def header_end(smol_path: Path) -> int:
    """Where SmolLM2's tensor data starts: everything before it is header, metadata and tensor infos."""
    from gguf import GGUFReader

    return int(GGUFReader(str(smol_path), "r").data_offset)


EXTREMES = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1]
mutation = st.one_of(
    st.tuples(st.just("byte"), st.floats(0, 1), st.integers(0, 255)),
    st.tuples(st.just("u64"), st.floats(0, 1), st.sampled_from(EXTREMES)),
    st.tuples(st.just("u32"), st.floats(0, 1), st.sampled_from(EXTREMES[:6])),
)
# The first 24 bytes hold the magic, the version and the two counts: aim there often.
early_mutation = st.tuples(st.sampled_from(["u64", "u32"]), st.sampled_from([4 / 1e6, 8 / 1e6, 16 / 1e6]),
                           st.sampled_from(EXTREMES))  # fmt: skip


@FILE_SETTINGS
@given(mutations=st.lists(st.one_of(mutation, early_mutation), min_size=1, max_size=6), cut=st.none() | st.floats(0, 1))
def test_mutated_gguf_header_ends_cleanly(
    smol_path: Path, header_end: int, tmp_path_factory: pytest.TempPathFactory, mutations: list[Any], cut: float | None
) -> None:
    out = tmp_path_factory.mktemp("fuzz") / "mutated.gguf"
    shutil.copyfile(smol_path, out)
    with out.open("r+b") as fh:
        for kind, where, value in mutations:
            offset = min(int(where * 1e6) if where < 1e-4 else int(where * header_end), header_end - 8)
            fh.seek(offset)
            if kind == "byte":
                fh.write(bytes([value]))
            else:
                size = 8 if kind == "u64" else 4
                fh.write((value % 2 ** (8 * size)).to_bytes(size, "little"))
        if cut is not None:
            fh.truncate(int(cut * header_end))
    t0 = time.monotonic()
    assert_clean(run_cli(out), f"mutations {mutations}, cut {cut}")
    assert time.monotonic() - t0 < RUN_SECONDS


@pytest.mark.slow
@FILE_SETTINGS
@given(data=st.binary(max_size=4096), header=st.sampled_from([b"", b"GGUF", b"GGUF\x03\x00\x00\x00"]))
def test_small_junk_files_end_cleanly(tmp_path_factory: pytest.TempPathFactory, data: bytes, header: bytes) -> None:
    out = tmp_path_factory.mktemp("fuzz") / "junk.gguf"
    out.write_bytes(header + data)
    assert_clean(run_cli(out), f"{len(header + data)} bytes starting {(header + data)[:32]!r}")


# ------------------------------------------------------------------ templates
NUMBERS = st.sampled_from(["0", "1", "3", "-1", "100000", "10**9", "2**64", "10**6"])
STRINGS = st.sampled_from(["'a'", "'%s'", "'{}'", "'x' * 1000", "messages[0]['content']", "''"])


def expression() -> st.SearchStrategy[str]:
    base = st.one_of(NUMBERS, STRINGS, st.just("messages"), st.just("range(10)"))

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.builds(lambda a, op, b: f"({a} {op} {b})", inner, st.sampled_from(["*", "+", "**", "%", "~", "/", "//"]),
                      inner),  # fmt: skip
            st.builds(lambda a, f, n: f"({a}|{f}({n}))", inner,
                      st.sampled_from(["center", "indent", "truncate", "wordwrap", "batch", "join", "replace('', 'xx')|default",
                                       "format", "tojson", "list|join", "string|replace('a', 'aa')|default"]),
                      NUMBERS),  # fmt: skip
            st.builds(lambda a, m, n: f"{a}.{m}({n})", STRINGS,
                      st.sampled_from(["ljust", "center", "zfill", "format", "replace('a', 'b') and 'x'.join"]),
                      inner),  # fmt: skip
            st.builds(lambda a: f"range({a})|list", NUMBERS),
        )

    return st.recursive(base, extend, max_leaves=6)


def statement() -> st.SearchStrategy[str]:
    expr = expression()
    return st.recursive(
        expr.map(lambda e: "{{ " + e + " }}"),
        lambda inner: st.one_of(
            st.builds(lambda n, body: f"{{% for i in range({n}) %}}{body}{{% endfor %}}", NUMBERS, inner),
            st.builds(lambda a, b: a + b, inner, inner),
            st.builds(lambda body: "{% set ns = namespace(s='ab') %}" + body + "{% set ns.s = ns.s ~ ns.s %}", inner),
            st.builds(lambda body: "{% macro f(n) %}" + body + "{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", inner),
            st.builds(lambda e, body: "{% if " + e + " %}" + body + "{% endif %}", expr, inner),
            st.just("{% for %}"),
        ),
        max_leaves=5,
    )


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None)
@given(template=statement())
def test_generated_templates_end_cleanly(template: str) -> None:
    t0 = time.monotonic()
    try:
        out = templates.render(template, [{"role": "user", "content": "hi"}], bos_token="<s>", eos_token="</s>")
        assert isinstance(out, str) and len(out) <= templates.MAX_CHARS
    except SpecdecError as exc:
        assert "\n" not in str(exc) or "refused" in str(exc)
    assert time.monotonic() - t0 < templates.RENDER_SECONDS + 2, template
