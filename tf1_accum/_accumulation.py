"""The builder: zero, accumulate and apply ops for one accumulation window."""

from __future__ import annotations

import functools
import typing

import tensorflow as tf
from tensorflow.python.client import session as _tf_session

from tf1_accum import _validate
from tf1_accum import _distributed
from tf1_accum import _keras
from tf1_accum import _migration
from tf1_accum import _stats
from tf1_accum._window import Applied
from tf1_accum._window import Window
from tf1_accum._window import gradients
from tf1_accum._options import GradientTransform
from tf1_accum import _options
from tf1_accum._options import WindowOptions


class Accumulation(typing.NamedTuple):
    """The ops and state of one gradient accumulation, from `build_accumulation`.

    A window is: ``accum_op`` once per micro-batch (each with that micro-batch's
    ``feed_dict``), then ``apply_op`` once, with no feed. ``apply_op`` resets
    the window itself, so the next ``accum_op`` starts the next window.
    Each op runs in a ``session.run`` of its own: TensorFlow runs the ops of
    one run in no fixed order, so a run fetching two of them (``accum_op``
    with ``apply_op``) is refused with a ``ValueError`` before anything runs.
    Several threads may run these ops on one session: they take turns, and no
    micro-batch is lost or applied twice (see :ref:`ways-in-threads`).

    Attributes:
        zero_op: Discards a partial window: resets the counter (the next
            ``accum_op`` then starts a window). Not needed between windows:
            ``apply_op`` resets.
        accum_op: Adds this micro-batch's gradients to the accumulators,
            increments ``counter`` and runs ``update_ops``. Run it with the
            micro-batch's feed.
        apply_op: Applies ``grads_and_vars`` through the optimizer, increments
            ``global_step`` once (if one was given), then resets the
            counter. Needs no feed. Raises
            ``tf.errors.InvalidArgumentError`` when nothing was accumulated,
            leaving every variable untouched.
        counter: ``int64`` variable: micro-batches accumulated since the last
            reset.
        accumulators: Accumulator variables, aligned with ``var_list``
            (``accumulators[i]`` serves ``var_list[i]``). While ``counter`` is
            above 0, each holds the window's sum of micro-batch gradients
            (with ``weight``, the weighted sum); while it is 0, nothing reads
            them (see :doc:`concepts`). Float16 and bfloat16 variables
            accumulate in float32.
        var_list: The variables trained, in the order of ``accumulators``.
            Variables whose gradient is None are not in it.
        grads_and_vars: ``(gradient, variable)`` pairs that ``apply_op`` hands
            to the optimizer: the accumulated mean (or sum, with
            ``average=False``) after ``clip_norm`` and ``transform``, the
            values the apply uses when fetched with ``apply_op``. A sparse
            gradient is a ``tf.IndexedSlices`` of the rows touched in the
            window.
        global_norm: float64 global norm of the window's gradient (the mean,
            or the sum) before any clipping. Fetch it in the same
            ``session.run`` as ``apply_op``, and only with it: after the apply
            the window is reset, and it does not describe the window that
            ``accum_apply_op`` applies.
        skipped_windows: ``int64`` variable: windows not applied because their
            gradient held a NaN or an Inf (see ``skip_nonfinite``).
        accum_apply_op: With ``fused=True``, the last micro-batch fused with
            the apply: adds this micro-batch's gradients, then applies the
            window and resets it, in one ``session.run`` fed that micro-batch.
            A window then costs N runs instead of N + 1, with the same result.
            None when built without ``fused=True``.
        statistics: With ``statistics=True``, the window's
            `GradientStatistics` (norms and the gradient noise scale),
            evaluated together with ``apply_op``; None otherwise.
        accum_apply_statistics: With ``statistics=True`` and ``fused=True``,
            the `GradientStatistics` of the window that ``accum_apply_op``
            applies, evaluated together with it; None otherwise.
        options: The `WindowOptions` the window was built with.
        weight: The scalar ``weight`` it was built with (each micro-batch's
            weight, computed from its feed), or None.
    """

    zero_op: tf.Operation
    accum_op: tf.Operation
    apply_op: tf.Operation
    counter: tf.Variable
    accumulators: typing.List[tf.Variable]
    var_list: typing.List[tf.Variable]
    grads_and_vars: typing.List[typing.Tuple[typing.Any, tf.Variable]]
    global_norm: tf.Tensor
    skipped_windows: tf.Variable
    accum_apply_op: typing.Optional[tf.Operation]
    statistics: typing.Optional[_stats.GradientStatistics] = None
    accum_apply_statistics: typing.Optional[_stats.GradientStatistics] = None
    options: typing.Optional[WindowOptions] = None
    weight: typing.Optional[tf.Tensor] = None


