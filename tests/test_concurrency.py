"""Concurrency: threads running accum_op on one session lose no gradient.

Queue-runner style feeding runs ``accum_op`` from several Python threads on
one session at once; ``Session.run`` releases the GIL, so the adds really
overlap. In float64, the accumulators must then hold the sum of every fed
micro-batch's gradient (each computed on its own), the counter the number of
runs, and the apply must equal large-batch training on all of them.
"""

import threading

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import Model
from _helpers import RTOL
from _helpers import assert_same_values
from _helpers import make_batches
from _helpers import plain_training
from _helpers import values_by_name

v1 = tf.compat.v1

THREADS = 4
RUNS_PER_THREAD = 25
DTYPE = tf.float64


def _dense(gradient, shape):
    """A fetched gradient (an array, or IndexedSlicesValue) as a dense array."""
    if isinstance(gradient, np.ndarray):
        return gradient
    dense = np.zeros(shape, gradient.values.dtype)
    np.add.at(dense, gradient.indices, gradient.values)  # repeated ids add up
    return dense


def _run_in_threads(sess, op, feeds):
    """Runs ``op`` once per feed, the feeds dealt round-robin to THREADS threads."""
    start = threading.Barrier(THREADS)
    errors = []

    def worker(mine):
        try:
            start.wait()
            for feed in mine:
                sess.run(op, feed)
        except Exception as error:  # reported by the test thread
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(feeds[t::THREADS],)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a feeding thread hung"
    assert not errors, errors


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_threads_feeding_accum_op_lose_no_gradient(sparse):
    batches = make_batches(DTYPE, sparse, THREADS * RUNS_PER_THREAD, 5)
    with tf.Graph().as_default():
        model = Model(DTYPE, sparse)
        acc = tf1_accum.build_accumulation(
            model.loss,
            v1.train.AdamOptimizer(0.05),
            global_step=v1.train.get_or_create_global_step(),
        )
        gradients = tf.gradients(model.loss, acc.var_list)
        assert isinstance(gradients[0], tf.IndexedSlices) == sparse
        shapes = [v.shape.as_list() for v in acc.var_list]
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            # Each micro-batch's gradient on its own, one run at a time.
            expected = [np.zeros(shape) for shape in shapes]
            for batch in batches:
                for total, g, shape in zip(
                    expected, sess.run(gradients, model.feed(batch)), shapes
                ):
                    total += _dense(g, shape)
            assert all(np.abs(total).max() > 0 for total in expected)

            _run_in_threads(sess, acc.accum_op, [model.feed(b) for b in batches])

            assert sess.run(acc.counter) == len(batches)
            for var, total, want in zip(acc.var_list, sess.run(acc.accumulators), expected):
                # The adds ran in another order than the sum above: equal up
                # to float64 rounding, and a lost micro-batch is far larger.
                np.testing.assert_allclose(
                    total, want, rtol=0, atol=RTOL[DTYPE] * np.abs(want).max(), err_msg=var.op.name
                )

            sess.run(acc.apply_op)
            got = values_by_name(sess, tf1_accum.plain_variables())

    (want,) = plain_training("adam", DTYPE, sparse, [batches])
    assert_same_values(got, want, RTOL[DTYPE], f"{THREADS} feeding threads")
    assert got["global_step"] == 1
