"""A drop-in optimizer that accumulates: for code that cannot change its loop."""

from __future__ import annotations

import inspect
import typing

from tf1_accum._compat import cached_property, control_flow_context, tf

from tf1_accum import _accumulation, _validate, _count_check, _distributed, _fed, _guard, _hooks
from tf1_accum import _keras, _migration, _options, _scaffold, _schedule_check, _stats
from tf1_accum import _sync_replicas, _unhooked
from tf1_accum._window import Applied, Window, APPLY_DUE_COLLECTION
from tf1_accum._options import GradientTransform, Pairs, WindowOptions


def check_weight(weight: object) -> None:
    """Checks ``weight``: None, a scalar tensor, or a callable of no argument returning one."""
    if callable(weight) and not isinstance(weight, tf.Tensor):
        try:
            inspect.signature(weight).bind()
        except TypeError:
            raise TypeError(
                "weight must be a scalar tensor or a callable of no argument returning one, "
                f"got {_validate.describe(weight)}, which needs arguments."
            ) from None
        except ValueError:  # no signature to read (a builtin): called as it is
            pass
        return
    # Before the loss is known, a weight tensor is checked in its own graph.
    _validate.check_weight(weight, getattr(weight, "graph", None))


class _Reach:
    """What one train op's window trains, and (worked out when first asked) what its loss reads."""

    def __init__(self, window: Window, roots: list[tf.Tensor]) -> None:
        self.window, self._roots = window, roots
        self.trains = {v.op.name for v in window.var_list}

    @cached_property
    def reads(self) -> set[str]:
        """Names of the ops the loss (or the gradients given) reads: variables, placeholders..."""
        ops: set[tf.Operation] = set()
        for root in self._roots:
            if root.op not in ops:
                ops |= _validate._ancestors(root.op)
        return {op.name for op in ops}

    @property
    def name(self) -> str:
        return self.window.scope.rstrip("/")

    def describe(self) -> str:
        trains = sorted(self.trains)
        more = ", ..." if len(trains) > 2 else ""
        return f"{self.name} (training {', '.join(trains[:2])}{more})"

    def coupling(self, other: _Reach) -> str | None:
        """Why an update of one window changes the gradients of the other's, or None."""
        for trains, reads, says in (
            (self.trains, other.trains, "both train {var}"),
            (other.trains, self.reads, "{other} trains {var}, which the loss of {this} reads"),
            (self.trains, other.reads, "{this} trains {var}, which the loss of {other} reads"),
        ):
            shared = sorted(trains & reads)
            if shared:
                return says.format(var=shared[0], this=self.name, other=other.name)
        return None


def _reaches(graph: tf.Graph) -> list[_Reach]:
    """The train ops built in ``graph`` by every AccumulationOptimizer, kept on the graph.

    Kept on the graph, not in a table keyed by it: each record holds the
    window's variables, which hold the graph, so a table would keep every
    graph alive.
    """
    if not hasattr(graph, "_tf1_accum_reaches"):
        graph._tf1_accum_reaches = []  # type: ignore[attr-defined]
    return typing.cast(list, graph._tf1_accum_reaches)  # type: ignore[attr-defined]


def _check_alone(this: _Reach, earlier: list[_Reach]) -> typing.Iterator[tf.Operation]:
    """Stops a run of ``this`` train op while a window coupled with it (a GAN's) is partly full."""
    for other in earlier:
        why = this.coupling(other)
        if why is None:
            continue
        message = (
            f"tf1_accum: the train op {this.describe()} ran while the window of "
            f"{other.describe()} is partly full, and the two are coupled: {why}. Run one train "
            "op a whole window in a row before the other (docs: Several optimizers on shared "
            f"variables). This micro-batch was not accumulated. {other.name}'s micro-batches:"
        )
        with tf.compat.v1.name_scope(this.window.scope):
            count = tf.identity(other.window.counter.read_value(), name="coupled_micro_batches")
            yield _guard.refuse_unless(
                tf.equal(count, 0), message, count, name="coupled_window_empty", summarize=3
            )


