"""llama.cpp's RPC backend: a model's layers on `rpc-server` processes, reached through ggml's backend registry.

The client side lives in the same libraries as the bindings (set-up builds them with GGML_RPC=ON), and so
does the server `specdec rpc-server` starts (engine/rpc_server.py): both speak exactly this build's
protocol. A model placed on servers gets their devices in `llama_model_params.devices` (nothing is
registered process-wide, so a local draft stays local); the servers' CPU backends run the default buffer
type (no repacked weights) with this build's kernels, and `check_exact` verifies on the loaded model that a
batch's logits equal single-token decoding, as exact mode needs.

Faults. llama.cpp's RPC client aborts the process when a server cannot be reached, speaks another
protocol, or stops answering: `probe` checks each endpoint in Python first (connect, the HELLO exchange,
the version), so the first two are one clear error; a server lost later is engine/rpc_faults.py's. After
a loss, a reload connects under another spelling of the endpoint (`retire`: a leading zero on the port,
as llama.cpp keeps one dispatcher per endpoint string and the old one is held by the abandoned model).
"""

from __future__ import annotations

import ctypes
import socket
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec_cli.engine import kernels
from specdec_cli.errors import RpcError, UsageError

PROTOCOL = (7, 0, 0)  # RPC_PROTO_*_VERSION in ggml-rpc.h of llama-cpp-python 0.3.36's llama.cpp
_HELLO = 14  # RPC_CMD_HELLO
_CAPS = 24  # RPC_CONN_CAPS_SIZE


def parse_endpoints(text: str | Sequence[str], what: str = "--rpc") -> tuple[str, ...]:
    """'HOST:PORT[,HOST:PORT...]' (or a list of them) as a tuple, each checked; UsageError names the bad one."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[str] = []
    for raw in items:
        item = raw.strip()
        host, sep, port = item.rpartition(":")
        if not sep or not host or ":" in host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise UsageError(f"{what}: {item!r} is not HOST:PORT (an IPv4 address or a name, and a port 1-65535)")
        endpoint = f"{host}:{int(port)}"
        if endpoint in out:
            raise UsageError(f"{what}: {endpoint} is given twice")
        out.append(endpoint)
    if not out:
        raise UsageError(f"{what} needs at least one HOST:PORT")
    return tuple(out)


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host, int(port)


def probe(endpoint: str, timeout: float = 5.0) -> tuple[int, int, int]:
    """Connect to `endpoint` and exchange HELLO as llama.cpp's client does; the server's protocol version.

    Raises RpcError naming the endpoint: nothing listening, no answer in time (the server serves one
    client at a time: another process may hold it), not an RPC server, or another protocol version."""
    host, port = split_endpoint(endpoint)
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except TimeoutError:
        raise RpcError(f"RPC server {endpoint} does not answer (no connection within {timeout:g} s)") from None
    except OSError as exc:
        raise RpcError(f"cannot reach the RPC server at {endpoint}: {exc.strerror or exc}") from None
    with sock:
        try:
            sock.sendall(struct.pack("<BQ", _HELLO, _CAPS) + bytes(_CAPS))
            head = _recv(sock, 8)
            (size,) = struct.unpack("<Q", head)
            if size != 4 + _CAPS:
                raise RpcError(f"{endpoint} is not a llama.cpp RPC server of this protocol (its HELLO answer has "
                               f"{size} bytes)")  # fmt: skip
            body = _recv(sock, size)
        except TimeoutError:
            raise RpcError(f"RPC server {endpoint} does not answer within {timeout:g} s: it serves one client at a "
                           "time; is another process using it?") from None  # fmt: skip
        except OSError as exc:
            raise RpcError(f"RPC server {endpoint} closed the connection ({exc.strerror or exc}): is it a "
                           "llama.cpp RPC server?") from None  # fmt: skip
    version = (body[0], body[1], body[2])
    if version[0] != PROTOCOL[0] or version[1] > PROTOCOL[1]:
        raise RpcError(f"RPC server {endpoint} speaks protocol {'.'.join(map(str, version))}, this build "
                       f"{'.'.join(map(str, PROTOCOL))}: start it with `specdec rpc-server` (the same llama.cpp "
                       "build) or update one side")  # fmt: skip
    return version


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            raise ConnectionResetError(0, "connection closed")
        buf += part
    return buf


# ------------------------------------------------------------------ the libraries
_LIBS: dict[str, Any] = {}


def ggml() -> Any:
    """libggml (the backend registry) and libggml-base (the abort callback), from the bindings' folder."""
    if "ggml" not in _LIBS:
        from specdec_cli.engine.native import bindings

        bindings()  # loads libllama, and with it the ggml libraries under their sonames
        base = ctypes.CDLL(_loaded("libggml-base.so"))
        lib = ctypes.CDLL(_loaded("libggml.so"))
        vp, cp = ctypes.c_void_p, ctypes.c_char_p
        for name, args, res in [
            ("ggml_backend_reg_by_name", [cp], vp),
            ("ggml_backend_reg_get_proc_address", [vp, cp], vp),
            ("ggml_backend_reg_dev_count", [vp], ctypes.c_size_t),
            ("ggml_backend_reg_dev_get", [vp, ctypes.c_size_t], vp),
            ("ggml_backend_dev_by_type", [ctypes.c_int], vp),
            ("ggml_backend_dev_name", [vp], cp),
            ("ggml_backend_dev_description", [vp], cp),
        ]:
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
        base.ggml_set_abort_callback.argtypes = [vp]
        base.ggml_set_abort_callback.restype = vp
        _LIBS["ggml"], _LIBS["base"] = lib, base
    return _LIBS["ggml"]


