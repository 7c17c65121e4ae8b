"""One accumulation window: its state, and `Window.add`, `mean`, `apply`, `reset`.

Every way in composes these, each inside `exclusive` (the window's mutex).
"""

from __future__ import annotations

import contextlib
import functools
import typing

import numpy as np
import tensorflow as tf

from tf1_accum import _validate
from tf1_accum._norms import square_norms as _square_norms
from tf1_accum._sync_replicas import SyncPush
from tf1_accum._options import Gradient
from tf1_accum._options import Pairs
from tf1_accum._options import WindowMean
from tf1_accum._options import WindowOptions
from tf1_accum._options import transformed
from tf1_accum._options import transforms_of
from tf1_accum._shared_apply import SharedApply
from tf1_accum._stats import GradientStatistics
from tf1_accum._stats import MovingAverages
from tf1_accum._stats import WindowStatistics
from tf1_accum._state import new_mutex
from tf1_accum._state import state_variable
from tf1_accum._wrapping import scales_loss as _scales_loss

#: Graph collection of the ``counter >= steps`` predicate of each window that
#: applies every ``steps`` micro-batches (where `check_graph` reads ``steps``).
APPLY_DUE_COLLECTION = "tf1_accum_apply_due"


class Reducer(typing.Protocol):
    """Sums a window's totals across the workers (`_distributed._WindowReducer`)."""

    def reduce(
        self,
        per_slot: typing.Sequence[tuple[tf.Tensor, ...]],
        count: tf.Tensor,
        weight: tf.Tensor | None,
        scalars: typing.Sequence[tf.Tensor] = (),
    ) -> tuple[list[tuple[tf.Tensor, ...]], tf.Tensor, tf.Tensor | None, list[tf.Tensor]]: ...


class Added(typing.NamedTuple):
    """What `Window.add` built: its op, and the window's totals right after it.

    An apply in the same run reads these, not the variables: Grappler drops
    identity reads of reference variables with their control dependencies,
    so "after the add" must be a data dependency.
    """

    op: tf.Operation
    # Each slot's values after the add (see _VariableAccumulator); None: read the variable.
    per_slot: typing.Sequence[typing.Optional[tuple]]
    count: tf.Tensor  # the counter's increment; it waits for every other add
    weight: typing.Optional[tf.Tensor]  # the float64 weight total, or None
    square_norm: typing.Optional[tf.Tensor]  # the statistics' sum, or None
    micro_batches: typing.Optional[tf.Tensor]  # micro-batches of positive weight, or None


class Applied(typing.NamedTuple):
    """What one apply computed; built in a conditional, ``grads_and_vars`` is None."""

    grads_and_vars: typing.Optional[list]
    op: typing.Optional[tf.Operation]
    norm: tf.Tensor  # float64 global norm before clipping (0 where nothing applied)
    applied: tf.Tensor  # bool: whether the optimizer was given the window
    statistics: typing.Any = None  # a _stats.GradientStatistics, or None


class Mean(typing.NamedTuple):
    """The window's mean (or sum), as `Window.mean` builds it for one apply."""

    gradients: typing.Callable[[], list]  # builds them, aligned with var_list
    norm: tf.Tensor  # float64 global norm before clipping
    statistics: typing.Any  # a _stats.GradientStatistics, or None
    observed: typing.List[tf.Operation]  # the statistics' updates; the reset waits for them
    rows: typing.List[typing.Optional[tf.Tensor]]  # sparse rows the reset clears
    after: typing.List[tf.Tensor]  # what the update waits for: the add's count


_NOTHING_ACCUMULATED = (
    "tf1_accum: apply_op ran with nothing accumulated (counter is 0). Run "
    "accum_op on at least one micro-batch before apply_op; no variable was "
    "changed."
)
_NOTHING_ACCUMULATED_ANYWHERE = (
    "tf1_accum: apply_op ran with nothing accumulated on any worker (the counters "
    "summed across the workers are 0). Run accum_op on at least one micro-batch "
    "before apply_op; no variable was changed."
)


