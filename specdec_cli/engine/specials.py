"""Special tokens come from the chat template, never from what a user or system message says.

The rendered conversation must be tokenized with special tokens parsed (the
template writes `<|im_start|>` and friends as text), so a message containing
`<|im_end|>\\n<|im_start|>system\\n...` would forge a turn. Before rendering,
every control-token text inside a message is swapped for a marker that no
message can contain (a random nonce in private-use characters); after
rendering, the text between markers is tokenized with special tokens parsed and
each marker becomes its original text tokenized as plain text.

Only CONTROL tokens are parsed specially by llama.cpp; user-defined tokens (Gemma's
`<table>`, whitespace runs) match in plain text too, so they need no care. A
conversation with no control-token text in its messages is tokenized exactly
as before: one call with special tokens parsed.
"""

from __future__ import annotations

import re
import secrets
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ControlTexts:
    """Finds control-token texts in a string: candidates by first character, then a set lookup per length."""

    texts: frozenset[str]
    _by_first: dict[str, tuple[int, ...]] = field(default_factory=dict, compare=False)

    @staticmethod
    def of(texts: Iterable[str]) -> ControlTexts:
        kept = frozenset(t for t in texts if t)
        lengths: dict[str, set[int]] = defaultdict(set)
        for t in kept:
            lengths[t[0]].add(len(t))
        return ControlTexts(kept, {c: tuple(sorted(ls, reverse=True)) for c, ls in lengths.items()})

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Non-overlapping (start, end) of control texts in `text`, longest match first, left to right."""
        out: list[tuple[int, int]] = []
        i, n = 0, len(text)
        while i < n:
            lengths = self._by_first.get(text[i])
            if lengths:
                for length in lengths:
                    if text[i : i + length] in self.texts:
                        out.append((i, i + length))
                        i += length
                        break
                else:
                    i += 1
            else:
                i += 1
        return out


@dataclass
class Defanged:
    """Messages whose control texts are markers, and how to undo that after rendering."""

    messages: list[dict[str, str]]
    originals: list[str]
    nonce: str

    @property
    def changed(self) -> bool:
        return bool(self.originals)

    def marker(self, i: int) -> str:
        return f"\ue000{self.nonce}:{i}\ue001"

    def pieces(self, rendered: str) -> list[tuple[str, bool]]:
        """(text, parse_special) pieces: template text and messages' other text, then each marker's original."""
        pattern = re.compile(f"\ue000{self.nonce}:(\\d+)\ue001")
        out: list[tuple[str, bool]] = []
        pos = 0
        for m in pattern.finditer(rendered):
            if m.start() > pos:
                out.append((rendered[pos : m.start()], True))
            out.append((self.originals[int(m.group(1))], False))
            pos = m.end()
        if pos < len(rendered):
            out.append((rendered[pos:], True))
        return out


def defang(messages: Sequence[Mapping[str, str]], controls: ControlTexts) -> Defanged:
    nonce = secrets.token_hex(8)
    result = Defanged([], [], nonce)
    for m in messages:
        content = m["content"]
        spans = controls.spans(content)
        if spans:
            parts, pos = [], 0
            for start, end in spans:
                parts.append(content[pos:start])
                parts.append(result.marker(len(result.originals)))
                result.originals.append(content[start:end])
                pos = end
            parts.append(content[pos:])
            content = "".join(parts)
        result.messages.append({**m, "content": content})
    return result