def _loaded(name: str) -> str:
    """The file of this library the process has mapped already (the wheel ships `libggml.so` and
    `libggml.so.0` as two copies: opening the other one would give a second registry and abort callback)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split(maxsplit=5)[-1]
        if Path(path).name.startswith(name):
            return path
    from specdec_cli.engine.native import bindings

    return str(Path(bindings().__file__).parent / "lib" / f"{name}.0")


def rpc_reg() -> Any:
    lib = ggml()
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise RpcError("this llama.cpp build has no RPC backend: run scripts/setup.sh again (it builds with GGML_RPC=ON)")
    return reg


def proc(name: str, restype: Any, *argtypes: Any) -> Any:
    """A function the RPC backend exports through the registry (as llama.cpp's tools reach it)."""
    addr = ggml().ggml_backend_reg_get_proc_address(rpc_reg(), name.encode())
    if not addr:
        raise RpcError(f"this llama.cpp build's RPC backend has no {name}")
    return ctypes.CFUNCTYPE(restype, *argtypes)(addr)


# ------------------------------------------------------------------ devices for a model
_SPELLINGS: dict[str, int] = {}  # endpoint -> leading zeros on its port for the next connection
_SPELLING_LOCK = threading.Lock()


def _spelling(endpoint: str) -> str:
    host, port = split_endpoint(endpoint)
    with _SPELLING_LOCK:
        zeros = _SPELLINGS.get(endpoint, 0)
    return f"{host}:{'0' * zeros}{port}"


def retire(endpoint: str) -> None:
    """The next model on `endpoint` connects afresh (its dispatcher died with a server)."""
    with _SPELLING_LOCK:
        _SPELLINGS[endpoint] = _SPELLINGS.get(endpoint, 0) + 1


def devices(endpoints: Sequence[str], connected: Sequence[str] = ()) -> list[int]:
    """The ggml devices of these servers (probed first: a bad endpoint is an RpcError, not an abort)."""
    for endpoint in endpoints:
        if endpoint not in connected:  # a server this process holds already would not answer a second client
            probe(endpoint)
    add_server = proc("ggml_backend_rpc_add_server", ctypes.c_void_p, ctypes.c_char_p)
    lib = ggml()
    out: list[int] = []
    for endpoint in endpoints:
        reg = add_server(_spelling(endpoint).encode())
        n = lib.ggml_backend_reg_dev_count(reg) if reg else 0
        if n == 0:
            raise RpcError(f"RPC server {endpoint} offers no device")
        out += [lib.ggml_backend_reg_dev_get(reg, i) for i in range(n)]
    return out


@dataclass
class Placement:
    """Where a model's layers go: the servers (empty: local), and the share each takes (empty: by free memory)."""

    endpoints: tuple[str, ...] = ()
    tensor_split: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.tensor_split and len(self.tensor_split) != len(self.endpoints):
            raise UsageError(f"--tensor-split has {len(self.tensor_split)} shares for {len(self.endpoints)} RPC "
                             "servers: give one per server")  # fmt: skip
        if any(not (s >= 0) for s in self.tensor_split) or (self.tensor_split and sum(self.tensor_split) <= 0):
            raise UsageError("--tensor-split shares must be >= 0 and not all 0")

    def describe(self) -> str:
        return "local" if not self.endpoints else "rpc " + ",".join(self.endpoints)


def weights_by_device(lines: Sequence[str]) -> dict[str, float]:
    """MiB of weights per device, from llama.cpp's load log ("load_tensors: RPC0[127.0.0.1:50052] model
    buffer size = 258.00 MiB"): the endpoints as the user wrote them, and "local" for what stays here."""
    out: dict[str, float] = {}
    for line in lines:
        head, sep, size = line.partition("model buffer size =")
        if not sep:
            continue
        name = head.split(":", 1)[-1].strip()
        if "[" in name and name.endswith("]"):
            name = name[name.index("[") + 1 : -1]
            host, _, port = name.rpartition(":")
            name = f"{host}:{int(port)}" if port.isdigit() else name
        else:
            name = "local"
        try:
            mib = float(size.split()[0])
        except (ValueError, IndexError):
            continue
        out[name] = out.get(name, 0.0) + mib
    return out


def load_failure(path: Path, placement: Placement, reason: str) -> str:
    """What to tell the user when a model placed on RPC servers does not load (often: out of memory there)."""
    where = ", ".join(placement.endpoints)
    if "alloc" in reason.lower() or "memory" in reason.lower():
        return (f"the RPC server{'s' if len(placement.endpoints) > 1 else ''} {where} could not hold "
                f"{path.name}'s layers ({reason}): free memory there, add a server, or shift the split "
                "(--tensor-split)")  # fmt: skip
    return f"llama.cpp could not load {path.name} onto the RPC server{'s' if len(placement.endpoints) > 1 else ''} {where}" + (
        f": {reason}" if reason else "")


def check_exact(model: Any, placement: Placement, n: int = 12) -> None:
    """Refuse servers whose batch logits differ from single-token logits (a build with llamafile's sgemm
    or repacked weights): speculative output would then drift from the target alone. Costs n + 1 decodes
    at load."""
    if kernels.batch_equals_single(model, (n,)) is not True:  # None (non-finite logits) refused as before
        several = len(placement.endpoints) > 1
        raise RpcError(f"the RPC server{'s' if several else ''} {', '.join(placement.endpoints)} "
                       f"{'compute' if several else 'computes'} a batch of tokens differently from one token at a time (a llama.cpp build with "
                       "llamafile's sgemm or repacked weights?): speculative output would differ from the target "
                       "alone. Start them with `specdec rpc-server` (this build's kernels)")  # fmt: skip


def place(mparams: Any, placement: Placement, n_gpu_layers: int, max_devices: int,
          connected: Sequence[str] = ()) -> list[Any]:  # fmt: skip
    """Point `mparams` at the servers' devices: every layer (or `n_gpu_layers` of them) there, split by
    `placement.tensor_split` (default: llama.cpp's, by the memory each server reports free). Returns what
    `mparams` points to, to keep alive until the load is done."""
    devs = devices(placement.endpoints, connected)
    arr = (ctypes.c_void_p * (len(devs) + 1))(*devs, None)
    keep: list[Any] = [arr]
    mparams.devices = ctypes.addressof(arr)
    mparams.n_gpu_layers = n_gpu_layers if n_gpu_layers > 0 else 999
    if placement.tensor_split:
        shares = list(placement.tensor_split)
        if len(devs) != len(shares):
            raise RpcError("--tensor-split needs one share per device, and a server offers several: leave "
                           "--tensor-split out")  # fmt: skip
        split = (ctypes.c_float * max_devices)(*shares, *([0.0] * (max_devices - len(shares))))
        keep.append(split)
        mparams.tensor_split = split
    return keep


def parse_split(text: str | None) -> tuple[float, ...]:
    if not text:
        return ()
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"--tensor-split: {text!r} is not a list of numbers such as 3,1") from None
