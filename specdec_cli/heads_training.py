"""Training Medusa heads for a target on this machine (`specdec heads train`): data, hidden states, fitting.

Self-distillation, as Medusa-1 trains: the labels are the target's own greedy continuations, so the heads learn
to guess what this target will write. Three phases, each reported through a callback (nothing here prints):

1. generate: the target continues each prompt greedily, `parallel` generations at a time in one batch
   (engine/batch/: a batch of 8 single tokens costs far less than 8 single decodes), no drafts;
2. read: each text (prompt + continuation) goes through the target once more with llama.cpp's embeddings
   output on, in batches of `n_batch`, for the hidden state at every position (the prompt's prefill reads
   thousands of positions a second; position t's labels are tokens t+2 .. t+1+K of the continuation);
3. fit: Adam on the heads (engine/heads.py), an epoch at a time; after each the held-out texts (every
   tenth subject's, or file's: a topic they never trained on; every tenth text held out let the other
   texts on its subject teach it, and scored 41% for head 1 where new prompts got 11-27%) are scored, and
   the heads that would add the most tokens to a verified draft (`expected_run`: how many heads in a row
   guess right) are kept, and an interruption keeps them too. Not the lowest
   held-out loss: on the packaged target's 160 answers the loss was lowest after 3 epochs and rose after,
   while the guesses kept getting right more often (the heads grow overconfident where they are wrong;
   a draft only needs the top guess).

The prompts are a built-in set (instructions of several kinds, none of them the benchmarks' prompts) and,
optionally, passages of the user's own text files, continued as plain text (no chat template): what the
heads see in training should be what the user's runs look like.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specdec_cli.api import PromptTokens, Speculator
from specdec_cli.engine import heads as H
from specdec_cli.engine.drafters.pool import vocab_fingerprint
from specdec_cli.engine.protocol import LoadedModel
from specdec_cli.engine.settings import NONE

SUBJECTS = (
    "tides", "the water cycle", "how bread rises", "black holes", "the printing press", "photosynthesis",
    "volcanoes", "the immune system", "how a bicycle stays upright", "glaciers", "the Silk Road", "honeybees",
    "compound interest", "the human heart", "rainbows", "the steam engine", "coral reefs", "earthquakes",
    "how vaccines work", "the moon's phases", "recycling plastic", "the Roman aqueducts", "solar panels",
    "how birds migrate", "the stock market", "sleep", "the history of chess", "electric cars", "deserts",
    "how memory works", "the Great Wall of China", "wind turbines", "octopuses", "the Renaissance",
    "how a refrigerator works", "rain forests", "the invention of the telephone", "antibiotics",
    "the solar system", "how languages change", "fermentation", "the Industrial Revolution", "penguins",
    "how GPS works", "the Olympic Games", "mushrooms", "lightning", "the internet",
)  # fmt: skip
TEMPLATES = (
    "Explain {} in simple terms.",
    "Write a short story in which {} plays a part.",
    "List five surprising facts about {}, with a sentence on each.",
    "Write a Python function related to {}, and explain how it works.",
    "Write a friendly email to a colleague about {}.",
)
PROMPTS = tuple(t.format(s) for s in SUBJECTS for t in TEMPLATES)  # 240, subjects interleaved by template
PASSAGE_TOKENS = 256  # a text file is cut into passages of this many tokens, each continued as plain text
HOLDOUT_EVERY = 10  # every tenth group of texts is held out: it scores the heads, it does not train them


@dataclass(frozen=True)
class Plan:
    n_prompts: int = 160
    max_tokens: int = 192
    n_heads: int = 3
    vocab: int = 4096  # at most this many draftable tokens (the most frequent in training)
    epochs: int = 8
    parallel: int = 8

    def n_tokens(self, n_texts: int) -> int:
        return n_texts * self.max_tokens


@dataclass
class Estimate:
    """Seconds each phase should take, from timings taken here before it starts."""

    generate: float
    read: float
    fit: float

    @property
    def total(self) -> float:
        return self.generate + self.read + self.fit


@dataclass
class Text:
    prompt: list[int]
    group: int = 0  # texts of one subject (or one file) are held out together: none teaches the others' topic
    output: list[int] = field(default_factory=list)

    @property
    def tokens(self) -> np.ndarray:
        return np.array(self.prompt + self.output, np.int64)


@dataclass
class Epoch:
    epoch: int
    loss: float  # held-out mean cross-entropy over the heads (labels inside the subset)
    accuracy: list[float]  # held out, per head: the top guess is the label (outside the subset: a miss)
    run: float  # held out: tokens a draft of every head adds, on average (`heads.expected_run`)
    chain: list[float]  # held out: P(heads 1..j all right), j = 1..K (`heads.chain_rates`)
    seconds: float
    best: bool


def file_passages(model: LoadedModel, paths: Sequence[Path], limit: int) -> list[tuple[int, list[int]]]:
    """Up to `limit` passages of PASSAGE_TOKENS tokens from the text files (not UTF-8: skipped), each with the
    number of its file."""
    out: list[tuple[int, list[int]]] = []
    for n, p in enumerate(paths):
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        ids = model.tokenize(text, add_special=False, parse_special=False)
        for i in range(0, max(len(ids) - 16, 0), PASSAGE_TOKENS):
            out.append((n, ids[i : i + PASSAGE_TOKENS]))
            if len(out) >= limit:
                return out
    return out


def estimate(target: LoadedModel, plan: Plan, n_texts: int, prompt_tokens: int) -> Estimate:
    """Time a batch of `parallel` tokens (a generation step), a batch of n_batch with hidden states (reading)
    and one training step, and scale each by the work planned."""
    target.rollback(0)
    probe = list(range(100, 100 + plan.parallel))
    target.decode(probe[:1])
    t0 = time.perf_counter()
    for _ in range(3):
        target.rollback(1)
        target.decode(probe, n_logits=len(probe))
    step = (time.perf_counter() - t0) / 3
    n_read = min(target.n_batch, 256)
    target.rollback(0)
    t0 = time.perf_counter()
    H.decode_hidden(target, list(range(100, 100 + n_read)))
    per_read = (time.perf_counter() - t0) / n_read
    target.rollback(0)
    n_tok = plan.n_tokens(n_texts)
    steps = math.ceil(n_texts / plan.parallel) * plan.max_tokens
    d = target.n_embd
    heads = H.Heads.initial(1, np.zeros((min(plan.vocab, 2048), d), np.float32), np.arange(min(plan.vocab, 2048)), "")
    h = np.zeros((H.BATCH, d), np.float32)
    t0 = time.perf_counter()
    H.train_step(heads, 0, h, np.zeros(H.BATCH, np.int64), H.Adam())
    per_step = time.perf_counter() - t0
    fit_steps = plan.epochs * plan.n_heads * math.ceil(n_tok / H.BATCH) * 1.1  # + the held-out scoring
    return Estimate(steps * step, (n_tok + prompt_tokens) * per_read, fit_steps * per_step)


def generate(spec: Speculator, texts: list[Text], plan: Plan, chat: Sequence[bool],
             on_text: Callable[[int], None]) -> None:  # fmt: skip
    """Fill each text's output: the target's greedy continuation, `plan.parallel` at a time."""

    def one(i: int) -> None:
        g = spec.generate(PromptTokens(texts[i].prompt, chat[i]), max_tokens=plan.max_tokens, temperature=0.0,
                          drafter=NONE)  # fmt: skip
        texts[i].output = list(g.token_ids)
        on_text(len(g.token_ids))

    with ThreadPoolExecutor(max_workers=plan.parallel) as pool:
        for f in [pool.submit(one, i) for i in range(len(texts))]:
            f.result()


def read(target: LoadedModel, texts: Sequence[Text], n_heads: int,
         on_text: Callable[[int], None]) -> tuple[list[np.ndarray], list[np.ndarray]]:  # fmt: skip
    """Per text, the hidden states of the positions that have labels and those labels (K, n): the positions
    from the one that gave the first output token on."""
    hidden, labels = [], []
    for t in texts:
        target.rollback(0)
        toks = t.tokens
        start = max(len(t.prompt) - 1, 0)
        _, h = H.decode_hidden(target, list(toks))
        lab = H.targets_for(toks, n_heads)
        hidden.append(h[start:])
        labels.append(lab[:, start:])
        on_text(toks.size)
    target.rollback(0)
    return hidden, labels


def held_out_loss(heads: H.Heads, hidden: np.ndarray, labels: np.ndarray) -> float:
    """Mean over heads of the cross-entropy of the labels inside the subset."""
    losses = []
    for k in range(heads.n_heads):
        idx = H.index_labels(heads, labels[k])
        keep = idx >= 0
        if not keep.any():
            continue
        z = heads.logits(k, hidden[keep])
        z -= z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        losses.append(float(-logp[np.arange(keep.sum()), idx[keep]].mean()))
    return float(np.mean(losses)) if losses else math.inf


@dataclass
class Result:
    heads: H.Heads  # the best by held-out loss
    epochs: list[Epoch]
    interrupted: bool = False


def fit(target: LoadedModel, hidden: list[np.ndarray], labels: list[np.ndarray], plan: Plan,
        on_step: Callable[[int, int], None], on_epoch: Callable[[Epoch], None],
        groups: Sequence[int] | None = None) -> Result:  # fmt: skip
    """Train heads from the target's output rows; keep the best by held-out `expected_run`. Ctrl-C ends training and
    returns the best kept so far (an epoch must have been scored: else KeyboardInterrupt goes on up)."""
    groups = list(groups) if groups is not None else list(range(len(hidden)))
    held = [i for i, g in enumerate(groups) if g % HOLDOUT_EVERY == HOLDOUT_EVERY - 1] or [len(hidden) - 1]
    train_ix = [i for i in range(len(hidden)) if i not in held] or held
    h_tr, l_tr = np.concatenate([hidden[i] for i in train_ix]), np.concatenate([labels[i] for i in train_ix], axis=1)
    h_te, l_te = np.concatenate([hidden[i] for i in held]), np.concatenate([labels[i] for i in held], axis=1)
    subset = H.choose_subset(l_tr[0], plan.vocab)
    fingerprint = vocab_fingerprint(target.vocab_info().texts)
    heads = H.Heads.initial(plan.n_heads, H.output_rows(target.path, subset), subset, fingerprint, target.path.name)
    per_epoch = sum(math.ceil(int((H.index_labels(heads, l_tr[k]) >= 0).sum()) / H.BATCH) for k in range(plan.n_heads))
    total = per_epoch * plan.epochs
    opt = H.Adam()
    best: H.Heads | None = None
    best_run = -1.0
    history: list[Epoch] = []
    done = 0
    try:
        for e in range(plan.epochs):
            t0 = time.perf_counter()

            def step(n: int, _total: int, _loss: float, base: int = done) -> None:
                on_step(base + n, total)

            H.train(heads, h_tr, l_tr, 1, seed=e, on_step=step, opt=opt)
            done += per_epoch
            chain = H.chain_rates(heads, h_te, l_te)
            run = sum(chain)
            is_best = run > best_run
            if is_best:
                best, best_run = copy.deepcopy(heads), run
            ep = Epoch(e + 1, held_out_loss(heads, h_te, l_te), H.accuracy(heads, h_te, l_te), run, chain,
                       time.perf_counter() - t0, is_best)  # fmt: skip
            history.append(ep)
            on_epoch(ep)
    except KeyboardInterrupt:
        if best is None:
            raise
        return _finish(best, history, plan, len(train_ix), len(held), interrupted=True)
    assert best is not None
    return _finish(best, history, plan, len(train_ix), len(held))


def _finish(best: H.Heads, history: list[Epoch], plan: Plan, n_train: int, n_held: int,
            interrupted: bool = False) -> Result:  # fmt: skip
    kept = max((e for e in history if e.best), key=lambda e: e.run)
    best.settings = {
        "epochs": len(history), "kept_epoch": kept.epoch, "held_out_loss": round(kept.loss, 4),
        "held_out_run": round(kept.run, 4), "held_out_chain": [round(c, 4) for c in kept.chain],
        "held_out_accuracy": [round(a, 4) for a in kept.accuracy], "texts": n_train + n_held, "held_out_texts": n_held,
        "max_tokens": plan.max_tokens, "vocab": int(best.subset.size), "learning_rate": H.LEARNING_RATE,
        "batch": H.BATCH, "interrupted": interrupted,
    }  # fmt: skip
    return Result(best, history, interrupted)
