"""Slots' caches kept in host memory when a new request takes a slot over (llama-server's prompt cache).

A request reuses what its slot's cache holds of its prompt (the common prefix) and the slot's other
tokens are dropped. With more conversations than slots, or prompts that share only a system prompt
(admission.py gives such a prompt the slot that holds that system prompt), a request often drops a
conversation that comes back later, which then reads its whole prompt again. The cache keeps what a
slot held when a request drops at least `MIN_SAVED` of its tokens: the target's sequence state
(llama.cpp's `llama_state_seq_get_data`: the cells' keys and values), with the tokens it holds. A new
request whose prompt shares a longer prefix with a kept state than with its slot has that state restored
into its slot first. A restored state computes bit for bit as a fresh prefill of the same tokens
(`Model.restore_seq`; tests/test_batch.py compares the logits), so the output stays the target's.

Bounded by bytes (`--prompt-cache-mb`), least recently used out first; a kept state that is a prefix of
a newer one is dropped (the newer one serves every prompt it served). Saving and restoring run on the
engine's thread, between steps: a memory copy of the slot's cells (tens of kilobytes a token for a small
model, over a hundred for an 8B one), so a state is restored only where it saves more than a few tokens
of prefill (`MIN_GAIN`, and a token of prefill per `TOKENS_PER_GAIN` tokens copied). A slot whose request
ended is kept while the engine has nothing to step (`keep`), so that the copy is not made while the request
that displaces it waits for its first token. The draft model's
cache is not kept: a draft catches up on its own (drafters/model.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from specdec_cli.engine.kv_cache import first_difference
from specdec_cli.engine.protocol import LoadedModel
from specdec_cli.errors import SpecdecError

MIN_SAVED = 16  # tokens a request must drop from its slot for them to be kept
MIN_GAIN = 4  # a kept state is restored where it holds at least this many more prompt tokens than the slot
TOKENS_PER_GAIN = 64  # ... and at least one more per this many tokens it copies


class PromptCache:
    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._states: OrderedDict[tuple[int, ...], bytearray] = OrderedDict()  # oldest first
        self.bytes_used = 0
        self.saved = 0  # states kept
        self.restored = 0  # states restored into a slot
        self.tokens_restored = 0  # prompt tokens those restores spared a prefill
        self.idle_keep = False  # `keep` slots while the engine is idle (the server turns it on)

    def __len__(self) -> int:
        return len(self._states)

    def best(self, prompt: Sequence[int]) -> tuple[tuple[int, ...], int]:
        """The kept state sharing the longest prefix with `prompt`, and that prefix's length ((), 0: none)."""
        best: tuple[tuple[int, ...], int] = ((), 0)
        head = list(prompt)
        for tokens in self._states:
            n = _common(tokens, head)
            if n > best[1]:
                best = (tokens, n)
        return best

    def put(self, tokens: tuple[int, ...], data: bytearray) -> None:
        if len(data) > self.budget_bytes:
            return
        for kept in [t for t in self._states if len(t) <= len(tokens) and tokens[: len(t)] == t]:
            self.bytes_used -= len(self._states.pop(kept))  # covered by the new one
        while self._states and self.bytes_used + len(data) > self.budget_bytes:
            self.bytes_used -= len(self._states.popitem(last=False)[1])
        self._states[tokens] = data
        self.bytes_used += len(data)
        self.saved += 1

    def keep(self, target: LoadedModel, seq: int) -> None:
        """Keep what slot `seq` holds now, unless it is kept already (or within a kept state), short, or being
        moved. With `idle_keep` on, the engine calls it when it has nothing to step, for a slot whose request
        ended: a later request that takes the slot over then finds its cells kept and copies nothing before its
        prompt is read (at one client, the copy was most of a request's own host time:
        benchmarks/request_profile.py). Off unless the owner of the models says nothing else uses them while
        the engine is idle (the server does; `specdec heads train` reads the target itself between batches)."""
        held = target.seq_tokens[seq]
        if len(held) < MIN_SAVED or seq in target.pending_moves:
            return
        now = tuple(held)
        if now in self._states or any(len(t) > len(now) and t[: len(now)] == now for t in self._states):
            return
        try:
            self.put(now, target.save_seq(seq))
        except SpecdecError:  # llama.cpp would not save it: a later take-over tries again (its own error then)
            self.idle_keep = False

    def take_over(self, target: LoadedModel, seq: int, prompt: Sequence[int]) -> int:
        """Ready slot `seq` for `prompt`: keep what it holds that a request may come back to, restore a kept
        state that holds more of the prompt than the slot does. Returns the prompt tokens the slot's cache then
        holds (the common prefix; the caller rolls back to it)."""
        held = target.seq_tokens[seq]
        common = target.common_prefix(prompt, seq)
        if seq in target.pending_moves:  # its stream is copied over as the next decode starts: nothing to save,
            return common  # and a restore would be overwritten (admission.py's set_aside, in the same admission)
        tokens, n = self.best(prompt)
        now = tuple(held)
        if now in self._states:
            self._states.move_to_end(now)
        elif len(held) - common >= MIN_SAVED:
            self.put(now, target.save_seq(seq))
        if n - common >= max(MIN_GAIN, len(tokens) // TOKENS_PER_GAIN):
            data = self._states[tokens]
            if target.restore_seq(seq, data, tokens):
                self._states.move_to_end(tokens)
                self.restored += 1
                self.tokens_restored += n - common
                return n
            return 0  # no room for it: the slot is empty now
        return common


def _common(kept: tuple[int, ...], prompt: list[int]) -> int:
    n = min(len(kept), len(prompt))
    a = list(kept[:n])
    return n if a == prompt[:n] else first_difference(a, prompt, n)
