"""What the batch engine steps: a submitted generation (`BatchJob`), the slot that runs it (`Slot`: one
sequence in the target's and the draft's contexts), and one sequence seen as a single-sequence model
(`SeqView`, for the verifier)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from specdec_cli.engine.drafters import NgramDrafter, Proposal
from specdec_cli.engine.drafters.gate import ShadowScore
from specdec_cli.engine.drafters.medusa import HeadsDrafter
from specdec_cli.engine.estimates import Acceptance
from specdec_cli.engine.events import Event, Transcript
from specdec_cli.engine.protocol import LoadedModel, argmax_of_logits, chain_by_steps
from specdec_cli.engine.settings import GenerateOptions
from specdec_cli.engine.speculative import SpeculativeGenerator

END = object()  # a job's last queue item


@dataclass(eq=False)
class BatchJob:
    """One generation submitted to the engine; iterate `events()` from any thread, or `listen`, then read
    `result`."""

    prompt: list[int]
    config: GenerateOptions
    kind: str  # AUTO, MODEL, NGRAM, HEADS or NONE
    should_stop: Callable[[], bool] = lambda: False
    k_max: int = 8
    result: Transcript = field(init=False)
    greedy: bool = field(init=False)  # its tokens are each row's argmax (the engine asks llama.cpp for those)
    n_cached: int = 0  # prompt tokens the slot's cache already held
    slot: int = -1
    _queue: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    _listener: Callable[[object], None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.result = Transcript(text="", token_ids=[], stop_reason="", n_prompt=len(self.prompt))
        self.greedy = self.config.sampler.greedy

    def put(self, item: object) -> None:
        """An event, an exception or `END`, from the engine's thread (or `fail_all`'s): to the listener, else
        into the queue `events()` reads."""
        with self._lock:
            if self._listener is None:
                self._queue.put(item)
                return
            self._listener(item)

    def listen(self, listener: Callable[[object], None]) -> None:
        """Have every item `put` handed to `listener` on the thread that puts it (the engine's), those put
        before this call first, in order, instead of reading `events()`: a server then needs no thread
        waiting per generation (a thread switch per step)."""
        with self._lock:
            while not self._queue.empty():
                listener(self._queue.get())
            self._listener = listener

    def events(self) -> Iterator[Event]:
        while True:
            item = self._queue.get()
            if item is END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


@dataclass(eq=False)
class Slot:
    seq: int
    job: BatchJob | None = None
    gen: SpeculativeGenerator | None = None
    context: list[int] = field(default_factory=list)
    prefilled: int = 0  # prompt tokens in the target's cache (of the prompt[:-1] the prefill covers)
    draft_offset: int = 0  # the draft cache holds context[draft_offset:]
    index: int = 0  # the next step's index
    started: float = 0.0
    last_used: float = 0.0  # when its last job ended (perf_counter): a new job takes the longest unused slot
    last_streamed: bool = False  # its last job was streamed: a conversation whose next turn may come any time
    t_prefill: float = 0.0
    ngram: NgramDrafter = field(default_factory=NgramDrafter)
    shadow: ShadowScore = field(default_factory=ShadowScore)
    proposal: Proposal = field(default_factory=Proposal)  # what this step verifies
    lookup: Proposal = field(default_factory=Proposal)  # this step's free proposal (n-gram or heads), at the cap
    lookup_acc: Acceptance | None = None  # ... and the acceptance it is priced by
    heads: HeadsDrafter | None = None  # the heads' guesses from this sequence's hidden state (drafters/medusa.py)
    heads_shadow: ShadowScore | None = None  # their guesses scored (its tables shared by every slot)
    heads_wait: int = 0  # steps until heads that did not pay guess again
    undrafted: int = 0  # steps in a row its planner gave no draft (engine/plain_loops.py's QUIET_STEPS)

    @property
    def streamed(self) -> bool:
        """Its job is read token by token (`GenerateOptions.interactive`): fair slots read its prompt first."""
        return self.job is not None and self.job.config.interactive

    @property
    def generating(self) -> bool:
        return self.job is not None and self.prefilled >= len(self.job.prompt) - 1 and bool(self.context)


class SeqView:
    """One sequence of a multi-sequence `Model`, as the `LanguageModel` the verifier expects."""

    def __init__(self, model: LoadedModel, seq: int) -> None:
        self.model, self.seq = model, seq
        self.n_vocab, self.n_ctx = model.n_vocab, model.n_ctx

    @property
    def tokens(self) -> list[int]:
        return self.model.seq_tokens[self.seq]

    @property
    def decode_seconds(self) -> float:
        return self.model.decode_seconds

    @property
    def decoded_tokens(self) -> int:
        return self.model.decoded_tokens

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def eog_ids(self) -> frozenset[int]:
        return self.model.eog_ids

    def token_text(self, token: int) -> bytes:
        return self.model.token_text(token)

    def decode(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        return self.model.decode(tokens, n_logits, seq=self.seq)

    def decode_argmax(self, tokens: Sequence[int], n_logits: int = 1) -> list[int] | None:
        return argmax_of_logits(self, tokens, n_logits)

    def argmax_chain(self, tokens: Sequence[int], k: int, stop: frozenset[int]) -> list[int] | None:
        return chain_by_steps(self, tokens, k, stop)

    def rollback(self, n_keep: int) -> None:
        self.model.rollback(n_keep, self.seq)

    def common_prefix(self, tokens: Sequence[int]) -> int:
        return self.model.common_prefix(tokens, self.seq)

    def prefill(self, tokens: Sequence[int]) -> None:
        self.model.prefill(tokens, self.seq)

    def set_hidden(self, on: bool) -> None:
        self.model.set_hidden(on)  # the whole context's: every sequence's batches

    def hidden(self, n: int) -> np.ndarray:
        return self.model.hidden(n)
