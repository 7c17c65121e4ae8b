"""Squared L2 norms of gradients in float64, one way for the window's norm and the statistics."""

import typing

import tensorflow as tf


def at_least_float32(values: tf.Tensor) -> tf.Tensor:
    """``values``, cast to float32 if their dtype is narrower (float16, bfloat16)."""
    return tf.cast(values, tf.float32) if values.dtype.base_dtype.size < 4 else values


def square_norms(values: typing.Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """The float64 squared L2 norm of each of ``values``, whatever their dtypes.

    Pass a sparse gradient's values with each row once (as a window's sums
    hold them): the norm of those values is then the norm of the dense
    gradient.

    Each sum of squares is taken in one pass, in its tensor's own dtype
    (float32 at least), with no squared or float64 copy: ``l2_loss`` is
    sum(t ** 2) / 2, and doubling it is exact. Only if that overflows (the
    sum is Inf) is it taken again in float64, so finite values whose norm
    exceeds the float32 range still have a finite norm. A NaN is not taken
    again: it would be NaN in float64 too.
    """

    def squares(widen: typing.Callable[[tf.Tensor], tf.Tensor]) -> list[tf.Tensor]:
        return [tf.cast(2 * tf.nn.l2_loss(widen(v)), tf.float64) for v in values]

    fast = squares(at_least_float32)
    if all(v.dtype.base_dtype == tf.float64 for v in values):
        return fast
    wide = tf.cond(
        tf.math.is_inf(tf.add_n(fast)),
        lambda: squares(lambda v: tf.cast(v, tf.float64)),
        lambda: [tf.identity(q) for q in fast],
        name="square_norms",
    )
    return list(wide) if isinstance(wide, (list, tuple)) else [wide]
