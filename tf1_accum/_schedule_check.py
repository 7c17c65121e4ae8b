"""`check_graph`'s schedule check (why it reports so little: concepts page, "Design notes")."""

from __future__ import annotations

import math
import typing
import warnings

import numpy as np
from tf1_accum._compat import function_bodies, tf

from tf1_accum import _count_check, _validate
from tf1_accum._window import APPLY_DUE_COLLECTION
from tf1_accum.check._catalogue import message

# Ops that hand the global step on as a number of steps.
_STEP_OPS = frozenset(
    "Identity ReadVariableOp Cast Snapshot Minimum Maximum Sub Add AddV2 Switch Merge".split()
)
# Ops that compare the step with a count, on either side.
_COMPARE_OPS = frozenset("Minimum Maximum Less LessEqual Greater GreaterEqual Equal".split())
# Ops that divide the step by a count (input 1), or subtract it.
_DIVIDE_OPS = frozenset("RealDiv Div FloorDiv TruncateDiv DivNoNan FloorMod Sub".split())
# Dataset ops that keep the number of elements.
_SAME_SIZE = frozenset(
    "ShuffleDataset ShuffleDatasetV2 ShuffleDatasetV3 MapDataset ParallelMapDataset "
    "ParallelMapDatasetV2 PrefetchDataset CacheDataset CacheDatasetV2 ModelDataset "
    "OptimizeDataset OptimizeDatasetV2 MaxIntraOpParallelismDataset PrivateThreadPoolDataset "
    "OptionsDataset AssertCardinalityDataset".split()
)
_GET_NEXT = frozenset({"IteratorGetNext", "IteratorGetNextSync"})


class _Size(typing.NamedTuple):
    """Elements a dataset yields: as a program counts them, and in fact."""

    exact: float  # examples / batch_size, unrounded
    actual: float  # batches, rounded as ``batch`` rounds (math.inf: repeated forever)
    epochs: float  # product of the repeat counts (math.inf: forever)


def warn_of_schedules(train_op: tf.Operation, global_step: tf.Variable) -> None:
    """Warns, as ``train_op`` is built, of each step count `schedule_findings` finds in it."""

    def runs(op: tf.Operation) -> list[tf.Operation]:
        bodies = [o for body in function_bodies(op) for o in body.get_operations()]
        return [t.op for t in op.inputs] + list(op.control_inputs) + bodies

    # What a run of the train op may run, function bodies too.
    reached = _count_check.walk([train_op], runs)
    for _, where in schedule_findings(train_op.graph, {global_step.op}, reached):
        warnings.warn(
            f"tf1_accum: {message('TFA013', where)}", stacklevel=_validate._caller_stacklevel()
        )


def schedule_findings(
    graph: tf.Graph, global_steps: set[tf.Operation], apply_set: set[tf.Operation]
) -> typing.Iterator[tuple[str, str]]:
    """The step counts in micro-batches, as ``(op_name, where)`` of each finding."""
    steps = _window_steps(graph, apply_set)
    if steps is None or not global_steps:
        return
    iterators = {op.inputs[0].op for op in apply_set if op.type in _GET_NEXT}
    sizes = [_pipeline(graph, iterator) for iterator in iterators]
    if len(sizes) != 1 or sizes[0] is None:
        return
    total, epoch = sizes[0]
    if not math.isfinite(total.epochs) or epoch.exact <= 0:
        return
    updates = math.ceil(total.actual / steps)
    counts = _step_counts(global_steps, apply_set)
    reported: set[float] = set()
    for value, op, var in sorted(counts, key=lambda c: (c[1].name, c[0])):
        if value in reported or value <= updates:
            continue
        epochs = _whole_epochs(value, epoch, int(total.epochs))
        if epochs is None:
            continue
        reported.add(value)
        what = "all" if epochs == total.epochs else f"{epochs} of the {int(total.epochs)}"
        where = (
            f"Schedule op {op.name} ({op.type}) sets the global step {var.name} against the "
            f"step count {value:g}, the micro-batches of {what} epoch(s) of the input pipeline "
            f"({epoch.actual:g} per epoch, {total.actual:g} in all), where the global step "
            f"counts updates, one per {steps} micro-batches: training ends at update "
            f"{updates}, N = {steps}"
        )
        yield op.name, where


def _window_steps(graph: tf.Graph, apply_set: set[tf.Operation]) -> int | None:
    """The N of the windows the apply runs, if they all have one and the same."""
    dues = graph.get_collection(APPLY_DUE_COLLECTION)
    found = {_static(due.op.inputs[1]) for due in dues if due.op in apply_set}
    steps = found.pop() if len(found) == 1 else None
    return int(steps) if steps is not None and steps > 1 else None


