"""One accumulation window: a counter, its slots and its parts; `Window.add`, `mean`, `apply`.

Every way in composes these, each inside `exclusive` (the window's mutex).
"""

from __future__ import annotations

import typing
import weakref

import numpy as np
from tf1_accum._compat import add_control_inputs, control_flow_context, set_control_inputs
from tf1_accum._compat import tf, without_control_inputs, write_of

from tf1_accum import _validate
from tf1_accum._locking import apply_one_at_a_time, exclusive, on_device, reference_control_flow
from tf1_accum._locking import values_of
from tf1_accum._options import Gradient, GradientTransform, Pairs, WindowMean, WindowOptions
from tf1_accum._options import transformed, transforms_of
from tf1_accum._shared_apply import SharedApply
from tf1_accum._stats import GradientStatistics, WindowStatistics, square_norms
from tf1_accum._state import Part, Weight, new_mutex, rescaled, state_variable
from tf1_accum._sync_replicas import SyncPush
from tf1_accum._wrapping import scales_loss as _scales_loss

#: Graph collection of the ``counter >= steps`` predicate of each window that
#: applies every ``steps`` micro-batches (where `check_graph` reads ``steps``).
APPLY_DUE_COLLECTION = "tf1_accum_apply_due"

Totals = typing.Tuple[tf.Tensor, ...]  # what a slot's add returns: its sum (and touched rows)


if typing.TYPE_CHECKING:  # typing.Protocol is Python 3.8's

    class Reducer(typing.Protocol):
        """Sums a window across the workers (`_distributed._WindowReducer`)."""

        def reduce(
            self, slots: typing.Sequence[typing.Any], added: Added, parts: typing.Sequence[Part]
        ) -> tuple[Added, list[tf.Operation]]: ...


class Added(typing.NamedTuple):
    """What `Window.add` built: its op, and the window's totals right after it.

    An apply in the same run reads these, not the variables: Grappler drops
    identity reads of reference variables with their control dependencies,
    so "after the add" must be a data dependency.
    """

    op: tf.Operation | None
    # Each slot's values after the add (see _VariableAccumulator); None: read the variable.
    per_slot: typing.Sequence[typing.Optional[Totals]]
    count: tf.Tensor  # the counter's increment; it waits for every other add
    parts: typing.Sequence[tuple]  # each part's sums after the add, aligned with Window.parts


class Applied(typing.NamedTuple):
    """What one apply computed; built in a conditional, ``grads_and_vars`` is None."""

    grads_and_vars: typing.Optional[list]
    op: typing.Optional[tf.Operation]
    norm: tf.Tensor  # float64 global norm before clipping (0 where nothing applied)
    applied: tf.Tensor  # bool: whether the optimizer was given the window
    statistics: typing.Optional[GradientStatistics] = None


_NOTHING_ACCUMULATED = (
    "tf1_accum: apply_op ran with nothing accumulated (counter is 0): run accum_op on a "
    "micro-batch first. No variable changed."
)


