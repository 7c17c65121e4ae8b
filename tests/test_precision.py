"""Half-precision variables accumulate in float32 and match float32 training."""

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import Model
from _helpers import concat
from _helpers import make_batches
from _helpers import relative_error
from _helpers import values_by_name

v1 = tf.compat.v1

# Two units in the last place of each format (float16: 2 x 2**-10, bfloat16:
# 2 x 2**-7): the parameters and the inputs are themselves rounded to it, so
# no accumulation can do better. Measured: about 4e-4 and 4e-3.
TOLERANCE = {tf.float16: 2e-3, tf.bfloat16: 1.6e-2}


def _trained(dtype, batches, n, accumulate):
    with tf.Graph().as_default():
        model = Model(dtype, False)
        opt = v1.train.GradientDescentOptimizer(0.05)
        if accumulate:
            acc = tf1_accum.build_accumulation(model.loss, opt)
            assert all(a.dtype.base_dtype == tf.float32 for a in acc.accumulators)
        else:
            train_op = opt.minimize(model.loss)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for w in range(len(batches) // n):
                window = batches[w * n : (w + 1) * n]
                if accumulate:
                    tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in window])
                else:
                    sess.run(train_op, model.feed(concat(window)))
            return values_by_name(sess, v1.trainable_variables())


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16], ids=lambda d: d.name)
def test_half_precision_accumulation_matches_float32_large_batch(dtype):
    n = 8
    batches32 = make_batches(tf.float32, False, 2 * n, 4)
    cast = [(x.astype(dtype.as_numpy_dtype), y.astype(dtype.as_numpy_dtype)) for x, y in batches32]
    reference = _trained(tf.float32, batches32, n, accumulate=False)
    start = _trained(tf.float32, batches32[:0], n, accumulate=False)
    got = _trained(dtype, cast, n, accumulate=True)
    for name, want in reference.items():
        moved = np.abs(want - start[name]).max()
        assert moved > 1e-2, name  # the training moved the weights measurably
        err = relative_error(np.asarray(got[name], np.float64), want)
        assert err <= TOLERANCE[dtype], f"{dtype.name} {name}: relative error {err:.3g}"
