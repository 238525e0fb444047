"""Fair slots: what a drafting request and a chat client's background tasks cost the stream a person watches.

    .venv/bin/python -m benchmarks.fair_slots [--pair P] [--rounds 5] [--results PATH]

Two `specdec serve` processes at the default `--parallel`, one with fair slots (the default) and one
with `--no-fair`, both kept up and measured in alternating rounds (ABBA), with other prompts each round:

- **gaps**: a plain stream (`speculative.drafter: none`, 96 tokens) alone; then another beside a request
  that copies two passages it has copied before (the n-gram lookup drafts long runs of its earlier answer
  from the token pool; auto drafter), joining once that request has streamed its first token; then, as
  a control, a third beside the same copying request drafting nothing. Per run: the plain streams' gaps
  between content chunks (after their first), and the aggregate completion tokens/s of each pair over
  the wall time from the first request to the last token.
- **aggregate**: after both servers' runs of a round, the copying request beside another plain stream,
  and drafting nothing beside it, on the two servers in turn, `--interleaved` times (ABBA): the servers'
  aggregate tokens/s measured seconds apart, where the runs above are a minute apart and this
  machine's speed drifts by tens of percent in a minute.
- **webui**: what Open WebUI sends. A chat's first turn streams (128 tokens); its second turn then
  streams alone, or (another conversation) beside the three tasks Open WebUI sends as an answer ends
  (title, tags, follow-up questions: non-streamed requests holding the task's instructions and the
  chat so far, up to 1,024 tokens each). The second turn is sent 5 s after the answer (a person reads
  it and types: the tasks generate), 2 s after it (the tasks' prompts are still being read), and at once
  (a script). Per run: the second turn's time to first token. The task
  prompts here are written for this benchmark in the shape of Open WebUI's.

Greedy throughout: each request's text is the same on both servers (the "same" columns say so).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

import httpx

from benchmarks import record
from benchmarks.record import pair_files
from benchmarks.serve_bench import SUBJECTS
from tests.server_fixtures import live_server

PASSAGES = [
    "The river rose slowly through the night, and by morning the lower fields were under a sheet of brown "
    "water. The farmers moved their animals to the hill behind the church, where the ground stays dry even in "
    "the worst years. By noon the rain had stopped, but the water kept rising for two more days.",
    "A good loaf needs four things: flour, water, salt and time. Mix the flour and water first and let them "
    "rest for half an hour, then add the salt and the yeast. Fold the dough every half hour for two hours, "
    "shape it, and let it rise overnight in a cool place before baking it in a very hot oven.",
    "The station stood at the end of a long valley, three hours by road from the nearest town. Twice a day "
    "a train stopped there for one minute, long enough for the post to be thrown down and a passenger or two "
    "to climb aboard. The stationmaster kept bees, and sold honey to the drivers.",
    "To change a bicycle tyre, first open the brake and take the wheel out of the frame. Push the valve into "
    "the tyre, then lever one side of the tyre over the rim with two tyre levers. Pull out the tube, find the "
    "hole, and check the inside of the tyre for the thorn or glass that made it.",
    "Every spring the swallows came back to the barn on the same day, give or take a week. They rebuilt the "
    "old nests under the roof with mud from the pond, and by June the young birds were already flying in and "
    "out of the open door, catching flies above the yard until late in the evening.",
    "The library opened at nine, but people began to queue at half past eight: students with their laptops, "
    "old men who came for the newspapers, and mothers with small children for the reading hour. The "
    "librarian knew most of them by name and kept a kettle going in the back room.",
]
QUESTIONS = ["Can you explain that in simpler words?", "What is the most surprising part of it?",
             "Give me one example from everyday life."]  # fmt: skip
TASKS = {  # the shape of Open WebUI's default task prompts: instructions, then the chat so far
    "title": ("### Task:\nWrite a short title of three to five words, with one emoji, that sums up the chat "
              "history below.\n### Guidelines:\n- Name the main subject of the conversation.\n- Use the chat's "
              "language.\n- Keep it plain: no quotation marks.\n### Output:\nJSON: { \"title\": \"...\" }\n"
              "### Chat History:\n<chat_history>\n{chat}\n</chat_history>"),
    "tags": ("### Task:\nGive one to three broad tags for the main themes of the chat history below, and one to "
             "three narrower ones.\n### Guidelines:\n- Start with broad domains (Science, History, Arts, "
             "Technology, Health, Sports, Business, Education).\n- Add narrower subjects when the chat is about "
             "them throughout.\n- If the chat is very short, answer [\"General\"].\n- Use the chat's "
             "language.\n### Output:\nJSON: { \"tags\": [\"tag1\", \"tag2\"] }\n### Chat History:\n"
             "<chat_history>\n{chat}\n</chat_history>"),
    "follow_ups": ("### Task:\nSuggest three to five questions the user might ask next, written as the user, "
                   "to go on with the conversation below.\n### Guidelines:\n- Ask as the user, to the "
                   "assistant.\n- Keep each question short and about the subject.\n- Do not repeat what was "
                   "already answered.\n- Use the chat's language.\n### Output:\nJSON: { \"follow_ups\": "
                   "[\"Question 1?\", \"Question 2?\"] }\n### Chat History:\n<chat_history>\n{chat}\n"
                   "</chat_history>"),
}
PLAIN_TOKENS, COPY_TOKENS, TURN_TOKENS, TASK_TOKENS = 96, 256, 128, 1024
INTERLEAVED = 6  # fair/no-fair pairs of runs a round measures the aggregate tokens/s with, seconds apart
THINK = (0.0, 2.0, 5.0)  # seconds from the answer to the next turn: at once (a script), a quick reply while the
# tasks' prompts are still read, and a person's reading and typing


async def stream(http: httpx.AsyncClient, messages: list[dict[str, str]], max_tokens: int,
                 first: asyncio.Event | None = None, **extra: Any) -> dict[str, Any]:  # fmt: skip
    """One streamed chat request: chunk arrival times (from the send), its text and completion tokens;
    `first` is set at its first content chunk."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **extra}  # fmt: skip
    t0 = time.perf_counter()
    times, text, tokens, speculative, prompt = [], [], 0, {}, (0, 0)
    async with http.stream("POST", "/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if data.get("usage"):
                tokens = data["usage"]["completion_tokens"]
                prompt = (data["usage"]["prompt_tokens"], data["usage"]["prompt_tokens_details"]["cached_tokens"])
                speculative = data.get("speculative", {})
            if data.get("choices") and data["choices"][0]["delta"].get("content"):
                times.append(time.perf_counter())
                if first is not None:
                    first.set()
                text.append(data["choices"][0]["delta"]["content"])
    return {"t0": t0, "times": times, "text": "".join(text), "tokens": tokens or len(times),
            "tokens_per_step": speculative.get("tokens_per_step"), "prompt_tokens": prompt}  # fmt: skip


def gaps_of(run: dict[str, Any]) -> list[float]:
    return [b - a for a, b in zip(run["times"], run["times"][1:], strict=False)]


async def beside(http: httpx.AsyncClient, first: list[dict[str, str]], second: list[dict[str, str]],
                 **first_extra: Any) -> tuple[dict[str, Any], dict[str, Any], float]:  # fmt: skip
    """`first` streams; `second` (a plain stream) joins once the first generates. Both runs, and the aggregate
    completion tokens/s from the first request to the last token."""
    generating = asyncio.Event()
    task = asyncio.ensure_future(stream(http, first, COPY_TOKENS, generating, **first_extra))
    await generating.wait()
    other = await stream(http, second, PLAIN_TOKENS, speculative={"drafter": "none"})
    run = await task
    end = max(other["times"][-1], run["times"][-1])
    return run, other, (run["tokens"] + other["tokens"]) / (end - run["t0"])


async def gaps_round(base: str, i: int) -> dict[str, Any]:
    # Each plain stream has a prompt of its own: the same prompt would find its cache in a slot and take that slot
    # wherever it is, a layout this benchmark does not mean to measure
    alone_msgs, beside_msgs, control_msgs = ([{"role": "user", "content": f"Write a few paragraphs about {subject}."}]
                                             for subject in (SUBJECTS[(i + k * 17) % len(SUBJECTS)] for k in range(3)))  # fmt: skip
    text = " ".join(PASSAGES[(i + k) % len(PASSAGES)] for k in range(2))
    copy_msgs = [{"role": "user", "content": f"Repeat this text exactly, word for word:\n\n{text}"}]
    plain = {"speculative": {"drafter": "none"}}
    async with httpx.AsyncClient(base_url=base, timeout=600) as http:
        alone = await stream(http, alone_msgs, PLAIN_TOKENS, **plain)
        copy_alone = await stream(http, copy_msgs, COPY_TOKENS)  # its answer goes to the token pool: long runs
        copy, plain_beside, aggregate = await beside(http, copy_msgs, beside_msgs)
        # the control: the same copying request drafting nothing, beside another plain stream
        copy_plain, plain_control, aggregate_control = await beside(http, copy_msgs, control_msgs, **plain)
        again = await stream(http, beside_msgs, PLAIN_TOKENS, **plain)  # the stream beside, alone: its text
    return {"alone_gaps": gaps_of(alone), "beside_gaps": gaps_of(plain_beside), "control_gaps": gaps_of(plain_control),
            "same_plain": again["text"] == plain_beside["text"],
            "same_copy": copy_alone["text"] == copy["text"] == copy_plain["text"],
            "copy_tokens_per_step": {"alone": copy_alone["tokens_per_step"], "beside": copy["tokens_per_step"]},
            "copy_tokens": copy["tokens"], "aggregate_tokens_per_second": aggregate,
            "control_aggregate_tokens_per_second": aggregate_control}  # fmt: skip


async def interleaved_round(bases: dict[str, str], i: int, n: int) -> list[dict[str, dict[str, float]]]:
    """The copying request beside a plain stream, and drafting nothing beside it, on the two servers in turn
    (ABBA), `n` times: aggregate tokens/s measured seconds apart, so that this machine's drift in speed
    (tens of percent over a minute) touches both settings alike. Run after the round's gaps runs, which left
    the passages in both servers' token pools."""
    text = " ".join(PASSAGES[(i + k) % len(PASSAGES)] for k in range(2))
    copy_msgs = [{"role": "user", "content": f"Repeat this text exactly, word for word:\n\n{text}"}]
    out: list[dict[str, dict[str, float]]] = []
    for j in range(n):
        subject = SUBJECTS[(n * i + j + 40) % len(SUBJECTS)]
        plain_msgs = [{"role": "user", "content": f"Write a short essay about {subject}."}]
        labels = list(bases) if j % 2 == 0 else list(reversed(bases))
        row: dict[str, dict[str, float]] = {"beside": {}, "control": {}}
        for kind, extra in (("beside", {}), ("control", {"speculative": {"drafter": "none"}})):
            for label in labels:
                async with httpx.AsyncClient(base_url=bases[label], timeout=600) as http:
                    row[kind][label] = (await beside(http, copy_msgs, plain_msgs, **extra))[2]
        out.append(row)
    return out


async def turn_one(http: httpx.AsyncClient, subject: str) -> list[dict[str, str]]:
    chat = [{"role": "user", "content": f"Tell me about {subject}."}]
    first = await stream(http, chat, TURN_TOKENS)
    return [*chat, {"role": "assistant", "content": first["text"]}]


async def webui_round(base: str, i: int, think: float) -> dict[str, Any]:
    subjects = [SUBJECTS[(2 * i + 7 + int(think)) % len(SUBJECTS)], SUBJECTS[(2 * i + 8 + int(think)) % len(SUBJECTS)]]
    order = ("alone", "tasks") if i % 2 == 0 else ("tasks", "alone")
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=base, timeout=600) as http:
        for kind, subject in zip(order, subjects, strict=True):
            chat = await turn_one(http, subject)
            second = [*chat, {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
            tasks: list[asyncio.Task[Any]] = []
            if kind == "tasks":
                history = "\n".join(f"{m['role'].upper()}: {m['content']}" for m in chat)
                for template in TASKS.values():
                    body = {"messages": [{"role": "user", "content": template.replace("{chat}", history)}],
                            "max_tokens": TASK_TOKENS, "temperature": 0, "stream": False}  # fmt: skip
                    tasks.append(asyncio.ensure_future(http.post("/chat/completions", json=body)))
            # the tasks are sent as the answer ends; the person reads it and writes the next turn (`think`)
            await asyncio.sleep(max(think, 0.05))
            turn = await stream(http, second, 64)
            finished = sum(t.done() for t in tasks)
            for t in tasks:
                t.cancel()  # the server stops them when their connections close
            await asyncio.gather(*tasks, return_exceptions=True)
            out[kind] = {"ttft": turn["times"][0] - turn["t0"], "text": turn["text"], "tasks_done_first": finished,
                         "gaps": gaps_of(turn), "prompt_tokens": turn["prompt_tokens"]}  # fmt: skip
            await asyncio.sleep(1.0)  # the cancelled tasks leave their slots
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--interleaved", type=int, default=INTERLEAVED, metavar="N",
                    help=f"fair/no-fair pairs of aggregate runs a round (default {INTERLEAVED}): a run's tokens/s "
                         "varies by about a tenth, so a median within a few percent takes dozens")  # fmt: skip
    ap.add_argument("--only", choices=("gaps", "webui"), default=None, help="one of the two workloads (a quick look)")
    record.add_option(ap)
    args = ap.parse_args()
    target, draft = pair_files(args.pair)
    costs = record.calibrated(target, draft, args.threads)
    common = ["--ctx-size", "4096", "--threads", str(args.threads), *(["--pair", args.pair] if args.pair else [])]
    servers = {"fair": [], "no-fair": ["--no-fair"]}
    rounds: list[dict[str, Any]] = []
    interleaved: list[dict[str, Any]] = []
    with live_server(*common, *servers["fair"]) as fair, live_server(*common, *servers["no-fair"]) as unfair:
        bases = {"fair": fair.base_url, "no-fair": unfair.base_url}
        for base in bases.values():  # warm both up
            asyncio.run(gaps_round(base, 99))
        if args.only:
            print(f"--only {args.only}: a quick look; the report reads files with both workloads", file=sys.stderr)
        for i in range(args.rounds):
            labels = list(bases) if i % 2 == 0 else list(reversed(bases))
            for label in labels:
                g = asyncio.run(gaps_round(bases[label], i)) if args.only != "webui" else None
                w = {str(t): asyncio.run(webui_round(bases[label], i, t)) for t in THINK} if args.only != "gaps" else None
                rounds.append({"round": i, "server": label, "gaps": g, "webui": w})
                print(f"round {i} {label}:"
                      + (f" gap alone {1000 * statistics.median(g['alone_gaps']):.1f} ms (longest "
                         f"{1000 * max(g['alone_gaps']):.1f}), longest beside {1000 * max(g['beside_gaps']):.1f} ms,"
                         f" aggregate {g['aggregate_tokens_per_second']:.1f} tok/s;" if g else "")
                      + (" webui TTFT alone / with tasks "
                         + ", ".join(f"{w[t]['alone']['ttft']:.3f} / {w[t]['tasks']['ttft']:.3f} s ({t} s)" for t in w)
                         if w else ""), file=sys.stderr)  # fmt: skip
            if args.only != "webui":
                pairs = asyncio.run(interleaved_round(bases, i, args.interleaved))
                interleaved.append({"round": i, "pairs": pairs})
                print(f"round {i} interleaved, fair / no-fair aggregate tok/s: "
                      + ", ".join(f"{p['beside']['fair'] / p['beside']['no-fair']:.2f}" for p in pairs)
                      + "; drafting nothing: "
                      + ", ".join(f"{p['control']['fair'] / p['control']['no-fair']:.2f}" for p in pairs),
                      file=sys.stderr)  # fmt: skip
    record.save(args, "fair-slots", threads=args.threads, models={"target": target, "draft": draft},
                data={"settings": {"pair": args.pair or "default", "rounds": args.rounds, "servers": servers,
                                   "plain_tokens": PLAIN_TOKENS, "copy_tokens": COPY_TOKENS,
                                   "turn_tokens": TURN_TOKENS, "task_tokens": TASK_TOKENS, "think": THINK,
                                   "interleaved": args.interleaved, "only": args.only},
                      "costs": costs, "rounds": rounds, "aggregate": interleaved})  # fmt: skip


if __name__ == "__main__":
    main()
