"""The drafters: who proposes the tokens the target verifies.

`base` is the lifecycle every drafter follows (llama.cpp's common_speculative: `begin`, then per step
`propose` and `accept`) and what it exchanges with the loop; `model` is the draft model, `ngram` the
n-gram lookup, `cross` a draft model with another tokenizer, `auto` the drafter that chooses between
them and plain decodes from measured costs, `policies` the wrappers (adaptive K, and `gate`'s cost
gate for a free drafter). The common names are importable from here.
"""

from specdec_cli.engine.drafters.base import NO_DRAFT, Drafter, DraftRequest, DraftUnusable, Outcome, Proposal
from specdec_cli.engine.drafters.model import ModelDrafter, check_finite, pick
from specdec_cli.engine.drafters.ngram import NgramDrafter

__all__ = ["NO_DRAFT", "DraftRequest", "DraftUnusable", "Drafter", "ModelDrafter", "NgramDrafter", "Outcome",
           "Proposal", "check_finite", "pick"]
