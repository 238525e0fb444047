"""llama.cpp's RPC backend: a model's layers on `rpc-server` processes, reached through ggml's backend registry.

The client side lives in the same libraries as the bindings (set-up builds them with GGML_RPC=ON), and so
does the server `specdec rpc-server` starts (engine/rpc_server.py): both speak exactly this build's
protocol. A model placed on servers gets their devices in `llama_model_params.devices` (nothing is
registered process-wide, so a local draft stays local); the servers' CPU backends run the default buffer
type (no repacked weights) with this build's kernels, and `check_exact` verifies on the loaded model that a
batch's logits equal single-token decoding, as exact mode needs.

Faults. llama.cpp's RPC client aborts the process when a server cannot be reached, speaks another
protocol, or stops answering: `probe` checks each endpoint in Python first (connect, the HELLO exchange,
the version), so the first two are one clear error. A server that dies later fails inside llama.cpp's
dispatcher thread (one per endpoint), where `ggml_abort` calls our abort callback before `abort()`: the
callback notes the loss, tells whoever listens (`watch`), and then never returns, so the process lives on.
The thread that waited for that server (a generation's worker thread, engine/barrier.py) stays blocked
for good; the model on that connection is abandoned (freeing it would wait on the same dead dispatcher),
and a reload connects afresh under another spelling of the endpoint (a leading zero on the port: llama.cpp
keeps one dispatcher per endpoint string, and the old one is held by the abandoned model).
"""

from __future__ import annotations

import ctypes
import os
import socket
import stat
import struct
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from specdec_cli.errors import RpcError, UsageError

T = TypeVar("T")
PROTOCOL = (7, 0, 0)  # RPC_PROTO_*_VERSION in ggml-rpc.h of llama-cpp-python 0.3.36's llama.cpp
_HELLO = 14  # RPC_CMD_HELLO
_CAPS = 24  # RPC_CONN_CAPS_SIZE
DEFAULT_PORT = 50052


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


def devices(endpoints: Sequence[str]) -> list[int]:
    """The ggml devices of these servers (probed first: a bad endpoint is an RpcError, not an abort)."""
    for endpoint in endpoints:
        probe(endpoint)
    install_abort_callback()
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
    import numpy as np

    ids = [t for t in model.tokenize("The quick brown fox jumps over the lazy dog, and then it runs away.",
                                     add_special=True, parse_special=False)][:n]  # fmt: skip
    batch = np.array(model.decode(ids, n_logits=len(ids)), copy=True)
    model.reset()
    single = np.stack([np.array(model.decode([t])[0], copy=True) for t in ids])
    model.reset()
    if not np.array_equal(batch, single):
        several = len(placement.endpoints) > 1
        raise RpcError(f"the RPC server{'s' if several else ''} {', '.join(placement.endpoints)} "
                       f"{'compute' if several else 'computes'} a batch of tokens differently from one token at a time (a llama.cpp build with "
                       "llamafile's sgemm or repacked weights?): speculative output would differ from the target "
                       "alone. Start them with `specdec rpc-server` (this build's kernels)")  # fmt: skip


def parse_split(text: str | None) -> tuple[float, ...]:
    if not text:
        return ()
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"--tensor-split: {text!r} is not a list of numbers such as 3,1") from None


# ------------------------------------------------------------------ losing a server mid-generation
class RpcLost(RpcError):
    """A server stopped answering while we waited on it (the waiting thread will not come back)."""


@dataclass
class Loss:
    endpoints: tuple[str, ...]  # the ones that no longer answer (all in use, when none could be told apart)
    message: str

    def reason(self) -> str:
        return f"RPC server {', '.join(self.endpoints)} stopped answering ({self.message})"


