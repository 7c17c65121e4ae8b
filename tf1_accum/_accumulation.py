"""The builder: zero, accumulate and apply ops for one accumulation window."""

from __future__ import annotations

import dataclasses
import typing

from tf1_accum._compat import tf

from tf1_accum import _validate, _count_check, _distributed, _guard, _keras, _migration, _stats
from tf1_accum import _options, _sync_replicas
from tf1_accum._window import Added, Applied, Window, gradients
from tf1_accum._options import GradientTransform, Pairs, WindowOptions


class Accumulation(typing.NamedTuple):
    """The ops and state of one gradient accumulation, from `build_accumulation`.

    A window is ``accum_op`` once per micro-batch (with its feed), then
    ``apply_op`` once, with no feed; each in a ``session.run`` of its own (a
    run fetching two, listed or grouped, is refused with a ``ValueError``:
    :ref:`ways-in-one-op-per-run`). Threads may share them
    (:ref:`ways-in-threads`); see :doc:`concepts`.

    Attributes:
        zero_op: Discards a partial window (not needed between windows).
        accum_op: Adds the fed micro-batch, increments ``counter``, runs ``update_ops``.
        apply_op: Applies ``grads_and_vars``, increments ``global_step``, resets;
            ``InvalidArgumentError`` (changing nothing) on an empty window.
        counter: ``int64`` variable: micro-batches accumulated in the window.
        accumulators: ``accumulators[i]`` for ``var_list[i]`` (float32 for
            float16 and bfloat16 variables).
        var_list: The variables trained (those with a gradient).
        grads_and_vars: The pairs ``apply_op`` gives the optimizer, after
            ``clip_norm`` and ``transform`` (sparse: the rows touched).
        global_norm: float64 global norm before clipping; fetch with ``apply_op``.
        skipped_windows: ``int64`` variable: windows skipped (``skip_nonfinite``).
        accum_apply_op: With ``fused=True``, adds then applies in one run; else None.
        statistics: With ``statistics=True``, the `GradientStatistics` fetched
            with ``apply_op``; else None.
        accum_apply_statistics: Those of ``accum_apply_op`` (``fused=True``); else None.
        options: The `WindowOptions` the window was built with.
        weight: The scalar ``weight`` it was built with, or None.
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

    N runs of ``accum_op`` then one of ``apply_op`` make one
    ``optimizer.minimize(loss)`` step on the N micro-batches (:doc:`concepts`).

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
        optimizer: A ``tf.compat.v1.train.Optimizer`` (BERT-style ones
            included, :doc:`real_programs`) or a tf_keras legacy optimizer
            (resource variables only). Keras 3 optimizers are refused.
        var_list: Variables to train; defaults to the graph's trainable ones.
        global_step: Optional integer variable, incremented once per update.
        weight: Optional scalar tensor computed from each micro-batch (e.g.
            its number of examples, or of tokens for a loss averaged over
            tokens); a negative or non-finite one fails the run, as does one
            whose ratio to the window's others its dtype cannot hold (see
            :doc:`concepts`, "Weighted mean"). Without it, a loss divided by a
            count of the fed data (``reduce_sum(mask)``) is warned of
            (:ref:`real-programs-token-mean`).
        average, clip_norm, transform, skip_nonfinite, update_ops: see `WindowOptions`.
        statistics, micro_batch_size, cross_replica, fused: see `WindowOptions`.
        name: Name scope for the ops; defaults to ``"accumulation"``.

    Returns:
        An `Accumulation`.

    Raises:
        RuntimeError: If eager execution is active.
        TypeError: If ``optimizer`` is not a ``tf.compat.v1.train.Optimizer``
            or a tf_keras legacy optimizer, is tf_keras's ``LossScaleOptimizer``,
            or accumulates by itself (`AccumulationOptimizer`).
        TypeError, ValueError: An argument of the wrong type, not a scalar or
            not of the loss's graph; an option `WindowOptions` refuses;
            ``fused=True`` or ``weight`` with a ``SyncReplicasOptimizer``; a tf_keras
            optimizer given a reference variable; a transform returning
            another shape or dtype than the gradient's.
        ValueError: Nothing to train (no variable or no gradient), a shape not
            fully defined, or the optimizer's apply creating a variable from a
            tensor computed there (or, ``fused=True``, other state each build).
    """
    _validate.check_graph_mode("build_accumulation")
    _validate.check_loss(loss)
    optimizer, options = prepare("build_accumulation", optimizer, cross_replica, locals())
    _validate.check_bool("fused", fused)
    if fused and isinstance(optimizer, tf.compat.v1.train.SyncReplicasOptimizer):
        raise ValueError(
            "fused=True builds two applies, and SyncReplicasOptimizer allows one: pass fused=False."
        )
    var_list, update_ops = check_in_graph(optimizer, options, loss, var_list, global_step, weight)
    how = "build_accumulation(loss, optimizer, weight={})"
    _count_check.warn_if_unweighted([loss], weight, how)
    # Checked: from here on the graph grows, and a failure puts its collections back.
    with loss.graph.as_default(), _validate.restored_on_failure(loss.graph, "build_accumulation"):
        if loss.shape.ndims is None:
            # Unknown statically: fails at run time unless it holds one value.
            loss = tf.reshape(loss, [], name="scalar_loss")
        pairs = gradients(loss, optimizer, var_list)
        with tf.compat.v1.name_scope(name, "accumulation", values=[loss]) as scope:
            window = make_window(pairs, options, scope, cross_replica)
        if options.update_ops is None:
            roots = [loss.op] + ([] if weight is None else [weight.op])
            reads = {op.name for root in roots for op in _validate._ancestors(root)}
            _validate.warn_of_other_models(update_ops, reads, f"accum_op of {scope.rstrip('/')}")
        if weight is not None and weight.shape.ndims is None:
            weight = tf.reshape(weight, [], name="scalar_weight")
        grads = [g for g, _ in pairs]

        def add() -> Added:
            """Adds the fed micro-batch: what ``accum_op`` and ``accum_apply_op`` run first."""
            return window.add(grads, weight, run_with=update_ops)

        accum_op, _ = window.exclusive(lambda: (add().op, None), name="accumulate")
        # zero_op and apply_op run without a feed: they drop the caller's
        # control dependencies, which may read one.
        with tf.control_dependencies(None), window.control_flow(global_step):
            zero_op, _ = window.exclusive(lambda: (window.reset(), None), name="zero")
            apply_op, applied = window.exclusive(
                lambda: _op_first(window.apply(optimizer, global_step)), name="apply"
            )
        accum_apply_op, fused_applied = None, None
        if fused:
            with window.control_flow(global_step):
                accum_apply_op, fused_applied = window.exclusive(
                    lambda: _op_first(window.apply(optimizer, global_step, after=add())),
                    name="accumulate_and_apply",
                )
    ops = {"zero_op": zero_op, "accum_op": accum_op, "apply_op": apply_op}
    for field, op in {**ops, "accum_apply_op": accum_apply_op}.items():
        _guard.mark(window.scope, field, op)
    return Accumulation(
        **ops,
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


def prepare(
    what: str,
    optimizer: object,
    cross_replica: object,
    arguments: typing.Mapping[str, typing.Any] | WindowOptions,
) -> tuple[tf.compat.v1.train.Optimizer, WindowOptions]:
    """The checks every way in runs first: the optimizer and the options (or its ``locals()``)."""
    optimizer = _validate.check_optimizer(optimizer)
    _migration.refuse_accumulating_optimizer(optimizer, what)
    if isinstance(arguments, WindowOptions):
        options = arguments
    else:
        names = {field.name for field in dataclasses.fields(WindowOptions)}
        given = {key: value for key, value in arguments.items() if key in names}
        options = WindowOptions(weighted=arguments.get("weight") is not None, **given)
    _distributed.check_cross_replica(cross_replica)
    if options.weighted and isinstance(optimizer, tf.compat.v1.train.SyncReplicasOptimizer):
        _sync_replicas.refuse_weight(what)
    return optimizer, options


def check_in_graph(
    optimizer: tf.compat.v1.train.Optimizer,
    options: WindowOptions,
    loss: tf.Tensor,
    var_list: typing.Sequence[tf.Variable] | None,
    global_step: tf.Variable | None,
    weight: tf.Tensor | None,
) -> tuple[list[tf.Variable], list[tf.Operation]]:
    """Checks the arguments against the (checked) loss's graph; the variables and update ops."""
    graph = loss.graph
    _validate.check_global_step(global_step, graph)
    _validate.check_weight(weight, graph)
    update_ops = _options.update_ops_in(options, graph)
    var_list = _validate.check_var_list(var_list, graph)
    _validate.check_trainable(loss, var_list)
    _keras.check_variables(optimizer, var_list)
    return var_list, update_ops


def make_window(
    pairs: Pairs,
    options: WindowOptions,
    scope: str,
    cross_replica: _distributed.Engine | None,
    mutex: tf.Tensor | None = None,
) -> Window:
    """The `Window` of ``pairs`` in the name scope ``scope``."""
    reducer = None if cross_replica is None else cross_replica._reducer()
    with tf.compat.v1.name_scope(scope):
        return Window(pairs, options, scope, cross_replica=reducer, mutex=mutex)


def _op_first(applied: Applied) -> tuple[tf.Operation, Applied]:
    """An `Applied` as ``(op, applied)``, for `Window.exclusive`: the op holds the lock."""
    return applied.op, applied
