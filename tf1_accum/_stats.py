"""Gradient statistics of a window: norms, the gradient noise scale, running averages.

The estimators are McCandlish et al. (2018)'s, described in docs/statistics.rst;
each micro-batch adds one float64 scalar to the window.
"""

from __future__ import annotations

import math
import numbers
import typing

import numpy as np
from tf1_accum._compat import tf

from tf1_accum import _validate
from tf1_accum._options import WindowOptions
from tf1_accum._state import Part, Weight, state_variable

# Decay of the moving averages across windows: about the last ten windows count.
EMA_DECAY = 0.9


def at_least_float32(values: tf.Tensor) -> tf.Tensor:
    """``values``, cast to float32 if their dtype is narrower (float16, bfloat16)."""
    return tf.cast(values, tf.float32) if values.dtype.base_dtype.size < 4 else values


def square_norms(values: typing.Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """The float64 squared L2 norm of each of ``values`` (a sparse gradient's rows once each).

    One pass in each tensor's dtype (float32 at least), with no squared or
    float64 copy (2 x ``l2_loss`` is exact); taken again in float64 only if
    that overflows to Inf.
    """

    def squares(widen: typing.Callable[[tf.Tensor], tf.Tensor]) -> list[tf.Tensor]:
        return [tf.cast(2 * tf.nn.l2_loss(widen(v)), tf.float64) for v in values]

    fast = squares(at_least_float32)
    if all(v.dtype.base_dtype == tf.float64 for v in values):
        return fast
    # A list, even of one: TensorFlow 2's cond (1.15's compat.v2 too) keeps the branches' structure.
    return tf.cond(
        tf.math.is_inf(tf.add_n(fast)),
        lambda: squares(lambda v: tf.cast(v, tf.float64)),
        lambda: [tf.identity(q) for q in fast],
        name="square_norms",
    )


def _rows_summed(gradient: tf.Tensor | tf.IndexedSlices) -> tf.Tensor:
    """``gradient``; if sparse, its values with repeated rows summed (in float32 at least).

    The squared norm of the dense gradient is that of these rows.
    """
    if not isinstance(gradient, tf.IndexedSlices):
        return gradient
    rows, position = tf.unique(gradient.indices)
    return tf.math.unsorted_segment_sum(at_least_float32(gradient.values), position, tf.size(rows))


class GradientStatistics(typing.NamedTuple):
    """Statistics of one window, from a way in built with ``statistics=True``.

    Fetch them in the same ``session.run`` as the op that applies (after it
    the window is reset). :doc:`statistics` defines each field: means
    whatever ``average`` says, norms before any clipping, ``micro_batches``
    int64 (with ``weight``, those of positive weight), ``summary_op`` a
    string, the rest float64.
    """

    global_norm: tf.Tensor
    variable_norms: typing.List[tf.Tensor]
    micro_batch_square_norm: tf.Tensor
    micro_batch_size: tf.Tensor
    micro_batches: tf.Tensor
    gradient_square: tf.Tensor
    noise_trace: tf.Tensor
    noise_scale: tf.Tensor
    noise_scale_ema: tf.Tensor
    summary_op: tf.Tensor


class WindowStatistics(Part):
    """The window's part behind `GradientStatistics`: its sums and moving averages.

    Per micro-batch it adds the squared norm (times the weight) and, weighted,
    whether the weight is positive.
    """

    def __init__(self, variables: typing.Iterable[tf.Variable], options: WindowOptions) -> None:
        self.variables = list(variables)
        # Its micro_batch_size None: the statistics take the window's mean weight.
        self.options = options
        zero = lambda: tf.constant(0.0, tf.float64)  # noqa: E731
        sums = [state_variable(zero, "micro_batch_square_norms")]
        if options.weighted:
            # The statistics count micro-batches of positive weight only.
            sums.append(state_variable(lambda: tf.constant(0, tf.int64), "micro_batches_weighted"))
        super().__init__(*sums)
        # The moving averages of the noise trace and of the gradient square.
        self.emas = [state_variable(zero, n) for n in ("noise_trace_ema", "gradient_square_ema")]

    def state(self) -> list[tf.Variable]:
        return [*self.sums, *self.emas]

    def increments(
        self, gradients: typing.Sequence[tf.Tensor | tf.IndexedSlices], weight: Weight | None
    ) -> list[tf.Tensor]:
        # The float64 squared global norm of the micro-batch's gradients.
        square = tf.add_n(square_norms([_rows_summed(g) for g in gradients]))
        if weight is None:
            return [square]
        return [tf.math.multiply_no_nan(square, weight.ratio), tf.cast(weight.ratio > 0, tf.int64)]

    def observe(
        self,
        sums: tuple[tf.Tensor, ...],
        squares: typing.Sequence[tf.Tensor],
        count: tf.Tensor,
        total: tf.Tensor,
        reference: tf.Tensor | float = 1.0,
    ) -> tuple[GradientStatistics, list[tf.Operation]]:
        """Builds the statistics of the window being applied.

        ``sums`` are this part's sums; ``squares`` each variable's float64
        squared window norm (mean or sum, before clipping); ``total`` what
        the mean divides by (``count``, or the weight total, over ``reference``,
        the weight the weighted sums are relative to). Returns the
        `GradientStatistics` and the moving averages' updates, which the
        reset must wait for.
        """
        with tf.compat.v1.name_scope("statistics"):
            # The tensors in a scope of their own: the summaries take their names.
            with tf.compat.v1.name_scope("values"):
                n = tf.cast(sums[1] if self.options.weighted else count, tf.float64)
                total = tf.cast(total, tf.float64)
                if not self.options.average:  # the sum: the mean's squares are 1 / total^2 of it
                    squares = [s / tf.square(total) for s in squares]
                variable_norms = [tf.sqrt(s) for s in squares]
                big = tf.add_n(squares, name="gradient_square_norm")
                small = tf.identity(tf.cast(sums[0], tf.float64) / total, name="micro_batch")
                if self.options.micro_batch_size is None:
                    b_small = tf.identity(total / n * reference, name="micro_batch_size")
                else:  # a constant, not its identity: run_accumulation reads it statically
                    size = float(self.options.micro_batch_size)
                    b_small = tf.constant(size, tf.float64, name="micro_batch_size")
                b_big = n * b_small
                several = n > 1.0
                nan = tf.constant(np.nan, tf.float64)
                # Where N = 1 the denominators are 0: no estimate, NaN rather than Inf.
                square = tf.math.divide_no_nan(b_big * big - b_small * small, b_big - b_small)
                gradient_square = tf.where(several, square, nan, name="gradient_square")
                trace = tf.math.divide_no_nan(small - big, 1.0 / b_small - 1.0 / b_big)
                noise_trace = tf.where(several, trace, nan, name="noise_trace")
                noise_scale = tf.identity(noise_trace / gradient_square, name="noise_scale")

                valid = tf.math.is_finite(noise_trace) & tf.math.is_finite(gradient_square)
                moved, updates = [], []
                for average, value in zip(self.emas, [noise_trace, gradient_square]):
                    updated = EMA_DECAY * average + (1.0 - EMA_DECAY) * tf.where(valid, value, 0.0)
                    moved.append(tf.where(valid, updated, average.read_value()))
                    updates.append(average.assign(moved[-1], use_locking=True, read_value=False))
                noise_scale_ema = tf.math.divide(*moved, name="noise_scale_ema")
                global_norm = tf.sqrt(big, name="global_norm")
            fields = dict(
                global_norm=global_norm,
                variable_norms=variable_norms,
                micro_batch_square_norm=small,
                micro_batch_size=b_small,
                # From n, which the averages' updates wait for: a read of the
                # counter itself could come after the reset.
                micro_batches=tf.cast(n, tf.int64, name="micro_batches"),
                gradient_square=gradient_square,
                noise_trace=noise_trace,
                noise_scale=noise_scale,
                noise_scale_ema=noise_scale_ema,
            )
            # A summary of each scalar field, in the fields' order, then of each variable's norm.
            unsummarized = ("variable_norms", "micro_batches")
            named = [(k, v) for k, v in fields.items() if k not in unsummarized]
            named += zip([f"gradient_norm/{v.op.name}" for v in self.variables], variable_norms)
            summaries = [tf.compat.v1.summary.scalar(k, v, collections=[]) for k, v in named]
            summary_op = tf.compat.v1.summary.merge(summaries, collections=[])
            return GradientStatistics(**fields, summary_op=summary_op), updates

    def idle(self) -> GradientStatistics:
        """The statistics of a run that applies nothing: NaN, 0 micro-batches, an empty summary."""
        nan = lambda: tf.constant(np.nan, tf.float64)  # noqa: E731
        special = dict(
            variable_norms=[nan() for _ in self.variables],
            micro_batches=tf.constant(0, tf.int64),
            summary_op=tf.constant(b""),
        )
        fields = GradientStatistics._fields
        return GradientStatistics(**{f: special[f] if f in special else nan() for f in fields})

    def pack(self, flat: typing.Iterable[tf.Tensor]) -> GradientStatistics:
        """`GradientStatistics` from the flat outputs of a conditional (``tf.nest`` order)."""
        fields: dict[str, typing.Any] = dict.fromkeys(GradientStatistics._fields, 0)
        fields["variable_norms"] = [0] * len(self.variables)
        return tf.nest.pack_sequence_as(GradientStatistics(**fields), list(flat))


def recommend_micro_batches(noise_scale: float, micro_batch_size: float) -> int:
    """Returns how many micro-batches make the window's batch reach the noise scale.

    The smallest N with N x ``micro_batch_size`` >= ``noise_scale``, at least
    1 (see :doc:`statistics`). Feed it ``noise_scale_ema``.

    >>> tf1_accum.recommend_micro_batches(1000.0, 64)
    16

    Args:
        noise_scale: The estimated noise scale, in examples: a finite number
            of at least 0.
        micro_batch_size: Examples per micro-batch: a positive number.

    Returns:
        An int of at least 1.

    Raises:
        TypeError: If an argument is not a number.
        ValueError: If ``noise_scale`` is NaN, infinite or negative (no usable
            estimate yet: accumulate more windows), or ``micro_batch_size`` is
            not positive.
    """
    for name, value in (("noise_scale", noise_scale), ("micro_batch_size", micro_batch_size)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a number, got {_validate.describe(value)}.")
    if not (math.isfinite(noise_scale) and noise_scale >= 0):
        raise ValueError(
            f"noise_scale must be a finite number of at least 0, got {noise_scale}: no usable "
            "estimate yet; pass noise_scale_ema after more windows (docs: statistics)."
        )
    if not (math.isfinite(micro_batch_size) and micro_batch_size > 0):
        raise ValueError(f"micro_batch_size must be a positive number, got {micro_batch_size}.")
    return max(1, math.ceil(float(noise_scale) / float(micro_batch_size)))


def log_recommendation(noise_scale: float, noise_scale_ema: float, micro_batch_size: float) -> None:
    """Logs a window's noise scale and the recommendation (tf.compat.v1.logging.info)."""
    args: tuple[float, ...]
    try:
        n = recommend_micro_batches(float(noise_scale_ema), float(micro_batch_size))
    except ValueError:
        message, args = ": no estimate yet (this window: %s).", (noise_scale,)
    else:
        message = (
            " %.4g (moving average; this window %.4g): recommend %d micro-batches of %g examples."
        )
        args = (noise_scale_ema, noise_scale, n, micro_batch_size)
    tf.compat.v1.logging.info("tf1_accum: gradient noise scale" + message, *args)


class RunningAverage(typing.NamedTuple):
    """A running average that resets, from `build_running_average`.

    Attributes:
        update_op: Adds the current ``values`` to the average (and first
            starts a new one, when ``horizon`` updates have been averaged).
        averages: Tensors reading the averages, aligned with ``values``; in
            the dtypes of ``values``.
        count: ``int64`` variable: the updates the averages cover.
        reset_op: Starts a new average: the next update's values become it.
    """

    update_op: tf.Operation
    averages: typing.List[tf.Tensor]
    count: tf.Variable
    reset_op: tf.Operation


def build_running_average(
    values: tf.Tensor | typing.Sequence[tf.Tensor],
    horizon: int | None = None,
    name: str | None = None,
) -> RunningAverage:
    """Builds a running average of ``values`` over a window or a horizon.

    Unlike one keyed on the global step, it starts again at every ``reset_op``
    or after every ``horizon`` updates (see :doc:`statistics`).

    Example:

    >>> with tf.Graph().as_default():
    ...     g = tf.compat.v1.placeholder(tf.float64, [])
    ...     avg = tf1_accum.build_running_average([g], horizon=2)
    ...     with tf.compat.v1.Session() as sess:
    ...         sess.run(tf.compat.v1.global_variables_initializer())
    ...         for value in (1.0, 3.0, 10.0):
    ...             _ = sess.run(avg.update_op, {g: value})
    ...             print(float(sess.run(avg.averages[0])), int(sess.run(avg.count)))
    1.0 1
    2.0 2
    10.0 1

    Args:
        values: A floating-point tensor, or a list of them (gradients, say;
            a ``tf.IndexedSlices`` is averaged as its dense value), each of
            fully defined shape.
        horizon: None (the default) to average until ``reset_op`` runs, or
            an int of at least 1: after that many updates, the next update
            starts a new average.
        name: Name scope for the ops; defaults to ``"running_average"``.

    Returns:
        A `RunningAverage`.

    Raises:
        RuntimeError: If eager execution is active.
        TypeError: If a value is not a floating-point tensor, or ``horizon``
            is not an int.
        ValueError: If ``values`` is empty, a value's shape is not fully
            defined, or ``horizon`` is less than 1.
    """
    _validate.check_graph_mode("build_running_average")
    values = [values] if isinstance(values, (tf.Tensor, tf.IndexedSlices)) else values
    if not isinstance(values, (list, tuple)):
        raise _validate.type_error("values", values, "a tensor or a list of tensors")
    if not values:
        raise ValueError("values is empty: expected at least one floating-point tensor.")
    shapes = []
    for i, value in enumerate(values):
        if not isinstance(value, (tf.Tensor, tf.IndexedSlices)) or not hasattr(value, "graph"):
            raise _validate.type_error(f"values[{i}]", value, "a floating-point tensor of a graph")
        if not value.dtype.base_dtype.is_floating:
            raise TypeError(
                f"values[{i}] must be a floating-point tensor, got {value.name} of dtype "
                f"{value.dtype.base_dtype.name}."
            )
        if isinstance(value, tf.IndexedSlices):  # whose ``shape`` TensorFlow 1.15 lacks
            shape = tf.TensorShape(tf.get_static_value(value.dense_shape))
        else:
            shape = value.shape
        if not shape.is_fully_defined():
            raise ValueError(
                f"values[{i}] ({value.name}) has shape {shape}, which is not fully "
                "defined; the average needs a static shape for its variable."
            )
        shapes.append(shape)
    if horizon is not None:
        if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)):
            raise _validate.type_error("horizon", horizon, "an int (updates per average) or None")
        if horizon < 1:
            raise ValueError(f"horizon must be at least 1 (updates per average), got {horizon}.")
    graph = values[0].graph
    with graph.as_default(), tf.compat.v1.name_scope(name, "running_average", values=values):
        count = state_variable(lambda: tf.constant(0, tf.int64), "count")
        dense = [tf.reshape(tf.convert_to_tensor(v), shape) for v, shape in zip(values, shapes)]
        averages = [
            state_variable(lambda v=v: tf.zeros(v.shape, v.dtype.base_dtype), "average")
            for v in dense
        ]
        old = tf.identity(count.read_value())
        restart = tf.equal(old, 0)
        if horizon is not None:
            restart = tf.logical_or(restart, old >= horizon)
        n = tf.where(restart, tf.constant(1, tf.int64), old + 1)
        updates = [count.assign(n, use_locking=True, read_value=False)]
        for average, value in zip(averages, dense):
            step = tf.cast(n, value.dtype.base_dtype)
            moved = average.read_value() + (value - average.read_value()) / step
            # A new average is the value itself, not 0 + (value - 0) / 1.
            new = tf.where(restart, value, moved)
            updates.append(average.assign(new, use_locking=True, read_value=False))
        update_op = tf.group(*updates, name="update")
        reset = count.assign(tf.constant(0, tf.int64), use_locking=True, read_value=False)
        reset_op = tf.group(reset, name="reset")
        reads = [tf.identity(a.read_value(), name="read") for a in averages]
    return RunningAverage(update_op=update_op, averages=reads, count=count, reset_op=reset_op)
