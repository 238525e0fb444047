"""A Speculator's models on llama.cpp RPC servers (engine/rpc.py): where they are, the loss of a server
(engine/rpc_faults.py), and opening them again once it answers."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol

from specdec_cli.engine import rpc, rpc_faults
from specdec_cli.engine.batch import BatchEngine
from specdec_cli.engine.drafters.auto import AutoState
from specdec_cli.engine.protocol import LoadedModel
from specdec_cli.errors import RpcError, UsageError
from specdec_cli.models import loading


class Speculator(Protocol):
    """What the link reads and replaces of api.py's `Speculator` (a protocol: api.py imports this module)."""

    target: LoadedModel
    draft: LoadedModel | None
    cross: bool
    _engine: BatchEngine | None
    _auto: AutoState | None


def placements(rpc_servers: str | Sequence[str] | None, draft_rpc: str | Sequence[str] | None,
               tensor_split: Sequence[float] | None, *, has_draft: bool) -> tuple[rpc.Placement | None, rpc.Placement | None]:  # fmt: skip
    """The target's and the draft's placements for `api.load`'s arguments (None: local)."""
    placement = rpc.Placement(rpc.parse_endpoints(rpc_servers), tuple(tensor_split or ())) if rpc_servers else None
    if tensor_split and placement is None:
        raise UsageError("--tensor-split shares the target's layers between --rpc servers: give --rpc too")
    draft_placement = rpc.Placement(rpc.parse_endpoints(draft_rpc, "--draft-rpc")) if draft_rpc else None
    if draft_placement is not None and not has_draft:
        raise UsageError("--draft-rpc places the draft model, and this run has none: drop --draft-rpc")
    return placement, draft_placement


class RpcLink:
    """Listens for the loss of the servers its Speculator's models are on (nothing when both are local)."""

    def __init__(self, spec: Speculator, loader: loading.Loader | None) -> None:
        self.spec = spec
        self.loader = loader  # to open a model again after its RPC server came back
        self.lost: rpc_faults.Loss | None = None  # a server stopped answering; the next start connects again
        self._lock = threading.Lock()  # one reconnect at a time
        self._loss_lock = threading.Lock()
        self._unlisten = rpc_faults.listen(self._on_lost) if self.endpoints else None

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The RPC servers the models are on (none: both local)."""
        out: list[str] = []
        for m in (self.spec.target, self.spec.draft):
            place = m.placement if m is not None else None
            if place is not None:
                out += [e for e in place.endpoints if e not in out]
        return tuple(out)

    @property
    def where(self) -> dict[str, Any]:
        """Where each model runs: "local", or MiB of its weights per RPC server (and here)."""
        out: dict[str, Any] = {}
        for role, m in (("target", self.spec.target), ("draft", self.spec.draft)):
            if m is not None:
                out[role] = "local" if m.placement is None else {k: round(v, 1) for k, v in m.where.items()}
        return out

    def _on_lost(self, loss: rpc_faults.Loss) -> None:
        """From llama.cpp's dispatcher thread: a server stopped answering. Every model on RPC servers is
        abandoned and its connections cut (a live server then frees what it held for us); a batch engine's
        generations end; the next `start` connects again."""
        mine = self.endpoints
        if not set(loss.endpoints) & set(mine):
            return
        with self._loss_lock:  # not _lock: a reconnect holds it while it waits on this thread's listeners
            if self.lost is not None:
                return
            self.lost = loss
        for m in (self.spec.target, self.spec.draft):
            if m is not None and m.placement is not None:
                m.abandon()
        rpc_faults.forget(mine)
        engine, self.spec._engine = self.spec._engine, None
        if engine is not None:
            engine.fail_all(RpcError(loss.reason()))

    def ready(self) -> None:
        """After a lost server: connect again before anything else uses the models."""
        if self.lost is not None:
            with self._lock:
                if self.lost is not None:
                    self._reconnect()

    def _reconnect(self) -> None:
        """After a lost server: connect again if every server answers (RpcError otherwise)."""
        loss, loader = self.lost, self.loader
        assert loss is not None and loader is not None
        for e in (loader.placement.endpoints if loader.placement else ()) + (
                loader.draft_placement.endpoints if loader.draft_placement else ()):  # fmt: skip
            try:
                rpc.probe(e)
            except RpcError as exc:
                raise RpcError(f"{loss.reason()} during an earlier generation; now {exc}") from None
        if loader.placement is not None:
            self.spec.target = loader.target()
        if self.spec.draft is not None and loader.draft_placement is not None:
            self.spec.draft = loader.draft(self.spec.cross)
        self.spec._auto = None if loader.draft_placement is not None else self.spec._auto  # a new draft: calibrate again
        self.lost = None

    def close(self) -> None:
        if self._unlisten is not None:
            self._unlisten()
