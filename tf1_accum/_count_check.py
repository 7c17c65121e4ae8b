"""Losses averaged over a count the fed data decides (a token mean), found in the graph.

A micro-batch mean over a fixed count (its examples, all positions of a
``[batch, time]`` tensor) needs no ``weight=``: equal micro-batches average to
the large batch's mean. A mean over the tokens of padded sequences, the valid
positions of a mask or a ``boolean_mask`` does: each micro-batch holds another
count, and the plain mean of their means weighs a micro-batch of few tokens as
much as one of many. Such a count is a scalar ``Sum`` (or ``Mean``) of what is
fed, computed from no variable, or the size of a tensor whose size comes from
fed values (``Where``, ``DynamicPartition``, ``Unique``); a loss divides by it
(or a ``Mean`` averages over such a tensor). The walk starts from the loss, or
from gradients, whose graph divides by the same count.
"""

from __future__ import annotations

import typing
import warnings

from tf1_accum._compat import tf

from tf1_accum import _validate
from tf1_accum.check._catalogue import CATALOGUE

_DIVIDE_OPS = frozenset({"RealDiv", "Div", "DivNoNan"})
# Ops that hand a count on: cast, clipped away from 0, taken from a shape.
_COUNT_OPS = frozenset(
    "Cast Identity StopGradient Reshape Squeeze StridedSlice Maximum Minimum Add AddV2 Mul "
    "Prod FloorDiv Gather GatherV2".split()
)
# Ops whose output's size depends on the values of their inputs.
_SIZED_BY_VALUES = frozenset(
    "Where DynamicPartition Unique UniqueV2 UniqueWithCounts UniqueWithCountsV2 ListDiff".split()
)
_GATHER_OPS = frozenset({"Gather", "GatherV2", "GatherNd", "ResourceGather"})
# Ops whose output's size does not follow their inputs' sizes.
_FIXED_SIZE_OPS = frozenset(
    "Sum Mean Prod Max Min All Any Shape ShapeN Size Rank Const VarHandleOp".split()
)
# Ops that read a tensor's shape, not its values.
SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank", "ZerosLike", "OnesLike"})
_VARIABLE_OPS = frozenset({"VariableV2", "Variable", "VarHandleOp", "ReadVariableOp"})


class DataCount(typing.NamedTuple):
    """A count a loss averages over: the op to name, and what the graph shows."""

    op_name: str
    where: str  # "divides by X (Sum)", "averages over X, whose size ..."
    weight: str  # what to pass as weight=


def walk(
    starts: typing.Iterable[tf.Operation],
    follow: typing.Callable[[tf.Operation], typing.Iterable[tf.Operation]],
) -> set[tf.Operation]:
    """The ops reached from ``starts`` (included) by ``follow``, which gives an op's next ops."""
    seen: set[tf.Operation] = set()
    stack = list(starts)
    while stack:
        op = stack.pop()
        if op not in seen:
            seen.add(op)
            stack += follow(op)
    return seen


def _values(op: tf.Operation) -> list[tf.Operation]:
    """The ops whose values ``op`` computes with (a shape op reads sizes only)."""
    return [] if op.type in SHAPE_OPS else [t.op for t in op.inputs]


def is_fed(op: tf.Operation) -> bool:
    """Whether ``op`` outputs what is fed: a placeholder's value, an iterator's element."""
    return op.type in ("Placeholder", "OptionalGetValue") or "IteratorGetNext" in op.type


def _from_data(tensor: tf.Tensor) -> bool:
    """Whether ``tensor`` is computed from fed data and from no variable (a mask, lengths)."""
    ops = walk([tensor.op], _values)
    variables = any(
        o.type in _VARIABLE_OPS or (o.type == "Placeholder" and o.outputs[0].dtype == tf.resource)
        for o in ops
    )
    # Fed data: a function's input is its caller's, a variable when a resource.
    return not variables and any(is_fed(o) and o.outputs[0].dtype != tf.resource for o in ops)