class _Weighting(Part):
    """The weight total of a weighted window: what its mean divides by.

    In one process (``relative``) the window holds every weight over a
    reference, the largest weight rounded down to a power of two: whatever
    the weights' size (1e-300 or 1e300), the accumulators and the total hold
    ratios, in [0, 2). A larger weight moves the reference, and the sums
    held so far are rescaled by a power of two (exact). The sums are the
    total, the largest weight and the least positive one. Across replicas
    the workers' sums add up, so they hold the weights themselves.
    """

    exact = True

    def __init__(self, dtypes: typing.Iterable[tf.DType], average: bool, relative: bool) -> None:
        names = ["weight_total"] + (["weight_largest", "weight_least"] if relative else [])
        super().__init__(*[state_variable(lambda: tf.constant(0.0, tf.float64), n) for n in names])
        self.narrowest = min(dtypes, key=lambda d: d.size)
        # With average=False the sum applied holds the weights themselves.
        self.absolute = not (relative and average)

    def checked(self, weight: typing.Any) -> Weight:
        """``weight`` as a `Weight`, once asserted finite, non-negative and representable.

        A weight that rounds to 0 or Inf in an accumulator would change the mean silently.
        """
        weight = tf.cast(weight, tf.float64)
        dtype = self.narrowest
        tiny, high = float(np.finfo(dtype.as_numpy_dtype).tiny), float(dtype.max)
        finite = "a weight must be finite and non-negative."
        # Each check: (whether it refuses the weight, why, the rule it breaks).
        checks: list = [
            (tf.math.is_nan(weight), "NaN", finite),
            (tf.math.is_inf(weight), "infinite", finite),
            (weight < 0, "negative", finite),
        ]
        if self.absolute:
            outside = tf.logical_and(weight > 0, tf.logical_or(weight < tiny, weight > high))
            rule = f"a positive weight must be a normal number, in [{tiny:g}, {high:g}]."
            checks.append((outside, f"outside the range of {dtype.name}", rule))
        ratio, scale = weight, None
        bounds: tuple = ()
        if self.sums[1:]:
            old_largest, old_least = (s.read_value() for s in self.sums[1:])
            largest = tf.maximum(old_largest, weight)
            lower = tf.logical_or(old_least <= 0, weight < old_least)
            least = tf.where(tf.logical_and(weight > 0, lower), weight, old_least)
            reference = _power_of_two(largest)
            scale = tf.math.divide_no_nan(_power_of_two(old_largest), reference)
            ratio = tf.math.divide_no_nan(weight, reference)
            # Each ratio must be a normal number of the accumulators (TensorFlow
            # flushes subnormal ones to 0): the least weight's over the largest decides.
            too_far = tf.logical_and(least > 0, tf.math.divide_no_nan(least, largest) < tiny)

            def ratio_rule() -> tf.Tensor:
                shown = [tf.strings.as_string(w, shortest=True) for w in (least, largest)]
                return tf.strings.join(
                    ["the least positive weight of a window (", shown[0], ") over its largest ("]
                    + [shown[1], f") must be a normal {dtype.name} number, at least {tiny:g}: "]
                    + ["keep the weights of one window within that ratio."]
                )

            checks.append((too_far, "too far from the other weights of its window", ratio_rule))
            bounds = (largest, least)
        flags, reasons, rules = zip(*checks)
        # The first flag that holds, else len(flags): the weight passes.
        case = tf.reduce_min(tf.where(tf.stack(flags), tf.range(len(flags)), len(flags)))

        def fail() -> tf.Operation:  # the message is made only for a weight refused (case < len)
            value = tf.strings.as_string(weight, shortest=True)
            rule = tf.stack([r() if callable(r) else r for r in rules])
            message = tf.strings.join(
                ["tf1_accum: a micro-batch weight is ", tf.gather(reasons, case), " (", value]
                + ["): ", tf.gather(rule, case)]
            )
            return tf.debugging.Assert(False, [message], name="check_weight")

        check = tf.cond(case >= len(flags), tf.no_op, fail, name="weight_ok")
        with tf.control_dependencies([check]):
            ratio = tf.identity(ratio, name=_CHECKED)  # update ops wait for it: see _run_after
            scale = None if scale is None else tf.identity(scale)
        # A bitcast aliases the variable it reads: the new bounds wait for the scale.
        with tf.control_dependencies([ratio] + ([] if scale is None else [scale])):
            return Weight(ratio, scale, tuple(tf.identity(b) for b in bounds))

    def increments(self, gradients: typing.Sequence[Gradient], weight: Weight) -> list:
        return [weight.ratio]  # to the total: `add` assigns the bounds

    def add(self, gradients: typing.Sequence[Gradient], weight: Weight) -> tuple:
        bounds = (s.assign(b, use_locking=True) for s, b in zip(self.sums[1:], weight.bounds))
        return (*super().add(gradients, weight), *bounds)

    def reference(self, sums: tuple) -> tf.Tensor | None:
        """The float64 weight the sums are relative to; None: they hold the weights themselves."""
        return _power_of_two(sums[1]) if len(sums) > 1 else None


