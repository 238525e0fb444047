"""Which slot a new job takes, which slots take part in a step, and which prompt chunks it reads
(engine/batch/engine.py).

A job takes the free slot whose cache holds most of its prompt, where that is most of it
(llama-server's `--slot-prompt-similarity`, 0.5); otherwise not the slot whose job ended last, so
that a shared system prompt alone does not evict the conversation most likely to come back (a
chat's next turn arrives after the title, tag and follow-up requests its client sends after each
answer), then one that keeps the busy slots' ids contiguous, then the one used longest ago.

Fair (the default): while a streamed request's prompt is read, jobs nobody reads token by token sit
the step out (`taking_part`). Prompts are read under the step's token budget: a step reads no more
prompt than fits in PROMPT_STEP_SECONDS beside other requests (PROMPT_ALONE_SECONDS alone,
BACKGROUND_SECONDS for prompts nobody streams while a streamed conversation may come back); the prompt
with the least left goes first, since the shortest remaining prompt first gives the least time to
first token on average; and a prompt that finishes in a step is held up by the other prompts' chunks
by at most `FAIR_STEP - 1` of the step. Otherwise every job takes part, first admitted first, up to the
budget.
"""

from __future__ import annotations

from specdec_cli.engine.batch.slots import BatchJob, Slot
from specdec_cli.engine.estimates import BatchCosts
from specdec_cli.engine.protocol import LoadedModel

# Beside other generating slots, a step's drafts may make it at most this many times as long as the plain
# step (every slot one token), so a stream that does not draft waits at most about FAIR_STEP times its gap
# beside the same batch-mates without drafts (plan.py; docs/design.md, "Fair slots").
FAIR_STEP = 1.5
# ... or, beside a stream and where that is longer, as long as FAIR_GAP single-token decodes: a stream's gap alone
# is one, so its longest gap beside a drafting batch-mate stays under 3x that, with room for a busy machine's own
# spikes. On a bandwidth-bound target a batch of two costs little more than one token, and FAIR_STEP plain steps
# alone would leave a copying request drafting 2 tokens where it could draft 8.
FAIR_GAP = 2.5
# A step reads at most this much prompt beside other requests, and alone (a request may arrive meanwhile).
# The exact kernels read the packaged Q4_1 target's prompts as fast in chunks of 16 tokens as of 256; the
# bandwidth-bound F32 one reads them about 10% slower in chunks of 64, 3% in chunks of 128.
PROMPT_STEP_SECONDS = 0.1
PROMPT_ALONE_SECONDS = 0.25
# While a free slot holds a streamed conversation, a step nobody streams (whole answers: a chat client's title and
# tag tasks, their prompts and their drafts) lasts at most this long, or a plain step: the conversation's next turn
# waits for the step in progress, and its first token should come about as soon as alone, which for a next turn is
# one prompt step of the new message (on the F32 pair a 20-token message takes about 55 ms). Chunks of 16 tokens
# cost the packaged target no more a token; the F32 one about 45% more. With no conversation to come back (a script
# sending whole answers only), whole answers are read and drafted as streams are.
BACKGROUND_SECONDS = 0.03
MIN_CHUNK = 8
SLOT_SIMILARITY = 0.5  # the share of a prompt a slot's cache must hold to be chosen for it


def _contiguous(busy: list[int], seq: int) -> bool:
    seqs = sorted([*busy, seq])
    return seqs[-1] - seqs[0] == len(seqs) - 1


def _reuse(target: LoadedModel, job: BatchJob, slot: Slot) -> int:
    """The prompt tokens `slot`'s cache holds, where that is most of the prompt; else 0."""
    n = target.common_prefix(job.prompt, slot.seq)
    return n if n >= SLOT_SIMILARITY * len(job.prompt) else 0


def _ended_last(free: list[Slot]) -> float:
    """When the free slot whose job ended last was freed (0.0: none was ever used)."""
    return max(s.last_used for s in free)


