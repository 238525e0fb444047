"""Stop strings, matched across token boundaries and never emitted.

Text that could be the start of a stop string is held back until the next
token shows whether it is; a match ends the text right before it.
"""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.text = ""  # everything generated so far
        self.sent = 0  # how much of `text` has been released
        self.stopped = False

    def feed(self, piece: str) -> str:
        """Add generated text; return what may be released now (nothing after a stop)."""
        if self.stopped:
            return ""
        self.text += piece
        if not self.stops:
            out, self.sent = self.text[self.sent :], len(self.text)
            return out
        longest = max(len(s) for s in self.stops)
        start = max(0, self.sent - longest)
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if hits:
            end = min(hits)
            out = self.text[self.sent : end]
            self.sent = end
            self.stopped = True
            return out
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.text)), hold, -1):
                if self.text.endswith(s[:n]):
                    hold = n
                    break
        end = max(self.sent, len(self.text) - hold)
        out, self.sent = self.text[self.sent : end], end
        return out

    def flush(self) -> str:
        """At the end of generation: release what was held back (it was not a stop after all)."""
        if self.stopped:
            return ""
        out, self.sent = self.text[self.sent :], len(self.text)
        return out

    @property
    def released(self) -> str:
        return self.text[: self.sent]
