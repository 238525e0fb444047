"""A step's drafts (engine/batch/engine.py's step 3): every drafting slot's proposal, the draft model's in
batched rounds in the draft context (a draft cache catches up on at most `WINDOW` recent tokens: prompts are
not prefilled into the draft, so they do not delay the first token)."""

from __future__ import annotations

import dataclasses
from typing import Any

from specdec_cli.engine.batch.plan import Choice, Planner
from specdec_cli.engine.batch.slots import Slot
from specdec_cli.engine.drafters import NO_DRAFT, DraftRequest, DraftUnusable, Proposal, pick
from specdec_cli.engine.events import DrafterDropped
from specdec_cli.engine.protocol import LoadedModel
from specdec_cli.engine.sampling import Dist
from specdec_cli.engine.settings import AUTO, HEADS, MODEL, NGRAM


def draft_rounds(draft: LoadedModel | None, planner: Planner, gen: list[Slot], choices: dict[int, Choice]) -> float:
    """Fill each slot's `proposal` as `planner` chose: n-gram tokens at once, model drafts in batched rounds of
    `draft` (a draft that cannot go on breaks the planner's drafting: `Planner.draft_broken`). Returns seconds
    inside the draft's decode."""
    drafting: list[Slot] = []
    for s in gen:
        c = choices.get(s.seq)
        assert s.job is not None
        if c is None or c.n == 0:
            s.proposal = NO_DRAFT
        elif c.source in (NGRAM, HEADS):
            s.proposal = dataclasses.replace(s.lookup.cut(c.n), k=c.n)
        else:
            drafting.append(s)
    if not drafting or draft is None:
        return 0.0
    td0 = draft.decode_seconds
    want = {s.seq: choices[s.seq].n for s in drafting}
    toks: dict[int, list[int]] = {s.seq: [] for s in drafting}
    dists: dict[int, list[Dist]] = {s.seq: [] for s in drafting}
    feed: dict[int, list[int]] = {}
    reqs: dict[int, DraftRequest] = {}
    for s in drafting:  # round 0: catch each draft cache up with its context
        assert s.job is not None and s.gen is not None
        s.draft_offset, keep = planner.catch_up(s)
        draft.rollback(keep, s.seq)
        feed[s.seq] = s.context[s.draft_offset + keep :]
        reqs[s.seq] = DraftRequest(s.context, want[s.seq], s.job.config.sampler, s.gen.rng, s.gen.eog)
    active = list(drafting)
    try:
        while active:
            seqs = sorted(s.seq for s in active)
            t0 = draft.decode_seconds
            rows = draft.decode_many([(seq, feed[seq], 1, 0) for seq in seqs])
            n_tok = sum(len(feed[seq]) for seq in seqs)
            planner.draft_costs.observe(n_tok, draft.decode_seconds - t0)
            by: dict[int, Any] = dict(zip(seqs, rows, strict=True))  # logits: no greedy sequences
            still: list[Slot] = []
            for s in active:
                assert s.job is not None and s.gen is not None
                picked = pick(draft, by[s.seq][0], reqs[s.seq], s.job.config.draft_p_min)
                if picked is None:
                    continue
                tok, q = picked
                toks[s.seq].append(tok)
                dists[s.seq].append(q)
                if tok in s.gen.eog or len(toks[s.seq]) >= want[s.seq]:
                    continue
                feed[s.seq] = [tok]
                still.append(s)
            active = still
    except DraftUnusable as exc:
        planner.draft_broken = str(exc)
        for s in drafting:
            assert s.job is not None
            rest = "the n-gram lookup goes on alone" if s.job.kind == AUTO else "speculation is off"
            s.job.put(DrafterDropped(f"{exc}: {rest} for the rest of this run"))
            s.proposal = NO_DRAFT
        return draft.decode_seconds - td0
    for s in drafting:
        s.proposal = Proposal(toks[s.seq], dists[s.seq], want[s.seq], MODEL)
    return draft.decode_seconds - td0
