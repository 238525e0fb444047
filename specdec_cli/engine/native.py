"""llama.cpp's process-wide side: the bindings, exact mode's kernel switch, the log, cores, quantize.

The ctypes bindings are imported here, lazily (`bindings()`), so that `--help` stays fast; only
engine/model.py and engine/vocab.py call into them for a model's handles.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import functools
import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any

from specdec_cli.engine.gguf import check_gguf_file
from specdec_cli.errors import DeviceError, ModelFileError, UsageError


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def busy_cores(samples: int = 3, interval: float = 0.01, loadavg: str = "/proc/loadavg") -> int:
    """Cores other work keeps busy now: the tasks the kernel counts as runnable (/proc/loadavg's fourth field),
    this one left out, the least of a few samples (a busy process stays runnable; a passing one does not). 0
    where it cannot be known: no /proc, or a process pinned to some of the machine's cores (the count is the
    whole machine's)."""
    if usable_cores() != (os.cpu_count() or 0):
        return 0
    least: int | None = None
    for i in range(samples):
        try:
            running = int(Path(loadavg).read_text().split()[3].split("/")[0]) - 1
        except (OSError, ValueError, IndexError):
            return 0
        least = running if least is None else min(least, running)
        if i + 1 < samples:
            time.sleep(interval)
    return max(0, least or 0)


def default_threads() -> tuple[int, str | None]:
    """Threads for llama.cpp when none are asked for: one per core other work leaves free, at least one, and
    the note that says so when that is fewer than the cores. ggml's threads meet at a spinning barrier after
    every operation: with a second load on every core, two threads on 2 cores decoded at 0.3-0.4 tokens/s in
    three of five runs where one thread kept about 100 (docs/install.md, troubleshooting). `SPECDEC_THREADS`
    names the count instead (a server on a shared machine, a test suite that must not depend on its neighbours)."""
    if (fixed := os.environ.get("SPECDEC_THREADS")) is not None:
        if not fixed.strip().isdigit() or int(fixed) < 1:
            raise UsageError(f"SPECDEC_THREADS must be a whole number >= 1, got {fixed!r}")
        return int(fixed), None
    cores = usable_cores()
    busy = busy_cores()
    threads = max(1, cores - busy)
    if threads == cores:
        return cores, None
    return threads, (f"{busy} other task{'s' if busy > 1 else ''} running on this machine's {cores} cores: "
                     f"{threads} thread{'s' if threads > 1 else ''} (--threads sets it)")  # fmt: skip


# Exact mode. Speculative verification decodes K+1 tokens in one batch; the output
# is identical to the target alone only if a batch computes bit-identical logits
# to single-token decoding. CPU kernels that break that are turned off or made
# row by row: the tiled K-quant matmul (taken above a batch-size floor) is off for
# the process; the repacked-weight GEMMs (taken from 4 rows) compute every row on
# its own where the build has specdec's patches (patches/llama.cpp/), which
# GGML_CPU_BATCH_INVARIANT=1 turns on, and are off for an exact model elsewhere;
# so is flash attention, which the patches compute in fixed chunks of cells
# (engine/kernels.py, engine/model.py). tests/test_engine.py checks bit-identity
# on the packaged models and their requantizations. ggml reads both variables once
# per process, at its first use.
os.environ.setdefault("GGML_CPU_TILED_MM", "0")
os.environ.setdefault("GGML_CPU_BATCH_INVARIANT", "1")
# The CUDA twin (patch 0008): on a GPU, batches of up to GGML_CUDA_BATCH_INVARIANT_MAX rows computed as their
# rows alone (matrix-vector kernels with one column's warps, attention one query at a time with a fixed KV
# split). Read when the library loads; each exact GPU model turns it on for its own decodes (engine/model.py).
os.environ.setdefault("GGML_CUDA_BATCH_INVARIANT", "1")

def batch_invariant_switch() -> ctypes.c_bool:
    """Patch 0001's switch in the ggml CPU library llama.cpp loaded, which every patched kernel reads at each
    call (benchmarks.kernels turns it off for rounds of llama.cpp's own kernels). ggml's CPU backend sets it
    when it starts, at the first model load."""
    return ctypes.c_bool.in_dll(_ggml_cpu(), "ggml_cpu_batch_invariant")


def q4_0_gemm_switch() -> ctypes.c_bool | None:
    """Patch 0002's switch: in batch-invariant mode Q4_0's repacked weights keep llama.cpp's GEMM (on x86 it
    sums each element as the GEMV that one token takes; the probe checks it at load) while it is true, else
    they go row by row like every other repacked type. None on a build without it."""
    try:
        return ctypes.c_bool.in_dll(_ggml_cpu(), "ggml_cpu_batch_invariant_gemm_q4_0")
    except (OSError, ValueError):
        return None


def cuda_invariant_width() -> int | None:
    """The widest batch patch 0008's CUDA kernels compute row by row, where this build has them and
    GGML_CUDA_BATCH_INVARIANT=1 turned them on (its system info says so); None elsewhere."""
    info = system_info() or ""
    key = "BATCH_INVARIANT_CUDA_MAX = "
    if "BATCH_INVARIANT_CUDA = 1 " not in info or key not in info:
        return None
    width = info.split(key, 1)[1].split(" ", 1)[0]
    return int(width) if width.isdigit() else None


@functools.cache
def cuda_invariant_switch() -> ctypes.c_bool | None:
    """Patch 0008's switch in the CUDA library llama.cpp loaded, read at every matrix product and attention
    op: an exact GPU model turns it on for its decodes and a draft's or `--kernels fast` model's off (each
    llama.cpp context keeps the CUDA graphs of its own setting). None on a build without it."""
    if cuda_invariant_width() is None:
        return None
    try:
        return ctypes.c_bool.in_dll(ctypes.CDLL("libggml-cuda.so.0", mode=os.RTLD_NOLOAD), "ggml_cuda_batch_invariant")
    except (OSError, ValueError):
        return None


@dataclasses.dataclass(frozen=True)
class Device:
    """A GPU llama.cpp can put layers on (a CUDA, Vulkan or Metal backend's device)."""

    name: str  # llama.cpp's: CUDA0
    description: str  # the driver's: NVIDIA H100 80GB HBM3
    free_mib: float
    total_mib: float


# ggml_backend_dev_type: CPU, GPU, IGPU (integrated), ACCEL, META (ggml-backend.h)
_GPU_TYPES = (1, 2)


@functools.cache
def gpu_devices() -> tuple[Device, ...]:
    """The GPUs this llama.cpp build found at start: none on a CPU build, and none on a GPU build on a machine
    without one (or with CUDA_VISIBLE_DEVICES empty). RPC servers' devices are typed GPU too, and are not
    counted: `--rpc` places layers on them (engine/rpc.py). One answer per process, read before any model."""
    system_info()  # the backends registered
    try:
        lib = ctypes.CDLL("libggml.so.0", mode=os.RTLD_NOLOAD)  # the registry (and, through it, ggml-base)
    except OSError:
        return ()
    ptr, text = ctypes.c_void_p, ctypes.c_char_p
    fns = {"ggml_backend_dev_count": ([], ctypes.c_size_t), "ggml_backend_dev_get": ([ctypes.c_size_t], ptr),
           "ggml_backend_dev_type": ([ptr], ctypes.c_int), "ggml_backend_dev_name": ([ptr], text),
           "ggml_backend_dev_description": ([ptr], text), "ggml_backend_dev_backend_reg": ([ptr], ptr),
           "ggml_backend_reg_name": ([ptr], text),
           "ggml_backend_dev_memory": ([ptr, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)], None)}  # fmt: skip
    for name, (args, res) in fns.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    found = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        if lib.ggml_backend_dev_type(dev) not in _GPU_TYPES or lib.ggml_backend_reg_name(
            lib.ggml_backend_dev_backend_reg(dev)
        ) == b"RPC":
            continue
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        found.append(Device(lib.ggml_backend_dev_name(dev).decode(errors="replace"),
                            lib.ggml_backend_dev_description(dev).decode(errors="replace"),
                            free.value / 2**20, total.value / 2**20))  # fmt: skip
    return tuple(found)


