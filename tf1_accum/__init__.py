"""tf1_accum: gradient accumulation for TensorFlow 1 graph-mode code.

Accumulate gradients over several micro-batches with ``tf.compat.v1``,
``Session`` and ``feed_dict``, then apply one update that equals training on
the large batch. Public names are imported on first use (PEP 562): the source
checker needs no TensorFlow.
"""

from __future__ import annotations as _annotations  # private, as every import here

import importlib as _importlib
import typing as _typing

__version__ = "0.1.0"

# The private module that defines each public name, which __getattr__ imports.
_MODULES = {
    name: module
    for module, names in (
        ("_accumulation", "Accumulation build_accumulation"),
        ("_dataset", "DatasetAccumulation build_dataset_accumulation"),
        ("_distributed", "CollectiveAllReduce broadcast_variables"),
        ("_graph_check", "GraphFinding check_graph"),
        ("_horovod", "HorovodAllReduce"),
        ("_keras_optimizer", "KerasAccumulationOptimizer"),
        ("_optimizer", "AccumulationOptimizer TrainOpWindow"),
        ("_options", "WindowMean WindowOptions clip_by_global_norm"),
        ("_saver", "Saver"),
        ("_session", "run_accumulation"),
        ("_split", "MemoryFit SizeChange"),
        ("_state", "STATE_COLLECTION plain_variables"),
        ("_stats", "GradientStatistics RunningAverage build_running_average"),
        ("_stats", "recommend_micro_batches"),
    )
    for name in names.split()
}
__all__ = tuple(sorted(_MODULES))

if _typing.TYPE_CHECKING:
    # For type checkers; at run time __getattr__ imports each name on first use.
    from tf1_accum._state import STATE_COLLECTION as STATE_COLLECTION
    from tf1_accum._accumulation import Accumulation as Accumulation
    from tf1_accum._accumulation import build_accumulation as build_accumulation
    from tf1_accum._state import plain_variables as plain_variables
    from tf1_accum._saver import Saver as Saver
    from tf1_accum._dataset import DatasetAccumulation as DatasetAccumulation
    from tf1_accum._dataset import build_dataset_accumulation as build_dataset_accumulation
    from tf1_accum._distributed import CollectiveAllReduce as CollectiveAllReduce
    from tf1_accum._distributed import broadcast_variables as broadcast_variables
    from tf1_accum._graph_check import GraphFinding as GraphFinding, check_graph as check_graph
    from tf1_accum._horovod import HorovodAllReduce as HorovodAllReduce
    from tf1_accum._keras_optimizer import KerasAccumulationOptimizer as KerasAccumulationOptimizer
    from tf1_accum._optimizer import AccumulationOptimizer as AccumulationOptimizer
    from tf1_accum._optimizer import TrainOpWindow as TrainOpWindow
    from tf1_accum._options import WindowMean as WindowMean, WindowOptions as WindowOptions
    from tf1_accum._options import clip_by_global_norm as clip_by_global_norm
    from tf1_accum._session import run_accumulation as run_accumulation
    from tf1_accum._split import MemoryFit as MemoryFit, SizeChange as SizeChange
    from tf1_accum._stats import GradientStatistics as GradientStatistics
    from tf1_accum._stats import RunningAverage as RunningAverage
    from tf1_accum._stats import build_running_average as build_running_average
    from tf1_accum._stats import recommend_micro_batches as recommend_micro_batches

_NO_TENSORFLOW = (
    "tf1_accum needs TensorFlow (2.15 to 2.21, or 1.15 on Python 3.7), not installed. Install "
    "it with: pip install 'tensorflow>=2.15,<2.22' (or 'tensorflow-cpu>=2.15,<2.22', without "
    "GPU support; on Python 3.7: pip install 'tensorflow>=1.15,<1.16' 'protobuf<3.21')."
)


def __getattr__(name: str) -> _typing.Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'tf1_accum' has no attribute {name!r}")
    try:
        _importlib.import_module("tensorflow")
    except ImportError as error:
        raise ImportError(_NO_TENSORFLOW) from error
    value = getattr(_importlib.import_module(f"tf1_accum.{module}"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