def _power_of_two(weight: tf.Tensor) -> tf.Tensor:
    """The float64 ``weight`` (>= 0) rounded down to a power of two: its exponent bits, exactly.

    A subnormal weight has none: it is itself.
    """
    bits = tf.bitwise.bitwise_and(tf.bitcast(weight, tf.int64), 0x7FF0000000000000)
    power = tf.bitcast(bits, tf.float64)
    return tf.where(power > 0, power, weight)


class Window:
    """A counter, accumulators (slots) and parts, and the ops on them, in the name scope ``scope``.

    ``cross_replica``: an engine's ``_reducer()`` (a `Reducer`), or None.
    """

    def __init__(
        self,
        pairs: Pairs,
        options: WindowOptions,
        scope: str,
        cross_replica: Reducer | None = None,
        mutex: tf.Tensor | None = None,
    ) -> None:
        self.options, self.scope, self.cross_replica = options, scope, cross_replica
        # Every apply built through one optimizer (or transform) shares its state.
        self._shared_applies: dict[int, SharedApply] = {}
        self._transform_state = SharedApply(options.transform)
        # Parameter servers: the window's state stays local to the worker.
        worker = _worker_device(pairs)
        with on_device(worker):
            zero = lambda: tf.constant(0, tf.int64)  # noqa: E731
            # Another name, so a checkpoint of one kind fails to restore into the other.
            counter = "weighted_counter" if options.weighted else "counter"
            self.counter = state_variable(zero, counter)
            self.skipped = state_variable(zero, "skipped_windows")
            self.weighting: _Weighting | None = None
            if options.weighted:
                dtypes = {_accumulator_dtype(v.dtype) for _, v in pairs}
                self.weighting = _Weighting(dtypes, options.average, cross_replica is None)
            self.slots = [
                (_SparseAccumulator if isinstance(g, tf.IndexedSlices) else _VariableAccumulator)(v)
                for g, v in pairs
            ]
            self.var_list = [slot.var for slot in self.slots]
            self.accumulators = [slot.accumulator for slot in self.slots]
            self.mutex = new_mutex() if mutex is None else mutex
            self.statistics: WindowStatistics | None = None
            if options.statistics:
                self.statistics = WindowStatistics([v for _, v in pairs], options)
            parts = (self.weighting, self.statistics)
            self.parts: tuple[Part, ...] = tuple(part for part in parts if part is not None)
        if worker:
            _make_local(self._state())

    def _state(self) -> list[tf.Variable]:
        holders: list[Part | _VariableAccumulator] = [*self.parts, *self.slots]
        return [self.counter, self.skipped] + [v for holder in holders for v in holder.state()]

    def exclusive(
        self, build: typing.Callable[[], tuple[typing.Any, typing.Any]], name: str | None = None
    ) -> tuple[typing.Any, typing.Any]:
        """`exclusive` with the window's mutex and state."""
        return exclusive(self.mutex, self.scope, build, self._state, name)

    def control_flow(self, global_step: tf.Variable | None = None) -> typing.ContextManager[None]:
        """`reference_control_flow` for the trained variables, the state and ``global_step``."""
        return reference_control_flow(self.var_list + self._state() + [global_step])

    def add(
        self,
        gradients: typing.Sequence[Gradient],
        weight: tf.Tensor | None = None,
        run_with: typing.Sequence[tf.Operation | tf.Tensor] = (),
    ) -> Added:
        """Adds one micro-batch's gradients (aligned with ``var_list``), times ``weight``.

        Weight 0 adds nothing, even a NaN, but is counted; ``run_with`` runs
        before every stateful op, after the weight's check. Returns an `Added`.
        """
        if self.weighting is not None:
            # Checked first, free of the caller's dependencies (a lock): the
            # update ops wait for it, so a refused micro-batch moves nothing.
            with tf.compat.v1.name_scope(self.scope), without_control_inputs():
                weight = self.weighting.checked(weight)
            _run_after(run_with, weight.ratio)
        with tf.compat.v1.name_scope(self.scope), tf.control_dependencies(run_with):
            sums = tuple(part.add(gradients, weight) for part in self.parts)
            # The window's first add assigns: no reset pass, no zeros (see _VariableAccumulator).
            first = tf.equal(self.counter.read_value(), 0, name="first")
            totals = [slot.add(g, weight, first) for slot, g in zip(self.slots, gradients)]
            # What the count waits on: each write, not a read of what it wrote (a
            # read of a scattered-into resource variable copies an embedding table).
            stateful = [write_of(t) for each in (*sums, *totals) for t in each]
            with tf.control_dependencies(stateful):
                count = self.counter.assign_add(1, use_locking=True)
            return Added(op=tf.group(count), per_slot=totals, count=count, parts=sums)

    def reset(self, rows: list | None = None) -> tf.Operation:
        """Empties the window (a dense accumulator keeps its values: the next add assigns).

        ``rows``: each slot's rows to clear, as `mean` gives them (None: read them).
        """
        with tf.compat.v1.name_scope(self.scope):
            zero = self.counter.assign(tf.constant(0, tf.int64), use_locking=True, read_value=False)
            return tf.group(
                *[slot.reset(r) for slot, r in zip(self.slots, rows or [None] * len(self.slots))],
                zero,
                *[op for part in self.parts for op in part.reset()],
            )

    def mean(self, after: Added | None = None, nonempty: bool = False) -> tuple:
        """The window's mean (sum with ``average=False``), norm and statistics, for one apply.

        ``after``: an `Added` of the same run, read instead of the variables.
        ``nonempty``: the caller's predicate implies a micro-batch (no check).
        Returns ``(gradients, norm, statistics, observed, rows)``: ``gradients()``
        builds the gradients (aligned with ``var_list``), ``norm`` is the float64
        global norm before clipping, ``statistics`` a `GradientStatistics` or
        None, ``observed`` the statistics' updates (the reset waits for them),
        ``rows`` each slot's rows the reset clears (None: a dense slot).
        """
        with tf.compat.v1.name_scope(self.scope):
            totals = after or Added(
                None, [None] * len(self.slots), self.counter, [p.sums for p in self.parts]
            )
            # Values, not references.
            sums = [tuple(tf.identity(s) for s in part) for part in totals.parts]
            totals = totals._replace(count=tf.identity(totals.count), parts=sums)
            if self.cross_replica is not None:
                totals, checks = self.cross_replica.reduce(self.slots, totals, self.parts)
            elif after is not None or nonempty:
                # After an add, the mean waits for its count (which waits for every add).
                checks = [totals.count]
            else:
                nonempty_check = tf.debugging.Assert(
                    totals.count > 0, [_NOTHING_ACCUMULATED], name="nothing_accumulated"
                )
                checks = [nonempty_check]
            # Weighted, the mean divides by the weight total, and the sums are
            # relative to a reference weight (None: to 1).
            total, reference, count = totals.count, None, totals.count
            if self.weighting is not None:
                total, reference = totals.parts[0][0], self.weighting.reference(totals.parts[0])
            # Weights summing to 0 give a NaN mean: skipped as non-finite.
            with tf.control_dependencies(checks):
                total = tf.cast(total, tf.float64)
                # What the sums are multiplied by: 1 / total, or the reference, or nothing.
                factor = tf.math.reciprocal(total) if self.options.average else reference
                # Each variable's mean is made only where the optimizer takes it.
                window_sums = [slot.window_sum(t) for slot, t in zip(self.slots, totals.per_slot)]
                squares = square_norms([values_of(s) for s, _ in window_sums])
                if self.options.average:
                    squares = [q / tf.square(total) for q in squares]
                norm = tf.sqrt(tf.add_n(squares))
                if not self.options.average and reference is not None:
                    norm *= reference
                norm = tf.identity(norm, name="global_norm")
                statistics: GradientStatistics | None = None
                observed: list[tf.Operation] = []
                if self.statistics is not None:  # the last part
                    unit = 1.0 if reference is None else reference
                    statistics, observed = self.statistics.observe(
                        totals.parts[-1], squares, count, total, unit
                    )
                window = WindowMean(norm, count)
        transforms = transforms_of(self.options)  # one clip_by_global_norm for every variable

        def grads() -> list[Gradient]:
            with tf.compat.v1.name_scope(self.scope):
                return [
                    slot.finish(s, factor, window, transforms)
                    for slot, (s, _) in zip(self.slots, window_sums)
                ]

        return grads, norm, statistics, observed, [rows for _, rows in window_sums]

    def apply(
        self,
        optimizer: tf.compat.v1.train.Optimizer,
        global_step: tf.Variable | None = None,
        *,
        after: Added | None = None,
        when: tf.Tensor | None = None,
        otherwise: typing.Callable[[], list] | None = None,
    ) -> Applied:
        """Applies the window's `mean` through ``optimizer``, then resets the window.

        ``after``: as in `mean`. ``when``: a bool tensor implying a micro-batch:
        apply inside a ``tf.cond`` where it holds (``otherwise()`` returns the
        other branch's ops). Returns an `Applied` (``applied`` False where
        skipped or not applied).
        """
        if when is None:
            return self._apply(optimizer, global_step, after)

        def apply() -> tuple[tf.Tensor, ...]:
            result = self._apply(optimizer, global_step, after, nonempty=True)
            outcome = [result.applied, result.norm] + tf.nest.flatten(result.statistics or ())
            with tf.control_dependencies([result.op]):
                return tuple(tf.identity(t) for t in outcome)

        def idle() -> tuple[tf.Tensor, ...]:
            with tf.control_dependencies(otherwise() if otherwise else []):
                statistics = () if self.statistics is None else self.statistics.idle()
                outcome = (tf.constant(False), tf.constant(0.0, tf.float64))
                return outcome + tuple(tf.nest.flatten(statistics))

        applied, norm, *rest = _cond(self.scope, when, apply, idle, "apply_when")
        statistics = None if self.statistics is None else self.statistics.pack(rest)
        with tf.compat.v1.name_scope(self.scope):
            return Applied(None, tf.group(applied), norm, applied, statistics)

    def _apply(
        self,
        optimizer: tf.compat.v1.train.Optimizer,
        global_step: tf.Variable | None,
        after: Added | None,
        nonempty: bool = False,
    ) -> Applied:
        """`apply` without a condition: the mean, the optimizer's update, the reset."""
        make_grads, norm, statistics, observed, rows = self.mean(after, nonempty)
        finite = tf.math.is_finite(norm)
        if self.options.transform is None:
            # Made where the optimizer takes each; these, for a user to fetch, are equal.
            grads = make_grads()
        else:
            # Made once, before the apply, for the non-finite check (a parameter copy).
            with tf.compat.v1.name_scope(self.scope):
                grads = self._transform_state.build(make_grads)
                squares = square_norms([values_of(g) for g in grads])
                finite = tf.logical_and(finite, tf.math.is_finite(tf.add_n(squares)))
            make_grads = lambda: grads  # noqa: E731
        # In the caller's name scope: Adam's beta powers get minimize()'s names.
        with tf.control_dependencies([] if after is None else [after.count]):
            update, applied = self._apply_if_finite(optimizer, make_grads, global_step, finite)
        with tf.control_dependencies([update] + observed):
            reset = self.reset(rows=rows)
        with tf.compat.v1.name_scope(self.scope):
            op = tf.group(update, reset)
        return Applied(list(zip(grads, self.var_list)), op, norm, applied, statistics)

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
        shared = self._shared_applies.setdefault(id(optimizer), SharedApply(optimizer))

        def update() -> tf.Operation:
            return apply_one_at_a_time(shared, make_grads, self.var_list, global_step)

        count_skip = lambda: self.skipped.assign_add(  # noqa: E731
            tf.cast(tf.logical_not(finite), tf.int64), use_locking=True, read_value=False
        )
        if (
            not self.options.skip_nonfinite
            or _scales_loss(optimizer)
            or isinstance(optimizer, (tf.compat.v1.train.SyncReplicasOptimizer, SyncPush))
        ):
            op = tf.group(update(), count_skip())
            # A dynamic loss scale applies exactly the finite windows.
            applied = finite if self.options.skip_nonfinite and _scales_loss(optimizer) else True
            with tf.control_dependencies([op]):
                return op, tf.identity(applied)

        def apply() -> tf.Tensor:
            with tf.control_dependencies([update()]):
                return tf.constant(True)

        def skip() -> tf.Tensor:
            with tf.control_dependencies([count_skip()]):
                return tf.constant(False)

        applied = _cond(self.scope, finite, apply, skip, "apply_if_finite")
        return applied.op, applied


