"""The API, the CLI and the server on the fake model (tests/fakes.py's `FakeGGUF`), in seconds.

The same guarantees the real-model tests check, at every layer: greedy output identical to the
target alone for every drafter, one at a time and four at once; stats that add up; the server's
request shapes and errors through httpx's ASGI transport with the real `openai` client. The files
are the packaged models' (checked as GGUF files); their weights are never read.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from typer.testing import CliRunner

from specdec_cli import api
from specdec_cli.cli import app
from specdec_cli.engine.batch import engine as engine_module
from specdec_cli.engine.batch.plan import Planner
from specdec_cli.engine.settings import GenerateOptions
from specdec_cli.server.app import Server, ServerSettings
from tests.fakes import FakeGGUF, open_fake
from tests.server_fixtures import in_process

DRAFTERS = ["auto", "model", "ngram", "none"]
PROMPTS = ["Name three rivers.", "Write a line about the sea.", "Say hello.", "Count to five."]

pytestmark = pytest.mark.usefixtures("fake_models")  # every model file a fake (tests/conftest.py)


@pytest.fixture(scope="module")
def spec() -> Iterator[api.Speculator]:
    with api.load(open_model=open_fake, n_ctx=1024) as s:
        yield s


def reference(spec: api.Speculator, prompt: str, max_tokens: int) -> list[int]:
    """The target alone, one token per decode, straight from the fake's logits."""
    target = spec.target
    assert isinstance(target, FakeGGUF)
    context = list(spec.tokenize(prompt).ids)
    out: list[int] = []
    while len(out) < max_tokens:
        tok = int(np.argmax(target.logits_after(context)))
        if tok in target.eog_ids:
            break
        out.append(tok)
        context.append(tok)
    return out


# ------------------------------------------------------------------ the API
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_api_greedy_is_the_target_alone(spec: api.Speculator, drafter: str) -> None:
    assert spec.draft is not None and isinstance(spec.draft, FakeGGUF)
    for prompt in PROMPTS:
        g = spec.generate(prompt, max_tokens=48, drafter=drafter)
        assert list(g.token_ids) == reference(spec, prompt, 48), (drafter, prompt)
        s = g.stats
        assert 0 <= s.emitted_from_draft <= s.accepted <= s.drafted
        assert s.emitted_from_draft + s.emitted_from_target == len(g.token_ids)


def test_api_stream_joins_to_the_generation(spec: api.Speculator) -> None:
    chunks = list(spec.stream(PROMPTS[0], max_tokens=40))
    final = chunks[-1].generation
    assert final is not None
    assert "".join(c.text for c in chunks) == final.text
    assert [t for c in chunks for t in c.token_ids] == list(final.token_ids)


def test_a_drafter_that_is_tried_drafts_and_is_sometimes_right(spec: api.Speculator) -> None:
    """The fake pair is a real pair for speculation: the draft agrees with the target often, not always."""
    g = spec.generate(PROMPTS[1], max_tokens=64, drafter="model", draft_max=4, adaptive=False)
    assert 0 < g.stats.accepted < g.stats.drafted


def test_concurrent_requests_match_their_solo_runs(spec: api.Speculator) -> None:
    solo = {(p, d): list(spec.generate(p, max_tokens=40, drafter=d).token_ids) for p in PROMPTS for d in DRAFTERS}
    assert len({tuple(solo[p, "none"]) for p in PROMPTS}) == len(PROMPTS)  # a mix-up of slots would show
    with api.load(open_model=open_fake, n_ctx=1024, parallel=4) as par:
        for d in DRAFTERS:
            assert at_once(par, d) == {p: solo[p, d] for p in PROMPTS}, d


