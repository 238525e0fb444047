"""Pairs: can a target and a draft speculate together (`compat`), and what would it gain (`probe`).

The compatibility check's names are re-exported here: `pairs.check(...)`, `pairs.Verdict`.
"""

from specdec_cli.pairs.compat import (
    COMPATIBLE,
    CROSS,
    INCOMPATIBLE,
    PairReport,
    Verdict,
    check,
    cross_check,
    inspect_pair,
)

__all__ = ["COMPATIBLE", "CROSS", "INCOMPATIBLE", "PairReport", "Verdict", "check", "cross_check", "inspect_pair"]