_Branch = typing.Callable[[], typing.Any]  # builds a branch of a conditional


def _cond(scope: str, pred: tf.Tensor, apply: _Branch, otherwise: _Branch, name: str) -> typing.Any:
    """``tf.cond`` in the name scope ``scope``, ``apply`` in the caller's (for Adam's names)."""
    caller = tf.compat.v1.get_default_graph().get_name_scope()

    def in_caller_scope() -> typing.Any:
        # The branch's graph: a function graph in cond_v2.
        with tf.compat.v1.get_default_graph().name_scope(caller + "/" if caller else ""):
            return apply()

    with tf.compat.v1.name_scope(scope):
        return tf.cond(pred, in_caller_scope, otherwise, name=name)


def gradients(
    loss: tf.Tensor,
    optimizer: tf.compat.v1.train.Optimizer,
    var_list: typing.Sequence[tf.Variable] | None,
) -> list[tuple[Gradient, tf.Variable]]:
    """Returns ``(gradient, variable)`` pairs of ``loss``, without the None gradients.

    Check the variables first (``_validate.check_trainable``): this builds ops.
    """
    return _validate.usable_gradients(optimizer.compute_gradients(loss, var_list=var_list), loss)


def _worker_device(pairs: Pairs) -> str | None:
    """The gradients' device when the variables live on another job (a parameter server)."""
    for gradient, var in pairs:
        here = tf.DeviceSpec.from_string(values_of(gradient).op.device or "")
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
    graph.get_collection_ref(tf.compat.v1.GraphKeys.LOCAL_VARIABLES).extend(variables)