class Window:
    """Accumulators, a counter, and the ops on them; built in the name scope ``scope``."""

    def __init__(
        self,
        pairs: Pairs,
        options: WindowOptions,
        scope: str,
        cross_replica: Reducer | None = None,
        mutex: tf.Tensor | None = None,
    ) -> None:
        self.options = options
        self.scope = scope
        self.cross_replica = cross_replica
        self.statistics = statistics = WindowStatistics.for_window(options, pairs)
        self.square_norms: tf.Variable | None = None
        self.weighted_micro_batches: tf.Variable | None = None
        weighted = options.weighted
        # Every apply built through one optimizer (or transform) shares its state.
        self._shared_applies: dict[int, SharedApply] = {}
        self._transform_state = SharedApply(options.transform)
        # Parameter servers: the window's state stays local to the worker.
        worker = _worker_device(pairs)
        with tf.device(worker) if worker else contextlib.nullcontext():
            # Another name, so a checkpoint of one kind fails to restore into the other.
            self.counter = state_variable(
                lambda: tf.constant(0, tf.int64), "weighted_counter" if weighted else "counter"
            )
            self.skipped = state_variable(lambda: tf.constant(0, tf.int64), "skipped_windows")
            self.weight_total: tf.Variable | None = None
            if weighted:
                self.weight_total = state_variable(
                    lambda: tf.constant(0.0, tf.float64), "weight_total"
                )
            self.slots = [_VariableAccumulator.create(g, v) for g, v in pairs]
            self.mutex = new_mutex() if mutex is None else mutex
            self.statistics_state: MovingAverages | None = None
            if statistics is not None:
                self.square_norms = state_variable(
                    lambda: tf.constant(0.0, tf.float64), "micro_batch_square_norms"
                )
                if weighted:
                    # The statistics count micro-batches of positive weight only.
                    self.weighted_micro_batches = state_variable(
                        lambda: tf.constant(0, tf.int64), "micro_batches_weighted"
                    )
                self.statistics_state = statistics.create_state()
        if worker:
            _make_local(self._state())

    def _state(self) -> list[tf.Variable]:
        state = [self.counter, self.skipped, self.weight_total]
        state.append(self.square_norms)
        state.append(self.weighted_micro_batches)
        state += self.statistics_state or ()
        for slot in self.slots:
            state += [slot.accumulator, getattr(slot, "touched", None)]
        return [v for v in state if v is not None]

    def exclusive(
        self, build: typing.Callable[[], tuple[typing.Any, typing.Any]], name: str | None = None
    ) -> tuple[typing.Any, typing.Any]:
        """`exclusive` with the window's mutex and state."""
        return exclusive(self.mutex, self.scope, build, self._state, name)

    def control_flow(self, global_step: tf.Variable | None = None) -> typing.ContextManager[None]:
        """`reference_control_flow` for the trained variables, the state and ``global_step``."""
        return reference_control_flow(self.var_list + self._state() + [global_step])

    @property
    def var_list(self) -> list[tf.Variable]:
        return [slot.var for slot in self.slots]

    @property
    def accumulators(self) -> list[tf.Variable]:
        return [slot.accumulator for slot in self.slots]

    def add(
        self,
        gradients: typing.Sequence[Gradient],
        weight: tf.Tensor | None = None,
        run_with: typing.Sequence[tf.Operation | tf.Tensor] = (),
        name: str | None = None,
    ) -> Added:
        """Adds one micro-batch's gradients (aligned with ``var_list``), times ``weight``.

        Weight 0 adds nothing, even a NaN, but is counted; ``run_with`` runs
        before every stateful op. Returns an `Added`.
        """
        with tf.compat.v1.name_scope(self.scope), tf.control_dependencies(run_with):
            stateful = []
            weight_after = square_after = counted_after = None
            if self.weight_total is not None:
                weight = tf.cast(weight, tf.float64)
                dtypes = {slot.dtype for slot in self.slots}
                with tf.control_dependencies([_check_weight(weight, dtypes)]):
                    weight = tf.identity(weight)
                    weight_after = self.weight_total.assign_add(weight, use_locking=True)
                stateful.append(weight_after)
            if self.statistics is not None and self.square_norms is not None:  # made together
                square = self.statistics.square_norm(gradients)
                if weight is not None:
                    square = tf.math.multiply_no_nan(square, weight)
                    # Made with the statistics of a weighted window.
                    counted = typing.cast(tf.Variable, self.weighted_micro_batches)
                    counted_after = counted.assign_add(
                        tf.cast(weight > 0, tf.int64), use_locking=True
                    )
                    stateful.append(counted_after)
                square_after = self.square_norms.assign_add(square, use_locking=True)
                stateful.append(square_after)
            # The window's first add assigns: no reset pass, no zeros (see _VariableAccumulator).
            first = tf.equal(self.counter.read_value(), 0, name="first")
            totals = [slot.add(g, weight, first) for slot, g in zip(self.slots, gradients)]
            stateful += [_write_of(t) for total in totals for t in total]
            with tf.control_dependencies(stateful):
                count = self.counter.assign_add(1, use_locking=True)
            return Added(
                op=tf.group(count, name=name),
                per_slot=totals,
                count=count,
                weight=weight_after,
                square_norm=square_after,
                micro_batches=counted_after,
            )

    def reset(self, name: str | None = None) -> tf.Operation:
        """Empties the window (a dense accumulator keeps its values: the next add assigns)."""
        with tf.compat.v1.name_scope(self.scope):
            return tf.group(*[slot.reset() for slot in self.slots], self._reset_totals(), name=name)

    def mean(self, after: Added | None = None, nonempty: bool = False) -> Mean:
        """The window's mean (sum with ``average=False``), norm and statistics: a `Mean`.

        ``after``: an `Added` of the same run, read instead of the variables.
        ``nonempty``: the caller's predicate implies a micro-batch (no check).
        """
        with tf.compat.v1.name_scope(self.scope):
            totals = self._read_totals() if after is None else after
            per_slot, count, weight = totals.per_slot, totals.count, totals.weight
            count = tf.identity(count)  # a value, not a reference
            square, counted = totals.square_norm, totals.micro_batches
            if square is not None:
                square = tf.identity(square)
            if counted is not None:
                counted = tf.identity(counted)
            # Weights summing to 0 give a NaN mean: skipped as non-finite.
            if self.cross_replica is None:
                # After an add, the mean waits for its count (which waits for every add).
                checks = [count] if after is not None else []
                if after is None and not nonempty:
                    checks.append(
                        tf.debugging.Assert(
                            tf.greater(count, 0), [_NOTHING_ACCUMULATED], name="nothing_accumulated"
                        )
                    )
            else:
                # Every worker joins the all-reduce (an empty window with zeros),
                # so the apply fails on every worker or on none.
                filled = [
                    slot.totals() if t is None else t for slot, t in zip(self.slots, per_slot)
                ]
                # An empty window's dense accumulators hold the last window's values.
                holds = tf.greater(count, 0)
                local = [slot.masked(t, holds) for slot, t in zip(self.slots, filled)]
                scalars = [t for t in (square, counted) if t is not None]
                per_slot, count, weight, scalars = self.cross_replica.reduce(
                    local, count, weight, scalars
                )
                if square is not None:
                    square, counted = scalars[0], (scalars[1:] or [None])[0]
                checks = [
                    tf.compat.v1.assert_positive(count, message=_NOTHING_ACCUMULATED_ANYWHERE)
                ]
            with tf.control_dependencies(checks):
                denominator = None
                if self.options.average:
                    denominator = tf.identity(count if weight is None else weight)
                # Each variable's mean is made only where the optimizer takes it.
                sums = [slot.window_sum(t) for slot, t in zip(self.slots, per_slot)]
                squares = _square_norms([_values(total) for total, _ in sums])
                if denominator is not None:
                    squares = [q / tf.square(tf.cast(denominator, tf.float64)) for q in squares]
                norm = tf.sqrt(tf.add_n(squares), name="global_norm")
                statistics: GradientStatistics | None = None
                observed: list[tf.Operation] = []
                if self.statistics is not None and self.statistics_state is not None:
                    counted = count if counted is None else counted
                    statistics, observed = self.statistics.observe(
                        self.statistics_state, squares, counted, weight, square
                    )
                window = WindowMean(norm, count)
        transforms = transforms_of(self.options)  # one clip_by_global_norm for every variable

        def grads() -> list[Gradient]:
            with tf.compat.v1.name_scope(self.scope):
                return [
                    slot.finish(
                        total,
                        denominator,
                        functools.partial(
                            transformed, variable=slot.var, window=window, transforms=transforms
                        ),
                    )
                    for slot, (total, _) in zip(self.slots, sums)
                ]

        return Mean(
            gradients=grads,
            norm=norm,
            statistics=statistics,
            observed=observed,
            rows=[rows for _, rows in sums],
            after=[] if after is None else [after.count],
        )

    def apply(
        self,
        optimizer: tf.compat.v1.train.Optimizer,
        global_step: tf.Variable | None = None,
        *,
        after: Added | None = None,
        when: tf.Tensor | None = None,
        otherwise: typing.Callable[[], list] | None = None,
        name: str | None = None,
    ) -> Applied:
        """Applies the window's `mean` through ``optimizer``, then resets the window.

        ``after``: as in `mean`. ``when``: a bool tensor implying a micro-batch:
        apply inside a ``tf.cond`` where it holds (``otherwise()`` returns the
        other branch's ops). Returns an `Applied` (``applied`` False where
        skipped or not applied).
        """
        if when is None:
            return self._apply(optimizer, global_step, after, name=name)
        caller_scope = tf.compat.v1.get_default_graph().get_name_scope()

        def apply() -> tuple[tf.Tensor, ...]:
            # The caller's name scope, not the cond's, for Adam's beta powers.
            branch_graph = tf.compat.v1.get_default_graph()  # a function graph in cond_v2
            with branch_graph.name_scope(caller_scope + "/" if caller_scope else ""):
                result = self._apply(optimizer, global_step, after, nonempty=True)
            outcome = [result.applied, result.norm] + tf.nest.flatten(result.statistics or ())
            with tf.control_dependencies([result.op]):
                return tuple(tf.identity(t) for t in outcome)

        def idle() -> tuple[tf.Tensor, ...]:
            with tf.control_dependencies(otherwise() if otherwise else []):
                outcome = (tf.constant(False), tf.constant(0.0, tf.float64))
                if self.statistics is not None:
                    outcome += tuple(tf.nest.flatten(self.statistics.idle()))
                return outcome

        with tf.compat.v1.name_scope(self.scope):
            applied, norm, *rest = tf.cond(when, apply, idle, name="apply_when")
            statistics = None if self.statistics is None else self.statistics.pack(rest)
            return Applied(
                grads_and_vars=None,
                op=tf.group(applied, name=name),
                norm=norm,
                applied=applied,
                statistics=statistics,
            )

    def _apply(
        self,
        optimizer: tf.compat.v1.train.Optimizer,
        global_step: tf.Variable | None,
        after: Added | None,
        nonempty: bool = False,
        name: str | None = None,
    ) -> Applied:
        """`apply` without a condition: the mean, the optimizer's update, the reset."""
        mean = self.mean(after, nonempty)
        finite = tf.math.is_finite(mean.norm)
        if self.options.transform is None:
            # Made where the optimizer takes each; these, for a user to fetch, are equal.
            grads = mean.gradients()
            make_grads = mean.gradients
        else:
            # Made once, before the apply, for the non-finite check (a parameter copy).
            with tf.compat.v1.name_scope(self.scope):
                grads = self._transform_state.build(mean.gradients)
                squares = _square_norms([_values(g) for g in grads])
                finite = tf.logical_and(finite, tf.math.is_finite(tf.add_n(squares)))
            make_grads = lambda: grads  # noqa: E731
        grads_and_vars = list(zip(grads, self.var_list))
        # In the caller's name scope: Adam's beta powers get minimize()'s names.
        with tf.control_dependencies(mean.after):
            update, applied = self._apply_if_finite(optimizer, make_grads, global_step, finite)
        with tf.compat.v1.name_scope(self.scope):
            with tf.control_dependencies([update] + mean.observed):
                reset = tf.group(
                    *[slot.reset(rows) for slot, rows in zip(self.slots, mean.rows)],
                    self._reset_totals(),
                )
            return Applied(
                grads_and_vars=grads_and_vars,
                op=tf.group(update, reset, name=name),
                norm=mean.norm,
                applied=applied,
                statistics=mean.statistics,
            )

    def _read_totals(self) -> Added:
        """The window's totals as the variables hold them, in the shape of an `Added`."""
        return Added(
            op=None,
            per_slot=[None] * len(self.slots),
            count=self.counter,
            weight=self.weight_total,
            square_norm=self.square_norms,
            micro_batches=self.weighted_micro_batches,
        )

    def _apply_if_finite(
        self,
        optimizer: tf.compat.v1.train.Optimizer,
        make_grads: typing.Callable[[], list[Gradient]],
        global_step: tf.Variable | None,
        finite: tf.Tensor,
    ) -> tuple[tf.Operation, tf.Tensor]:
        """Hands the window to the optimizer unless ``finite`` is False; returns (op, applied).

        A loss-scale optimizer gets every window (it must see the overflow),
        and so does a ``SyncReplicasOptimizer`` (its chief waits for every
        push): there a non-finite window is counted, not skipped.
        ``make_grads()`` builds the gradients inside the conditional.
        """
        shared = self._shared_applies.get(id(optimizer))
        if shared is None:
            shared = self._shared_applies[id(optimizer)] = SharedApply(optimizer)
        count_skip = lambda: self.skipped.assign_add(  # noqa: E731
            tf.cast(tf.logical_not(finite), tf.int64), use_locking=True, read_value=False
        )
        if (
            not self.options.skip_nonfinite
            or _scales_loss(optimizer)
            or isinstance(optimizer, (tf.compat.v1.train.SyncReplicasOptimizer, SyncPush))
        ):
            update = tf.group(
                _apply_one_at_a_time(shared, make_grads, self.var_list, global_step), count_skip()
            )
            # A dynamic loss scale applies exactly the finite windows.
            applied = finite if self.options.skip_nonfinite and _scales_loss(optimizer) else True
            with tf.control_dependencies([update]):
                return update, tf.identity(applied)
        caller_scope = tf.compat.v1.get_default_graph().get_name_scope()

        def apply() -> tf.Tensor:
            # The caller's name scope, not the cond's, for Adam's beta powers.
            branch_graph = tf.compat.v1.get_default_graph()
            with branch_graph.name_scope(caller_scope + "/" if caller_scope else ""):
                op = _apply_one_at_a_time(shared, make_grads, self.var_list, global_step)
            with tf.control_dependencies([op]):
                return tf.constant(True)

        def skip() -> tf.Tensor:
            with tf.control_dependencies([count_skip()]):
                return tf.constant(False)

        with tf.compat.v1.name_scope(self.scope):
            applied = tf.cond(finite, apply, skip, name="apply_if_finite")
            return applied.op, applied

    def _reset_totals(self) -> tf.Operation:
        resets = [self.counter.assign(tf.constant(0, tf.int64), use_locking=True, read_value=False)]
        if self.weight_total is not None:
            resets.append(
                self.weight_total.assign(
                    tf.constant(0.0, tf.float64), use_locking=True, read_value=False
                )
            )
        if self.square_norms is not None:
            resets.append(
                self.square_norms.assign(
                    tf.constant(0.0, tf.float64), use_locking=True, read_value=False
                )
            )
        if self.weighted_micro_batches is not None:
            resets.append(
                self.weighted_micro_batches.assign(
                    tf.constant(0, tf.int64), use_locking=True, read_value=False
                )
            )
        return tf.group(*resets)


