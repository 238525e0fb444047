"""Greedy tokens computed where the logits are: llama.cpp's backend sampling with its greedy sampler.

A greedy step needs one number per row of logits, its argmax. Read back and reduced by numpy, every row
costs a copy out of the graph (inside `llama_decode`: the whole vocabulary, from the GPU over PCIe on a GPU)
and a pass over memory the decode has just swept from the caches (docs/design.md#host-time). With a greedy
sampler attached to the context, llama.cpp adds an argmax per output row to the graph, computed by the
backend that holds the logits, and copies back only the token ids (`llama_get_sampled_token_ith`); raw logits
are then not copied at all. The argmax is the same reduction on the same logits (the first maximum), so a
token is the one numpy's argmax gives, and the target alone and the verification take the same path.

Where it pays: where the logits are on a GPU (`in_graph`). On a CPU the logits are already in host memory and
a vectorised argmax over them is cheaper than llama.cpp's: its graph pads the logits with a zero row element by
element and its CPU argmax is a scalar loop, and an A/B in one process (`specdec run`-shaped generations,
the packaged pair, greedy) gave numpy's path the higher tokens per second, alone and with a draft model, even
though the time outside `llama_decode` (host time) reads lower with the graph's: the work moves into the
decode, it does not go away. So on a CPU greedy tokens are the host's (engine/greedy.py; tests turn the
graph's on: `IN_GRAPH`).

Attached per sequence, only for greedy decoding, and only once the model's logits were seen finite
(`Model.decode_argmax` and `Model.decode_many` check their first reads with numpy): in-graph, a NaN row would
give a token, not an error. Attaching or detaching rebuilds the graph's reservation (milliseconds), so a
sequence keeps it while its generations are greedy and drops it when its logits are read again (a sampled
run). The batch engine attaches one per greedy slot: a batch whose output rows all belong to sequences with a
sampler copies no logits at all; with one sampled sequence beside them, llama.cpp copies every row's. A
sampler whose sequence is not in a batch still takes an argmax (of a dummy row): cheap on a GPU.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

IN_GRAPH: bool | None = None  # None: where the logits are on a GPU (`in_graph`); tests set True to run it on a CPU


def in_graph(C: Any, model: Any, n_gpu_layers: int) -> bool:  # noqa: N803
    """Whether a model's greedy tokens are computed in llama.cpp's graph: where its output layer, and so its
    logits, are on a GPU (llama.cpp puts it there when every layer is)."""
    return IN_GRAPH if IN_GRAPH is not None else n_gpu_layers > int(C.llama_model_n_layer(model))


class BackendArgmax:
    """Greedy sampler chains of `ctx`'s sequences, attached on demand; `free` after the context is freed."""

    def __init__(self, C: Any, ctx: Any) -> None:  # noqa: N803
        self._C, self._ctx = C, ctx
        self.refused = False  # llama.cpp would not attach it: the numpy path for good
        self.chains: dict[int, Any] = {}  # attached now, by sequence
        self._retired: list[Any] = []  # detached, freed once a decode has rebuilt the graph without them
        self.token_at = C.llama_get_sampled_token_ith  # (ctx, row): a row's token

    @property
    def on(self) -> bool:
        """Sequence 0's is attached (a one-sequence context's greedy path)."""
        return 0 in self.chains

    def attach(self, seq: int = 0) -> bool:
        """Attach a greedy sampler to `seq` (False: this context cannot offload it, logits it is). A chain is set
        up for one context once (llama.cpp asserts it), so each attach makes a new one."""
        C = self._C  # noqa: N806
        if self.refused:  # this context cannot offload it: once is enough to know (llama.cpp warns each time)
            return False
        if seq in self.chains:
            return True
        chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_greedy())  # the chain owns it
        if C.llama_set_sampler(self._ctx, seq, chain):
            self.chains[seq] = chain
            return True
        C.llama_sampler_free(chain)
        self.refused = True
        return False

    def detach(self, seq: int = 0) -> None:
        chain = self.chains.pop(seq, None)
        if chain is not None:
            self._C.llama_set_sampler(self._ctx, seq, None)
            self._retired.append(chain)

    def prepare(self, seqs: Collection[int], greedy: Collection[int], allowed: bool) -> frozenset[int]:
        """Before a batch with output rows of `seqs`: the sequences whose rows will be the graph's argmaxes. Those
        in `greedy` get a chain where `allowed` (the logits were seen finite, no hidden states); every other one
        of `seqs` loses its own, its logits being read. A sequence with no output row keeps what it has."""
        want = {s for s in greedy if s in seqs} if allowed and not self.refused else set()
        for seq in seqs:
            if seq in self.chains and seq not in want:
                self.detach(seq)
        for seq in want:
            if not self.attach(seq):
                return frozenset()
        return frozenset(want)

    def decoded(self) -> None:
        """A decode rebuilt the graph: nothing holds a detached chain any more."""
        if self._retired:
            for chain in self._retired:
                self._C.llama_sampler_free(chain)
            self._retired.clear()

    def tokens(self, n: int, end: int = 0) -> list[int]:
        """The last decode's `n` output rows' tokens that end `end` rows before its last one, in order."""
        got = [int(self.token_at(self._ctx, i)) for i in range(-n - end, -end)]
        if got and min(got) < 0:  # a row without a token: the batch did not ask for these outputs
            raise RuntimeError(f"llama.cpp sampled no token for one of the outputs {-n - end}..{-end - 1}: {got}")
        return got

    def free(self) -> None:
        self.decoded()
        for chain in self.chains.values():
            self._C.llama_sampler_free(chain)
        self.chains.clear()
