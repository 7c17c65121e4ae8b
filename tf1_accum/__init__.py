"""tf1_accum: gradient accumulation for TensorFlow 1 graph-mode code.

Accumulate gradients over several micro-batches with ``tf.compat.v1``,
``Session`` and ``feed_dict``, then apply one update that equals training on
the large batch. Public names are imported on first use (PEP 562): the source
checker needs no TensorFlow.
"""

import importlib as _importlib
import typing as _typing

__version__ = "0.1.0"

__all__ = (
    "Accumulation",
    "AccumulationOptimizer",
    "CollectiveAllReduce",
    "DatasetAccumulation",
    "GradientStatistics",
    "GraphFinding",
    "HorovodAllReduce",
    "KerasAccumulationOptimizer",
    "MemoryFit",
    "RunningAverage",
    "STATE_COLLECTION",
    "Saver",
    "SizeChange",
    "TrainOpWindow",
    "WindowMean",
    "WindowOptions",
    "broadcast_variables",
    "build_accumulation",
    "build_dataset_accumulation",
    "build_running_average",
    "check_graph",
    "clip_by_global_norm",
    "plain_variables",
    "recommend_micro_batches",
    "run_accumulation",
)

# Public name -> the private module that defines it (and a line in __all__).
_MODULES = {
    "Accumulation": "_accumulation",
    "AccumulationOptimizer": "_optimizer",
    "CollectiveAllReduce": "_distributed",
    "DatasetAccumulation": "_dataset",
    "GraphFinding": "_graph_check",
    "GradientStatistics": "_stats",
    "HorovodAllReduce": "_horovod",
    "KerasAccumulationOptimizer": "_keras_optimizer",
    "MemoryFit": "_split",
    "RunningAverage": "_stats",
    "STATE_COLLECTION": "_state",
    "Saver": "_saver",
    "SizeChange": "_split",
    "TrainOpWindow": "_optimizer",
    "WindowMean": "_options",
    "WindowOptions": "_options",
    "broadcast_variables": "_distributed",
    "build_accumulation": "_accumulation",
    "build_dataset_accumulation": "_dataset",
    "build_running_average": "_stats",
    "check_graph": "_graph_check",
    "clip_by_global_norm": "_options",
    "plain_variables": "_state",
    "recommend_micro_batches": "_stats",
    "run_accumulation": "_session",
}

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
    from tf1_accum._graph_check import GraphFinding as GraphFinding
    from tf1_accum._graph_check import check_graph as check_graph
    from tf1_accum._horovod import HorovodAllReduce as HorovodAllReduce
    from tf1_accum._keras_optimizer import KerasAccumulationOptimizer as KerasAccumulationOptimizer
    from tf1_accum._optimizer import AccumulationOptimizer as AccumulationOptimizer
    from tf1_accum._optimizer import TrainOpWindow as TrainOpWindow
    from tf1_accum._options import WindowMean as WindowMean
    from tf1_accum._options import WindowOptions as WindowOptions
    from tf1_accum._options import clip_by_global_norm as clip_by_global_norm
    from tf1_accum._session import run_accumulation as run_accumulation
    from tf1_accum._split import MemoryFit as MemoryFit
    from tf1_accum._split import SizeChange as SizeChange
    from tf1_accum._stats import GradientStatistics as GradientStatistics
    from tf1_accum._stats import RunningAverage as RunningAverage
    from tf1_accum._stats import build_running_average as build_running_average
    from tf1_accum._stats import recommend_micro_batches as recommend_micro_batches

_NO_TENSORFLOW = (
    "tf1_accum needs TensorFlow (2.15 to 2.21), which is not installed. "
    "Install it with: pip install 'tensorflow>=2.15,<2.22' "
    "(or 'tensorflow-cpu>=2.15,<2.22', without GPU support)."
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
    return sorted(set(globals()) | set(__all__) | set(_MODULES))
