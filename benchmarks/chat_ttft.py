"""Time to first token over a 10-turn chat: it must not grow with the conversation.

    .venv/bin/python -m benchmarks.chat_ttft [--turns 10] [-n 48]

Runs a scripted conversation on the default pair through ChatSession (the code
`specdec chat` uses) and prints, per turn: the conversation length in tokens, the
tokens each model evaluated before the first reply token (only the new turn, thanks
to common-prefix cache reuse), and the time to first token. For comparison it also
times, at the last turn, what a cold cache (whole conversation re-evaluated) costs.
"""

from __future__ import annotations

import argparse
import time

from benchmarks import record
from specdec_cli import api
from specdec_cli.chat_session import ChatSession
from specdec_cli.engine.events import Step

QUESTIONS = [
    "Name a fruit.", "Why is it healthy?", "Name a vegetable.", "How do I cook it?", "Name a spice.",
    "What dish uses it?", "Name a drink.", "Is it sweet?", "Name a dessert.", "Summarise our chat.",
]  # fmt: skip


def ttft(session: ChatSession, text: str) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    before = session.spec.tokens_evaluated
    first = None
    evaluated = (0, 0)
    for ev in session.reply(text):
        if first is None and isinstance(ev, Step) and ev.emitted:
            first = time.perf_counter() - t0
            now = session.spec.tokens_evaluated
            evaluated = (now["target"] - before["target"], now["draft"] - before["draft"])
    return (first if first is not None else float("nan")), evaluated[0], evaluated[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("-n", "--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    record.add_option(ap)
    args = ap.parse_args()
    costs = record.calibrated(*record.pair_files("smollm2-135m-q2k"), args.threads)  # before the chat: nothing else runs
    spec = api.load(pair="smollm2-135m-q2k", n_ctx=4096, n_threads=args.threads)
    turns = []
    session = ChatSession(spec, api.GenerateOptions(max_tokens=args.max_tokens, draft_max=4))
    print("turn  conversation tokens  evaluated (target/draft) before 1st token  time to first token")
    for i in range(args.turns):
        q = QUESTIONS[i % len(QUESTIONS)]
        n_conv = len(session.prompt_tokens(q, 0)[0].ids)
        t, et, ed = ttft(session, q)
        print(f"{i + 1:4d}  {n_conv:19d}  {et:17d} / {ed:<5d}                  {t * 1000:8.1f} ms")
        turns.append({"turn": i + 1, "conversation_tokens": n_conv, "evaluated_target": et, "evaluated_draft": ed,
                      "ttft_ms": round(t * 1000, 2)})  # fmt: skip
    # the same last turn with cold caches, for comparison
    history = list(session.history[:-2])
    spec.target.reset()
    if spec.draft is not None:
        spec.draft.reset()
    session.history = history
    t, et, ed = ttft(session, QUESTIONS[(args.turns - 1) % len(QUESTIONS)])
    print(f"cold  (last turn, caches cleared)  {et} / {ed} evaluated, time to first token {t * 1000:.1f} ms")
    files = {"target": spec.choice.target, "draft": spec.choice.draft}
    spec.close()
    record.save(args, "chat-ttft", threads=args.threads, models=files, data={
        "settings": {"pair": "smollm2-135m-q2k", "turns": args.turns, "max_tokens": args.max_tokens}, "costs": costs,
        "turns": turns, "cold": {"turn": args.turns, "evaluated_target": et, "evaluated_draft": ed,
                                  "ttft_ms": round(t * 1000, 2)}})  # fmt: skip


if __name__ == "__main__":
    main()
