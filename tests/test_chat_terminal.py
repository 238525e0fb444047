"""`specdec chat` in a real pseudo-terminal: two turns, /set, /stats, and Ctrl-C in the middle of a reply."""

from __future__ import annotations

import os
import re
import sys

import pexpect
import pytest

from tests.conftest import THREADS

CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.mark.slow
def test_chat_session_in_a_pty(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env.update(TERM="xterm-256color", XDG_DATA_HOME=str(tmp_path), PROMPT_TOOLKIT_NO_CPR="1")
    child = pexpect.spawn(
        sys.executable,
        ["-m", "specdec_cli", "chat", "-n", "300", "--ctx-size", "2048", "--threads", str(THREADS), "--drafter", "model"],
        env=env,
        dimensions=(40, 120),
        encoding="utf-8",
        timeout=240,
    )
    child.expect(">>>")
    child.sendline("What is the capital of France?")
    child.expect(r"tokens/s, acceptance")
    child.expect(">>>")
    child.sendline("/set temp 0.3")
    child.expect(r"\(temp = 0\.3\)")
    child.expect(">>>")
    child.sendline("Write a very long story about a dragon and a knight.")
    child.expect(r"\x1b\[1;32m")  # the reply is streaming, with accepted draft tokens in green
    child.sendcontrol("c")  # Ctrl-C in the middle of the reply
    child.expect(r"stopped: interrupted")
    child.expect(">>>")
    child.sendline("/stats")
    child.expect(r"session: 2 replies, (\d+) tokens")
    child.expect(">>>")
    child.sendline("And the capital of Italy?")
    child.expect(r"tokens/s, acceptance")
    child.expect(">>>")
    child.sendcontrol("c")  # Ctrl-C at the prompt keeps the session
    child.expect(r"/exit or Ctrl-D")
    child.sendline("/stats")
    child.expect(r"session: 3 replies")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    screen = CSI.sub("", child.before or "")
    assert "Traceback" not in screen