def choose_slot(target: LoadedModel, slots: list[Slot], job: BatchJob, free: list[Slot]) -> Slot:
    busy = [s.seq for s in slots if s.job is not None]
    # The longest prefix that is most of the prompt; else not the slot whose job ended last (a chat's next turn
    # comes back to it, after the tasks its client sends); then keeping busy ids contiguous (it saves a pass
    # over the weights every step); then the slot whose last job ended longest ago (one never used first)
    latest = _ended_last(free)
    return max(free, key=lambda s: (_reuse(target, job, s), not (latest and s.last_used == latest),
                                    _contiguous(busy, s.seq), -s.last_used, -s.seq))  # fmt: skip


def set_aside(target: LoadedModel, slots: list[Slot], job: BatchJob, free: list[Slot], chosen: Slot) -> tuple[Slot, Slot | None]:  # fmt: skip
    """(the job's slot, where the cache of the slot it takes moves to, or None). Where `chosen` (choose_slot's)
    leaves a gap between busy slots only to keep the cache of the conversation that ended last, the job takes
    that conversation's slot and the cache moves to `chosen` (`LoadedModel.move_seq`): llama.cpp batches only
    consecutive sequences in one pass, and a gap costs every step a second pass or filler tokens, whose
    attention runs over the length the idle slot holds."""
    busy = [s.seq for s in slots if s.job is not None]
    if not busy or _contiguous(busy, chosen.seq):
        return chosen, None
    if _reuse(target, job, chosen):
        return chosen, None  # its cache is the job's prompt
    latest = _ended_last(free)
    for s in free:
        if s is not chosen and latest and s.last_used == latest and _contiguous(busy, s.seq):
            return s, chosen
    return chosen, None


def taking_part(slots: list[Slot], fair: bool) -> tuple[list[Slot], list[Slot]]:
    """The slots in a step: (generating, reading their prompts). Fair: while a streamed request's prompt is
    read, requests nobody reads token by token (`GenerateOptions.interactive` off: the server's whole answers,
    such as a chat client's title and tag tasks) sit the step out, so that the stream's first token comes about
    as soon as alone; streams already generating keep their token a step."""
    gen = [s for s in slots if s.job is not None and s.generating]
    pre = [s for s in slots if s.job is not None and not s.generating]
    first = [s for s in pre if s.streamed]
    if not fair or not first:
        return gen, pre
    return [s for s in gen if s.streamed], first


def prompt_room(costs: BatchCosts, generating: int, busy: int, budget: int, background: bool = False) -> int:
    """The prompt tokens a fair step may read with `busy` requests in the slots: as many as keep the step within
    PROMPT_STEP_SECONDS beside other requests, PROMPT_ALONE_SECONDS for a request alone, BACKGROUND_SECONDS
    for prompts nobody streams while a conversation may come back (`background`) (at least MIN_CHUNK), so that
    a request arriving meanwhile, or a stream beside, waits at most about that long for it."""
    one = costs.one
    if one is None:
        return budget
    seconds = BACKGROUND_SECONDS if background else PROMPT_STEP_SECONDS if busy > 1 else PROMPT_ALONE_SECONDS
    lo, hi = min(MIN_CHUNK, budget), budget  # the largest n with relative(generating + n) * one <= seconds
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if costs.relative(generating + mid) * one <= seconds:
            lo = mid
        else:
            hi = mid - 1
    return lo


def prompt_chunks(pre: list[Slot], room: int, generating: int, fair: bool) -> list[tuple[Slot, int]]:
    """(slot, tokens) to read this step, in order, within `room` tokens; `generating`: the step's other tokens."""
    left = {s.seq: len(s.job.prompt) - s.prefilled for s in pre if s.job is not None}
    order = sorted(pre, key=lambda s: left.get(s.seq, 0)) if fair else pre
    out: list[tuple[Slot, int]] = []
    placed, extra = generating, None  # extra: what later chunks may add once a prompt finishes in this step
    for s in order:
        n = min(left.get(s.seq, 0), room)
        if extra is not None:
            n = min(n, extra)
            extra -= max(n, 0)
        if n <= 0:
            continue
        out.append((s, n))
        room, placed = room - n, placed + n
        if fair and extra is None and n == left[s.seq]:  # a prompt finishes in this step: keep the step short
            extra = int((FAIR_STEP - 1) * placed)
    return out
