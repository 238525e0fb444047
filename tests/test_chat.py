"""`specdec chat`: the session (KV reuse, trimming, interruption) and the REPL through CliRunner."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specdec_cli import api
from specdec_cli.api import GenerateOptions
from specdec_cli.chat_session import ChatSession
from specdec_cli.cli import app
from specdec_cli.engine.events import Step
from specdec_cli.engine.model import Model
from specdec_cli.errors import UnsupportedModelError, UsageError
from tests.conftest import THREADS, wrap
from tests.fakes import open_fake

cli = CliRunner()
FAST = ["--ctx-size", "1024", "--threads", str(THREADS), "-n", "24", "--drafter", "model"]


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> Iterator[ChatSession]:
    """On the fake (tests/fakes.py): the session's logic (cache reuse, trimming, interruption, /set) does not
    depend on the weights; the REPL tests below and tests/test_chat_terminal.py run the real models."""
    monkeypatch.setenv("SPECDEC_CALIBRATE", "0")
    with api.load(n_ctx=1024, open_model=open_fake, drafter="model") as spec:
        yield ChatSession(spec, GenerateOptions(max_tokens=24, draft_max=4))


def drain(session: ChatSession, text: str, stop_after: int | None = None) -> str:
    n = 0

    def should_stop() -> bool:
        return stop_after is not None and n >= stop_after

    for ev in session.reply(text, should_stop=should_stop):
        if isinstance(ev, Step):
            n += 1
    assert session.last is not None
    return session.last.text


def test_second_turn_evaluates_only_new_tokens(session: ChatSession) -> None:
    turn1 = session.prompt_tokens("Name a fruit.", 0)[0].ids
    drain(session, "Name a fruit.")
    assert session.last is not None
    reply = len(session.last.token_ids)
    target = session.spec.target
    before = target.decoded_tokens
    turn2_prompt = session.prompt_tokens("Name a vegetable.", 0)[0].ids
    reused = target.common_prefix(turn2_prompt)
    drain(session, "Name a vegetable.")
    prefill_and_steps = target.decoded_tokens - before
    assert reused >= len(turn1) + reply - 2  # the whole first exchange is reused (but its final tokens)
    # what was evaluated: the new part of the prompt plus the reply's verification batches
    steps = session.last_stats.steps
    drafted = session.last_stats.drafted
    assert prefill_and_steps <= (len(turn2_prompt) - reused) + steps + drafted


def test_interrupted_reply_keeps_text_and_caches_consistent(session: ChatSession) -> None:
    partial = drain(session, "Write a long story about a lighthouse.", stop_after=3)
    assert session.last is not None and session.last.stop_reason == "interrupted"
    assert session.history[-1] == {"role": "assistant", "content": partial} and partial
    after = drain(session, "Give it a title.")
    # a fresh session with the same history (cold caches) must say exactly the same
    with api.load(n_ctx=1024, open_model=open_fake, drafter="model") as fresh_spec:
        fresh = ChatSession(fresh_spec, GenerateOptions(max_tokens=24, draft_max=4))
        fresh.history = list(session.history[:-2])
        assert drain(fresh, "Give it a title.") == after


def test_near_context_limit_drops_oldest_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEC_CALIBRATE", "0")
    with api.load(n_ctx=256, open_model=open_fake, drafter="model") as spec:
        s = ChatSession(spec, GenerateOptions(max_tokens=40, draft_max=4), system="You are brief.")
        for i in range(6):
            drain(s, f"Tell me fact number {i} about the ocean.")
            assert s.last is not None and s.last.text
        assert s.dropped_turns > 0
        tokens, _ = s.prompt_tokens("one more", 40)
        assert len(tokens.ids) + 40 <= 256
        assert s.history and s.system == "You are brief."  # the system prompt is kept, old turns dropped


def test_set_validates(session: ChatSession) -> None:
    assert session.set("temp", "0.7") == "temp = 0.7"
    assert session.options.temperature == 0.7
    with pytest.raises(UsageError, match="^temp must be a finite number >= 0"):  # named as /set names it
        session.set("temp", "-1")
    with pytest.raises(UsageError, match="^temp must be"):
        session.set("temp", "nan")
    with pytest.raises(UsageError, match="needs a number"):
        session.set("top_k", "many")
    with pytest.raises(UsageError, match="^draft_max must be from 1 to 64"):
        session.set("draft_max", "0")
    with pytest.raises(UsageError, match="^seed must be a whole number"):
        session.set("seed", "-1")
    with pytest.raises(UsageError, match="unknown setting"):
        session.set("colour", "red")
    assert session.options.temperature == 0.7 and session.options.seed is None  # refused values left nothing


def test_base_model_is_refused(gemma_path: Path) -> None:
    res = cli.invoke(app, ["chat", "--target", str(gemma_path), "--no-draft", *FAST], input="hi\n")
    assert res.exit_code == 1
    assert "no chat template" in res.stderr and "specdec run --raw" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_scripted_session(tmp_path: Path) -> None:
    saved = tmp_path / "chat.json"
    script = "\n".join(
        [
            "Hello! Who are you?",
            "/set temp 0.5",
            "/set temp abc",
            "/set seed 3",
            "/stats",
            "/draft off",
            '"""',
            "Two lines:",
            "say hi.",
            '"""',
            "/draft on",
            "/system Be brief.",
            "/nonsense",
            f"/save {saved}",
            "/reset",
            "/stats",
            "/exit",
        ]
    )
    res = cli.invoke(app, ["chat", *FAST], input=script + "\n")
    assert res.exit_code == 0, res.stderr
    out, err = res.stdout, res.stderr
    assert "(temp = 0.5)" in out and "(seed = 3)" in out
    assert "Error: temp needs a number, got 'abc'" in err
    assert "session: 1 reply," in out and "session: 0 replies" in out
    assert "(speculation off)" in out and "(speculation on)" in out
    assert "Error: unknown command /nonsense" in err
    assert err.count("tokens/s, acceptance") == 2  # one summary line per reply
    data = json.loads(saved.read_text())
    assert [m["role"] for m in data["messages"]] == ["user", "assistant", "user", "assistant"]
    assert data["messages"][2]["content"] == "Two lines:\nsay hi."
    assert data["settings"]["temperature"] == 0.5 and data["settings"]["seed"] == 3
    assert data["turns"][1]["stats"]["drafted"] == 0  # the /draft off turn
    assert data["totals"]["drafted"] > 0


