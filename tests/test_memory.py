"""What an apply holds at once: one variable's mean, not a parameter copy.

Read from the allocator's records of one traced run (the bytes each op asked
for and gave back, in time order): exact, whatever the allocator keeps
besides.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum

v1 = tf.compat.v1

SIZES = ((300, 300), (300, 300), (300, 300), (300, 10))
N = 3


def _model(dtype=tf.float32):
    """Four dense layers, three of the same size; a loss on fed inputs."""
    rng = np.random.RandomState(0)
    x = v1.placeholder(dtype, [None, SIZES[0][0]])
    y = v1.placeholder(dtype, [None, SIZES[-1][1]])
    h = x
    variables = []
    for i, shape in enumerate(SIZES):
        w = v1.get_variable(f"w{i}", initializer=(rng.randn(*shape) * 0.05).astype(dtype.name))
        variables.append(w)
        h = tf.matmul(h, w)
        if i < len(SIZES) - 1:
            h = tf.tanh(h)
    loss = tf.reduce_mean(tf.square(h - y))
    feeds = [
        {
            x: rng.randn(4, SIZES[0][0]).astype(dtype.name),
            y: rng.randn(4, SIZES[-1][1]).astype(dtype.name),
        }
        for _ in range(N)
    ]
    return loss, feeds, variables


def _live_peak(sess, fetches, feed_dict=None):
    """The most bytes the run held at once of what it allocated."""
    metadata = v1.RunMetadata()
    options = v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE)
    sess.run(fetches, feed_dict, options=options, run_metadata=metadata)
    records = sorted(
        (record.alloc_micros, record.alloc_bytes)
        for device in metadata.step_stats.dev_stats
        for node in device.node_stats
        for memory in node.memory
        for record in memory.allocation_records
    )
    assert records, "the trace recorded no allocation"
    live = peak = 0
    for _, change in records:
        live += change
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize(
    "options",
    [{}, {"clip_norm": 1.0}, {"statistics": True, "micro_batch_size": 4}],
    ids=["default", "clip_norm", "statistics"],
)
def test_the_apply_holds_one_variables_mean_at_a_time(options):
    with tf.Graph().as_default():
        _one_mean_at_a_time(options)


def _one_mean_at_a_time(options):
    loss, feeds, _ = _model()
    acc = tf1_accum.build_accumulation(loss, v1.train.GradientDescentOptimizer(0.1), **options)
    layer = SIZES[0][0] * SIZES[0][1] * 4
    with v1.Session() as sess:
        sess.run(v1.global_variables_initializer())
        # A variable's first update copies it (TensorFlow's own initial
        # value may still share its buffer): measure the second window.
        tf1_accum.run_accumulation(sess, acc, feeds)
        for feed in feeds:
            sess.run(acc.accum_op, feed)
        peak = _live_peak(sess, acc.apply_op)
    # Three layers' means at once would be 3 x 360 KB; one at a time, one
    # layer's (and the small last one's).
    assert layer <= peak < 1.5 * layer, (peak, layer)


class _NormScaledDescent(v1.train.GradientDescentOptimizer):
    """Scales every gradient by the global norm of all of them, in one op per gradient.

    Each update reads every gradient: the apply cannot order them one at a
    time, and must still run (no deadlock) and stay exact.
    """

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        grads_and_vars = list(grads_and_vars)
        norm = tf.linalg.global_norm([g for g, _ in grads_and_vars])
        scale = 1.0 / tf.maximum(norm, tf.constant(1.0, norm.dtype))
        return super().apply_gradients(
            [(g * scale, v) for g, v in grads_and_vars], global_step=global_step, name=name
        )


def test_an_optimizer_reading_every_gradient_at_once_is_applied_as_large_batch_training():
    with tf.Graph().as_default():
        loss, feeds, variables = _model(tf.float64)
        train_op = _NormScaledDescent(0.5).minimize(loss)
        big = {key: np.concatenate([f[key] for f in feeds]) for key in feeds[0]}
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train_op, big)
            expected = sess.run(variables)
    with tf.Graph().as_default():
        loss, feeds, variables = _model(tf.float64)
        acc = tf1_accum.build_accumulation(loss, _NormScaledDescent(0.5))
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            tf1_accum.run_accumulation(sess, acc, feeds)
            got = sess.run(variables)
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)
    assert any(not np.allclose(e, v) for e, v in zip(expected, _initial(tf.float64)))


def _initial(dtype):
    with tf.Graph().as_default():
        _, _, variables = _model(dtype)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            return sess.run(variables)
