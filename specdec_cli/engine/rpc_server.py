"""The child process of `specdec rpc-server`: llama.cpp's RPC server, from the bindings' own libraries.

    python -m specdec_cli.engine.rpc_server HOST:PORT THREADS [CACHE_DIR]

It calls `ggml_backend_rpc_start_server` (through the backend registry, as llama.cpp's rpc-server tool
does) on this machine's CPU device, so the protocol and the kernels are exactly the client's: exact mode's
switch (engine/native.py) is set before ggml starts, and a server's buffers are the CPU backend's default
type (no repacked weights). The call never returns; llama.cpp prints the banner and a line per client
connection on stdout, which the parent (cli/rpc_server.py) reads. The process ends with its parent.
"""

from __future__ import annotations

import ctypes
import signal
import sys

GGML_BACKEND_DEVICE_TYPE_CPU = 0
PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    endpoint, threads = argv[0], int(argv[1])
    cache = argv[2] if len(argv) > 2 and argv[2] else None
    try:  # end with the parent, whatever ends it (a test's server never outlives its test)
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass
    from specdec_cli.engine import native, rpc

    native.install_log_callback()  # llama_backend_init; llama.cpp's log kept, not printed
    lib = rpc.ggml()
    cpu = lib.ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)
    if not cpu:
        print("error: no CPU device in this build", file=sys.stderr)
        return 1
    start = rpc.proc("ggml_backend_rpc_start_server", None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                     ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p))  # fmt: skip
    devs = (ctypes.c_void_p * 1)(cpu)
    start(endpoint.encode(), cache.encode() if cache else None, threads, 1, devs)
    return 1  # it returns only when it could not listen or set up


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
