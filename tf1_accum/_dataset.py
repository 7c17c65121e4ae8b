"""The in-graph loop: one session.run draws a window from a tf.data.Dataset."""

from __future__ import annotations

import functools
import typing

from tf1_accum._compat import control_flow_context, empty_optional, next_as_optional, tf

from tf1_accum import _validate, _count_check, _distributed, _guard, _stats
from tf1_accum._accumulation import make_window, prepare
from tf1_accum._window import Window, exclusive, gradients, reference_control_flow
from tf1_accum._options import GradientTransform
from tf1_accum._state import new_mutex

GraphKeys = tf.compat.v1.GraphKeys
# What loss_fn and weight must be, as a refusal of either says.
_CALLABLE = "a callable taking one dataset element and returning "

# Op collections model code adds to: what the loop body adds cannot be fetched outside it.
_OP_COLLECTIONS = (GraphKeys.UPDATE_OPS, GraphKeys.SUMMARIES, GraphKeys.LOSSES)


class DatasetAccumulation(typing.NamedTuple):
    """The train op and state of `build_dataset_accumulation`.

    Attributes:
        train_op: One run draws up to ``steps`` micro-batches and applies
            them (a short last window with its true count); the run after
            the end of the data raises ``tf.errors.OutOfRangeError``.
        loss: Mean loss of the micro-batches the run drew (weighted, with
            ``weight``), fetched with ``train_op``.
        micro_batches: ``int64``: micro-batches the window applied (with any a
            failed run left in it).
        counter: The window's counter (0 between runs).
        global_norm, statistics: As `Accumulation`'s, fetched with ``train_op``.
        skipped_windows, accumulators, var_list: As `Accumulation`'s.
        applied: bool tensor, fetched with ``train_op``: whether the run gave
            the optimizer its window (False if skipped as non-finite).
    """

    train_op: tf.Operation
    loss: tf.Tensor
    micro_batches: tf.Tensor
    global_norm: tf.Tensor
    skipped_windows: tf.Variable
    counter: tf.Variable
    accumulators: typing.List[tf.Variable]
    var_list: typing.List[tf.Variable]
    statistics: typing.Optional[_stats.GradientStatistics] = None
    applied: typing.Optional[tf.Tensor] = None