def build_accumulation(
    loss: tf.Tensor,
    optimizer: tf.compat.v1.train.Optimizer,
    var_list: typing.Sequence[tf.Variable] | None = None,
    *,
    global_step: tf.Variable | None = None,
    average: bool = True,
    weight: tf.Tensor | None = None,
    clip_norm: float | None = None,
    transform: GradientTransform | typing.Sequence[GradientTransform] | None = None,
    skip_nonfinite: bool = True,
    update_ops: typing.Sequence[tf.Operation] | None = None,
    fused: bool = False,
    statistics: bool = False,
    micro_batch_size: int | None = None,
    cross_replica: _distributed.Engine | None = None,
    name: str | None = None,
) -> Accumulation:
    """Builds the ops that accumulate gradients over micro-batches and apply once.

    N runs of ``accum_op`` (each fed one micro-batch of B examples) followed by
    one run of ``apply_op`` make the same update as one
    ``optimizer.minimize(loss)`` step on the N x B examples together, when
    ``loss`` is the mean over the micro-batch. Optimizer state (slots, Adam's
    beta powers) and ``global_step`` advance once per window, and slot
    variables get the names plain ``minimize`` gives them, so checkpoints
    interchange with plain training (see `plain_variables`).

    Sparse gradients (from ``tf.gather`` or ``tf.nn.embedding_lookup``) are
    scatter-added into the accumulator, never densified, and applied as the
    rows touched in the window.

    Built under ``tf.compat.v1.train.replica_device_setter`` (variables on
    parameter servers), the accumulators and counters go to the device that
    computes the gradients, as local variables that each worker's
    ``local_init_op`` initializes (see the guide "Across several machines").

    Example:

    >>> import numpy as np
    >>> with tf.Graph().as_default():
    ...     x = tf.compat.v1.placeholder(tf.float32, [None])
    ...     w = tf.compat.v1.get_variable("w", initializer=1.0)
    ...     loss = tf.reduce_mean((w * x - 2.0 * x) ** 2)
    ...     opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    ...     acc = tf1_accum.build_accumulation(loss, opt)
    ...     with tf.compat.v1.Session() as sess:
    ...         sess.run(tf.compat.v1.global_variables_initializer())
    ...         for batch in ([1.0, 2.0], [3.0, 4.0]):
    ...             _ = sess.run(acc.accum_op, {x: np.array(batch)})
    ...         print(sess.run(acc.counter))
    ...         sess.run(acc.apply_op)
    ...         print(round(float(sess.run(w)), 4), sess.run(acc.counter))
    2
    2.5 0

    Args:
        loss: Scalar floating-point tensor: the mean loss of one micro-batch.
        optimizer: A ``tf.compat.v1.train.Optimizer`` (or subclass), including
            one that replaces ``apply_gradients`` and creates its state there
            (BERT's ``AdamWeightDecayOptimizer``: see :doc:`real_programs`).
            Or a tf_keras legacy
            optimizer (``tf_keras.optimizers.legacy.Adam`` and the other
            ``OptimizerV2`` subclasses), which updates resource variables only
            and advances its ``iterations`` once per window. Keras 3
            optimizers build no graph-mode ops and are refused.
        var_list: Variables to train; defaults to the trainable variables of
            the loss's graph, as in ``Optimizer.minimize``.
        global_step: Optional integer variable, incremented once per applied
            window (so learning-rate schedules driven by it follow updates,
            not micro-batches), whether the optimizer increments it or ignores
            it; the optimizer still receives it. A dynamic loss-scale
            optimizer and a ``SyncReplicasOptimizer`` increment it themselves.
        average: The window's mean (True, the default) or sum (False). This
            and the other window options (``clip_norm``, ``transform``,
            ``skip_nonfinite``, ``statistics``, ``micro_batch_size``) are the
            same in every way in and described once: :ref:`window-options`.
        weight: Optional scalar tensor computed from each micro-batch (its
            number of examples, or of non-padding tokens): the apply uses
            sum(weight_i * gradient_i) / sum(weight_i). A micro-batch of
            weight 0 contributes nothing, even a NaN gradient; a negative,
            NaN or infinite weight fails the run (``InvalidArgumentError``,
            saying which). See
            :ref:`window-options`.
        clip_norm: Clip the window's gradient to this global norm before
            the apply (``global_norm`` is its norm before clipping).
        transform: Gradient transforms run on each variable's mean, after
            ``clip_norm``'s clipping.
        skip_nonfinite: Skip a window whose gradient holds a NaN or an Inf
            (True, the default), counted in ``skipped_windows``.
        update_ops: Ops run once with each micro-batch (by ``accum_op`` and
            ``accum_apply_op``): None (the default) takes the graph's
            ``tf.compat.v1.GraphKeys.UPDATE_OPS`` as they are now, a list
            exactly those ops, ``[]`` none.
        fused: Also build ``accum_apply_op``, the last micro-batch fused with
            the apply, for windows of N runs (see `run_accumulation`). Off by
            default: it builds the optimizer's update a second time.
        statistics: Also build ``statistics`` (and, with ``fused``,
            ``accum_apply_statistics``): the window's `GradientStatistics`.
            See :doc:`statistics`.
        micro_batch_size: Examples per micro-batch, for ``statistics``;
            needed unless ``weight`` is given.
        cross_replica: Optional `CollectiveAllReduce` or `HorovodAllReduce`,
            for between-graph replication over several workers: the apply
            sums the window across the workers in one all-reduce (the
            statistics' sums included), then every worker applies the mean
            over all their micro-batches. Every worker must run every apply,
            even with nothing accumulated (see :doc:`distributed`).
        name: Name scope for the ops; defaults to ``"accumulation"``.

    Returns:
        An `Accumulation`.

    Every argument is checked before anything is built: a ``TypeError`` or
    ``ValueError`` about an argument leaves the graph as it was. A failure
    that shows only once the gradients or the optimizer's apply are built
    puts the graph's collections back; the ops built stay in the graph,
    unused, and the error says how many.

    Raises:
        RuntimeError: If eager execution is active.
        TypeError: If ``optimizer`` is not a ``tf.compat.v1.train.Optimizer``
            or a tf_keras legacy optimizer (a Keras 3 optimizer, say), or is
            tf_keras's ``LossScaleOptimizer`` (use
            ``tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer``).
        TypeError: If ``optimizer`` is an `AccumulationOptimizer` or a
            `KerasAccumulationOptimizer`, which accumulate by themselves:
            give the optimizer they wrap.
        TypeError: If a tf_keras optimizer is to train a reference variable
            (it updates resource variables only).
        TypeError: If another argument has the wrong type: ``loss`` (a
            floating-point tensor), ``var_list`` (variables), ``global_step``
            (an integer variable), ``average``, ``skip_nonfinite``, ``fused``,
            ``statistics`` (bools), ``weight`` (a real tensor), ``clip_norm``,
            ``micro_batch_size`` (numbers), ``update_ops`` (None or a list of
            ops or tensors), ``cross_replica`` (a `CollectiveAllReduce` or a
            `HorovodAllReduce`).
        ValueError: If ``loss`` or ``weight`` is not a scalar, or
            ``clip_norm`` or ``micro_batch_size`` is not positive and
            finite.
        ValueError: If a variable of ``var_list``, ``global_step``,
            ``weight`` or an op of ``update_ops`` is not in the loss's graph.
        ValueError: If options do not go together: ``statistics=True``
            without ``micro_batch_size`` or ``weight``; ``micro_batch_size``
            without ``statistics=True``, or with ``weight``; ``fused=True``
            with a ``SyncReplicasOptimizer``.
        ValueError: If there is nothing to train: no trainable variable, an
            empty ``var_list``, or no variable with a gradient.
        ValueError: If a variable the loss reads has a shape that is not
            fully defined (its accumulator needs one).
        ValueError: If the optimizer's apply cannot be built here: it creates
            a variable inside ``apply_gradients`` from a tensor computed
            there, or (with ``fused=True``) creates different state each time
            its ``apply_gradients`` is built.
        TypeError, ValueError: If ``transform`` is not a callable or a list
            of them, or a transform returns something other than a gradient
            of the gradient's shape and dtype (a tensor; ``tf.IndexedSlices`` for a
            sparse one).
    """
    _validate.check_graph_mode("build_accumulation")
    _validate.check_loss(loss)
    optimizer = _validate.check_optimizer(optimizer)
    _migration.refuse_accumulating_optimizer(optimizer, "build_accumulation")
    graph = loss.graph
    _validate.check_global_step(global_step, graph)
    _validate.check_weight(weight, graph)
    options = WindowOptions(
        average=average,
        weighted=weight is not None,
        clip_norm=clip_norm,
        transform=transform,
        skip_nonfinite=skip_nonfinite,
        update_ops=update_ops,
        statistics=statistics,
        micro_batch_size=micro_batch_size,
    )
    _validate.check_bool("fused", fused)
    if fused and isinstance(optimizer, tf.compat.v1.train.SyncReplicasOptimizer):
        raise ValueError(
            "fused=True builds the optimizer's apply twice, and SyncReplicasOptimizer "
            "allows one apply_gradients call: build with fused=False (the default)."
        )
    _distributed.check_cross_replica(cross_replica)
    update_ops = _options.update_ops_in(options, graph)
    var_list = _validate.check_var_list(var_list, graph)
    _validate.check_trainable(loss, var_list)
    _keras.check_variables(optimizer, var_list)
    # Checked: from here on the graph grows. A failure now (a gradient None
    # everywhere, an optimizer that cannot build its apply) puts the
    # graph's collections back and says which ops remain.
    with graph.as_default(), _validate.restored_on_failure(graph, "build_accumulation"):
        if loss.shape.ndims is None:
            # Unknown statically: fails at run time unless it holds one value.
            loss = tf.reshape(loss, [], name="scalar_loss")
        pairs = gradients(loss, optimizer, var_list)
        with tf.compat.v1.name_scope(name, "accumulation", values=[loss]) as scope:
            window = Window(
                pairs,
                options,
                scope,
                statistics=_stats.WindowStatistics.for_window(options, pairs),
                cross_replica=None if cross_replica is None else cross_replica._reducer(),
            )
        if weight is not None and weight.shape.ndims is None:
            weight = tf.reshape(weight, [], name="scalar_weight")
        grads = [g for g, _ in pairs]
        # accum_op and the fused op keep the caller's control dependencies and
        # run update_ops (batch-norm updates: once per micro-batch). zero_op
        # and apply_op must run without a feed, so they drop both.
        # Each op holds the window's mutex while it runs (see Window.exclusive):
        # runs from several threads take turns on the window.
        accum_op, _ = window.exclusive(
            lambda: (window.add(grads, weight, run_with=update_ops).op, None),
            name="accumulate",
        )
        with tf.control_dependencies(None), window.control_flow(global_step):
            zero_op, _ = window.exclusive(lambda: (window.reset(), None), name="zero")
            apply_op, applied = window.exclusive(
                lambda: _op_first(window.apply(optimizer, global_step)), name="apply"
            )
        accum_apply_op, fused_applied = None, None
        if fused:
            with window.control_flow(global_step):
                accum_apply_op, fused_applied = window.exclusive(
                    lambda: _op_first(
                        window.apply(
                            optimizer,
                            global_step,
                            after=window.add(grads, weight, run_with=update_ops),
                        )
                    ),
                    name="accumulate_and_apply",
                )
    ops = {"zero_op": zero_op, "accum_op": accum_op, "apply_op": apply_op}
    ops["accum_apply_op"] = accum_apply_op
    _one_per_run(ops)
    return Accumulation(
        zero_op=zero_op,
        accum_op=accum_op,
        apply_op=apply_op,
        counter=window.counter,
        accumulators=window.accumulators,
        var_list=window.var_list,
        grads_and_vars=applied.grads_and_vars,
        global_norm=applied.norm,
        skipped_windows=window.skipped,
        accum_apply_op=accum_apply_op,
        statistics=applied.statistics,
        accum_apply_statistics=fused_applied and fused_applied.statistics,
        options=options,
        weight=weight,
    )