class TrainOpWindow(typing.NamedTuple):
    """The window of a train op an `AccumulationOptimizer` built: its ``window``.

    Attributes:
        counter: ``int64`` variable: micro-batches since the last update; fetch
            it in a run of its own (with the train op, fetch ``applied``).
        applied: bool tensor: whether this run of the train op applied an
            update; per-update work hangs on it (:doc:`real_programs`).
        global_norm: As `Accumulation`'s, of this run's update (else 0).
        statistics: As `Accumulation`'s, of this run's update (else NaN and
            0 ``micro_batches``).
        flush_op: Applies this window if partial (after the flushes of the
            train ops built before it in the graph), and resets.
        flush_statistics: The `GradientStatistics` ``flush_op`` applies
            (``statistics=True``; else None).
        skipped_windows, accumulators, var_list, options: As `Accumulation`'s.
    """

    counter: tf.Variable
    applied: tf.Tensor
    global_norm: tf.Tensor
    skipped_windows: tf.Variable
    statistics: typing.Optional[_stats.GradientStatistics]
    flush_op: tf.Operation
    flush_statistics: typing.Optional[_stats.GradientStatistics]
    accumulators: typing.List[tf.Variable]
    var_list: typing.List[tf.Variable]
    options: WindowOptions


#: The wrappers' properties that became `TrainOpWindow` fields: name -> field
#: (each of the same name but ``micro_step``).
_MOVED_TO_WINDOW = {
    "micro_step": "counter",
    "applied": "applied",
    "global_norm": "global_norm",
    "skipped_windows": "skipped_windows",
    "statistics": "statistics",
    "flush_statistics": "flush_statistics",
}


def missing_attribute(wrapper: object, name: str) -> typing.NoReturn:
    """The wrappers' ``__getattr__``: raises AttributeError, saying where ``name`` went if it moved.

    The pointer to the window stays for one release after the move.
    """
    kind = type(wrapper).__name__
    if name not in _MOVED_TO_WINDOW:
        raise AttributeError(f"'{kind}' object has no attribute '{name}'")
    raise AttributeError(
        f"tf1_accum: {kind}.{name} was removed: read opt.window.{_MOVED_TO_WINDOW[name]} "
        "instead (a TrainOpWindow field). This pointer is kept for one release only."
    )


def _unreachable(field: str) -> property:
    """A field of `_NestedWindow` that refuses, saying why and what nests the other way."""

    def refuse(self: TrainOpWindow) -> typing.NoReturn:
        raise ValueError(
            f"window.{field} of this AccumulationOptimizer is built inside another optimizer's "
            "conditional, where it cannot be fetched. Nest them the other way to read it: "
            "AccumulationOptimizer(MixedPrecisionLossScaleOptimizer(opt, loss_scale), steps)."
        )

    return property(refuse)


class _NestedWindow(TrainOpWindow):
    """The window of a train op built inside another optimizer's conditional."""

    __slots__ = ()
    applied = _unreachable("applied")
    global_norm = _unreachable("global_norm")
    statistics = _unreachable("statistics")


class _Build(typing.NamedTuple):
    """What building one train op returned."""

    window: Window
    record: TrainOpWindow
    start: typing.Optional[_migration.WindowStart]  # with global_step: its check


class _Builds(typing.List[_Build]):
    """The train ops one `AccumulationOptimizer` built, in order, in every graph."""

    def of(self, graph: tf.Graph | None = None) -> list[_Build]:
        """The train ops built in ``graph`` (the default graph, if None)."""
        graph = graph or tf.compat.v1.get_default_graph()
        return [b for b in self if b.window.counter.graph is graph]

    def one(self, what: str) -> _Build:
        """The one train op built in the default graph (or the only one); ValueError if not one."""
        builds = self.of()
        if not builds and len({id(b.window.counter.graph) for b in self}) == 1:
            builds = self  # read outside the one graph it was built in
        if not builds:
            elsewhere = " in this graph (it was built in other graphs: enter the one you mean "
            elsewhere += "with graph.as_default())"
            raise ValueError(
                f"{what} exists once the train op is built: call minimize() or apply_gradients() "
                f"first{elsewhere if self else ''}."
            )
        if len(builds) > 1:
            raise ValueError(
                f"{what} is ambiguous: this AccumulationOptimizer built {len(builds)} train ops "
                "in this graph. Build one AccumulationOptimizer per train op."
            )
        return builds[0]