def build_dataset_accumulation(
    loss_fn: typing.Callable[[typing.Any], tf.Tensor],
    optimizer: tf.compat.v1.train.Optimizer,
    dataset: tf.data.Dataset,
    steps: int,
    *,
    var_list: typing.Sequence[tf.Variable] | None = None,
    global_step: tf.Variable | None = None,
    average: bool = True,
    weight: typing.Callable[[typing.Any], tf.Tensor] | None = None,
    clip_norm: float | None = None,
    transform: GradientTransform | typing.Sequence[GradientTransform] | None = None,
    skip_nonfinite: bool = True,
    update_ops: typing.Sequence[tf.Operation] | None = None,
    statistics: bool = False,
    micro_batch_size: int | None = None,
    cross_replica: _distributed.Engine | None = None,
    name: str | None = None,
) -> DatasetAccumulation:
    """Builds a train op that runs a whole window inside the graph.

    One ``session.run`` draws up to ``steps`` micro-batches from ``dataset``
    (a one-shot iterator) and applies them; ``loss_fn`` builds the model once
    (what it adds to ``SUMMARIES`` and ``LOSSES`` is left out of them). See
    :doc:`ways_in` ("In-graph loop").

    Example:

    >>> import numpy as np
    >>> def loss_fn(batch):
    ...     w = tf.compat.v1.get_variable("w", initializer=1.0)
    ...     return tf.reduce_mean((w * batch - 2.0 * batch) ** 2)
    >>> with tf.Graph().as_default():
    ...     data = tf.data.Dataset.from_tensor_slices(
    ...         np.array([1.0, 2.0, 3.0, 4.0, 5.0], np.float32)).batch(2)
    ...     acc = tf1_accum.build_dataset_accumulation(
    ...         loss_fn, tf.compat.v1.train.GradientDescentOptimizer(0.01), data, steps=2)
    ...     with tf.compat.v1.Session() as sess:
    ...         sess.run(tf.compat.v1.global_variables_initializer())
    ...         print(sess.run([acc.train_op, acc.micro_batches])[1])
    ...         print(sess.run([acc.train_op, acc.micro_batches])[1])
    ...         try:
    ...             sess.run(acc.train_op)
    ...         except tf.errors.OutOfRangeError:
    ...             print("end of data")
    2
    1
    end of data

    Args:
        loss_fn: Callable taking one dataset element, returning a scalar
            floating-point loss tensor.
        dataset: A ``tf.data.Dataset`` of micro-batches.
        steps: Micro-batches per update, an int of at least 1.
        optimizer, var_list, global_step: As in `build_accumulation`
            (``var_list`` defaults to the trainable variables ``loss_fn`` built).
        weight: Optional callable taking one dataset element and returning its
            scalar weight; ``loss`` is weighted the same way.
        update_ops: None (the default: the ``UPDATE_OPS`` that ``loss_fn`` adds)
            or ``[]``; ops built outside the loop cannot run inside it.
        average, clip_norm, transform, skip_nonfinite, statistics, micro_batch_size:
            See `WindowOptions` (:ref:`window-options`).
        cross_replica: As in `build_accumulation`; every worker runs
            ``train_op`` equally often.
        name: Name scope of the ops; defaults to ``"dataset_accumulation"``.

    Returns:
        A `DatasetAccumulation`.

    Raises:
        RuntimeError: If eager execution is active.
        TypeError, ValueError: What `build_accumulation` refuses (of the
            arguments, the loss and weight that ``loss_fn`` and ``weight``
            return, the optimizer's apply and the transforms); ``loss_fn``,
            ``weight`` or ``dataset`` of the wrong type; ``steps`` not an int
            of at least 1; ``update_ops`` a non-empty list; ``loss_fn``
            creating a variable from a tensor that reads a value of the loop;
            or ``dataset`` capturing a placeholder.
    """
    _validate.check_graph_mode("build_dataset_accumulation")
    if not callable(loss_fn):
        raise _validate.type_error("loss_fn", loss_fn, _CALLABLE + "a scalar loss")
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"dataset must be a tf.data.Dataset, got {_validate.describe(dataset)}.")
    optimizer, options = prepare("build_dataset_accumulation", optimizer, cross_replica, locals())
    _validate.check_steps(steps)
    _validate.check_global_step(global_step, tf.compat.v1.get_default_graph())
    if weight is not None and not callable(weight):
        raise _validate.type_error("weight", weight, _CALLABLE + "its scalar weight")
    if options.update_ops:
        raise ValueError(
            "build_dataset_accumulation takes update_ops=None (the UPDATE_OPS loss_fn adds) or [], "
            f"got a list of {len(options.update_ops)} ops built outside the loop: add them to "
            "UPDATE_OPS inside loss_fn."
        )
    graph = tf.compat.v1.get_default_graph()
    if var_list is not None:
        var_list = _validate.check_var_list(var_list, graph)
    # A failure from here on (in loss_fn, say) puts the graph's collections back.
    with _validate.restored_on_failure(graph, "build_dataset_accumulation"):
        caller_scope = graph.get_name_scope()
        with tf.compat.v1.name_scope(name, "dataset_accumulation") as scope:
            iterator = tf.compat.v1.data.make_one_shot_iterator(dataset)
            # The window is built inside the loop, where loss_fn shows the
            # gradients' types; its mutex now: the lock on it is taken before.
            mutex = new_mutex()
        kept = {key: list(graph.get_collection(key)) for key in _OP_COLLECTIONS}
        # The body is traced once and returns only tensors: the window leaves it through this list.
        made: list[tuple[Window, tf.DType]] = []

        def build_window(batch: typing.Any) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor | None]:
            """Calls loss_fn (and weight) on a micro-batch, builds the window; (count, loss, w)."""
            branch_graph = tf.compat.v1.get_default_graph()  # a function graph in cond_v2
            # In the caller's name scope: variables get the names they have without accumulation.
            creator = functools.partial(_initialized_outside_the_loop, graph)
            with branch_graph.name_scope(caller_scope + "/" if caller_scope else ""):
                with tf.compat.v1.variable_creator_scope(creator):
                    loss = loss_fn(batch)
                    w = None if weight is None else weight(batch)
            before = {id(op) for op in kept[GraphKeys.UPDATE_OPS]}
            updates = branch_graph.get_collection(GraphKeys.UPDATE_OPS)
            # Run with each micro-batch if update_ops=None (else it is []).
            added = [op for op in updates if id(op) not in before and options.update_ops is None]
            for g in {graph, branch_graph}:
                for key, items in kept.items():
                    g.get_collection_ref(key)[:] = items
            _validate.check_loss(loss)
            _validate.check_weight(w, loss.graph)
            how = "build_dataset_accumulation(..., weight=lambda element: {}, from the element)"
            _count_check.warn_if_unweighted([loss], w, how)
            trainable = _validate.check_var_list(var_list, graph)
            _validate.check_trainable(loss, trainable)
            pairs = gradients(loss, optimizer, trainable)
            window = make_window(pairs, options, scope, cross_replica, mutex)
            made.append((window, loss.dtype.base_dtype))
            count = window.add([g for g, _ in pairs], w, run_with=added).count
            return count, loss, w

        def draw_one(*state: typing.Any) -> tuple[typing.Any, ...]:
            """Draws and adds one micro-batch; returns the loop's next state."""
            # The state: count (replaced by the window's after the add), element,
            # loss_sum, weight_sum, drawn.
            _, element, loss_sum, weight_sum, drawn = state
            new_count, loss, w = build_window(element.get_value())
            if w is None:
                # weight_sum stays 0: the mean loss divides by ``drawn``.
                loss_sum += tf.cast(loss, tf.float64)
            else:
                w = tf.cast(w, loss.dtype)
                # A weight-0 micro-batch (all padding: loss 0 / 0) adds nothing.
                loss_sum += tf.cast(tf.math.multiply_no_nan(loss, w), tf.float64)
                weight_sum += tf.cast(w, tf.float64)
            # The next micro-batch, drawn only if the window wants one: an element
            # drawn after the window's last would be lost to it and to the next.
            following = tf.cond(
                new_count < steps,
                lambda: next_as_optional(iterator),
                lambda: empty_optional(iterator),
                name="draw_next",
            )
            return tf.identity(new_count), following, loss_sum, weight_sum, drawn + 1

        def draw_and_apply() -> tuple[tuple[typing.Any, ...], None]:
            with tf.compat.v1.name_scope(scope):
                # float64 sums: the loss's dtype is unknown before loss_fn runs.
                zero = tf.constant(0.0, tf.float64)
                no_count = lambda: tf.constant(0, tf.int64)  # noqa: E731
                # Until the element drawn is empty: the data ended, or the window is full.
                count, _, loss_sum, weight_sum, drawn = tf.compat.v1.while_loop(
                    lambda *state: state[1].has_value(),
                    draw_one,
                    [no_count(), next_as_optional(iterator), zero, zero, no_count()],
                    back_prop=False,
                    name="draw",
                )
                window = made[0][0]
                # Nothing drawn (the data has ended): what a run that failed
                # midway left in the window is applied, if anything.
                count = tf.where(tf.equal(drawn, 0), window.counter.read_value(), count)
                with window.control_flow(global_step):
                    # The other branch: the iterator is exhausted, get_next() raises
                    # OutOfRangeError.
                    with tf.compat.v1.name_scope(caller_scope + "/" if caller_scope else ""):
                        applied = window.apply(
                            optimizer,
                            global_step,
                            when=count > 0,
                            otherwise=lambda: tf.nest.flatten(iterator.get_next()),
                        )
            # The op is left out: what the lock waits for is the flag, norm and statistics.
            return (applied._replace(op=None), loss_sum, weight_sum, drawn, count), None

        # The whole window, drawing included, holds the window's mutex; v1 control
        # flow if the variables it adds into are references (loss_fn's, if
        # tf.compat.v1.Variable makes no resource variables in this scope).
        uses_resource = tf.compat.v1.get_variable_scope().use_resource
        if uses_resource is None:
            uses_resource = tf.compat.v1.resource_variables_enabled()
        with reference_control_flow(
            graph.get_collection(GraphKeys.GLOBAL_VARIABLES) + list(var_list or []) + [global_step],
            references=not uses_resource,
        ):
            done, _ = exclusive(mutex, scope, draw_and_apply, lambda: made[0][0]._state())
        applied, loss_sum, weight_sum, drawn, count = done
        ((window, loss_dtype),) = made  # the body was traced once
        with tf.compat.v1.name_scope(scope):
            train_op = tf.group(applied.applied, name="train")
            weight_sum = tf.cast(drawn if weight is None else weight_sum, loss_dtype)
            mean_loss = tf.math.divide_no_nan(tf.cast(loss_sum, loss_dtype), weight_sum)
        _guard.mark(window.scope, "train_op", train_op, done)
        return DatasetAccumulation(
            train_op=train_op,
            loss=mean_loss,
            micro_batches=count,
            global_norm=applied.norm,
            skipped_windows=window.skipped,
            counter=window.counter,
            accumulators=window.accumulators,
            var_list=window.var_list,
            statistics=applied.statistics,
            applied=applied.applied,
        )