def test_ctrl_d_ends_the_session() -> None:
    res = cli.invoke(app, ["chat", *FAST], input="")
    assert res.exit_code == 0


def test_chat_model_file_errors(tmp_path: Path) -> None:
    res = cli.invoke(app, ["chat", "--target", str(tmp_path / "x.gguf"), "--no-draft"])
    assert res.exit_code == 1 and res.stderr.startswith("Error: model file not found")


def test_session_requires_template(gemma: Model) -> None:
    with pytest.raises(UnsupportedModelError):
        ChatSession(wrap(gemma, drafter="none"), GenerateOptions())


def test_chat_with_the_ngram_drafter_matches_the_target_alone(smol: Model) -> None:
    """Two turns with the n-gram drafter (no draft model), then the same turns with the target alone."""
    pair = wrap(smol, drafter="ngram")
    cfg = GenerateOptions(max_tokens=32, draft_max=6, adaptive=False)  # fixed K: drafts whenever the lookup matches
    turns = ["Repeat exactly: red, green, blue, red, green, blue.", "Now repeat it once more."]
    spec = ChatSession(pair, cfg)
    replies = [drain(spec, t) for t in turns]
    assert spec.totals.drafted > 0 and spec.totals.accepted <= spec.totals.drafted
    assert spec.summary()["settings"]["drafter"] == "ngram"
    alone = ChatSession(pair, cfg, draft_on=False)
    assert [drain(alone, t) for t in turns] == replies
    assert alone.totals.drafted == 0
