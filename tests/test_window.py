"""The window's global norm: one pass per gradient, float64 only on overflow."""

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum

v1 = tf.compat.v1


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16])
def test_a_finite_window_beyond_the_float32_range_is_applied(dtype):
    # Each gradient element is finite in its dtype, but the sum of squares
    # overflows float32: the norm is taken again in float64, not reported as
    # Inf, and the window is applied.
    x = np.array([3.0, -4.0])
    scale = 1e30 if dtype == tf.float32 else 1e4
    with tf.Graph().as_default():
        w = v1.get_variable("w", initializer=np.array([1.0, 2.0], dtype.as_numpy_dtype))
        loss = tf.cast(scale, dtype) * tf.reduce_sum(w * x.astype(dtype.as_numpy_dtype))
        acc = tf1_accum.build_accumulation(loss, v1.train.GradientDescentOptimizer(0.5 / scale))
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(acc.accum_op)
            _, norm = sess.run([acc.apply_op, acc.global_norm])
            assert sess.run(acc.skipped_windows) == 0
            got = sess.run(w)
    np.testing.assert_allclose(norm, 5.0 * scale, rtol=1e-3)
    np.testing.assert_allclose(got, [1.0 - 1.5, 2.0 + 2.0], rtol=1e-3)