def _sized_by_data(tensor: tf.Tensor, fixed: set[tf.Operation]) -> bool:
    """Whether ``tensor``'s number of elements comes from fed values (a ``boolean_mask``).

    ``fixed`` holds the ops found not to be: each walk adds those it saw, and
    stops at them (the sizes of a deep model's layers are walked once).
    """

    def sizes(op: tf.Operation) -> list[tf.Tensor]:
        if op.type in _GATHER_OPS:
            return [op.inputs[1]]  # as many as the indices
        if op.type == "Reshape":
            # As many as its input's, which a shape it is given decides unless it holds -1:
            # a static shape without -1 is a fixed count, a computed one (an embedding's
            # reshape to the fed ids' dense shape) sizes it, however its input was found.
            static = tf.get_static_value(op.inputs[1])
            if static is None:
                return [op.inputs[1]]
            return [op.inputs[0]] if -1 in list(static) else []
        if "Segment" in op.type:
            # As many rows as the segments: num_segments when given, else segment_ids.
            return [op.inputs[-1]]
        if op.type in _FIXED_SIZE_OPS or op.type in _SIZED_BY_VALUES or op in fixed:
            return []
        return [t for t in op.inputs if t.shape.ndims != 0 and t.dtype != tf.resource]

    seen = walk([tensor.op], lambda op: [t.op for t in sizes(op)])
    if any(op.type in _SIZED_BY_VALUES and any(map(_from_data, op.inputs)) for op in seen):
        return True
    fixed.update(seen)
    return False


def _count(denominator: tf.Tensor, fixed: set[tf.Operation]) -> DataCount | None:
    """The data-dependent count ``denominator`` is computed from, if a scalar one."""
    if denominator.shape.num_elements() != 1:
        return None  # a softmax's sums, a per-sequence mean: not the micro-batch's count
    stack, seen = [denominator.op], set()
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        if op.type in ("Sum", "Mean") and _from_data(op.inputs[0]):
            what = f"{denominator.name} ({denominator.op.type}), the {op.type} of fed data"
            return DataCount(op.name, f"divides by {what}", f"<the tensor {denominator.name}>")
        if op.type in ("Size", "Shape") and _sized_by_data(op.inputs[0], fixed):
            return _averaged(op.inputs[0])
        if op.type in _COUNT_OPS:
            stack += [t.op for t in op.inputs]
    return None


def _averaged(tensor: tf.Tensor) -> DataCount:
    return DataCount(
        tensor.op.name,
        f"averages over {tensor.name}, whose number of elements depends on the fed data",
        f"tf.size(<the tensor {tensor.name}>)",
    )


def data_counts(roots: typing.Sequence[tf.Tensor]) -> list[DataCount]:
    """The data-dependent counts the loss (or gradients) ``roots`` divides by; sorted.

    None when the walk shows them weighed already: a scalar count multiplies
    what is accumulated (a hand-written weighted mean). Each count is named
    once, by its op.
    """
    found: dict[str, DataCount] = {}
    fixed: set[tf.Operation] = set()
    for op in walk([r.op for r in roots], _values):
        count = None
        if op.type in _DIVIDE_OPS:
            count = _count(op.inputs[1], fixed)
        elif op.type == "Mul":
            for factor in op.inputs:
                if factor.op.type in ("Reciprocal", "Inv"):
                    count = _count(factor.op.inputs[0], fixed)
                elif _count(factor, fixed) is not None:
                    return []
        elif op.type == "Mean" and op.outputs[0].shape.num_elements() == 1:
            count = _averaged(op.inputs[0]) if _sized_by_data(op.inputs[0], fixed) else None
        if count is not None:
            found.setdefault(count.op_name, count)
    return [found[name] for name in sorted(found)]


def warn_if_unweighted(roots: typing.Sequence[tf.Tensor], weight: object, how: str) -> None:
    """Warns of each data-dependent count ``roots`` divide by, if no ``weight`` is given.

    ``how`` shows the call with ``{}`` where the weight goes.
    """
    if weight is not None:
        return
    mistake = CATALOGUE["TFA014"]
    for count in data_counts(roots):
        warnings.warn(
            f"tf1_accum: the loss {count.where}, and no weight= was given (TFA014, "
            f"{mistake.title}): {mistake.why}. Instead, pass {how.format(count.weight)}, "
            f"that count computed from each micro-batch (see {mistake.doc}).",
            stacklevel=_validate._caller_stacklevel(),
        )
