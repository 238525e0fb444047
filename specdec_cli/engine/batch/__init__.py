"""Continuous batching (`--parallel`): several generations share each step's target batch.

`engine` runs the step for every slot (admission, prefill, the draft rounds, verification), `plan`
chooses each step's drafts by pricing the batch they make, `slots` holds the jobs, the slots and one
sequence seen as a model, `occupancy` measures how soon the batch grows.
"""

from specdec_cli.engine.batch.engine import BatchEngine
from specdec_cli.engine.batch.slots import BatchJob, SeqView

__all__ = ["BatchEngine", "BatchJob", "SeqView"]
