"""tf1_accum: gradient accumulation for TensorFlow 1 graph-mode code.

Accumulate gradients over several micro-batches with ``tf.compat.v1``,
``Session`` and ``feed_dict``, then apply one update that equals training on
the large batch.
"""

try:
    import tensorflow as _tensorflow  # noqa: F401
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "tf1_accum needs TensorFlow (2.15 to 2.21), which is not installed. "
        "Install it with: pip install 'tf1_accum[cpu]' (or tensorflow)."
    ) from _error

from tf1_accum._accumulation import Accumulation
from tf1_accum._accumulation import STATE_COLLECTION
from tf1_accum._accumulation import build_accumulation
from tf1_accum._accumulation import plain_variables
from tf1_accum._dataset import DatasetAccumulation
from tf1_accum._distributed import CollectiveAllReduce
from tf1_accum._distributed import broadcast_variables
from tf1_accum._dataset import build_dataset_accumulation
from tf1_accum._optimizer import AccumulationOptimizer
from tf1_accum._session import run_accumulation

__version__ = "0.1.0"

__all__ = (
    "Accumulation",
    "AccumulationOptimizer",
    "CollectiveAllReduce",
    "DatasetAccumulation",
    "STATE_COLLECTION",
    "broadcast_variables",
    "build_accumulation",
    "build_dataset_accumulation",
    "plain_variables",
    "run_accumulation",
)