class AccumulationOptimizer(tf.compat.v1.train.Optimizer):
    """Wraps an optimizer so that its train op accumulates ``steps`` micro-batches.

    Every ``steps``-th run of the train op also applies the window through
    the wrapped optimizer; ``global_step`` counts updates (a run finding it
    moved by something else, or a coupled window partly full, stops:
    :doc:`concepts`); `flush_op` applies what is left over. Wrap it
    outermost. See :doc:`ways_in`, :doc:`real_programs`, :ref:`parameter-servers`.

    Example:

    >>> import numpy as np
    >>> with tf.Graph().as_default():
    ...     x = tf.compat.v1.placeholder(tf.float32, [None])
    ...     w = tf.compat.v1.get_variable("w", initializer=1.0)
    ...     loss = tf.reduce_mean((w * x - 2.0 * x) ** 2)
    ...     step = tf.compat.v1.train.get_or_create_global_step()
    ...     opt = tf1_accum.AccumulationOptimizer(
    ...         tf.compat.v1.train.GradientDescentOptimizer(0.1), steps=2)
    ...     train_op = opt.minimize(loss, global_step=step)
    ...     with tf.compat.v1.Session() as sess:
    ...         sess.run(tf.compat.v1.global_variables_initializer())
    ...         for batch in ([1.0, 2.0], [3.0, 4.0]):
    ...             _ = sess.run(train_op, {x: np.array(batch)})
    ...             print([int(v) for v in sess.run([step, opt.window.counter])])
    ...         print(round(float(sess.run(w)), 4))
    [0, 1]
    [1, 0]
    2.5

    Args:
        optimizer: As in `build_accumulation`.
        steps: Micro-batches per update, an int of at least 1.
        weight: A micro-batch's scalar weight tensor, or a callable with no
            argument that returns one when the train op is built (as in
            `build_accumulation`, which says when a loss needs one).
        average, clip_norm, transform, skip_nonfinite, statistics, micro_batch_size, update_ops:
            See `WindowOptions` (:ref:`window-options`).
        cross_replica: As in `build_accumulation`; every worker runs the train
            op (and ``flush_op``) equally often.
        name: Name scope of the accumulation ops.

    Raises:
        TypeError, ValueError: What `build_accumulation` refuses of
            ``optimizer``, ``weight``, ``cross_replica`` and the options;
            ``steps`` that is not an int of at least 1; a ``SyncReplicasOptimizer``
            that aggregates more windows per update than there are workers, or
            given ``weight`` (it averages the workers' windows equally).
    """

    def __init__(
        self,
        optimizer: tf.compat.v1.train.Optimizer,
        steps: int,
        *,
        average: bool = True,
        weight: tf.Tensor | typing.Callable[[], tf.Tensor] | None = None,
        clip_norm: float | None = None,
        transform: GradientTransform | typing.Sequence[GradientTransform] | None = None,
        skip_nonfinite: bool = True,
        statistics: bool = False,
        micro_batch_size: int | None = None,
        update_ops: typing.Sequence[tf.Operation] | None = None,
        cross_replica: _distributed.Engine | None = None,
        name: str = "Accumulation",
    ) -> None:
        check_weight(weight)
        # The optimizer checked (a Keras one behind an adapter), and the options made.
        optimizer, options = _accumulation.prepare(
            "AccumulationOptimizer", optimizer, cross_replica, locals()
        )
        if isinstance(optimizer, tf.compat.v1.train.SyncReplicasOptimizer):
            _sync_replicas.check(optimizer)
        _validate.check_steps(steps)
        super().__init__(use_locking=False, name=name)
        self._optimizer, self._options, self._steps = optimizer, options, int(steps)
        self._weight, self._cross_replica = weight, cross_replica
        self._builds = _Builds()

    #: How the warning of a loss that needs a weight gives one (the Keras wrapper's sets its own).
    _with_weight = "AccumulationOptimizer(optimizer, steps, weight={})"

    @property
    def optimizer(self) -> tf.compat.v1.train.Optimizer:
        """The wrapped optimizer, as given (a Keras optimizer stays a Keras optimizer)."""
        return _keras.given(self._optimizer)

    steps = property(lambda self: self._steps, doc="Micro-batches per update.")

    # A removed property's AttributeError names its `window` field (one release).
    __getattr__ = missing_attribute

    @property
    def window(self) -> TrainOpWindow:
        """The `TrainOpWindow` of the one train op built in the default graph.

        Raises:
            ValueError: If no train op was built yet, or several (build one
                AccumulationOptimizer per train op).
        """
        return self._builds.one("window").record

    @property
    def flush_op(self) -> tf.Operation:
        """Applies a partial window of every train op in the graph (no feed, no ``update_ops``).

        Run it alone: a run that fetches it with one of those train ops is
        refused (:ref:`ways-in-one-op-per-run`).

        Raises:
            ValueError: If no train op was built yet.
        """
        # Each train op's flush runs the flushes built before it in its graph.
        builds = self._builds.of() or self._builds[-1:]
        if not builds:
            self._builds.one("flush_op")
        return builds[-1].record.flush_op

    def compute_gradients(
        self, *args: typing.Any, **kwargs: typing.Any
    ) -> list[tuple[tf.Tensor | None, tf.Variable]]:
        """The wrapped optimizer's ``compute_gradients`` (loss scaling included)."""
        return self._optimizer.compute_gradients(*args, **kwargs)

    def apply_gradients(
        self,
        grads_and_vars: typing.Iterable[tuple[tf.Tensor | None, tf.Variable]],
        global_step: tf.Variable | None = None,
        name: str | None = None,
    ) -> tf.Operation:
        """As `minimize`, from the pairs of `compute_gradients` (None gradients skipped, warned).

        Raises:
            RuntimeError: If eager execution is active.
            TypeError, ValueError: As `minimize`; or if the gradients come from
                a ``SyncReplicasOptimizer`` wrapping this one (which would hang).
        """
        _validate.check_graph_mode("AccumulationOptimizer.apply_gradients")
        # Inside a loss-scale optimizer's conditional, the default graph is the
        # branch's function graph, and global_step a variable of the graph outside.
        with tf.init_scope():
            outer = tf.compat.v1.get_default_graph()
        _validate.check_global_step(global_step, outer)
        grads_and_vars = list(grads_and_vars)
        _validate.check_not_under_sync_replicas(grads_and_vars)
        pairs = _validate.usable_gradients(grads_and_vars)
        _migration.warn_if_clipped(pairs, self._options.clip_norm)
        _validate.check_shapes([v for _, v in pairs])
        _keras.check_variables(self._optimizer, [v for _, v in pairs])
        if not callable(self._weight):
            _validate.check_weight(self._weight, outer)
        _options.update_ops_in(self._options, outer)
        graph = tf.compat.v1.get_default_graph()
        with _validate.restored_on_failure(graph, "AccumulationOptimizer.apply_gradients"):
            roots = [g.values if isinstance(g, tf.IndexedSlices) else g for g, _ in pairs]
            return _build(self, pairs, global_step, name, roots)

    def minimize(
        self,
        loss: tf.Tensor,
        global_step: tf.Variable | None = None,
        var_list: typing.Sequence[tf.Variable] | None = None,
        gate_gradients: int = tf.compat.v1.train.Optimizer.GATE_OP,
        aggregation_method: typing.Any = None,
        colocate_gradients_with_ops: bool = False,
        name: str | None = None,
        grad_loss: tf.Tensor | None = None,
    ) -> tf.Operation:
        """As ``tf.compat.v1.train.Optimizer.minimize``, returning the accumulating train op.

        Raises:
            RuntimeError: If eager execution is active.
            TypeError, ValueError: What `build_accumulation` refuses of
                ``loss``, ``var_list``, ``global_step``, ``weight``, the
                gradients and the optimizer's apply; a wrapped
                ``SyncReplicasOptimizer`` given no ``global_step``.
        """
        given = dict(
            gate_gradients=gate_gradients,
            aggregation_method=aggregation_method,
            colocate_gradients_with_ops=colocate_gradients_with_ops,
            grad_loss=grad_loss,
        )
        if callable(loss):  # a callable loss is for eager execution: TF checks it
            return super().minimize(loss, global_step, var_list, name=name, **given)
        _validate.check_graph_mode("AccumulationOptimizer.minimize")
        _validate.check_loss(loss)
        weight = None if callable(self._weight) else self._weight
        _accumulation.check_in_graph(
            self._optimizer, self._options, loss, var_list, global_step, weight
        )
        # A failure from here on puts the graph's collections back.
        with _validate.restored_on_failure(loss.graph, "AccumulationOptimizer.minimize"):
            grads_and_vars = self.compute_gradients(loss, var_list=var_list, **given)
            pairs = _validate.usable_gradients(grads_and_vars)
            with loss.graph.as_default():
                return _build(self, pairs, global_step, name, [loss])

    def get_slot(self, var: tf.Variable, name: str) -> tf.Variable | None:
        """The wrapped optimizer's slot ``name`` of ``var`` (as plain training names it)."""
        return self._optimizer.get_slot(var, name)

    def get_slot_names(self) -> list[str]:
        """The wrapped optimizer's slot names."""
        return self._optimizer.get_slot_names()

    def variables(self) -> list[tf.Variable]:
        """The wrapped optimizer's variables, then each window's (not in `plain_variables`)."""
        state = [v for b in self._builds.of() for v in b.window._state()]
        state += [b.start.variable for b in self._builds.of() if b.start is not None]
        return list(self._optimizer.variables()) + state

    def make_session_run_hook(
        self, flush_at_end: bool = False
    ) -> tf.compat.v1.train.SessionRunHook:
        """A hook that saves a partial window at the end, or flushes it (:doc:`real_programs`).

        Its ``begin()`` raises ``ValueError`` if no train op of this optimizer is in the graph.

        Raises:
            TypeError: If ``flush_at_end`` is not a bool.
        """
        _validate.check_bool("flush_at_end", flush_at_end)
        return _hooks.AccumulationHook(self._built_windows, flush_at_end)

    def make_scaffold(
        self, *, max_to_keep: int = 5, **scaffold_kwargs: typing.Any
    ) -> tf.compat.v1.train.Scaffold:
        """A ``Scaffold`` that starts from a checkpoint of plain training, or resumes one.

        See :ref:`real-programs-plain-checkpoint`; make it after the train op.
        ``max_to_keep`` is the saver's; ``scaffold_kwargs`` the ``Scaffold``'s but ``saver``.

        Raises:
            TypeError: If ``saver`` is given, or ``max_to_keep`` is not an int.
            ValueError: If no train op was built yet, or the graph already has
                a saver in ``SAVERS``.
        """
        self._builds.one("make_scaffold")
        return _scaffold.make_scaffold(max_to_keep, scaffold_kwargs)

    def _built_windows(self, graph: tf.Graph) -> list[tuple[tf.Variable, tf.Operation]]:
        """(counter, flush op) of each train op in ``graph``; refuses a hand-written increment."""
        _migration.refuse_hand_written([b.start for b in self._builds.of(graph)])
        return [(b.window.counter, b.record.flush_op) for b in self._builds.of(graph)]