# The name of a window's checked weight, and per graph the names of the update
# ops two weighted windows share, which wait for neither's check.
_CHECKED = "checked_weight"
_SHARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _run_after(ops: typing.Sequence[tf.Operation | tf.Tensor], checked: tf.Tensor) -> None:
    """Makes ``ops`` (update ops) wait for ``checked`` (a checked weight) where they can.

    Not those of another graph or version 1 ``tf.cond`` / ``tf.while_loop``
    than the check's, which cannot wait for it. Nor an update op another
    weighted window runs too: each window runs with its own feeds, so such a
    shared op waits for no window's check (the other's is taken off) and is
    not held back on a refused micro-batch.
    """
    scope = checked.op.name.rpartition("/")[0]
    shared = _SHARED.setdefault(checked.graph, set())
    for op in dict.fromkeys(getattr(item, "op", item) for item in ops):
        same_context = control_flow_context(op) is control_flow_context(checked.op)
        if op.graph is not checked.graph or not same_context or checked.op in op.control_inputs:
            continue
        names = [c.name.rpartition("/") for c in op.control_inputs]
        if op.name in shared or any(n[2].startswith(_CHECKED) and n[0] != scope for n in names):
            shared.add(op.name)
            kept = [c for c, n in zip(op.control_inputs, names) if not n[2].startswith(_CHECKED)]
            set_control_inputs(op, kept)
        else:
            add_control_inputs(op, [checked.op])


