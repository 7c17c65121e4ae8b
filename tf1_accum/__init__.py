"""tf1_accum: gradient accumulation for TensorFlow 1 graph-mode code.

Accumulate gradients over several micro-batches with ``tf.compat.v1``,
``Session`` and ``feed_dict``, then apply one update that equals training on
the large batch.
"""

from tf1_accum._accumulation import Accumulation
from tf1_accum._accumulation import STATE_COLLECTION
from tf1_accum._accumulation import build_accumulation
from tf1_accum._accumulation import plain_variables
from tf1_accum._session import run_accumulation

__version__ = "0.1.0"

__all__ = (
    "Accumulation",
    "STATE_COLLECTION",
    "build_accumulation",
    "plain_variables",
    "run_accumulation",
)