def _op_first(applied: Applied) -> tuple[tf.Operation, Applied]:
    """An `Applied` as ``(op, applied)``, for `Window.exclusive`: the op holds the lock."""
    return applied.op, applied


# The attribute that marks an op of `Accumulation` with its window and field.
_WINDOW_OP = "_tf1_accum_window_op"


def window_op_of(op: tf.Operation) -> tuple[object, str] | None:
    """``(window, field)`` of an op that `build_accumulation` returned, else None."""
    return getattr(op, _WINDOW_OP, None)


def _one_per_run(ops: dict[str, tf.Operation | None]) -> None:
    """Makes ``session.run`` refuse two of a window's ``ops`` (by field) in one run.

    The ops of one run run in no fixed order, and no op can see which others
    its run fetches before it changes a variable: the fetches are checked in
    Python, when ``session.run`` (or ``make_callable``) sorts them, before
    anything runs. An op that groups two of them is `check_graph`'s to find.
    """
    window = object()
    for field, op in ops.items():
        if op is not None:
            setattr(op, _WINDOW_OP, (window, field))
    handler = _tf_session._FetchHandler
    if getattr(handler.__init__, "_tf1_accum_one_per_run", False):
        return
    original = handler.__init__

    @functools.wraps(original)
    def init(self: typing.Any, *args: typing.Any, **kwargs: typing.Any) -> None:
        original(self, *args, **kwargs)
        seen: dict[object, str] = {}
        for op in self.targets():
            mark = getattr(op, _WINDOW_OP, None)
            if mark is None:
                continue
            if mark[0] in seen:
                raise ValueError(_two_in_one_run(seen[mark[0]], mark[1]))
            seen[mark[0]] = mark[1]

    init.__dict__["_tf1_accum_one_per_run"] = True
    handler.__init__ = init


def _two_in_one_run(first: str, second: str) -> str:
    return (
        f"tf1_accum: {first} and {second} of one accumulation are fetched in one "
        "session.run. TensorFlow runs the ops of one run in no fixed order: an apply_op "
        "run before accum_op would apply the window without this micro-batch and leave "
        "it to the next window. Nothing was run. Run each in a session.run of its own: "
        "accum_op with each micro-batch's feed, then apply_op with no feed; or build "
        "with fused=True and run accum_apply_op with the last micro-batch's feed (it "
        "adds it, then applies). run_accumulation runs a window either way."
    )
