"""`specdec run` in a real pseudo-terminal: colours, legend, live panel, and the text intact."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pexpect
import pytest

from tests.conftest import THREADS

ARGS = ["run", "Write two short lines about the sea.", "--drafter", "model", "-n", "40", "--ctx-size", "512", "--threads", str(THREADS)]
CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.mark.slow
def test_run_on_a_terminal_colours_draft_tokens_and_keeps_the_text() -> None:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env["TERM"] = "xterm-256color"
    child = pexpect.spawn(
        sys.executable, ["-m", "specdec_cli", *ARGS], env=env, dimensions=(40, 120), encoding="utf-8", timeout=300
    )
    child.expect(pexpect.EOF)
    child.close()
    screen = child.before
    assert child.exitstatus == 0, screen[-2000:]
    assert "\x1b[1;32m" in screen  # accepted draft tokens are drawn bold green ...
    plain = CSI.sub("", screen)
    assert "legend: accepted from draft model  accepted from n-gram lookup  chosen by target" in plain  # ... as the legend says
    assert "acceptance by draft position: 1:" in plain
    assert "stop: " in plain

    expected = json.loads(
        subprocess.run(
            [sys.executable, "-m", "specdec_cli", *ARGS, "--json"], capture_output=True, text=True, check=True
        ).stdout
    )["text"]
    for line in expected.splitlines():
        if line.strip():
            assert line in plain, line