def _initialized_outside_the_loop(
    graph: tf.Graph, next_creator: typing.Callable[..., tf.Variable], **kwargs: typing.Any
) -> tf.Variable:
    """Builds a variable's initial value outside the loop: copied out if it reads none of it."""
    initial_value = kwargs.get("initial_value")
    if isinstance(initial_value, tf.Tensor) and (
        initial_value.graph is not graph or control_flow_context(initial_value.op) is not None
    ):
        lifted = _copied_out_of_the_loop(initial_value, graph)
        if lifted is None:
            name = kwargs.get("name") or "a variable"
            raise ValueError(
                f"loss_fn creates the variable {name} from {initial_value.name}, which reads a "
                "value of the loop (the micro-batch, a variable, a value from outside loss_fn): "
                "give its initial value as a NumPy value or an initializer, or create it first."
            )
        kwargs["initial_value"] = lifted
    return next_creator(**kwargs)


# Ops that carry values into, around or out of a loop or conditional, or call
# a function: an initial value computed through one reads the loop.
_LOOP_OP_TYPES = frozenset(
    # Placeholder: a value captured by a function graph, or the micro-batch.
    ["Placeholder", "LoopCond", "ControlTrigger"]
    + [ref + kind for ref in ("", "Ref") for kind in ("Enter", "Exit", "Switch", "Merge")]
    + ["NextIteration", "RefNextIteration"]
)


