"""Losing an RPC server: llama.cpp's abort turned into an error for whoever waited on that server.

llama.cpp's RPC client aborts the process when a server stops answering. The failure happens in its
dispatcher thread (one per endpoint), where `ggml_abort` calls the abort callback set here before
`abort()`: the callback notes the loss, tells whoever listens (`listen`), and then never returns, so the
process lives on. The thread that waited for that server (a generation's or a load's, started by
`isolated` or generation.py) stays blocked for good; the models on that connection are abandoned
(engine/model.py: freeing them would wait on the same dead dispatcher), this process's connections to
the servers are cut (`cut_connections`: a server still up frees what it held for us and accepts the
next client), and a reload connects afresh under another spelling of the endpoint (`rpc.retire`).
"""

from __future__ import annotations

import ctypes
import os
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from specdec_cli.engine.rpc import _LIBS, ggml, retire, split_endpoint
from specdec_cli.errors import RpcError

T = TypeVar("T")


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


def in_use() -> tuple[str, ...]:
    with WATCH.lock:
        return tuple(WATCH.in_use)


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


def forget(endpoints: Sequence[str]) -> None:
    """After a loss: cut this process's connections to these servers, and connect afresh next time."""
    cut_connections(endpoints)
    for e in endpoints:
        retire(e)


def lost_endpoints(candidates: Sequence[str], looks: int = 3) -> tuple[str, ...]:
    """Which of these no longer accept a connection (all of them, when every one still does). A server being
    killed can drop our connection an instant before its listening socket closes: when every one still
    accepts, look again (`looks` times, 0.2 s apart) before naming them all."""
    for look in range(looks):
        dead = []
        for e in candidates:
            try:
                socket.create_connection(split_endpoint(e), timeout=1.0).close()
            except OSError:
                dead.append(e)
        if dead:
            return tuple(dead)
        if look + 1 < looks:
            time.sleep(0.2)
    return tuple(candidates)


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