def _map_values(function: typing.Callable[[tf.Tensor], tf.Tensor], gradient: Gradient) -> Gradient:
    """``function`` of a dense gradient, or of an ``IndexedSlices``' values."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(function(gradient.values), gradient.indices, gradient.dense_shape)
    return function(gradient)


def _accumulator_dtype(dtype: tf.DType) -> tf.DType:
    """Float16 and bfloat16 sums lose precision: accumulate them in float32."""
    dtype = dtype.base_dtype
    return tf.float32 if dtype in (tf.float16, tf.bfloat16) else dtype


class _VariableAccumulator:
    """The accumulator of one variable with a dense gradient."""

    def __init__(self, var: tf.Variable) -> None:
        self.var = var
        self.shape = var.shape.as_list()
        self.dtype = _accumulator_dtype(var.dtype)
        self.accumulator = self._zeros(self.shape, "accumulator")

    def _zeros(self, shape: typing.Sequence[int], name: str) -> tf.Variable:
        """A state variable of zeros of a static ``shape``, beside the variable ``var``.

        Never from the variable's value: no initialization order. Zeros that
        Grappler does not fold into a constant, which would keep a
        parameter-sized copy for the session's life.
        """

        def zeros() -> tf.Tensor:
            return tf.raw_ops.Empty(shape=tf.constant(shape, tf.int32), dtype=self.dtype, init=True)

        with tf.compat.v1.name_scope(self.var.op.name + "/"):
            return state_variable(zeros, name)

    def add(self, gradient: Gradient, weight: Weight | None, first: tf.Tensor) -> Totals:
        """Adds ``gradient`` (times ``weight``); returns the value after the add, in a tuple.

        Where ``first`` holds (an empty window) it assigns, so no reset zeroes;
        where the weight's ``scale`` is not 1 it assigns the rescaled sum plus
        the values (scale 0: the window's first positive weight).
        """
        values = self._scaled(gradient, weight)
        scale = None if weight is None else weight.scale

        def assign() -> tf.Tensor:
            start = values if scale is None else rescaled(self.accumulator, scale) + values
            return tf.identity(self.accumulator.assign(start, use_locking=True))

        def add() -> tf.Tensor:
            return tf.identity(self.accumulator.assign_add(values, use_locking=True))

        restart = first if scale is None else tf.not_equal(scale, 1.0)
        with reference_control_flow([self.accumulator]):
            return (tf.cond(restart, assign, add, name="assign_or_add"),)

    def state(self) -> list[tf.Variable]:
        return [self.accumulator]

    def totals(self) -> Totals:
        """Reads what `add` returns: the value of each of `state`, in a tuple."""
        return tuple(v.read_value() for v in self.state())

    def window_sum(self, totals: Totals | None = None) -> tuple[Gradient, tf.Tensor | None]:
        """``(sum, None)`` from `add`'s ``totals``, or read from the accumulator."""
        return (self.accumulator.read_value() if totals is None else totals[0]), None

    def finish(
        self,
        total: Gradient,
        factor: tf.Tensor | None,
        window: WindowMean,
        transforms: typing.Sequence[GradientTransform],
    ) -> Gradient:
        """The gradient the optimizer takes: ``total * factor``, transformed, in its dtype."""
        if factor is not None:
            # Rounded to the dtype once (a multiply is cheaper than a divide).
            factor = tf.cast(factor, self.dtype)
            total = _map_values(lambda values: values * factor, total)
        total = transformed(total, variable=self.var, window=window, transforms=transforms)
        return tf.cast(total, self.var.dtype.base_dtype)  # an IndexedSlices' values too

    def masked(self, totals: Totals, holds: tf.Tensor) -> Totals:
        """``totals`` where the window ``holds`` a micro-batch, else zeros (even for NaN)."""
        keep = tf.cast(holds, self.dtype)
        return tuple(tf.math.multiply_no_nan(t, keep) for t in totals)

    def reset(self, rows: tf.Tensor | None = None) -> tf.Operation:
        """Nothing: the next add assigns (zeros would cost a pass and a constant)."""
        del rows
        return tf.no_op()

    def _scaled(self, values: tf.Tensor, weight: Weight | None) -> tf.Tensor:
        values = tf.cast(values, self.dtype)
        if weight is None:
            return values
        # A weight of 0 zeroes the values even where they are NaN or Inf.
        return tf.math.multiply_no_nan(values, tf.cast(weight.ratio, self.dtype))


class _SparseAccumulator(_VariableAccumulator):
    """Accumulates ``tf.IndexedSlices`` by scatter-add; ``touched`` marks the rows.

    The apply gives the optimizer those rows and the reset clears them only;
    the others are always zero.
    """

    def __init__(self, var: tf.Variable) -> None:
        super().__init__(var)
        self.touched = self._zeros(self.shape[:1], "accumulator_touched")

    def add(self, gradient: Gradient, weight: Weight | None, first: tf.Tensor) -> Totals:
        """Scatter-adds ``gradient`` (times ``weight``); returns (accumulator, touched) after.

        Needs no ``first``: untouched rows are zero. Weight 0 marks no row. A
        new reference weight rescales the table (scale 0 need not: all zero).
        """
        indices = gradient.indices
        values = self._scaled(gradient.values, weight)
        marks = tf.ones_like(indices, dtype=self.dtype)
        scale = None if weight is None else weight.scale
        rescale: list = []
        if scale is not None:

            def rescale_sums() -> tf.Operation:
                sums = rescaled(self.accumulator, scale)
                return self.accumulator.assign(sums, use_locking=True, read_value=False)

            downscaled = tf.logical_and(scale > 0, scale < 1)
            with reference_control_flow([self.accumulator]):
                rescale.append(tf.cond(downscaled, rescale_sums, tf.no_op, name="rescale"))
        mark = self.touched.scatter_update
        if weight is not None:  # weight 0 marks no row, nor unmarks one
            marks = marks * tf.cast(weight.ratio > 0, self.dtype)
            mark = self.touched.scatter_max
        touched = mark(tf.IndexedSlices(marks, indices), use_locking=True)
        with tf.control_dependencies(rescale):
            added = self.accumulator.scatter_add(
                tf.IndexedSlices(values, indices), use_locking=True
            )
        return (added, touched)

    def state(self) -> list[tf.Variable]:
        return [self.accumulator, self.touched]

    def _rows(self, touched: tf.Tensor | None = None) -> tf.Tensor:
        touched = self.touched.read_value() if touched is None else touched
        return tf.reshape(tf.where(touched > 0), [-1])

    def window_sum(self, totals: Totals | None = None) -> tuple[Gradient, tf.Tensor | None]:
        """``(IndexedSlices of the touched rows' sums, those rows)``."""
        accumulator, touched = (self.accumulator, None) if totals is None else totals
        rows = self._rows(touched)
        dense_shape = tf.constant(self.shape, tf.int64)
        return tf.IndexedSlices(tf.gather(accumulator, rows), rows, dense_shape), rows

    def masked(self, totals: Totals, holds: tf.Tensor) -> Totals:
        del holds  # untouched rows are zero, and an empty window touches none
        return totals

    def reset(self, rows: tf.Tensor | None = None) -> tf.Operation:
        rows = self._rows() if rows is None else rows
        row_shape = tf.constant(self.shape[1:], tf.int32)
        zeros = tf.zeros(tf.concat([tf.shape(rows), row_shape], 0), self.dtype)
        return tf.group(
            self.accumulator.scatter_update(tf.IndexedSlices(zeros, rows), use_locking=True),
            self.touched.scatter_update(
                tf.IndexedSlices(tf.zeros_like(rows, dtype=self.dtype), rows), use_locking=True
            ),
        )
