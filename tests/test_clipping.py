"""clip_norm: the window's gradient is clipped by its global norm, in every path."""

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


def _accumulated_clipped(optimizer_name, dtype, sparse, windows, path):
    n = len(windows[0])
    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        opt = OPTIMIZERS[optimizer_name](dtype)
        if path == "dataset":
            batches = [b for window in windows for b in window]
            dataset = tf.data.Dataset.from_tensor_slices(
                tuple(np.stack(part) for part in zip(*batches))
            )
            acc = tf1_accum.build_dataset_accumulation(
                lambda b: Model(dtype, sparse, inputs=b[0], labels=b[1]).loss,
                opt,
                dataset,
                n,
                global_step=step,
                clip_norm=CLIP,
            )
        else:
            model = Model(dtype, sparse)
            if path == "optimizer":
                wrapper = tf1_accum.AccumulationOptimizer(opt, n, clip_norm=CLIP)
                train_op = wrapper.minimize(model.loss, global_step=step)
            else:
                acc = tf1_accum.build_accumulation(
                    model.loss, opt, global_step=step, clip_norm=CLIP, fused=path == "fused"
                )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            values, norms = [], []
            for window in windows:
                if path == "dataset":
                    _, norm = sess.run([acc.train_op, acc.global_norm])
                elif path == "optimizer":
                    for batch in window:
                        _, norm = sess.run([train_op, wrapper.global_norm], model.feed(batch))
                elif path == "ops":
                    for batch in window:
                        sess.run(acc.accum_op, model.feed(batch))
                    _, norm = sess.run([acc.apply_op, acc.global_norm])
                else:  # fused: the norm is not fetched in this path
                    tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in window])
                    norm = None
                values.append(values_by_name(sess, v1.global_variables()))
                norms.append(norm)
    return values, norms


@pytest.mark.parametrize("path", ["ops", "fused", "optimizer", "dataset"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("optimizer_name", ["sgd", "adam"])
def test_clipped_window_equals_clipped_large_batch(optimizer_name, sparse, path):
    dtype = tf.float64
    batches = make_batches(dtype, sparse, 8, 5)
    windows = [batches[:4], batches[4:]]
    expected, expected_norms = _plain_clipped(optimizer_name, dtype, sparse, windows)
    actual, norms = _accumulated_clipped(optimizer_name, dtype, sparse, windows, path)
    assert min(expected_norms) > 2 * CLIP  # the clipping really acts
    for w, (got, want) in enumerate(zip(actual, expected)):
        assert_same_values(got, want, RTOL[dtype], f"{optimizer_name}, {path}, clipped: window {w}")
        if norms[w] is not None:
            np.testing.assert_allclose(norms[w], expected_norms[w], rtol=1e-12)


def test_global_norm_without_clipping_and_zero_in_accumulating_runs():
    batches = make_batches(tf.float64, False, 3, 4)
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        wrapper = tf1_accum.AccumulationOptimizer(OPTIMIZERS["sgd"](tf.float64), 3)
        train_op = wrapper.minimize(model.loss)
        with pytest.raises(ValueError, match="global_norm exists once the train op is built"):
            _ = tf1_accum.AccumulationOptimizer(OPTIMIZERS["sgd"](tf.float64), 3).global_norm
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            grads = tf.gradients(model.loss, v1.trainable_variables())
            want = np.sqrt(sum(np.sum(g**2) for g in sess.run(grads, model.feed(concat(batches)))))
            norms = [sess.run([train_op, wrapper.global_norm], model.feed(b))[1] for b in batches]
    assert norms[:2] == [0.0, 0.0]
    np.testing.assert_allclose(norms[2], want, rtol=1e-12)


@pytest.mark.parametrize(
    "clip_norm, error, message",
    [
        (0.0, ValueError, "clip_norm must be positive, got 0.0"),
        (-1, ValueError, "clip_norm must be positive, got -1"),
        ("1", TypeError, r"clip_norm must be a positive number or None, got '1'"),
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