def _build(
    wrapper: AccumulationOptimizer,
    pairs: Pairs,
    global_step: tf.Variable | None,
    name: str | None,
    roots: list[tf.Tensor],
) -> tf.Operation:
    """Builds ``wrapper``'s train op and flush on ``pairs`` (checked); returns the train op."""
    options, steps = wrapper._options, wrapper._steps
    graph = tf.compat.v1.get_default_graph()
    # Inside a loss-scale optimizer's conditional, the graph the session runs.
    with tf.init_scope():
        outer = tf.compat.v1.get_default_graph()
    weight = wrapper._weight
    if callable(weight):
        weight = weight()
        _validate.check_weight(weight, graph)
    _count_check.warn_if_unweighted(roots, weight, wrapper._with_weight)
    update_ops = _options.update_ops_in(options, outer)
    with tf.compat.v1.name_scope(name, wrapper.get_name()) as scope:
        window = _accumulation.make_window(pairs, options, scope, wrapper._cross_replica)
    reach = _Reach(window, roots)
    if options.update_ops is None:
        _validate.warn_of_other_models(update_ops, reach.reads, f"the train op of {reach.name}")
    applier: tf.compat.v1.train.Optimizer = wrapper._optimizer
    own: list[tf.Operation] = []
    if isinstance(applier, tf.compat.v1.train.SyncReplicasOptimizer):
        applier, own = _sync_replicas.prepare(applier, pairs, global_step)
    # The train op and the flush hold the window's mutex: threads take turns.
    with window.control_flow(global_step):
        start = None
        if global_step is not None:
            start = _migration.WindowStart(global_step, window.counter, scope)
            start.own.update(op.name for op in own)

        def accumulate_and_apply() -> tuple[Applied, None]:
            # With global_step: each run first checks that nothing else moved it.
            checked = [] if start is None else [start.check(steps)]
            checked += _check_alone(reach, _reaches(outer))
            # What the add waits for once the apply shows what it reads (a fed learning rate).
            with tf.compat.v1.name_scope(window.scope):
                gate = tf.no_op(name="fed_values_held")
            with tf.control_dependencies(checked + [gate]):
                added = window.add([g for g, _ in pairs], weight, run_with=update_ops)
            # The counter's increment waits for every add: the apply follows them.
            with tf.compat.v1.name_scope(window.scope):
                due = tf.greater_equal(tf.identity(added.count), steps, name="due")
            graph.add_to_collection(APPLY_DUE_COLLECTION, due)
            applied = window.apply(applier, global_step, when=due)
            with tf.compat.v1.name_scope(window.scope):
                held.append(_fed.hold(window.counter, gate, added.op, applied.applied))
            return applied, None

        held: list[_fed.Held | None] = []

        train, _ = window.exclusive(accumulate_and_apply)
        # Built now (a MonitoredSession finalizes the graph), outside any
        # conditional, after the earlier train ops' flushes: it flushes every window.
        earlier = [b.record.flush_op for b in wrapper._builds.of(outer)]
        with tf.init_scope(), tf.control_dependencies(earlier[-1:]):

            def flush() -> tuple[Applied, None]:
                with tf.compat.v1.name_scope(window.scope):
                    count = tf.identity(window.counter)
                    pending = tf.greater(count, 0, name="pending")
                    # Fed to the flush, a learning rate is the window's, as in its micro-batches.
                    fed = held[0] if graph is outer else None
                    checked = [fed.check(count, "flush_op")] if fed else []
                with tf.control_dependencies(checked):
                    return window.apply(applier, global_step, when=pending), None

            flushed, _ = window.exclusive(flush, name="flush")
    # Inside a loss-scale optimizer's conditional, what each run computes stays in it.
    nested = graph is not outer or control_flow_context(train.applied.op) is not None
    if start is not None and not nested:
        start.applied = train.applied  # what a hand-written increment hangs on
        step_op, _ = start.given()
        outer.add_to_collection(
            _migration.APPLIED_WITH_STEP, f"{train.applied.name} {step_op.name}"
        )
    record = (_NestedWindow if nested else TrainOpWindow)(
        counter=window.counter,
        applied=train.applied,
        global_norm=train.norm,
        skipped_windows=window.skipped,
        statistics=train.statistics,
        flush_op=flushed.op,
        flush_statistics=flushed.statistics,
        accumulators=window.accumulators,
        var_list=window.var_list,
        options=options,
    )
    wrapper._builds.append(_Build(window, record, start))
    _reaches(outer).append(reach)
    # Without make_session_run_hook's hook, a window may miss every checkpoint: warn.
    outer.add_to_collection(_unhooked.TRAIN_OP_COUNTERS, window.counter)
    _unhooked.watch_checkpoint_saver_hook()
    _unhooked.watch_keras_fit()
    with tf.compat.v1.name_scope(scope):
        train_op = tf.group(train.applied, name="train")
    _guard.mark(window.scope, "train_op", train_op, train)
    _guard.mark([b.window.scope for b in wrapper._builds.of(outer)], "flush_op", flushed)
    if global_step is not None:  # a schedule counted in micro-batches: say so before it runs
        _schedule_check.warn_of_schedules(train_op, global_step)
    return train_op