def _ggml_cpu() -> ctypes.CDLL:
    """The ggml CPU library llama.cpp loaded, opened by its soname (the wheel holds copies of the file under
    other names, which would load apart)."""
    system_info()  # the bindings, and so ggml's libraries, loaded
    return ctypes.CDLL("libggml-cpu.so.0", mode=os.RTLD_NOLOAD)


# ggml's CPU backend computes with OpenMP (libgomp), and libgomp keeps the team of every thread that has
# computed until that thread exits. Once a second thread computes while the first one's team exists, more
# OpenMP threads than cores are managed, libgomp stops spinning at barriers and every barrier waits in the
# kernel: a SmolLM2 token took 30 ms instead of 9.5 ms for the rest of the process, measured when the main
# thread had calibrated and the batch engine's thread then served (a parallel server's first start). A
# thread that is done computing for a while (a generation, a calibration, a check) lets its team go.
_GOMP: dict[str, Any] = {}


def release_compute_threads() -> None:
    """Free the calling thread's OpenMP team, if ggml uses one (the next computation starts a new one:
    a thread start, well under a millisecond). Never frees another thread's team."""
    pause = _GOMP.get("pause")
    if pause is None:
        try:  # only the copy ggml loaded (a build without OpenMP has none); a libgomp before OpenMP 5: none
            pause = _GOMP["pause"] = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD).omp_pause_resource_all
        except (OSError, AttributeError):
            return
    pause(1)  # omp_pause_soft; refused (nonzero) inside a parallel region: harmless