def _step_counts(
    global_steps: set[tf.Operation], apply_set: set[tf.Operation]
) -> typing.Iterator[tuple[float, tf.Operation, tf.Operation]]:
    """``(value, op, global step)`` of each constant the apply compares the step with."""

    def handed_on(op: tf.Operation) -> list[tf.Operation]:
        """The ops of the apply that hand ``op``'s output on as a number of steps."""
        consumers = [c for t in op.outputs for c in t.consumers()]
        return [c for c in consumers if c.type in _STEP_OPS and c in apply_set]

    # Each op the apply computes from a global step, as a number of steps -> that step.
    derived = {op: var for var in global_steps for op in _count_check.walk([var], handed_on)}
    for op in apply_set:
        if op.type not in _COMPARE_OPS | _DIVIDE_OPS or len(op.inputs) != 2:
            continue
        for index, tensor in enumerate(op.inputs):
            other = op.inputs[1 - index].op
            if other not in derived or (op.type in _DIVIDE_OPS and index != 1):
                continue
            value = tf.get_static_value(tensor)
            if value is None or np.ndim(value) != 0 or not np.isfinite(value) or value <= 1:
                continue
            yield float(value), op, derived[other]


def _whole_epochs(value: float, epoch: _Size, epochs: int) -> int | None:
    """k when ``value`` is the micro-batches of k epochs (1 <= k <= ``epochs``), else None."""
    for k in range(1, epochs + 1):
        exact = epoch.exact * k
        if math.floor(exact) <= value <= math.ceil(exact) or value == epoch.actual * k:
            return k
    return None


def _pipeline(graph: tf.Graph, iterator: tf.Operation) -> tuple[_Size, _Size] | None:
    """``(total, one epoch)`` `_Size` of the dataset of ``iterator``, or None."""
    if iterator.type == "OneShotIterator":  # its dataset is copied into a function, unused
        used = {t.op for op in graph.get_operations() for t in op.inputs}
        datasets = [
            op
            for op in graph.get_operations()
            if op.type.endswith(("Dataset", "DatasetV2", "DatasetV3")) and op not in used
        ]
    else:
        datasets = [
            op.inputs[0].op
            for op in graph.get_operations()
            if op.type == "MakeIterator" and op.inputs[1].op is iterator
        ]
    if len(datasets) != 1:
        return None
    total, epoch = _size(datasets[0], repeats=True), _size(datasets[0], repeats=False)
    return None if total is None or epoch is None else (total, epoch)


def _static(tensor: tf.Tensor) -> typing.Any:  # a Python scalar, or None
    value = tf.get_static_value(tensor)
    return None if value is None or np.ndim(value) != 0 else value.item()


def _size(op: tf.Operation, repeats: bool) -> _Size | None:
    """The `_Size` of dataset op ``op`` (``repeats=False``: each repeat once), or None."""
    if op.type == "TensorSliceDataset":
        shape = op.inputs[0].shape if op.inputs else None
        rows = tf.compat.dimension_value(shape[0]) if shape is not None and shape.rank else None
        return None if rows is None else _Size(rows, rows, 1)
    if op.type == "RangeDataset":
        start, stop, step = (_static(t) for t in op.inputs[:3])
        if None in (start, stop, step) or step == 0:
            return None
        rows = max(0, math.ceil((stop - start) / step))
        return _Size(rows, rows, 1)
    inner = _size(op.inputs[0].op, repeats) if op.inputs else None
    if inner is None:
        return None
    if op.type in _SAME_SIZE:
        return inner
    if op.type in ("BatchDataset", "BatchDatasetV2", "ParallelBatchDataset"):
        size = _static(op.inputs[1])
        drop = _static(op.inputs[-1]) if op.type != "BatchDataset" else False
        if not size or size < 1 or drop is None:
            return None
        actual = inner.actual / size
        if math.isfinite(actual):
            actual = math.floor(actual) if drop else math.ceil(actual)
        return _Size(inner.exact / size, actual, inner.epochs)
    if op.type == "RepeatDataset":
        count = _static(op.inputs[1])
        if count is None or not repeats:
            return None if count is None else inner
        factor = math.inf if count < 0 else count  # -1: forever
        return _Size(*(size * factor for size in inner))
    count = _static(op.inputs[1]) if op.type == "TakeDataset" else None
    if count is None or count < 0:
        return None if count is None else inner
    return _Size(min(inner.exact, count), min(inner.actual, count), inner.epochs)