def _apply_one_at_a_time(
    shared: SharedApply,
    make_grads: typing.Callable[[], list[Gradient]],
    var_list: typing.Sequence[tf.Variable],
    global_step: tf.Variable | None,
) -> tf.Operation:
    """Builds the optimizer's apply of ``make_grads()``, one large gradient alive at a time.

    Left to the executor, every mean would be alive at once (a parameter
    copy): each large one waits for the optimizer's ops reading the one
    before. An op reading two gradients (a global norm) would deadlock that
    order, so then the executor decides. Returns the update op.
    """
    graph = tf.compat.v1.get_default_graph()
    first = len(graph.get_operations())
    grads = make_grads()
    update = shared.apply_gradients(list(zip(grads, var_list)), global_step)
    built = graph.get_operations()[first:]
    inside = set(built)

    def before(op: tf.Operation) -> typing.List[tf.Operation]:
        return [t.op for t in op.inputs] + list(op.control_inputs)

    # The ops each gradient needs, and those only it needs (safe to hold back).
    needs: typing.List[typing.Set[tf.Operation]] = []
    for grad in grads:
        found, stack = set(), [_values(grad).op]
        while stack:
            op = stack.pop()
            if op in inside and op not in found:
                found.add(op)
                stack.extend(before(op))
        needs.append(found)
    shared_ops = {op for k, a in enumerate(needs) for b in needs[k + 1 :] for op in a & b}
    own = [a - shared_ops for a in needs]
    owner = {op: k for k, ops in enumerate(own) for op in ops}
    # Which gradients' own ops each op built here depends on.
    reads: typing.Dict[tf.Operation, typing.Set[int]] = {}
    for op in built:
        found = {owner[op]} if op in owner else set()
        for dependency in before(op):
            found |= reads.get(dependency, set())
        reads[op] = found
    users = [[c for c in _values(g).consumers() if c in inside] for g in grads]
    if any(reads[user] != {k} for k, mine in enumerate(users) for user in mine):
        return update
    # Only large gradients wait: a small one is cheaper run at once.
    large = [k for k, var in enumerate(var_list) if _elements(var) >= _ONE_AT_A_TIME_FROM]
    for k, following in zip(large, large[1:]):
        waited = users[k]
        starts = [op for op in own[following] if not any(d in own[following] for d in before(op))]
        for op in starts if waited else ():
            op._add_control_inputs(waited)
    return update


