"""One record per HTTP request: counted in /metrics and written as one log line when it ends.

A streamed request ends when its stream does, not when its handler returns: a
client that goes away mid-stream is a 499 (nginx's "client closed request", as
llama-server's logs read it), one whose generation failed after the first byte
has the error's status, and the line says how many tokens reached the client.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from specdec_cli.server.worker import Done

CLIENT_GONE = 499


@dataclass
class Record:
    method: str
    path: str
    client: str
    route: str = ""  # the route's pattern: the metrics label (a path would be unbounded)
    t0: float = field(default_factory=time.perf_counter)
    stream: bool = False
    status: int | None = None  # set where the request's outcome is known; a stream left without one was abandoned
    error: str | None = None
    first: float | None = None  # seconds to the first generated text
    prompt_tokens: int | None = None
    cached_tokens: int = 0
    tokens: int = 0  # completion tokens whose text was sent
    drafted: int = 0
    accepted: int = 0
    finish: str | None = None
    closed: bool = False
    checked: float = field(default_factory=time.perf_counter)  # when the client was last seen connected

    def done(self, final: Done) -> None:
        s = final.generation.stats
        self.prompt_tokens, self.cached_tokens = final.generation.n_prompt_tokens, final.cached_tokens
        self.tokens, self.finish = final.completion_tokens, final.finish_reason
        self.drafted, self.accepted = s.drafted, s.accepted

    def line(self, status: int) -> str:
        """`127.0.0.1:53410 POST /v1/chat/completions 200 stream, 35 prompt (20 cached) + 128 tokens (stop),
        accepted 40/52, first 0.21 s, 2.31 s`."""
        seconds = time.perf_counter() - self.t0
        head = f"{self.client} {self.method} {self.path} {status}"
        if self.prompt_tokens is None:  # never reached generation
            return f"{head} {seconds:.2f} s{': ' + self.error if self.error else ''}"
        parts = [f"{head} {'stream' if self.stream else 'whole'}"]
        cached = f" ({self.cached_tokens} cached)" if self.cached_tokens else ""
        if status == CLIENT_GONE:
            parts.append(f"{self.prompt_tokens} prompt{cached} + {self.tokens} tokens sent, then the client went away")
        else:
            parts.append(f"{self.prompt_tokens} prompt{cached} + {self.tokens} tokens"
                         f"{f' ({self.finish})' if self.finish else ''}")  # fmt: skip
        if self.drafted:
            parts.append(f"accepted {self.accepted}/{self.drafted}")
        if self.first is not None:
            parts.append(f"first {self.first:.2f} s")
        parts.append(f"{seconds:.2f} s{': ' + self.error if self.error else ''}")
        return ", ".join(parts)