def _copied_out_of_the_loop(tensor: tf.Tensor, graph: tf.Graph) -> tf.Tensor | None:
    """``tensor`` built again in ``graph`` (random seeds kept); None if it reads the loop."""
    order, seen, stack = [], set(), [(tensor.op, False)]
    while stack:
        op, inputs_done = stack.pop()
        if inputs_done:
            order.append(op)
            continue
        if op in seen:
            continue
        seen.add(op)
        if (
            op.type in _LOOP_OP_TYPES
            or op.type.endswith("VariableOp")
            or op.type.startswith("Variable")
            or any(value.HasField("func") for value in op.node_def.attr.values())
            or any(t.dtype in (tf.resource, tf.variant) for t in op.inputs)
        ):
            return None
        stack.append((op, True))
        stack += [(t.op, False) for t in op.inputs]
    copies: dict[tf.Operation, tf.Operation] = {}
    with tf.init_scope():
        if tf.compat.v1.get_default_graph() is not graph:
            return None
        for op in order:
            attrs = {key: value for key, value in op.node_def.attr.items() if key[0] != "_"}
            copies[op] = graph.create_op(
                op.type,
                [copies[t.op].outputs[t.value_index] for t in op.inputs],
                [t.dtype for t in op.outputs],
                name=op.name.split("/")[-1],
                attrs=attrs,
                op_def=op.op_def,
            )
    return copies[tensor.op].outputs[tensor.value_index]