# Gradients of this many elements (256 KiB of float32) or more are made one at a time.
_ONE_AT_A_TIME_FROM = 1 << 16


def _elements(var: tf.Variable) -> int:
    """The variable's element count (0 if its shape is not static)."""
    count = var.shape.num_elements()
    return 0 if count is None else count


def unfolded_zeros(shape: typing.Sequence[int], dtype: tf.DType) -> tf.Tensor:
    """Zeros of a static ``shape`` that Grappler does not fold into a constant.

    A folded constant keeps a parameter-sized copy for the session's life.
    """
    return tf.raw_ops.Empty(shape=tf.constant(shape, tf.int32), dtype=dtype, init=True)


def _check_weight(weight: tf.Tensor, dtypes: typing.Iterable[tf.DType]) -> tf.Operation:
    """An assert that ``weight`` is finite, non-negative and, if positive, normal in ``dtypes``.

    A weight that rounds to 0 or Inf in an accumulator would change the mean silently.
    """
    narrowest = min(dtypes, key=lambda d: d.size)
    low, high = float(np.finfo(narrowest.as_numpy_dtype).tiny), float(narrowest.max)
    finite = tf.math.is_finite(weight)
    in_range = tf.logical_or(tf.equal(weight, 0.0), tf.logical_and(weight >= low, weight <= high))
    what = tf.where(
        tf.math.is_nan(weight),
        "NaN",
        tf.where(
            tf.math.is_inf(weight),
            "infinite",
            tf.where(weight < 0, "negative", f"outside the range of {narrowest.name}"),
        ),
    )
    rule = tf.where(
        tf.logical_and(finite, weight > 0),
        f"a positive weight must be a normal {narrowest.name} number, in [{low:g}, {high:g}], "
        "as the accumulators are; with average=True only the weights' ratios matter: "
        "scale them all by one factor.",
        "a weight must be finite and non-negative.",
    )
    message = tf.strings.join(
        [
            "tf1_accum: a micro-batch weight is ",
            what,
            " (",
            tf.strings.as_string(weight, shortest=True),
            "): ",
            rule,
        ]
    )
    return tf.debugging.Assert(
        tf.logical_and(finite, tf.logical_and(weight >= 0, in_range)),
        [message],
        name="check_weight",
    )


