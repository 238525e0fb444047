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

from typing import Any


class BackendArgmax:
    """A greedy sampler chain for sequence 0 of `ctx`, attached on demand; `free` after the context is freed."""

    def __init__(self, C: Any, ctx: Any) -> None:  # noqa: N803
        self._C, self._ctx = C, ctx
        self._chain: Any = None  # attached now
        self._retired: Any = None  # detached, freed once a decode has rebuilt the graph without it
        self._token_at = C.llama_get_sampled_token_ith
        self.on = False

    def attach(self) -> bool:
        """Attach a greedy sampler (False: this context cannot offload it, logits it is). A chain is set up for
        one context once (llama.cpp asserts it), so each attach makes a new one."""
        C = self._C  # noqa: N806
        self._free_retired()  # the decode after its detach rebuilt the graph: nothing holds it
        chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_greedy())  # the chain owns it
        self.on = bool(C.llama_set_sampler(self._ctx, 0, chain))
        if self.on:
            self._chain = chain
        else:
            C.llama_sampler_free(chain)
        return self.on

    def detach(self) -> None:
        if self.on:
            self._C.llama_set_sampler(self._ctx, 0, None)
            self._retired, self._chain, self.on = self._chain, None, False

    def _free_retired(self) -> None:
        if self._retired is not None:
            self._C.llama_sampler_free(self._retired)
            self._retired = None

    def tokens(self, n: int) -> list[int]:
        """The last decode's last `n` output rows' tokens, in order."""
        got = [int(self._token_at(self._ctx, i)) for i in range(-n, 0)]
        if min(got) < 0:  # a row without a token: the batch did not ask for these outputs
            raise RuntimeError(f"llama.cpp sampled no token for one of the last {n} outputs: {got}")
        return got

    def free(self) -> None:
        self._free_retired()
        if self._chain is not None:
            self._C.llama_sampler_free(self._chain)
            self._chain = None