# llama.cpp's log goes through one process-wide callback: we keep the recent lines
# (to explain a failed load) and forward them to stderr only when asked to.
_LOG_LINES: collections.deque[str] = collections.deque(maxlen=200)
_LOG_STATE = {"verbose": False, "installed": False}
_LOG_LOCK = threading.Lock()
_LOG_CALLBACK: Any = None  # keep a reference: ctypes must not collect it


def bindings() -> Any:
    """Import the ctypes bindings lazily so `--help` stays fast. A library that does not load is one line
    (DeviceError): a CUDA build copied to a machine without the NVIDIA driver fails here, say."""
    try:
        import llama_cpp.llama_cpp as C  # noqa: N812
    except ImportError:
        raise
    except (OSError, RuntimeError) as exc:  # llama_cpp's own loader raises RuntimeError("Failed to load ...")
        raise DeviceError(f"llama.cpp's libraries could not be loaded ({str(exc).strip()}): a build for a GPU "
                          "needs its driver here; `SPECDEC_GPU=cpu bash scripts/setup.sh` builds for the CPU "
                          "only") from None  # fmt: skip
    return C


def system_info() -> str | None:
    """What this llama.cpp build compiled in and runs with (SIMD paths, OpenMP, repacking), as llama.cpp
    prints it: results files carry it, so a figure says which kernels it was measured on."""
    try:
        install_log_callback()  # llama_backend_init: the CPU backend registered
        text: bytes = bindings().llama_print_system_info()
    except (ImportError, OSError, AttributeError, DeviceError):
        return None
    return text.decode("utf-8", "replace").strip()


@functools.cache
def build_id() -> str:
    """A digest of the llama.cpp build this process runs: its system info and the bytes of the llama and ggml
    libraries it loaded. What is measured on one build (calibrated costs, the kernel probe's verdicts) says
    nothing of another: a set-up that builds new kernel patches installs a new wheel beside the same cache."""
    digest = hashlib.sha256((system_info() or "").encode())
    for path in sorted(_loaded_libraries(), key=lambda p: p.name):
        try:
            digest.update(path.name.encode() + path.read_bytes())
        except OSError:
            digest.update(path.name.encode())
    return digest.hexdigest()[:16]


def _loaded_libraries() -> list[Path]:
    """The llama and ggml libraries mapped into this process (Linux), else those the bindings ship."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    mapped = {Path(f[5]) for f in (line.split(None, 5) for line in maps.splitlines()) if len(f) == 6}
    libs = [p for p in mapped if p.name.startswith(("libllama", "libggml"))]
    if libs:
        return libs
    try:
        import llama_cpp

        return [p for p in (Path(llama_cpp.__file__).parent / "lib").glob("*") if p.is_file()]
    except (ImportError, OSError):
        return []


def set_verbose(verbose: bool) -> None:
    """Show llama.cpp's own log on stderr (it is hidden by default)."""
    _LOG_STATE["verbose"] = verbose
    install_log_callback()


def install_log_callback() -> None:
    global _LOG_CALLBACK
    with _LOG_LOCK:
        if _LOG_STATE["installed"]:
            return
        C = bindings()  # noqa: N806

        def _on_log(level: int, text: bytes | None, _user: Any) -> None:
            if not text:
                return
            line = text.decode("utf-8", errors="replace")
            _LOG_LINES.append(line)
            if _LOG_STATE["verbose"]:
                os.write(2, text)

        _LOG_CALLBACK = C.llama_log_callback(_on_log)
        C.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
        C.llama_backend_init()
        _LOG_STATE["installed"] = True