def gradients(
    loss: tf.Tensor,
    optimizer: tf.compat.v1.train.Optimizer,
    var_list: typing.Sequence[tf.Variable] | None,
) -> list[tuple[Gradient, tf.Variable]]:
    """Returns ``(gradient, variable)`` pairs of ``loss``, without the None gradients.

    Check the variables first (``_validate.check_trainable``): this builds ops.
    """
    pairs = optimizer.compute_gradients(loss, var_list=var_list)
    return _validate.usable_gradients(pairs, loss)


def exclusive(
    mutex: tf.Tensor,
    scope: str,
    build: typing.Callable[[], tuple[typing.Any, typing.Any]],
    state: typing.Callable[[], typing.Iterable[tf.Variable]],
    name: str | None = None,
) -> tuple[typing.Any, typing.Any]:
    """Builds what ``build()`` makes so that its runs hold a window's mutex.

    Runs from several threads then take turns on the window. The lock is
    taken when the run starts (see :doc:`performance`) and released when
    ``done`` has run, or the run fails.

    ``build()`` returns ``(done, other)``: ``done`` a structure of ops and
    tensors finishing after everything built, returned made to finish after
    the release (each op named ``name``); ``other`` as it is. ``state()``
    gives the window's variables.
    """
    graph = tf.compat.v1.get_default_graph()
    before = {op.name for op in graph.get_operations()}
    # On the mutex's device, the window's (the placer keeps it there too).
    on_device = tf.device(mutex.device) if mutex.device else contextlib.nullcontext()
    with tf.compat.v1.name_scope(scope), on_device:
        lock = tf.raw_ops.MutexLock(mutex=mutex, name="lock")
    with tf.control_dependencies([lock]):
        done, other = build()
    finished = [t for t in tf.nest.flatten(done) if t is not None]
    created = [op for op in graph.get_operations() if op.name not in before]
    section = _section(created, finished, lock.op)
    _lock_before_state_reads(lock.op, section, state())

    def after_release(
        t: tf.Tensor | tf.Operation | None,
    ) -> tf.Tensor | tf.Operation | None:
        if t is None:
            return None
        if isinstance(t, tf.Operation):
            return tf.group(t, name=name)
        return tf.identity(t)

    with tf.compat.v1.name_scope(scope):
        on_device = tf.device(mutex.device) if mutex.device else contextlib.nullcontext()
        with tf.control_dependencies(finished), on_device:
            release = tf.raw_ops.ConsumeMutexLock(mutex_lock=lock, name="unlock")
        with tf.control_dependencies([release]):
            done = tf.nest.map_structure(after_release, done)
    return done, other


