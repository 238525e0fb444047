"""A model whose layers are on llama.cpp RPC servers (engine/rpc.py): `Model`, placed, checked, and able to
be abandoned when a server stops answering (engine/rpc_faults.py)."""

from __future__ import annotations

import os
from typing import Any

from specdec_cli.engine import rpc, rpc_faults
from specdec_cli.engine.model import Model
from specdec_cli.engine.native import last_log_error, log_lines
from specdec_cli.engine.rpc import Placement
from specdec_cli.errors import DeviceError, ModelFileError, RpcError


class PlacedModel(Model):
    """Every layer (or `n_gpu_layers`) on `placement`'s servers. The load runs in a thread of its own, so
    that a server dying during it is an error, not a process blocked for good."""

    def __init__(self, path: str | os.PathLike[str], *, placement: Placement, n_gpu_layers: int = 0,
                 **kw: Any) -> None:  # fmt: skip
        self.placement = placement
        self.where = {}
        self._counted = False  # counted in rpc_faults.using (which servers are in use, for the abort callback)
        self._n_gpu_layers = n_gpu_layers
        super().__init__(path, n_gpu_layers=n_gpu_layers, **kw)

    def _open(self, mparams: Any, init_context: Any) -> None:
        place = self.placement
        assert place is not None
        rpc_faults.install_abort_callback()
        held = rpc_faults.in_use()  # servers another model of this process is on (connected already)
        keep = rpc.place(mparams, place, self._n_gpu_layers, int(self._C.LLAMA_MAX_DEVICES), held)  # noqa: F841
        rpc_faults.using(place.endpoints, +1)
        self._counted = True
        try:
            rpc_faults.isolated(lambda: super(PlacedModel, self)._open(mparams, lambda: self._init(init_context)),
                                place.endpoints)  # fmt: skip
        except rpc_faults.RpcLost:  # a server died while loading: that thread will not come back
            self.abandon()
            rpc_faults.forget(place.endpoints)
            raise
        except (ModelFileError, DeviceError):  # llama.cpp refused the load: on servers, most often their memory
            self._uncount()
            raise RpcError(rpc.load_failure(self.path, place, last_log_error())) from None
        except BaseException:
            self._uncount()
            raise

    def _init(self, init_context: Any) -> None:
        self.where = rpc.weights_by_device(log_lines())  # llama.cpp's load log (before the context's fills it)
        init_context()

    def _ready(self) -> None:
        assert self.placement is not None
        if self.exact:  # `--kernels fast` asks for no check
            rpc.check_exact(self, self.placement)

    def _uncount(self) -> None:
        if self._counted and self.placement is not None:
            rpc_faults.using(self.placement.endpoints, -1)
        self._counted = False

    def abandon(self) -> None:
        """Its server stopped answering: freeing it would wait on that server for good, so its handles are
        dropped unfreed (a leak, once per lost server)."""
        self._uncount()
        super().abandon()

    def close(self) -> None:
        self._uncount()
        super().close()