@dataclass
class _Watch:
    in_use: dict[str, int] = field(default_factory=dict)  # endpoint -> models placed on it
    listeners: list[Callable[[Loss], None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


WATCH = _Watch()
_CALLBACK: list[Any] = []  # keep the ctypes callback alive


def listen(fn: Callable[[Loss], None]) -> Callable[[], None]:
    """Call `fn` (from llama.cpp's dispatcher thread) when a server is lost; returns the unsubscribe."""
    with WATCH.lock:
        WATCH.listeners.append(fn)

    def unsubscribe() -> None:
        with WATCH.lock:
            if fn in WATCH.listeners:
                WATCH.listeners.remove(fn)

    return unsubscribe


def using(endpoints: Sequence[str], delta: int) -> None:
    with WATCH.lock:
        for e in endpoints:
            WATCH.in_use[e] = WATCH.in_use.get(e, 0) + delta
            if WATCH.in_use[e] <= 0:
                del WATCH.in_use[e]


def cut_connections(endpoints: Sequence[str]) -> int:
    """Shut down this process's TCP connections to these servers (the ones abandoned models hold): a
    server that still runs then frees what it held for us and accepts the next connection (it serves one
    client at a time). Returns how many were cut."""
    peers: set[tuple[str, int]] = set()
    for e in endpoints:
        host, port = split_endpoint(e)
        try:
            for info in socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM):
                peers.add((str(info[4][0]), int(info[4][1])))
        except OSError:
            continue
    n = 0
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with s:
            try:
                if s.type == socket.SOCK_STREAM and s.getpeername() in peers:
                    s.shutdown(socket.SHUT_RDWR)
                    n += 1
            except OSError:
                pass
    return n


def lost_endpoints(candidates: Sequence[str]) -> tuple[str, ...]:
    """Which of these no longer accept a connection (all of them, when every one still does)."""
    dead = []
    for e in candidates:
        try:
            socket.create_connection(split_endpoint(e), timeout=1.0).close()
        except OSError:
            dead.append(e)
    return tuple(dead or candidates)


def _on_abort(message: bytes | None) -> None:
    text = (message or b"").decode("utf-8", errors="replace").strip()
    if "ggml-rpc" not in text:
        sys.stderr.write(text + "\n")  # not ours: abort() follows, as without the callback
        return
    detail = text.split(": ", 1)[-1].strip()
    with WATCH.lock:
        candidates = tuple(WATCH.in_use)
        listeners = list(WATCH.listeners)
    loss = Loss(lost_endpoints(candidates), detail)
    if not isinstance(threading.current_thread(), threading._DummyThread):
        # on one of our own threads (a connection made while loading): nothing else waits, and abort()
        # must not run: say what happened and end the process
        sys.stderr.write(f"Error: {loss.reason()}\n")
        sys.stderr.flush()
        os._exit(1)
    for fn in listeners:
        try:
            fn(loss)
        except Exception as exc:  # noqa: BLE001 - a listener's bug must not let abort() run
            sys.stderr.write(f"specdec: while handling a lost RPC server: {type(exc).__name__}: {exc}\n")
    threading.Event().wait()  # llama.cpp's dispatcher thread for the dead server: never back to abort()


def isolated(fn: Callable[[], T], endpoints: Sequence[str]) -> T:
    """`fn()` (a load: it talks to these servers) in a thread of its own: when one of them stops answering,
    that thread stays blocked inside llama.cpp for good, and this one raises RpcError instead."""
    result: list[Any] = []
    done = threading.Event()
    wanted = set(endpoints)

    def work() -> None:
        try:
            result.append(("ok", fn()))
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            result.append(("error", exc))
        done.set()

    def on_loss(loss: Loss) -> None:
        if wanted & set(loss.endpoints):
            result.append(("error", RpcLost(loss.reason())))
            done.set()

    unsubscribe = listen(on_loss)
    try:
        threading.Thread(target=work, name="specdec-rpc-load", daemon=True).start()
        done.wait()
    finally:
        unsubscribe()
    kind, value = result[0]
    if kind == "error":
        raise value
    return value


def install_abort_callback() -> None:
    if _CALLBACK:
        return
    ggml()
    cb = ctypes.CFUNCTYPE(None, ctypes.c_char_p)(_on_abort)
    _CALLBACK.append(cb)
    _LIBS["base"].ggml_set_abort_callback(ctypes.cast(cb, ctypes.c_void_p))
