"""clip_norm: the window's gradient is clipped by its global norm, in every way in."""

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import OPTIMIZERS
from _helpers import RTOL
from _helpers import Model
from _helpers import assert_same_values
from _helpers import concat
from _helpers import make_batches
from _helpers import values_by_name
from _ways import WAYS

v1 = tf.compat.v1

CLIP = 0.05  # well below the gradient norms of the test model


def _plain_clipped(optimizer_name, dtype, sparse, windows):
    """Large-batch training with the (dense) gradient clipped to CLIP.

    Returns the values after each window and the norms before clipping.
    """
    with tf.Graph().as_default():
        model = Model(dtype, sparse)
        step = v1.train.get_or_create_global_step()
        opt = OPTIMIZERS[optimizer_name](dtype)
        grads, variables = zip(*opt.compute_gradients(model.loss))
        grads = [tf.convert_to_tensor(g) for g in grads]
        clipped, norm = tf.clip_by_global_norm(grads, CLIP)
        train_op = opt.apply_gradients(zip(clipped, variables), global_step=step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            values, norms = [], []
            for window in windows:
                _, n = sess.run([train_op, norm], model.feed(concat(window)))
                values.append(values_by_name(sess, v1.global_variables()))
                norms.append(n)
    return values, norms


def _accumulated_clipped(optimizer_name, dtype, sparse, windows, way, fetch_norm=False):
    """Values after each window, and the norms read in the apply runs (if ``fetch_norm``)."""
    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        built = way.build(
            lambda b: Model(dtype, sparse, inputs=b[0], labels=b[1]).loss,
            OPTIMIZERS[optimizer_name](dtype),
            [b for window in windows for b in window],
            len(windows[0]),
            global_step=step,
            clip_norm=CLIP,
        )
        fetch = built.global_norm if fetch_norm else None
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            values, norms = [], []
            for window in windows:
                norms.append(way.run_window(sess, built, window, fetch=fetch))
                values.append(values_by_name(sess, v1.global_variables()))
    return values, norms


def _clipped_windows(optimizer_name, sparse):
    """Two windows of 4 micro-batches, and large-batch training on them clipped."""
    batches = make_batches(tf.float64, sparse, 8, 5)
    windows = [batches[:4], batches[4:]]
    expected, expected_norms = _plain_clipped(optimizer_name, tf.float64, sparse, windows)
    assert min(expected_norms) > 2 * CLIP  # the clipping really acts
    return windows, expected, expected_norms


@pytest.mark.parametrize("way", WAYS, ids=str)
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("optimizer_name", ["sgd", "adam"])
def test_clipped_window_equals_clipped_large_batch(optimizer_name, sparse, way):
    windows, expected, _ = _clipped_windows(optimizer_name, sparse)
    actual, _ = _accumulated_clipped(optimizer_name, tf.float64, sparse, windows, way)
    for w, (got, want) in enumerate(zip(actual, expected)):
        assert_same_values(
            got, want, RTOL[tf.float64], f"{optimizer_name}, {way}, clipped: window {w}"
        )


@pytest.mark.parametrize("way", WAYS, ids=str)
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("optimizer_name", ["sgd", "adam"])
def test_the_apply_reports_the_norm_before_clipping(optimizer_name, sparse, way):
    way.require("fetch_at_apply")
    windows, expected, expected_norms = _clipped_windows(optimizer_name, sparse)
    actual, norms = _accumulated_clipped(
        optimizer_name, tf.float64, sparse, windows, way, fetch_norm=True
    )
    for w, (got, want) in enumerate(zip(actual, expected)):
        assert_same_values(
            got, want, RTOL[tf.float64], f"{optimizer_name}, {way}, clipped: window {w}"
        )
    # The first window's norm is of the same weights; a later one is of
    # weights equal to RTOL: TensorFlow 1.15's GradientDescentOptimizer applies
    # a sparse gradient (the window's) to a resource variable with its
    # learning rate in float64, a dense one (the large batch's) rounded to float32.
    np.testing.assert_allclose(norms[0], expected_norms[0], rtol=1e-12)
    np.testing.assert_allclose(norms, expected_norms, rtol=RTOL[tf.float64])


def test_global_norm_without_clipping_and_zero_in_accumulating_runs():
    batches = make_batches(tf.float64, False, 3, 4)
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        wrapper = tf1_accum.AccumulationOptimizer(OPTIMIZERS["sgd"](tf.float64), 3)
        train_op = wrapper.minimize(model.loss)
        with pytest.raises(ValueError, match="window exists once the train op is built"):
            _ = tf1_accum.AccumulationOptimizer(OPTIMIZERS["sgd"](tf.float64), 3).window
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            grads = tf.gradients(model.loss, v1.trainable_variables())
            want = np.sqrt(sum(np.sum(g**2) for g in sess.run(grads, model.feed(concat(batches)))))
            norm = wrapper.window.global_norm
            norms = [sess.run([train_op, norm], model.feed(b))[1] for b in batches]
    assert norms[:2] == [0.0, 0.0]
    np.testing.assert_allclose(norms[2], want, rtol=1e-12)


@pytest.mark.parametrize(
    "clip_norm, error, message",
    [
        (0.0, ValueError, r"clip_norm must be a positive, finite number or None .*got 0.0"),
        (-1, ValueError, r"clip_norm must be a positive, finite number or None .*got -1"),
        (float("inf"), ValueError, r"finite number or None \(no clipping\), got inf"),
        (
            float("nan"),
            ValueError,
            r"clip_norm must be a positive, finite number or None .*got nan",
        ),
        ("1", TypeError, r"clip_norm must be a positive, finite number or None .*got '1'"),
    ],
)
def test_bad_clip_norm(clip_norm, error, message):
    with tf.Graph().as_default():
        model = Model(tf.float32, False)
        opt = OPTIMIZERS["sgd"](tf.float32)
        with pytest.raises(error, match=message):
            tf1_accum.build_accumulation(model.loss, opt, clip_norm=clip_norm)
        with pytest.raises(error, match=message):
            tf1_accum.AccumulationOptimizer(opt, 2, clip_norm=clip_norm)
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []
