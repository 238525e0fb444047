"""The GPU's side, on machines without one (CI never has a GPU): the set-up's choice of build, GPU layers by
default and refused where there is no GPU, the batch-vs-single probe a GPU target gets and what exact mode
does when it fails, `--kernels fast`, llama.cpp's tools on the same device, and one-line errors for a library
that does not load or a GPU out of memory. scripts/gpu-check.sh shows the same on a real GPU."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from specdec_cli.bench import external
from specdec_cli.bench.core import BenchConfig
from specdec_cli.cli import app
from specdec_cli.engine import kernels, native
from specdec_cli.engine.batch.engine import BatchEngine
from specdec_cli.engine.drafters.auto import AutoState
from specdec_cli.engine.estimates import BatchCosts
from specdec_cli.engine.settings import InvalidSetting, check_kernels
from specdec_cli.errors import DeviceError
from tests.conftest import THREADS

ROOT = Path(__file__).resolve().parent.parent
PRETEND = native.Device("CUDA0", "Pretend GPU", 1000.0, 2000.0)


# --------------------------------------------------------------- the set-up
def cmake_args(tmp_path: Path, env: dict[str, str], tools: Sequence[str] = ()) -> tuple[int, str, str, str]:
    """Source scripts/cmake-args.sh with only `tools` and the shell's basics on PATH: a fake nvidia-smi (two
    GPUs of compute capability 9.0), a fake toolkit (nvcc beside cuBLAS's header) or a lone nvcc: (gpu_choice's
    status, $GPU, $ARGS, what it said)."""
    bin_dir = Path(tempfile.mkdtemp(dir=tmp_path))
    toolkit = bin_dir / "cuda"
    (toolkit / "bin").mkdir(parents=True)
    scripts = {"nvidia-smi": "#!/bin/sh\necho 9.0\necho 9.0\n", "nvcc": "#!/bin/sh\necho nvcc\n"}
    for tool in tools:
        at = toolkit / "bin" / "nvcc" if tool == "toolkit" else bin_dir / tool
        at.write_text(scripts.get(tool, scripts["nvcc"]))
        at.chmod(0o755)
        if tool == "toolkit":
            (toolkit / "include").mkdir()
            (toolkit / "include" / "cublas_v2.h").write_text("")
    for basic in ("grep", "tr", "sort", "paste", "cut", "uname", "cat", "ls", "readlink", "dirname"):
        target = Path("/usr/bin", basic) if Path("/usr/bin", basic).exists() else Path("/bin", basic)
        (bin_dir / basic).symlink_to(target)
    script = 'say() { echo "said: $*"; }; source scripts/cmake-args.sh; gpu_choice; rc=$?; echo "$rc|$GPU|$ARGS"'
    full = {"PATH": f"{bin_dir}:{toolkit / 'bin'}", "CUDA_HOME": str(tmp_path / "no-cuda"), **env}
    proc = subprocess.run(["/bin/bash", "-c", script], cwd=ROOT, env=full, capture_output=True, text=True, timeout=30)
    *said, last = proc.stdout.strip().split("\n")
    rc, gpu, args = last.split("|")
    return int(rc), gpu, args, "\n".join(said)


def test_setup_builds_for_an_nvidia_gpu_on_top_of_the_cpu_flags(tmp_path: Path) -> None:
    """A GPU (the driver reports its compute capability) and a toolkit: CUDA for that GPU, RPC and the CPU's
    flags kept; SPECDEC_GPU=cpu builds for the CPU; SPECDEC_CMAKE_ARGS adds, never replaces."""
    rc, gpu, args, said = cmake_args(tmp_path, {}, ["nvidia-smi", "toolkit"])
    assert (rc, gpu) == (0, "cuda") and "building for an NVIDIA GPU (CUDA) as well as the CPU" in said
    assert "-DGGML_CUDA=ON" in args and args.endswith("-DCMAKE_CUDA_ARCHITECTURES=90")  # two GPUs of one model
    assert "-DGGML_RPC=ON" in args and "-DGGML_NATIVE=OFF" in args and "-DGGML_AMX_INT8=OFF" in args
    rc, gpu, args, said = cmake_args(tmp_path, {"SPECDEC_GPU": "cpu", "SPECDEC_CMAKE_ARGS": "-DX=1"}, ["toolkit"])
    assert (rc, gpu, said) == (0, "cpu", "") and "CUDA" not in args and args.startswith("-DGGML_RPC=ON")
    assert args.endswith(" -DX=1")


@pytest.mark.skipif(Path("/usr/local/cuda/include/cublas_v2.h").exists(), reason="a CUDA toolkit is installed "
                    "where the set-up looks for one")  # fmt: skip
def test_setup_without_a_cuda_toolkit_builds_for_the_cpu_and_says_what_to_install(tmp_path: Path) -> None:
    """No nvcc, or an nvcc without cuBLAS (which llama.cpp's CUDA backend links; a partial toolkit)."""
    cases = [(["nvidia-smi", "nvcc"], "(nvcc, but no cuBLAS header")]
    if not Path("/usr/local/cuda/bin/nvcc").exists():  # where the set-up looks when nvcc is not on PATH
        cases.append((["nvidia-smi"], "(nvcc)"))
    for tools, missing in cases:
        rc, gpu, args, said = cmake_args(tmp_path, {}, tools)
        assert (rc, gpu) == (0, "cpu") and "CUDA" not in args
        assert f"an NVIDIA GPU is here but no CUDA toolkit {missing}" in said and "building for the CPU only" in said
    rc, gpu, args, said = cmake_args(tmp_path, {"SPECDEC_GPU": "cuda"}, ["nvcc"])
    assert (rc, gpu) == (1, "missing-toolkit") and "no CUDA toolkit was found (nvcc, but no cuBLAS" in said


def test_setup_refuses_an_unknown_gpu_choice_and_builds_for_the_cpu_without_a_gpu(tmp_path: Path) -> None:
    rc, gpu, args, said = cmake_args(tmp_path, {"SPECDEC_GPU": "rocm"}, ["toolkit"])
    assert (rc, gpu) == (1, "invalid") and "SPECDEC_GPU must be cuda, cpu or unset (auto), got 'rocm'" in said
    rc, gpu, args, said = cmake_args(tmp_path, {}, ["toolkit"])  # a toolkit and no GPU: a CI machine
    assert (rc, gpu, said) == (0, "cpu", "") and "CUDA" not in args


# --------------------------------------------------------------- GPU layers
def test_gpu_layers_default_to_all_where_there_is_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "gpu_devices", lambda: (PRETEND,))
    assert kernels.gpu_layers(None, "n_gpu_layers") == kernels.ALL_LAYERS
    assert kernels.gpu_layers(7, "n_gpu_layers") == 7
    assert kernels.gpu_layers(0, "n_gpu_layers") == 0
    assert kernels.choose(True, n_gpu_layers=7) == (kernels.GPU, None)
    assert kernels.choose(False, n_gpu_layers=7) == (kernels.FAST, None)
    monkeypatch.setattr(native, "gpu_devices", lambda: ())
    assert kernels.gpu_layers(None, "n_gpu_layers") == 0
    assert kernels.gpu_layers(None, "n_gpu_layers", on_rpc=True) == 0  # RPC servers: every layer (engine/rpc.py)
    assert kernels.gpu_layers(5, "n_gpu_layers", on_rpc=True) == 5
    assert kernels.choose(True, n_gpu_layers=7)[0] != kernels.GPU  # the CPU's kernels, not a silent change
    with pytest.raises(InvalidSetting, match="must be 0 where llama.cpp has no GPU, got 5"):
        kernels.gpu_layers(5, "n_gpu_layers")
    with pytest.raises(InvalidSetting, match=">= 0"):
        kernels.gpu_layers(-1, "n_gpu_layers")


def test_this_build_reports_no_gpu() -> None:
    """The suite runs on CPU builds (CI): no device, so no layer goes anywhere by default."""
    assert native.gpu_devices() == ()


@pytest.mark.parametrize(("args", "needle"), [
    (["--gpu-layers", "5"], "--gpu-layers must be 0 where llama.cpp has no GPU, got 5"),
    (["--draft-gpu-layers", "3"], "--draft-gpu-layers must be 0 where llama.cpp has no GPU, got 3"),
    (["--kernels", "turbo"], "--kernels must be one of exact, fast, got 'turbo'"),
])  # fmt: skip
def test_gpu_options_on_a_cpu_build_are_one_line(args: list[str], needle: str) -> None:
    res = CliRunner().invoke(app, ["run", "hi", *args])
    assert res.exit_code == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {needle}"), lines
    with pytest.raises(InvalidSetting):
        check_kernels("turbo")


# ------------------------------------------------------------------ the probe
class Rows:
    """A model whose logits are a function of (position, token), plus `skew` in a batch of `from_width` tokens
    or more (a kernel that changes with the batch's width, as a GPU's do)."""

    n_batch, n_ctx = 64, 512

    def __init__(self, skew: float = 0.0, from_width: int = 9) -> None:
        self.skew, self.from_width, self.tokens = skew, from_width, []  # type: list[int]

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        return [1] if not text else [2 + ord(c) % 50 for c in text]

    def reset(self) -> None:
        self.tokens = []

    def prefill(self, ids: list[int]) -> None:
        self.tokens = list(ids)

    def rollback(self, n: int) -> None:
        del self.tokens[n:]

    def decode(self, ids: list[int], n_logits: int = 1) -> np.ndarray:
        start = len(self.tokens)
        self.tokens += ids
        rows = np.array([[np.sin(start + i + t * 0.1 + v) for v in range(8)] for i, t in enumerate(ids)], np.float32)
        if len(ids) >= self.from_width:
            rows += np.float32(self.skew)
        return rows[-n_logits:]


def test_the_gpu_probe_compares_every_width_after_each_prefix() -> None:
    assert kernels.batch_equals_single_after(Rows(), (64, 1024), tuple(range(1, 66))) is True
    assert kernels.batch_equals_single_after(Rows(1e-6, from_width=9), (64,), (1, 2, 8)) is True  # not reached
    assert kernels.batch_equals_single_after(Rows(1e-6, from_width=9), (64,), (1, 2, 8, 9)) is False
    assert kernels.batch_equals_single_after(Rows(np.nan, from_width=3), (0,), (1, 4)) is None
    assert kernels.GPU_PROBE_WIDTHS[:65] == tuple(range(1, 66)) and max(kernels.GPU_PROBE_WIDTHS) == 256


CUDA_INFO = ("CPU : SSE3 = 1 | BATCH_INVARIANT = 1 | CUDA : ARCHS = 900 | USE_GRAPHS = 1 | BATCH_INVARIANT_CUDA = {on} | "
             "BATCH_INVARIANT_CUDA_MAX = {width} | ")  # llama_print_system_info on a CUDA build with patch 0008


@pytest.mark.parametrize(("info", "width"), [
    (CUDA_INFO.format(on=1, width=128), 128),
    (CUDA_INFO.format(on=1, width=80), 80),
    (CUDA_INFO.format(on=1, width=40), 40),  # under a verification's widest: probed at every width, so it fails
    (CUDA_INFO.format(on=0, width=128), None),  # GGML_CUDA_BATCH_INVARIANT=0: llama.cpp's own kernels
    ("CPU : SSE3 = 1 | BATCH_INVARIANT = 1 | CUDA : ARCHS = 900 | USE_GRAPHS = 1 | ", None),  # a build without 0008
    ("CPU : SSE3 = 1 | BATCH_INVARIANT = 1 | ", None),  # a CPU build
])  # fmt: skip
def test_the_gpu_probe_takes_the_widths_patch_0008_covers(monkeypatch: pytest.MonkeyPatch, info: str,
                                                          width: int | None) -> None:  # fmt: skip
    """Patch 0008 computes batches of up to its width row by row on the GPU (wider ones with llama.cpp's own
    kernels): the probe takes every width up to it, which is all an exact GPU model's decodes use
    (Model.exact_width caps them); a build without it, or with it off, is probed at every width."""
    monkeypatch.setattr(native, "system_info", lambda: info)
    assert native.cuda_invariant_width() == width
    widths = kernels.gpu_probe_widths()
    if width is None or width < 66:
        assert widths == kernels.GPU_PROBE_WIDTHS
    else:
        assert max(widths) == width and widths[: min(width, 65)] == tuple(range(1, min(width, 65) + 1))
        assert set(widths) <= set(kernels.GPU_PROBE_WIDTHS) | {width}
    assert "BATCH_INVARIANT = 1" in info and kernels.invariant_build() is False  # a CPU feature, not the CUDA one
    assert native.cuda_invariant_switch.__wrapped__() is None  # no CUDA library in this process


def test_an_exact_gpu_target_decodes_within_the_width_patch_0008_covers(monkeypatch: pytest.MonkeyPatch,
                                                                        smol_path: Path) -> None:  # fmt: skip
    """With patch 0008 (pretended: its width read from the system info, the probe passed), an exact GPU target
    never decodes more than that width at once: a prompt goes in chunks of it, and so does a server step (its
    budget is n_batch). Wider, llama.cpp's own kernels would compute rows that depend on the batch's make-up."""
    from specdec_cli.engine import model as model_module

    monkeypatch.setattr(native, "gpu_devices", lambda: (PRETEND,))
    monkeypatch.setattr(model_module, "cuda_invariant_width", lambda: 48)
    monkeypatch.setattr(kernels, "batch_equals_single_after", lambda *a: True)
    monkeypatch.setenv("SPECDEC_KERNEL_PROBE", "always")
    with contextlib.closing(model_module.Model(smol_path, n_ctx=256, n_threads=THREADS, n_gpu_layers=kernels.ALL_LAYERS,
                                               n_batch=128)) as model:  # fmt: skip
        assert model.kernels == kernels.GPU and model.exact_width == 48 and model.n_batch == 48
        sizes = []
        run = model._run_batch
        monkeypatch.setattr(model, "_run_batch", lambda n, seqs: (sizes.append(n), run(n, seqs))[1])
        model.decode(model.tokenize("The quick brown fox " * 12, add_special=True, parse_special=False))
        assert max(sizes) <= 48 and len(sizes) >= 2
        engine = BatchEngine(model, None, AutoState(costs=BatchCosts({2: 1.2}, 0.01, interpolate=True)))
        try:
            assert engine.budget == 48
        finally:
            engine.close()


def test_each_model_sets_the_cuda_switch_for_its_own_decodes(smol_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch 0008's switch is process-wide: an exact GPU target turns it on before each of its decodes, a draft or
    `--kernels fast` model (or a CPU's) off, so each llama.cpp context runs (and keeps CUDA graphs of) its own.
    The greedy chain runs where the logits are on a GPU: turned on here for the CPU (backend_argmax.IN_GRAPH)."""
    from specdec_cli.engine import backend_argmax
    from specdec_cli.engine.model import Model

    monkeypatch.setattr(backend_argmax, "IN_GRAPH", True)

    with contextlib.closing(Model(smol_path, n_ctx=256, n_threads=THREADS)) as model:
        assert model._cuda_switch is None and model.exact_width is None  # a CPU build: no switch, no limit
        model._cuda_switch = switch = ctypes.c_bool(True)
        model.decode(model.tokenize("Hello", add_special=True, parse_special=False))
        assert switch.value is False  # the CPU's kernels set, not the GPU's
        model.kernels = kernels.GPU
        model.decode(model.tokenize(" there", add_special=False, parse_special=False))
        assert switch.value is True
        # the greedy draft's chain (patch 0006: llama_decode calls in a C loop) sets it too
        model.kernels = kernels.FAST
        ids = model.tokenize(" and", add_special=False, parse_special=False)
        model.decode_argmax(ids)
        model.decode_argmax(model.tokenize(" so", add_special=False, parse_special=False))  # the graph's argmax on
        assert model._argmax is not None and model._argmax.on and model._native is not None
        switch.value = True
        model.argmax_chain([ids[0]], 2, frozenset())
        assert switch.value is False


PRETEND_GPU = """
import json, sys
from specdec_cli.engine import kernels, native
native.gpu_devices = lambda: (native.Device("CUDA0", "Pretend GPU", 1000.0, 2000.0),)
kernels.GPU_PROBE_PREFIXES, kernels.GPU_PROBE_WIDTHS = (40,), (1, 2, 3, 5, 9)  # a CPU's minute, not a GPU's second
if sys.argv[2] == "fails":  # the kernels of a GPU that computes a batch differently (stock llama.cpp's CUDA)
    kernels.batch_equals_single_after = lambda *a: False
from specdec_cli import api
out = {}
for kernel_choice in ("exact", "fast"):
    with api.load(sys.argv[1], sys.argv[3], drafter="model", n_ctx=512, kernels=kernel_choice) as spec:  # SPECDEC_THREADS
        g = spec.generate("Name three colours.", max_tokens=24)
        out[kernel_choice] = {"kernels": spec.target.kernels, "warnings": spec.warnings, "notes": spec.notes,
                              "drafted": g.stats.drafted, "layers": spec.gpu_layers, "ids": g.token_ids,
                              "exact": g.models["exact"]}
print(json.dumps(out))
"""


@pytest.mark.parametrize("verdict", ["fails", "passes"])
def test_a_gpu_target_is_probed_and_decodes_alone_where_the_probe_fails(verdict: str, smol_path: Path,
                                                                        smol_q2k_path: Path, tmp_path: Path) -> None:  # fmt: skip
    """With a GPU (pretended: this CPU build puts no layer anywhere), exact mode probes the target at load; a
    failed probe leaves the target decoding alone with one line that names --kernels fast, a passed one drafts;
    `--kernels fast` drafts either way and says its output may differ. The greedy texts agree here: the CPU
    computes them all exactly."""
    env = {**os.environ, "SPECDEC_CACHE_DIR": str(tmp_path), "SPECDEC_CALIBRATE": "0"}
    proc = subprocess.run([sys.executable, "-c", PRETEND_GPU, str(smol_path), verdict, str(smol_q2k_path)], capture_output=True,
                          text=True, timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    exact, fast = out["exact"], out["fast"]
    assert exact["layers"] == [kernels.ALL_LAYERS, kernels.ALL_LAYERS]
    if verdict == "fails":
        assert exact["kernels"] == kernels.INEXACT and exact["drafted"] == 0
        assert len(exact["warnings"]) == 1 and "on this GPU llama.cpp computes a batch of tokens differently" in \
            exact["warnings"][0] and "`--kernels fast` drafts" in exact["warnings"][0]
    else:
        assert exact["kernels"] == kernels.GPU and exact["warnings"] == [] and exact["drafted"] > 0
    assert exact["exact"] is True and exact["notes"] == []
    assert fast["kernels"] == kernels.FAST and fast["drafted"] > 0 and fast["exact"] is False
    assert fast["notes"] == [kernels.FAST_NOTE] and fast["warnings"] == []
    assert exact["ids"] == fast["ids"]
    verdicts = json.loads((tmp_path / "kernels.json").read_text())
    assert list(verdicts.values()) == [verdict == "passes"] and "Pretend GPU" in next(iter(verdicts))


def test_kernels_fast_is_said_in_the_summary_the_json_and_the_server_block(smol_path: Path) -> None:
    base = ["run", "Name a colour.", "--target", str(smol_path), "-n", "6", "--ctx-size", "512", "--threads", str(THREADS)]
    res = CliRunner().invoke(app, [*base, "--kernels", "fast", "--json"], env={"SPECDEC_CALIBRATE": "0"})
    assert res.exit_code == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["models"]["exact"] is False and d["models"]["kernels"]["target"] == kernels.FAST
    assert f"Note: {kernels.FAST_NOTE}" in res.stderr
    res = CliRunner().invoke(app, [*base, "--kernels", "fast"], env={"SPECDEC_CALIBRATE": "0", "NO_COLOR": "1"})
    assert res.exit_code == 0 and "this text may differ from the target alone in rare tokens" in res.stderr
    res = CliRunner().invoke(app, [*base, "--json"], env={"SPECDEC_CALIBRATE": "0"})
    assert json.loads(res.stdout)["models"]["exact"] is True and "differ" not in res.stderr


# ------------------------------------------------ llama.cpp's tools, errors
def test_llama_cpp_tools_run_on_the_targets_device_and_kernels(tmp_path: Path) -> None:
    cfg = BenchConfig("model:4", "model", 4)
    gpu = " ".join(external.llama_cpp_command(tmp_path, cfg, Path("t.gguf"), Path("d.gguf"), "hi", max_tokens=8,
                                              threads=2, ctx=512, kernel_set=kernels.INEXACT, gpu_layers=(999, 999)))  # fmt: skip
    assert "-fa auto -ngl 999" in gpu and "-ngld 999" in gpu and "--no-repack" not in gpu
    cpu = " ".join(external.llama_cpp_command(tmp_path, cfg, Path("t.gguf"), Path("d.gguf"), "hi", max_tokens=8,
                                              threads=2, ctx=512, kernel_set=kernels.INEXACT))  # fmt: skip
    assert "-fa off --no-repack -ngl 0" in cpu and "-ngld 0" in cpu
    assert external.target_kernels(kernels.INVARIANT)[0] == ["-fa", "on", "-ngl", "0"]
    assert external.target_kernels(kernels.FAST, 20)[0] == ["-fa", "auto", "-ngl", "20"]
    # patch 0008's CUDA kernels where specdec's target computes with them (its probe passed), llama.cpp's elsewhere
    assert external.target_kernels(kernels.GPU, 999)[1]["GGML_CUDA_BATCH_INVARIANT"] == "1"
    for other in (kernels.FAST, kernels.INEXACT, kernels.INVARIANT):
        assert external.target_kernels(other, 999)[1]["GGML_CUDA_BATCH_INVARIANT"] == "0"


def test_a_gpu_out_of_memory_is_one_line_naming_the_fix() -> None:
    native.clear_log()
    assert native.out_of_memory("m.gguf", "put fewer there (--gpu-layers)") is None
    native._LOG_LINES.append("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4096.00 MiB on device 0: "
                             "cudaMalloc failed: out of memory\n")  # fmt: skip
    err = native.out_of_memory("m.gguf with 999 layers on the GPU", "put fewer there (--gpu-layers)")
    native.clear_log()
    assert isinstance(err, DeviceError) and "\n" not in str(err)
    assert str(err).startswith("m.gguf with 999 layers on the GPU does not fit in memory (ggml_backend_cuda")
    assert str(err).endswith("put fewer there (--gpu-layers), or free the GPU")


def test_llama_cpp_libraries_that_do_not_load_are_one_line(tmp_path: Path) -> None:
    """A build whose libraries cannot load here (a CUDA build without the NVIDIA driver fails the same way):
    one line and exit 1, not a traceback."""
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "specdec_cli", "run", "hi", "-n", "2"], capture_output=True,
                          text=True, timeout=120, env=env)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: llama.cpp's libraries could not be loaded ("), lines
    assert "SPECDEC_GPU=cpu bash scripts/setup.sh" in lines[0]


def test_graph_shapes_times_each_shape_with_and_without_graphs_and_counts_llama_cpps_reuse(smol_path: Path,
                                                                                        tmp_path: Path) -> None:  # fmt: skip
    """scripts/gpu/graph_shapes.py (gpu-check's CUDA graphs step) on the CPU: every pattern's shapes timed in each
    run (graphs, not parked, none, llama.cpp's key, rebuilt each call); llama.cpp reuses its graph while the shape
    stays, and at a change of shape patch 0014 takes a parked one where llama.cpp (LLAMA_GRAPH_PARK=0) builds it
    again."""
    out = tmp_path / "graph-shapes.json"
    proc = subprocess.run([sys.executable, "scripts/gpu/graph_shapes.py", str(out), str(smol_path), "4", str(THREADS)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["gpu"] is False and got["steps"] == 4
    patterns = got["patterns"]
    assert list(patterns) == ["steady 1", "steady 5", "1,5", "2,3,4,5"]
    for name, shapes in (("steady 1", ["1"]), ("steady 5", ["5"]), ("1,5", ["1", "5"]), ("2,3,4,5", ["2", "3", "4", "5"])):
        assert [k for k in patterns[name] if not k.startswith("graph_reused")] == shapes
        for n in shapes:
            r = patterns[name][n]
            assert len(r["ms_graphs"]) == 2 and min(r["ms_graphs"]) > 0 and r["ms_no_graphs"] > 0
            assert r["off_over_on"] > 0
            # patch 0013 off (llama.cpp's key for captured graphs), timed in a process of its own
            assert r["ms_node_key"] > 0 and r["node_key_over_on"] > 0
            assert r["ms_rebuilt"] > 0 and r["rebuilt_over_on"] > 0  # LLAMA_GRAPH_REUSE_DISABLE=1
            assert r["ms_unparked"] > 0 and r["unparked_over_on"] > 0  # LLAMA_GRAPH_PARK=0

    def reused(name: str, key: str = "graph_reused") -> int:
        done, calls = map(int, patterns[name][key].split("/"))
        assert calls == 12  # 8 warm-up calls and 4 timed
        return done

    # a steady shape reuses its graph after the first call (after the prompt, a graph of its own)
    assert min(reused(n, k) for n in ("steady 1", "steady 5") for k in ("graph_reused", "graph_reused_unparked")) >= 11
    # alternating shapes: each shape's graph is built once at most, then taken back from the parked ones; with
    # parking off, llama.cpp builds it again at every change of shape
    assert reused("1,5") >= 10 and reused("2,3,4,5") >= 8
    assert reused("1,5", "graph_reused_unparked") == reused("2,3,4,5", "graph_reused_unparked") == 0
    assert all(p["graph_reused_when_rebuilt"] == "0/12" for p in patterns.values())
    # then more shapes in turn than patch 0013 keeps graphs for (a short run of them on a CPU), and 1-token calls
    many = got["many_shapes"]
    runs = ["graphs", "not parked", "no graphs", "graphs, llama.cpp's key", "graphs again", "rebuilt each call"]
    assert many["shapes"] == 3 and list(many["ms_1"]) == list(many["ms_1_steady"]) == runs
    assert min(many["ms_1"].values()) > 0
    assert many["ms_1_steady"]["graphs"] == patterns["steady 1"]["1"]["ms_graphs"][0]
    assert "after 3 shapes, 3 calls each: 1-token calls graphs " in proc.stdout


def test_the_graph_shapes_table_shows_llama_cpps_key_beside_patch_0013s_where_the_run_timed_it(monkeypatch) -> None:
    """docs/gpu.md's CUDA graphs table (benchmarks/report_gpu.graph_shapes): a results file from before patch 0013
    keeps its columns; one whose graph_shapes.py timed llama.cpp's key too gets that call's time and its ratio, and
    one that timed parking off (patch 0014) gets that too."""
    from benchmarks import report_gpu

    stamp = {"gpu": "G", "gpu_memory": "1 MiB", "driver": "d", "cuda_driver_version": "c", "nvcc": "n", "cpu": "x",
             "cores": 1, "date": "2026-11-28", "commit": "abcdef0"}  # fmt: skip
    old = {"ms_graphs": [3.0, 3.1], "ms_no_graphs": 3.3, "off_over_on": 1.08}
    new = {**old, "ms_node_key": 4.1, "node_key_over_on": 1.34}
    for row, has_key in ((old, False), (new, True)):
        data = {"stamp": stamp, "graph_shapes": {"target": "t.gguf", "steps": 64,
                                                 "patterns": {"1,5": {"1": row, "graph_reused": "0/72"}}}}  # fmt: skip
        monkeypatch.setattr(report_gpu, "load", lambda name, d=data: d)
        out = report_gpu.graph_shapes("x.json")
        header, line = out.splitlines()[0], out.splitlines()[2]
        assert ("llama.cpp's key" in header) is has_key, header
        assert ("4.10 ms" in line and "1.34x" in line) is has_key, line
        assert "3.00 ms / 3.10 ms" in line and line.rstrip(" |").endswith("0/72"), line
    # patch 0014's run: parking off timed too, and its count of reused graphs beside the parked run's
    parked = {**new, "ms_unparked": 3.7, "unparked_over_on": 1.22}
    data = {"stamp": stamp, "graph_shapes": {"target": "t.gguf", "steps": 64, "patterns": {
        "1,5": {"1": parked, "graph_reused": "72/72", "graph_reused_unparked": "0/72"}}}}  # fmt: skip
    monkeypatch.setattr(report_gpu, "load", lambda name, d=data: d)
    header, _, line = report_gpu.graph_shapes("x.json").splitlines()[:3]
    assert "not parked (patch 0014 off)" in header and "3.70 ms" in line and "1.22x" in line, line
    assert line.rstrip(" |").endswith("72/72 (0/72)"), line
