"""Greedy tokens computed where the logits are: llama.cpp's backend sampling with its greedy sampler.

A greedy step needs one number per row of logits, its argmax. Read back and reduced by numpy, every row
costs a copy out of the graph (inside `llama_decode`: the whole vocabulary, from the GPU over PCIe on a GPU)
and a pass over memory the decode has just swept from the caches (docs/design.md#host-time). With a greedy
sampler attached to the context, llama.cpp adds an argmax per output row to the graph, computed by the
backend that holds the logits, and copies back only the token ids (`llama_get_sampled_token_ith`); raw logits
are then not copied at all. The argmax is the same reduction on the same logits (the first maximum), so a
token is the one numpy's argmax gives, and the target alone and the verification take the same path.

Attached only for greedy decoding of a single-sequence context, and only once the model's logits were seen
finite (`Model.decode_argmax` checks its first call with numpy): in-graph, a NaN row would give a token,
not an error. Attaching or detaching rebuilds the graph's reservation (milliseconds), so a context keeps it
while decoding greedily and drops it when logits are read again (a sampled run).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

Chain = Callable[..., int]  # llama_specdec_argmax_chain, patch 0006


def chain_function(C: Any) -> Chain | None:  # noqa: N803
    """patches/llama.cpp/0006's greedy draft loop in C, or None where the library lacks it (not specdec's build)."""
    try:
        f = C._lib.llama_specdec_argmax_chain
    except AttributeError:
        return None
    i32, p32 = ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)
    f.argtypes = [ctypes.c_void_p, C.llama_batch, i32, i32, i32, p32, i32, p32, p32]
    f.restype = i32
    return f


class BackendArgmax:
    """A greedy sampler chain for sequence 0 of `ctx`, attached on demand; `free` after the context is freed."""

    NO_TOKEN = -100  # the chain's status where a decode gave no sampled token

    def __init__(self, C: Any, ctx: Any) -> None:  # noqa: N803
        self._C, self._ctx = C, ctx
        self.chain_fn = chain_function(C)
        self._out = (ctypes.c_int32 * 65)()
        self._status = ctypes.c_int32(0)
        self._stop: tuple[frozenset[int], Any] | None = None
        self.refused = False  # llama.cpp would not attach it: the numpy path for good
        self._chain: Any = None  # attached now
        self._retired: Any = None  # detached, freed once a decode has rebuilt the graph without it
        self.token_at = C.llama_get_sampled_token_ith  # (ctx, row): a row's token
        self.on = False

    def attach(self) -> bool:
        """Attach a greedy sampler (False: this context cannot offload it, logits it is). A chain is set up for
        one context once (llama.cpp asserts it), so each attach makes a new one."""
        C = self._C  # noqa: N806
        if self.refused:  # this context cannot offload it: once is enough to know (llama.cpp warns each time)
            return False
        self._free_retired()  # the decode after its detach rebuilt the graph: nothing holds it
        chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_greedy())  # the chain owns it
        self.on = bool(C.llama_set_sampler(self._ctx, 0, chain))
        if self.on:
            self._chain = chain
        else:
            C.llama_sampler_free(chain)
            self.refused = True
        return self.on

    def detach(self) -> None:
        if self.on:
            self._C.llama_set_sampler(self._ctx, 0, None)
            self._retired, self._chain, self.on = self._chain, None, False

    def run_chain(self, batch: Any, first: int, pos: int, k: int, stop: frozenset[int]) -> tuple[list[int], int]:
        """Decode `first` at `pos` and each sampled token after it, in C, until `k` tokens or a stop token: the
        tokens written and the status (0, llama_decode's failure, or NO_TOKEN)."""
        assert self.chain_fn is not None
        if len(self._out) < k:
            self._out = (ctypes.c_int32 * k)()
        if self._stop is None or self._stop[0] is not stop:  # a generation's stop set: one array for its steps
            ids: Sequence[int] = sorted(stop)
            self._stop = (stop, (ctypes.c_int32 * max(1, len(ids)))(*ids))
        n = self.chain_fn(self._ctx, batch, first, pos, k, self._stop[1], len(stop), self._out,
                          ctypes.byref(self._status))  # fmt: skip
        return self._out[:n], self._status.value

    def _free_retired(self) -> None:
        if self._retired is not None:
            self._C.llama_sampler_free(self._retired)
            self._retired = None

    def tokens(self, n: int) -> list[int]:
        """The last decode's last `n` output rows' tokens, in order."""
        got = [int(self.token_at(self._ctx, i)) for i in range(-n, 0)]
        if min(got) < 0:  # a row without a token: the batch did not ask for these outputs
            raise RuntimeError(f"llama.cpp sampled no token for one of the last {n} outputs: {got}")
        return got

    def free(self) -> None:
        self._free_retired()
        if self._chain is not None:
            self._C.llama_sampler_free(self._chain)
            self._chain = None