def clear_log() -> None:
    """Forget earlier lines (before a load, so that its failure is explained by its own)."""
    _LOG_LINES.clear()


def log_lines() -> list[str]:
    """llama.cpp's recent log lines (since the last `clear_log`)."""
    return list(_LOG_LINES)


def last_log_error() -> str:
    """The most telling recent llama.cpp log line, for an error message.

    llama.cpp logs the cause ("error loading model: tensor ... not within the file
    bounds", or the GGUF reader's "this GGUF file is version 7 but ...") before a
    generic "failed to load model": prefer the cause.
    """
    lines = [line.strip() for line in _LOG_LINES if line.strip()]
    for line in lines:  # the GGUF reader names what is wrong with the header
        if line.startswith("gguf_") and ": " in line and "failed to read" not in line:
            return line.split(": ", 1)[1]
    for line in reversed(lines):
        if "error loading model:" in line:
            cause = line.split("error loading model:", 1)[1].strip()
            if "failed to load model from" not in cause:
                return cause
    for line in reversed(lines):
        if "error" in line.lower() or "failed" in line.lower():
            return line
    return ""


def out_of_memory(what: str, fix: str) -> DeviceError | None:
    """The error for `what` when llama.cpp's log since the last `clear_log` has a failed allocation (a GPU out of
    memory: CUDA's "out of memory", ggml's "failed to allocate ... buffer"), else None."""
    for line in _LOG_LINES:
        if "out of memory" in line.lower() or ("alloc" in line and "failed" in line and "buffer" in line):
            return DeviceError(f"{what} does not fit in memory ({line.strip()}): {fix}, or free the GPU")
    return None


def load_failure(path: Path) -> str:
    """What to tell the user when llama.cpp refuses a file."""
    reason = last_log_error()
    size = path.stat().st_size
    if any(line.startswith("gguf_") and "failed to read header" in line for line in _LOG_LINES):
        return f"{path} ({size:,} bytes) has an invalid GGUF header: {reason or 'llama.cpp could not read it'}"
    hint = f": {reason}" if reason else ""
    if "bad_cast" in reason:  # a locale facet at another index: another libstdc++ (specdec_cli/cxx_runtime.py)
        return (f"llama.cpp could not load {path}{hint}: a library loaded before specdec brought its own C++ "
                "runtime and took the locale llama.cpp's tokenizer reads; import specdec (or run `specdec`) before "
                "it (docs/install.md#troubleshooting)")  # fmt: skip
    return (
        f"llama.cpp could not load {path} ({size:,} bytes){hint}. The file may be truncated "
        "(re-download it) or use an architecture this llama.cpp build does not know"
    )


def encode_utf8(text: str, what: str = "the text") -> bytes:
    """UTF-8 bytes, or a UsageError naming the first invalid byte.

    Python decodes argv and stdin with surrogateescape, so invalid input arrives
    as lone surrogates; they would otherwise fail deep inside tokenization.
    """
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = ord(text[exc.start])
        byte = f"byte 0x{bad - 0xDC00:02x}" if 0xDC80 <= bad <= 0xDCFF else f"code point U+{bad:04X}"
        raise UsageError(f"{what} is not valid UTF-8 ({byte} at character {exc.start})") from None


# llama_ftype values for the quantizations we derive models with (F32: a dequantized, bandwidth-bound target).
QUANT_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q2_K": 10, "Q3_K_S": 11, "Q3_K_M": 12, "Q4_K_M": 15}


def quantize(src: str | os.PathLike[str], dst: str | os.PathLike[str], qtype: str, n_threads: int = 0) -> None:
    """Requantize a GGUF through llama.cpp's quantize API (used to derive drafts)."""
    if qtype not in QUANT_TYPES:
        raise ModelFileError(f"unknown quantization {qtype!r}; choose one of {', '.join(QUANT_TYPES)}")
    check_gguf_file(src)
    install_log_callback()
    C = bindings()  # noqa: N806
    params = C.llama_model_quantize_default_params()
    params.ftype = QUANT_TYPES[qtype]
    params.allow_requantize = True
    params.nthread = n_threads
    ret = C.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if ret != 0:
        reason = last_log_error()
        raise ModelFileError(f"quantizing {src} to {qtype} failed{': ' + reason if reason else ''}")