@contextlib.contextmanager
def reference_control_flow(
    variables: typing.Iterable[tf.Variable | None], references: bool = False
) -> typing.Iterator[None]:
    """Builds ``tf.cond`` and ``tf.while_loop`` as version 1 control flow if needed.

    Version 2 control flow cannot take references: with a reference variable
    among ``variables`` (or ``references=True``, for ones the body creates)
    it is off while the body builds. The switch is process-wide.
    """
    references = references or any(
        v is not None and v.dtype != v.dtype.base_dtype for v in variables
    )
    if not references or not tf.compat.v1.control_flow_v2_enabled():
        yield
        return
    tf.compat.v1.disable_control_flow_v2()
    try:
        yield
    finally:
        tf.compat.v1.enable_control_flow_v2()


def _section(
    created: typing.Sequence[tf.Operation],
    finished: typing.Sequence[tf.Tensor | tf.Operation],
    lock_op: tf.Operation,
) -> list[tf.Operation]:
    """The ops of ``created`` that running ``finished`` runs: the locked section.

    The others (a ``SyncReplicasOptimizer``'s chief queue runner, which the
    apply waits for) lose the lock as a control input, or would deadlock.
    """
    names = {op.name for op in created}
    section = _ancestors([t.op if isinstance(t, tf.Tensor) else t for t in finished], names)
    # Nor the ops making state those runs share (a SyncReplicasOptimizer's queues).
    section = {name: op for name, op in section.items() if not _makes_state(op)}
    for op in created:
        if op.name not in section and lock_op in op.control_inputs:
            kept = [c for c in op.control_inputs if c is not lock_op]
            op._remove_all_control_inputs()
            op._add_control_inputs(kept)
    section.pop(lock_op.name, None)
    return list(section.values())


def _makes_state(op: tf.Operation) -> bool:
    """Whether ``op`` creates a resource or a variable: takes no input, returns a handle."""
    return not op.inputs and any(
        t.dtype == tf.resource or t.dtype != t.dtype.base_dtype for t in op.outputs
    )