def test_a_prompt_given_only_fillers_in_a_step_is_still_read_whole(spec: api.Speculator,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A slot still reading its prompt may get no chunk in a step, and filler tokens instead (rolled back after
    the step). It must go on from where its prompt was: a step's fillers once counted as prompt read, so the
    prompt's next token was never decoded (the real pair's greedy text then changed, 1 run in 5 of
    tests/test_batch.py's concurrent test). Here every step reads one prompt and fills every other sequence:
    each slot's cache must hold its prompt exactly, and the texts must be their solo runs'."""
    solo = {p: list(spec.generate(p, max_tokens=40, drafter="none").token_ids) for p in PROMPTS}
    read = engine_module.prompt_chunks
    monkeypatch.setattr(engine_module, "prompt_chunks", lambda *args: read(*args)[:1])
    monkeypatch.setattr(Planner, "fillers", lambda self, counts, gen, room: {s: 1 for s, n in enumerate(counts) if not n})
    with api.load(open_model=open_fake, n_ctx=1024, parallel=4) as par:
        assert at_once(par, "none") == solo
        held = par.batch_engine().target.seq_tokens
        for p in PROMPTS:
            ids = list(par.tokenize(p).ids)
            assert any(seq[: len(ids)] == ids for seq in held), p


def test_whole_answers_keep_their_steps_short_only_while_a_streamed_conversation_may_come_back() -> None:
    """A request that does not stream (`interactive` off) is bounded as background work (plan.py, BACKGROUND_SECONDS)
    only while a free slot holds a streamed conversation, whose next turn would wait for the step in progress: a
    script sending whole answers alone keeps every step's drafts."""
    with api.load(open_model=open_fake, n_ctx=1024, parallel=4) as par:
        engine = par.batch_engine()
        seen: list[bool] = []
        engine.on_step = lambda n_seqs, n_tokens, drafted: seen.append(engine.planner.chatting)

        def whole_answer() -> list[bool]:
            seen.clear()
            par.generate(PROMPTS[0], max_tokens=16, interactive=False)
            return list(seen)

        assert not any(whole_answer() + whole_answer())
        par.generate(PROMPTS[1], max_tokens=16)  # streamed: its slot now holds a conversation
        assert all(whole_answer())


def test_an_inexact_target_decodes_alone_one_request_at_a_time(spec: api.Speculator) -> None:
    """A target that no kernel set computes exactly in a batch (engine/kernels.py's `inexact`: a stock build's
    llamafile sgemm) gets neither drafts nor batch-mates: every drafter gives the target alone, and
    `parallel` falls back to one sequence; the load's warning says why."""
    def open_inexact(path: Any, **params: Any) -> FakeGGUF:
        m = open_fake(path, **params)
        if params.get("exact", True):
            m.kernels = "inexact"
            m.warnings.append(f"{m.name}: ... the target decodes alone, one request at a time")
        return m

    with api.load(open_model=open_inexact, n_ctx=1024, parallel=4) as alone:
        assert alone.parallel == 1 and alone.models["kernels"]["target"] == "inexact"
        assert any("decodes alone" in w for w in alone.warnings)
        for d in DRAFTERS:
            g = alone.generate(PROMPTS[2], max_tokens=40, drafter=d)
            assert list(g.token_ids) == reference(spec, PROMPTS[2], 40), d
            assert g.stats.drafted == 0 and g.settings["drafter"] is None, d


def at_once(par: api.Speculator, drafter: str) -> dict[str, list[int]]:
    """Every prompt from its own thread at the same time: the generations share each step's batch."""
    out: dict[str, list[int]] = {}
    errors: list[BaseException] = []

    def one(prompt: str) -> None:
        try:
            out[prompt] = list(par.generate(prompt, max_tokens=40, drafter=drafter).token_ids)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(p,)) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return out


# ------------------------------------------------------------------ the CLI
def test_cli_run_json_is_the_api_and_adds_up(spec: api.Speculator) -> None:
    res = CliRunner().invoke(app, ["run", PROMPTS[0], "-n", "48", "--json", "--ctx-size", "1024"])
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["token_ids"] == reference(spec, PROMPTS[0], 48)
    s = data["stats"]
    assert s["emitted_from_draft"] <= s["accepted"] <= s["drafted"]
    assert s["emitted_from_draft"] + s["emitted_from_target"] == len(data["token_ids"])
    assert data["settings"]["temperature"] == 0.0 and data["settings"]["drafter"] == "auto"


def test_cli_no_draft_and_drafters_agree() -> None:
    texts = set()
    for args in (["--no-draft"], ["--drafter", "model"], ["--drafter", "ngram"]):
        res = CliRunner().invoke(app, ["run", PROMPTS[2], "-n", "32", "--json", "--ctx-size", "1024", *args])
        assert res.exit_code == 0, res.stderr
        texts.add(json.loads(res.stdout)["text"])
    assert len(texts) == 1


