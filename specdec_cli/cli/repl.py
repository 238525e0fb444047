"""The `specdec chat` read-eval-print loop: input, commands, Ctrl-C, and streaming replies.

Line editing and history come from prompt_toolkit on a terminal; a pipe is read
line by line. A line of three double quotes starts and ends a multi-line message.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from specdec_cli.chat_session import SETTABLE, ChatSession
from specdec_cli.errors import SpecdecError
from specdec_cli.render import error_line
from specdec_cli.render import generation as render

HELP = """commands:
  /help                 this list
  /stats                the session's totals and acceptance by draft position
  /reset                start a new conversation (the system prompt stays)
  /system TEXT          set the system prompt (empty to clear)
  /set KEY VALUE        change temp, top_k, top_p, min_p, seed or draft_max
  /draft on|off         speculate, or run the target alone (to compare)
  /save FILE            write the conversation and stats as JSON
  /exit                 leave (Ctrl-D too)
  \"\"\"                   start/end a multi-line message
Ctrl-C stops a reply (what was written stays in the conversation)."""

MULTILINE = '"""'


class LineReader:
    """prompt_toolkit on a terminal, plain lines otherwise. Raises EOFError at the end."""

    def __init__(self, stdin: IO[str], history_file: Path | None) -> None:
        self.stdin = stdin
        self.session: Any = None
        if stdin.isatty():
            from prompt_toolkit import PromptSession
            from prompt_toolkit.history import FileHistory, InMemoryHistory

            history: Any = InMemoryHistory()
            if history_file is not None:
                try:
                    history_file.parent.mkdir(parents=True, exist_ok=True)
                    history = FileHistory(str(history_file))
                except OSError:
                    pass
            self.session = PromptSession(history=history)

    def line(self, prompt: str) -> str:
        if self.session is not None:
            return str(self.session.prompt(prompt))
        text = self.stdin.readline()
        if not text:
            raise EOFError
        return text.rstrip("\n")

    def message(self) -> str:
        first = self.line(">>> ")
        if first.strip() != MULTILINE:
            return first
        lines: list[str] = []
        while True:
            nxt = self.line("... ")
            if nxt.strip() == MULTILINE:
                return "\n".join(lines)
            lines.append(nxt)


class Repl:
    def __init__(self, session: ChatSession, out: IO[str], err: IO[str], reader: LineReader) -> None:
        self.session = session
        self.out = out
        self.err = err
        self.reader = reader
        self._stop = False

    def say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def note(self, text: str) -> None:
        self.err.write(text + "\n")
        self.err.flush()

    # ---------------------------------------------------------------- loop
    def run(self) -> None:
        while True:
            try:
                text = self.reader.message()
            except EOFError:
                self.note("")
                return
            except KeyboardInterrupt:
                self.note("(Ctrl-C: /exit or Ctrl-D leaves the chat)")
                continue
            if not text.strip():
                continue
            if text.startswith("/"):
                if self.command(text) == "exit":
                    return
                continue
            try:
                self.reply(text)
            except SpecdecError as exc:
                error_line(str(exc), self.err)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self._stop = True

    def reply(self, text: str) -> None:
        self._stop = False
        previous: Callable[..., Any] | int | None = None
        try:
            previous = signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not the main thread: no Ctrl-C handling
            previous = None
        renderer = render.make_chat_renderer(self.out, self.err)
        try:
            for ev in self.session.reply(text, should_stop=lambda: self._stop):
                renderer.event(ev)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        renderer.end()
        if self.session.last_dropped:
            self.note(
                f"(the conversation neared --ctx-size: dropped the {self.session.last_dropped} oldest "
                "exchange(s), kept the system prompt)"
            )
        if self.session.last is not None:
            self.note(render.reply_summary(self.session.last))

    # ------------------------------------------------------------ commands
    def command(self, text: str) -> str | None:
        name, _, arg = text.strip().partition(" ")
        arg = arg.strip()
        s = self.session
        if name in ("/exit", "/quit"):
            return "exit"
        if name == "/help":
            self.say(HELP)
        elif name == "/stats":
            self.say(render.session_stats(s.totals.summary(), len(s.turns)))
        elif name == "/reset":
            s.reset()
            self.say("(new conversation)")
        elif name == "/system":
            s.system = arg or None
            self.say(f"(system prompt {'set' if arg else 'cleared'})")
        elif name == "/set":
            key, _, value = arg.partition(" ")
            if key not in SETTABLE or not value.strip():
                error_line(f"usage: /set {'|'.join(SETTABLE)} VALUE", self.err)
                return None
            try:
                self.say(f"({s.set(key, value.strip())})")
            except SpecdecError as exc:
                error_line(str(exc), self.err)
        elif name == "/draft":
            if arg not in ("on", "off"):
                error_line("usage: /draft on|off", self.err)
                return None
            if arg == "on" and not s.has_drafter:
                error_line("no drafter (started with --no-draft)", self.err)
                return None
            s.draft_on = arg == "on"
            self.say(f"(speculation {arg})")
        elif name == "/save":
            if not arg:
                error_line("usage: /save FILE", self.err)
                return None
            try:
                Path(arg).expanduser().write_text(json.dumps(s.summary(), indent=2, ensure_ascii=False))
            except OSError as exc:
                error_line(f"cannot write {arg}: {exc.strerror}", self.err)
                return None
            self.say(f"(saved to {arg})")
        else:
            error_line(f"unknown command {name}; /help lists them", self.err)
        return None