def _ancestors(
    ops: typing.Iterable[tf.Operation], names: typing.Container[str]
) -> dict[str, tf.Operation]:
    """``ops`` and what they depend on, among the ops named in ``names``, by name."""
    found: dict[str, tf.Operation] = {}
    stack = list(ops)
    while stack:
        op = stack.pop()
        if op.name in found or op.name not in names:
            continue
        found[op.name] = op
        stack += [t.op for t in op.inputs] + list(op.control_inputs)
    return found


def _lock_before_state_reads(
    lock_op: tf.Operation,
    created: typing.Iterable[tf.Operation],
    state: typing.Iterable[tf.Variable],
) -> None:
    """Makes every op of ``created`` that reads the window's state wait for the lock.

    For ops built under ``tf.control_dependencies(None)`` (a flush), which
    the lock's own control dependency does not reach.
    """
    sources = {v.op.name for v in state}
    context = lock_op._get_control_flow_context()
    for op in created:
        if op is lock_op or op._get_control_flow_context() is not context:
            continue
        if lock_op not in op.control_inputs and any(t.op.name in sources for t in op.inputs):
            op._add_control_input(lock_op)


def _worker_device(pairs: Pairs) -> str | None:
    """The gradients' device when the variables live on another job (a parameter server)."""
    for gradient, var in pairs:
        here = tf.DeviceSpec.from_string(_values(gradient).op.device or "")
        there = tf.DeviceSpec.from_string(var.device or "")
        if here.job and there.job and here.job != there.job:
            return here.to_string()
    return None


def _make_local(variables: typing.Sequence[tf.Variable]) -> None:
    """Moves ``variables`` to the local variables: each worker initializes its own, unsaved."""
    graph = variables[0].graph
    ids = {id(v) for v in variables}
    global_vars = graph.get_collection_ref(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    global_vars[:] = [v for v in global_vars if id(v) not in ids]
    for v in variables:
        graph.add_to_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES, v)


def _write_of(total: tf.Tensor) -> tf.Tensor | tf.Operation:
    """What an add's ``total`` waits on: the write itself, not a read of what it wrote.

    A read of a scattered-into resource variable copies it (an embedding table).
    """
    return getattr(total, "_parent_op", total)


def _values(gradient: Gradient) -> tf.Tensor:
    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient


def _inverse(denominator: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """1 / ``denominator`` in float64, rounded to ``dtype`` once (a multiply is cheaper)."""
    return tf.cast(tf.math.reciprocal(tf.cast(denominator, tf.float64)), dtype)


def _accumulator_dtype(dtype: tf.DType) -> tf.DType:
    """Float16 and bfloat16 sums lose precision: accumulate them in float32."""
    dtype = dtype.base_dtype
    return tf.float32 if dtype in (tf.float16, tf.bfloat16) else dtype


class _VariableAccumulator:
    """The accumulator of one variable with a dense gradient."""

    @staticmethod
    def create(gradient: Gradient, var: tf.Variable) -> _VariableAccumulator:
        if isinstance(gradient, tf.IndexedSlices):
            return _SparseAccumulator(var)
        return _VariableAccumulator(var)

    def __init__(self, var: tf.Variable) -> None:
        self.var = var
        self.shape = var.shape.as_list()
        self.dtype = _accumulator_dtype(var.dtype)
        # Never from the variable's value: no initialization order.
        with tf.compat.v1.name_scope(var.op.name + "/"):
            self.accumulator = state_variable(
                lambda: unfolded_zeros(self.shape, self.dtype), "accumulator"
            )

    def add(
        self, gradient: Gradient, weight: tf.Tensor | None = None, first: tf.Tensor | None = None
    ) -> tuple[tf.Tensor, ...]:
        """Adds ``gradient`` (times ``weight``); returns the value after the add, in a tuple.

        Where ``first`` holds (an empty window) it assigns, so no reset zeroes.
        """
        values = self._scaled(gradient, weight)
        if first is None:
            return (self.accumulator.assign_add(values, use_locking=True),)
        accumulator = self.accumulator
        with reference_control_flow([accumulator]):
            total = tf.cond(
                first,
                lambda: tf.identity(accumulator.assign(values, use_locking=True)),
                lambda: tf.identity(accumulator.assign_add(values, use_locking=True)),
                name="assign_or_add",
            )
        return (total,)

    def totals(self) -> tuple[tf.Tensor, ...]:
        """Reads what `add` returns: the accumulator's value, in a tuple."""
        return (self.accumulator.read_value(),)

    def window_sum(
        self, totals: tuple[tf.Tensor, ...] | None = None
    ) -> tuple[Gradient, tf.Tensor | None]:
        """``(sum, None)`` from `add`'s ``totals``, or read from the accumulator."""
        return (self.accumulator.read_value() if totals is None else totals[0]), None

    def finish(
        self,
        total: Gradient,
        denominator: tf.Tensor | None,
        transform: typing.Callable[[Gradient], Gradient],
    ) -> Gradient:
        """The gradient the optimizer takes: ``transform(total / denominator)``, in its dtype."""
        if denominator is not None:
            total = total * _inverse(denominator, self.dtype)
        return tf.cast(transform(total), self.var.dtype.base_dtype)

    def masked(self, totals: tuple[tf.Tensor, ...], holds: tf.Tensor) -> tuple[tf.Tensor, ...]:
        """``totals`` where the window ``holds`` a micro-batch, else zeros (even for NaN)."""
        keep = tf.cast(holds, self.dtype)
        return tuple(tf.math.multiply_no_nan(t, keep) for t in totals)

    def reset(self, rows: tf.Tensor | None = None) -> tf.Operation:
        """Nothing: the next add assigns (zeros would cost a pass and a constant)."""
        del rows
        return tf.no_op()

    def _scaled(self, values: tf.Tensor, weight: tf.Tensor | None) -> tf.Tensor:
        values = tf.cast(values, self.dtype)
        if weight is None:
            return values
        # A weight of 0 zeroes the values even where they are NaN or Inf.
        return tf.math.multiply_no_nan(values, tf.cast(weight, self.dtype))


class _SparseAccumulator(_VariableAccumulator):
    """Accumulates ``tf.IndexedSlices`` by scatter-add; ``touched`` marks the rows.

    The apply gives the optimizer those rows and the reset clears them only;
    the others are always zero.
    """

    def __init__(self, var: tf.Variable) -> None:
        super().__init__(var)
        with tf.compat.v1.name_scope(var.op.name + "/"):
            self.touched = state_variable(
                lambda: unfolded_zeros(self.shape[:1], self.dtype), "accumulator_touched"
            )

    def add(
        self, gradient: Gradient, weight: tf.Tensor | None = None, first: tf.Tensor | None = None
    ) -> tuple[tf.Tensor, ...]:
        """Scatter-adds ``gradient`` (times ``weight``); returns (accumulator, touched) after.

        Needs no ``first``: untouched rows are zero. Weight 0 marks no row.
        """
        indices = gradient.indices
        values = self._scaled(gradient.values, weight)
        marks = tf.ones_like(indices, dtype=self.dtype)
        if weight is None:
            touched = self.touched.scatter_update(
                tf.IndexedSlices(marks, indices), use_locking=True
            )
        else:
            marks = marks * tf.cast(weight > 0, self.dtype)
            touched = self.touched.scatter_max(tf.IndexedSlices(marks, indices), use_locking=True)
        return (
            self.accumulator.scatter_add(tf.IndexedSlices(values, indices), use_locking=True),
            touched,
        )

    def totals(self) -> tuple[tf.Tensor, ...]:
        return (self.accumulator.read_value(), self.touched.read_value())

    def _rows(self, touched: tf.Tensor | None = None) -> tf.Tensor:
        touched = self.touched.read_value() if touched is None else touched
        return tf.reshape(tf.where(touched > 0), [-1])

    def window_sum(
        self, totals: tuple[tf.Tensor, ...] | None = None
    ) -> tuple[Gradient, tf.Tensor | None]:
        """``(IndexedSlices of the touched rows' sums, those rows)``."""
        accumulator, touched = (self.accumulator, None) if totals is None else totals
        rows = self._rows(touched)
        dense_shape = tf.constant(self.shape, tf.int64)
        return tf.IndexedSlices(tf.gather(accumulator, rows), rows, dense_shape), rows

    def finish(
        self,
        total: Gradient,
        denominator: tf.Tensor | None,
        transform: typing.Callable[[Gradient], Gradient],
    ) -> Gradient:
        values = total.values
        if denominator is not None:
            values = values * _inverse(denominator, self.dtype)
        result = transform(tf.IndexedSlices(values, total.indices, total.dense_shape))
        dtype = self.var.dtype.base_dtype
        return tf.IndexedSlices(tf.cast(result.values, dtype), result.indices, result.dense_shape)

    def masked(self, totals: tuple[tf.Tensor, ...], holds: tf.Tensor) -> tuple[tf.Tensor, ...]:
        del holds  # untouched rows are zero, and an empty window touches none
        return totals

    def reset(self, rows: tf.Tensor | None = None) -> tf.Operation:
        rows = self._rows() if rows is None else rows
        row_shape = tf.constant(self.shape[1:], tf.int32)
        zeros = tf.zeros(tf.concat([tf.shape(rows), row_shape], 0), self.dtype)
        return tf.group(
            self.accumulator.scatter_update(tf.IndexedSlices(zeros, rows), use_locking=True),
            self.touched.scatter_update(
                tf.IndexedSlices(tf.zeros_like(rows, dtype=self.dtype), rows),
                use_locking=True,
            ),
        )