def test_cli_bench_writes_a_stamped_results_file(tmp_path: Any) -> None:
    """`bench --results` keeps what the table was made of: the stamp (what ran, where, on which build and
    models) and every run's own numbers, from which the summaries add up."""
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(app, ["bench", "--configs", "target,ngram:auto", "--repeats", "2", "--warmup", "0",
                                   "-n", "24", "--category", "input-grounded", "--ctx-size", "1024", "--json",
                                   "--results", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.stderr
    saved = json.loads(out.read_text())
    assert saved["kind"] == "bench" and saved["results"] == json.loads(res.stdout)["results"]
    st = saved["stamp"]
    assert st["date"] and st["cpu"]["cores"] >= 1 and st["build"]["llama_cpp_python"]
    assert "commit" in st and "dirty" in st and st["command"].startswith("specdec bench ") and "--configs target,ngram:auto" in st["command"]
    # the models this bench loaded (no draft model for these configurations), each by its content
    assert set(st["models"]) == {"target"} and len(st["models"]["target"]["sha256"]) == 64
    runs = saved["runs"]
    assert {r["config"] for r in runs} == {"target", "ngram:auto"} and {r["repeat"] for r in runs} == {0, 1}
    for summary in saved["results"]:
        mine = [r for r in runs if r["config"] == summary["config"] and r["category"] == summary["category"]]
        assert sum(r["tokens"] for r in mine) == summary["tokens"]
    bad = CliRunner().invoke(app, ["bench", "--configs", "target", "--results", str(tmp_path / "no" / "x.json")])
    assert bad.exit_code == 2 and "--results" in bad.stderr


# ------------------------------------------------------------------ the server, in-process
def serve(spec: api.Speculator, coro: Any, **settings: Any) -> Any:
    """Run `coro(client)` against the server's ASGI app (httpx's transport: no socket, no thread of ours)."""
    return in_process(Server(spec, ServerSettings("fake-pair", GenerateOptions(max_tokens=32), **settings)), coro)


def test_metrics_count_every_step_and_batch_the_engine_ran() -> None:
    """/metrics' per-step figures (counted in plain Python, rendered when read) add up: the drafts of the batches
    are the drafts of the steps, each draft position counted once per step that drafted it, accepted within
    drafted, one batch per step at most (a prompt's batch has no step)."""
    from prometheus_client.parser import text_string_to_metric_families

    async def go(http: httpx.AsyncClient) -> str:
        for p in PROMPTS:
            body = {"model": "fake-pair", "messages": [{"role": "user", "content": p}], "max_tokens": 24}
            assert (await http.post("http://specdec.test/v1/chat/completions", json=body)).status_code == 200
        return (await http.get("http://specdec.test/metrics")).text

    with api.load(open_model=open_fake, n_ctx=1024, parallel=2, drafter="model") as par:
        text = in_process(Server(par, ServerSettings("fake-pair", GenerateOptions(max_tokens=24))), go)
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip
    steps, drafted = values[("specdec_steps_total", ())], values[("specdec_tokens_drafted_total", ())]
    at = {dict(k[1])["position"]: v for k, v in values.items() if k[0] == "specdec_position_drafted_total"}
    ok = {dict(k[1])["position"]: v for k, v in values.items() if k[0] == "specdec_position_accepted_total"}
    assert steps > len(PROMPTS) and drafted > 0 and sum(at.values()) == drafted
    assert values[("specdec_batch_draft_tokens_sum", ())] == drafted
    assert 0 < values[("specdec_tokens_accepted_total", ())] == sum(ok.values()) <= drafted
    assert all(ok[p] <= at[p] for p in at) and at["1"] >= max(at.values())
    batches = values[("specdec_batch_sequences_count", ())]
    assert batches >= steps / 2 and values[("specdec_batch_sequences_bucket", (("le", "+Inf"),))] == batches


def test_server_chat_greedy_is_the_api_through_the_openai_client(spec: api.Speculator) -> None:
    async def go(http: httpx.AsyncClient) -> tuple[Any, str]:
        client = openai.AsyncOpenAI(base_url="http://specdec.test/v1", api_key="unused", http_client=http, max_retries=0)
        r = await client.chat.completions.create(model="fake-pair", messages=[{"role": "user", "content": PROMPTS[0]}],
                                                 max_tokens=32, temperature=0)  # fmt: skip
        stream = await client.chat.completions.create(model="fake-pair", max_tokens=32, temperature=0, stream=True,
                                                      messages=[{"role": "user", "content": PROMPTS[0]}])  # fmt: skip
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        return r, text

    r, streamed = serve(spec, go)
    expected = spec.generate([{"role": "user", "content": PROMPTS[0]}], max_tokens=32).text
    assert r.choices[0].message.content == expected == streamed
    assert r.usage.completion_tokens == len(reference(spec, PROMPTS[0], 32))


def test_kernels_fast_is_said_in_the_server_speculative_block() -> None:
    """`--kernels fast` (no probe: the output may differ from the target alone) reaches every response."""

    async def go(http: httpx.AsyncClient) -> Any:
        body = {"model": "fake-pair", "messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 8}
        return (await http.post("http://specdec.test/v1/chat/completions", json=body)).json()

    with api.load(open_model=open_fake, n_ctx=1024, kernels="fast") as fast:
        assert fast.models["exact"] is False and fast.models["kernels"]["target"] == "fast"
        assert serve(fast, go)["speculative"]["exact"] is False


def test_a_streamed_request_is_interactive_and_a_whole_answer_is_not(spec: api.Speculator,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The server marks what streams as read token by token (`GenerateOptions.interactive`): with fair slots, a
    stream's prompt is read while whole answers (a chat client's title and tag tasks) sit the step out."""
    seen: list[bool] = []
    start = spec.start

    def recording(prompt: Any, options: GenerateOptions | None = None, **kw: Any) -> Any:
        assert options is not None
        seen.append(options.interactive)
        return start(prompt, options, **kw)

    monkeypatch.setattr(spec, "start", recording)

    async def go(http: httpx.AsyncClient) -> None:
        for stream in (True, False):
            body = {"messages": [{"role": "user", "content": PROMPTS[1]}], "max_tokens": 8, "stream": stream}
            assert (await http.post("/v1/chat/completions", json=body)).status_code == 200

    serve(spec, go)
    assert seen == [True, False]


def test_models_retrieve_names_the_served_model_or_is_a_404(spec: api.Speculator) -> None:
    """openai's `models.retrieve` (GET /v1/models/{id}): the model `models.list` gives, or a 404 naming it."""
    async def go(http: httpx.AsyncClient) -> tuple[Any, Any]:
        client = openai.AsyncOpenAI(base_url="http://specdec.test/v1", api_key="unused", http_client=http, max_retries=0)
        got = await client.models.retrieve("fake-pair")
        try:
            await client.models.retrieve("some/other-model")
        except openai.NotFoundError as exc:
            return got, exc
        return got, None

    got, missing = serve(spec, go)
    assert (got.id, got.object, got.owned_by) == ("fake-pair", "model", "specdec")
    assert missing is not None and missing.body["code"] == "model_not_found" and "'fake-pair'" in missing.body["message"]


MSG = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    ("body", "status", "code", "param", "needle"),
    [
        (b"{not json", 400, "invalid_json", None, "not valid JSON"),
        (b"[1, 2]", 400, "invalid_json", None, "JSON object"),
        ({"messages": MSG, "max_tokens": "ten"}, 400, "invalid_value", "max_tokens", "max_tokens"),
        ({"messages": "Hi"}, 400, "invalid_value", "messages", "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "invalid_value", None, "role"),
        ({"messages": []}, 400, "invalid_value", "messages", "messages"),
        ({"messages": MSG, "model": "gpt-9"}, 404, "model_not_found", "model", "gpt-9"),
        ({"messages": MSG, "n": 2}, 400, None, "n", "n must be 1"),
        ({"messages": MSG, "temperature": -1}, 400, "invalid_value", "temperature",
         "temperature must be a finite number >= 0"),
        ({"messages": MSG, "top_p": 2}, 400, "invalid_value", "top_p", "top_p must be in (0, 1], got 2.0"),
        ({"messages": MSG, "max_tokens": 0}, 400, "invalid_value", "max_tokens", "max_tokens must be >= 1, got 0"),
        ({"messages": MSG, "max_completion_tokens": 0}, 400, "invalid_value", "max_tokens", "max_tokens must be >= 1"),
        ({"messages": MSG, "stop": ["a", "b", "c", "d", "e"]}, 400, None, "stop", "at most 4"),
        ({"messages": MSG, "speculative": {"draft_max": 1000}}, 400, "invalid_value", "speculative.draft_max",
         "speculative.draft_max must be from 1 to 64, got 1000"),
        ({"messages": MSG, "speculative": {"draft_max": "4"}}, 400, "invalid_value", "speculative.draft_max", "integer"),
        ({"messages": MSG, "speculative": {"drafter": "nope"}}, 400, "invalid_value", "speculative.drafter",
         "'heads' or 'none'"),
        ({"messages": [{"role": "user", "content": "word " * 3000}]}, 400, "context_length_exceeded", "messages",
         "context"),
        # What the server does not do is a clear 400 naming the field (docs/serve.md, "Request fields")
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                                    {"type": "image_url", "image_url": {"url": "data:,"}}]}]},
         400, "unsupported_parameter", "messages.0.content.1", "'image_url' content parts are not supported"),
        ({"messages": MSG, "tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f"}}]},
         400, "unsupported_parameter", "tool_choice", "specdec does not call tools"),
        ({"messages": MSG, "tool_choice": {"type": "function", "function": {"name": "f"}}}, 400,
         "unsupported_parameter", "tool_choice", "does not call tools"),
        ({"messages": MSG, "function_call": {"name": "f"}}, 400, "unsupported_parameter", "function_call", "tools"),
        ({"messages": MSG, "response_format": {"type": "json_object"}}, 400, "unsupported_parameter",
         "response_format", "response_format 'json_object' is not supported"),
        ({"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
         400, "unsupported_parameter", "response_format", "'json_schema'"),
        ({"messages": MSG, "logprobs": True}, 400, "unsupported_parameter", "logprobs", "logprobs are not supported"),
        ({"messages": MSG, "top_logprobs": 3}, 400, "unsupported_parameter", "logprobs", "logprobs"),
        ({"messages": MSG, "frequency_penalty": 0.5}, 400, "unsupported_parameter", "frequency_penalty", "penalties"),
        ({"messages": MSG, "presence_penalty": -1}, 400, "unsupported_parameter", "presence_penalty", "penalties"),
        ({"messages": MSG, "logit_bias": {"1": 5}}, 400, "unsupported_parameter", "logit_bias", "logit_bias"),
        ({"messages": MSG, "modalities": ["text", "audio"]}, 400, "unsupported_parameter", "modalities", "text"),
        ({"messages": [{"role": "tool", "content": 3}]}, 400, "invalid_value", None, "content"),
    ],
)  # fmt: skip
def test_bad_requests_get_openai_errors(spec: api.Speculator, body: Any, status: int, code: str | None,
                                        param: str | None, needle: str) -> None:  # fmt: skip
    async def go(http: httpx.AsyncClient) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return await http.post("/v1/chat/completions", content=content, headers={"content-type": "application/json"})

    resp = serve(spec, go)
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and needle in err["message"], err
    assert code is None or err["code"] == code, err
    assert param is None or err["param"] == param, err


