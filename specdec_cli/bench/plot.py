"""`bench --plot`: acceptance by draft position, and tokens/s against K (matplotlib)."""

from __future__ import annotations

from pathlib import Path

from specdec_cli.bench.core import TARGET_ONLY, BenchInputError, Summary
from specdec_cli.engine.settings import MODEL, NGRAM


def plot(summaries: list[Summary], path: Path) -> None:
    """Acceptance by draft position per configuration, and tokens/s against K."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BenchInputError("--plot needs matplotlib: pip install 'specdec[plot]'") from None
    cat = summaries[-1].category  # "all" when there are several categories
    rows = [s for s in summaries if s.category == cat]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for s in rows:
        if s.accepted_by_position:
            xs = range(1, len(s.accepted_by_position) + 1)
            ax1.plot(xs, [100 * a for a in s.accepted_by_position], marker="o", label=s.config)
    ax1.set(title="acceptance by draft position", xlabel="position in the draft", ylabel="accepted (%)", ylim=(0, 100))
    if ax1.lines:
        ax1.legend(fontsize="small")
    base = next((s for s in rows if s.config == TARGET_ONLY), None)
    for kind in (MODEL, NGRAM, f"llama.cpp {MODEL}", f"llama.cpp {NGRAM}"):
        pts = sorted(
            (int(s.config.rsplit(":", 1)[1]), s.tokens / s.seconds)
            for s in rows
            if s.config.rsplit(":", 1)[0] == kind and s.config.rsplit(":", 1)[1].isdigit()
        )
        if pts:
            ax2.plot([k for k, _ in pts], [t for _, t in pts], marker="o", label=f"{kind}:K")
        for s in rows:
            if s.config == f"{kind}:auto":
                ax2.axhline(s.tokens / s.seconds, linestyle=":", color="grey")
                ax2.annotate(s.config, (1, s.tokens / s.seconds), fontsize="small")
    if base is not None:
        ax2.axhline(base.tokens / base.seconds, linestyle="--", color="black", label="target alone")
    ax2.set(title=f"tokens/s against K ({cat})", xlabel="K (tokens drafted per step)", ylabel="tokens/s")
    ax2.legend(fontsize="small")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise BenchInputError(f"cannot write --plot {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
