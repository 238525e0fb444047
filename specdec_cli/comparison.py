"""`--compare`: one prompt through the drafter and through the target alone, side by side: whether the text is
the same (greedy: the product's claim, checked in front of the user) and how much faster it came."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdec_cli.engine.kv_cache import first_difference
from specdec_cli.generation import Generation


@dataclass(frozen=True)
class Comparison:
    """A generation with its drafter (`speculative`) and the same prompt and settings through the target
    alone (`alone`), run after it on the same loaded models."""

    speculative: Generation
    alone: Generation

    @property
    def greedy(self) -> bool:
        return float(self.speculative.settings.get("temperature") or 0.0) <= 0.0

    @property
    def first_difference(self) -> int | None:
        """The index of the first token where the two differ (one ending first counts); None: the same."""
        a, b = self.speculative.token_ids, self.alone.token_ids
        n = min(len(a), len(b))
        if a[:n] != b[:n]:
            return first_difference(a, b, n)
        return None if len(a) == len(b) else n

    @property
    def same_text(self) -> bool:
        return self.first_difference is None

    @property
    def speedup(self) -> float | None:
        """Tokens/s with the drafter over tokens/s alone (both after the prompt is read)."""
        base = self.alone.stats.tokens_per_second
        return self.speculative.stats.tokens_per_second / base if base > 0 else None

    def to_json(self) -> dict[str, Any]:
        """`run --compare --json`'s `comparison`."""
        speedup = self.speedup
        return {
            "same_text": self.same_text,
            "first_difference": self.first_difference,
            "sampled": not self.greedy,
            "tokens_per_second": {"speculative": round(self.speculative.stats.tokens_per_second, 3),
                                  "target_alone": round(self.alone.stats.tokens_per_second, 3)},
            "speedup": None if speedup is None else round(speedup, 3),
            "target_alone": {"text": self.alone.text, "n_tokens": len(self.alone.token_ids),
                             "stop_reason": self.alone.stop_reason},
        }  # fmt: skip

    def line(self) -> str:
        """The one line `run --compare` ends with."""
        s, a = self.speculative.stats.tokens_per_second, self.alone.stats.tokens_per_second
        speedup = self.speedup
        speed = f"{s:.1f} tokens/s, the target alone {a:.1f}: " + (f"{speedup:.2f}x" if speedup else "-")
        if not self.greedy:
            return (f"compare: sampled, so two draws from the target's distribution, not the same text by design "
                    f"(the texts are not compared) · {speed}")  # fmt: skip
        if self.same_text:
            return f"compare: same text: yes ({len(self.alone.token_ids)} tokens) · {speed}"
        return f"compare: same text: NO, from token {self.first_difference}{self._why()} · {speed}"

    def _why(self) -> str:
        if not self.speculative.models.get("exact", True):
            return " (--kernels fast: expected where two tokens' logits are within rounding)"
        return " (a bug in specdec: please report it with this command)"