WEATHER = {"type": "function", "function": {"name": "weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}


def test_tools_and_formats_get_what_the_docs_say_through_the_openai_client(spec: api.Speculator) -> None:
    """tools with tool_choice auto/none: not shown to the model, the answer is its text (the same as without them);
    a history holding tool calls and `tool` messages reaches the template; what is not done is a 400."""
    question = [{"role": "user", "content": "Weather in Oslo?"}]
    history = [*question, {"role": "assistant", "content": None, "tool_calls": [CALL]},
               {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}]  # fmt: skip

    async def go(http: httpx.AsyncClient) -> tuple[list[Any], list[Any]]:
        client = openai.AsyncOpenAI(base_url="http://specdec.test/v1", api_key="unused", http_client=http, max_retries=0)
        ask = functools.partial(client.chat.completions.create, model="fake-pair", max_tokens=16, temperature=0)
        answers = [await ask(messages=question, tools=[WEATHER]),
                   await ask(messages=question, tools=[WEATHER], tool_choice="none"),
                   await ask(messages=question, response_format={"type": "text"}, logprobs=False, user="me",
                             parallel_tool_calls=False, frequency_penalty=0),
                   await ask(messages=history, tools=[WEATHER])]  # fmt: skip
        errors = []
        for bad in ({"tool_choice": "required", "tools": [WEATHER]}, {"response_format": {"type": "json_object"}},
                    {"logprobs": True, "top_logprobs": 2}):  # fmt: skip
            try:
                await ask(messages=question, **bad)
            except openai.BadRequestError as exc:
                errors.append(exc)
        return answers, errors

    answers, errors = serve(spec, go)
    plain = spec.generate(question, max_tokens=16).text
    assert [a.choices[0].message.content for a in answers[:3]] == [plain] * 3
    assert all(a.choices[0].message.tool_calls is None and a.choices[0].finish_reason in ("stop", "length")
               for a in answers)  # fmt: skip
    # the history as the template got it: the call as a JSON line, the tool's result in its own role
    rendered = [*question, {"role": "assistant", "content": '{"name": "weather", "arguments": {"city": "Oslo"}}'},
                {"role": "tool", "content": "Sunny, 21 C"}]  # fmt: skip
    assert answers[3].choices[0].message.content == spec.generate(rendered, max_tokens=16).text
    assert answers[3].usage.prompt_tokens == len(spec.tokenize(rendered).ids)
    assert [e.body["param"] for e in errors] == ["tool_choice", "response_format", "logprobs"]
    assert all(e.status_code == 400 and e.body["code"] == "unsupported_parameter" for e in errors)


def test_completions_echo_writes_the_prompt_before_the_answer(spec: api.Speculator) -> None:
    async def go(http: httpx.AsyncClient) -> tuple[Any, str, Any]:
        client = openai.AsyncOpenAI(base_url="http://specdec.test/v1", api_key="unused", http_client=http, max_retries=0)
        ask = functools.partial(client.completions.create, model="fake-pair", prompt=PROMPTS[1], max_tokens=12,
                                temperature=0)  # fmt: skip
        whole = await ask(echo=True)
        streamed = "".join([c.choices[0].text async for c in await ask(echo=True, stream=True) if c.choices])
        return whole, streamed, await ask()

    whole, streamed, plain = serve(spec, go)
    assert whole.choices[0].text == PROMPTS[1] + plain.choices[0].text == streamed
    assert whole.usage.completion_tokens == plain.usage.completion_tokens


def test_a_parameter_error_names_the_request_field() -> None:
    """draft_max lives under `speculative` in a request: the error says so (settings.py's message, renamed)."""
    with api.load(open_model=open_fake, n_ctx=256, drafter="ngram") as s:
        async def go(http: httpx.AsyncClient) -> httpx.Response:
            return await http.post("/v1/chat/completions", json={"messages": MSG, "speculative": {"drafter": "model"}})

        resp = serve(s, go)
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["param"] == "speculative.drafter"
    assert err["message"].startswith("speculative.drafter must be auto, ngram or none: this server has no draft model")


@pytest.mark.parametrize(("origin", "allowed"), [("http://localhost:3000", True), ("http://127.0.0.1:8080", True),
                                                 ("https://chat.example.org", True), ("http://evil.example", False)])  # fmt: skip
def test_web_pages_on_this_machine_or_a_named_origin_may_call_the_server(spec: api.Speculator, origin: str,
                                                                         allowed: bool) -> None:  # fmt: skip
    """CORS: a preflight for a chat request with a key, then the request; other origins get no CORS header."""
    async def go(http: httpx.AsyncClient) -> tuple[httpx.Response, httpx.Response]:
        pre = await http.options("/v1/chat/completions", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})  # fmt: skip
        got = await http.get("/v1/models", headers={"Origin": origin, "Authorization": "Bearer k"})
        return pre, got

    pre, got = serve(spec, go, api_key="k", cors_origins=("https://chat.example.org",))
    assert got.status_code == 200
    if allowed:
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == origin
        assert "authorization" in pre.headers["access-control-allow-headers"].lower()
        assert got.headers["access-control-allow-origin"] == origin
    else:
        assert pre.status_code == 400 and "access-control-allow-origin" not in got.headers
