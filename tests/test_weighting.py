"""Weighted averaging: micro-batches of different sizes, in every path."""

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import OPTIMIZERS
from _helpers import RTOL
from _helpers import Model
from _helpers import assert_same_values
from _helpers import make_batches
from _helpers import plain_training
from _helpers import relative_error
from _helpers import values_by_name

v1 = tf.compat.v1

SIZES = [5, 11, 3, 13]  # one window: 32 examples


def _size(inputs):
    return tf.cast(tf.shape(inputs)[0], tf.float32)


def _weighted_training(optimizer_name, dtype, sparse, windows, path):
    """Accumulates each window's micro-batches with weight = their size."""
    make_optimizer = lambda: OPTIMIZERS[optimizer_name](dtype)  # noqa: E731
    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        if path == "dataset":
            batches = [b for window in windows for b in window]
            dataset = tf.data.Dataset.from_tensors(batches[0])
            for batch in batches[1:]:
                dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))
            acc = tf1_accum.build_dataset_accumulation(
                lambda b: Model(dtype, sparse, inputs=b[0], labels=b[1]).loss,
                make_optimizer(),
                dataset,
                len(SIZES),
                global_step=step,
                weight=lambda b: _size(b[0]),
            )
        else:
            model = Model(dtype, sparse)
            weight = _size(model.inputs)
            if path == "optimizer":
                wrapper = tf1_accum.AccumulationOptimizer(
                    make_optimizer(), len(SIZES), weight=weight
                )
                train_op = wrapper.minimize(model.loss, global_step=step)
            else:
                acc = tf1_accum.build_accumulation(
                    model.loss,
                    make_optimizer(),
                    global_step=step,
                    weight=weight,
                    fused=path == "fused",
                )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            results = []
            for window in windows:
                if path == "dataset":
                    sess.run(acc.train_op)
                elif path == "optimizer":
                    for batch in window:
                        sess.run(train_op, model.feed(batch))
                elif path == "ops":
                    for batch in window:
                        sess.run(acc.accum_op, model.feed(batch))
                    sess.run(acc.apply_op)
                else:
                    tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in window])
                results.append(values_by_name(sess, v1.global_variables()))
    return results


@pytest.mark.parametrize("path", ["ops", "helper", "fused", "optimizer", "dataset"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("dtype", [tf.float64, tf.float32], ids=lambda d: d.name)
@pytest.mark.parametrize("optimizer_name", ["sgd", "adam", "adagrad"])
def test_weighted_micro_batches_equal_one_batch_of_32(optimizer_name, dtype, sparse, path):
    batches = make_batches(dtype, sparse, 8, SIZES * 2)
    windows = [batches[:4], batches[4:]]
    expected = plain_training(optimizer_name, dtype, sparse, windows)
    actual = _weighted_training(optimizer_name, dtype, sparse, windows, path)
    for w, (got, want) in enumerate(zip(actual, expected)):
        assert_same_values(
            got, want, RTOL[dtype], f"{optimizer_name}, {dtype.name}, {path}, weighted: window {w}"
        )


def test_unweighted_averaging_of_unequal_sizes_is_biased():
    """The default counter mean weights a 3-example micro-batch like a 13-example one."""
    batches = make_batches(tf.float64, False, 4, SIZES)
    expected = plain_training("sgd", tf.float64, False, [batches])[0]
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        acc = tf1_accum.build_accumulation(model.loss, OPTIMIZERS["sgd"](tf.float64))
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in batches])
            got = values_by_name(sess, acc.var_list)
    errors = [relative_error(got[name], expected[name]) for name in got]
    assert max(errors) > 1e-3


def test_token_masked_sequence_loss_equals_the_token_mean_of_the_window():
    rng = np.random.RandomState(3)
    lengths = [[3, 5, 1], [6, 2], [4, 4, 4, 2]]  # tokens per sequence, per micro-batch
    steps = 6
    batches = []
    for seqs in lengths:
        x = rng.randn(len(seqs), steps, 2)
        y = rng.randn(len(seqs), steps)
        mask = (np.arange(steps)[None, :] < np.array(seqs)[:, None]).astype(np.float64)
        batches.append((x, y, mask))

    def build():
        x = v1.placeholder(tf.float64, [None, steps, 2])
        y = v1.placeholder(tf.float64, [None, steps])
        mask = v1.placeholder(tf.float64, [None, steps])
        w = v1.get_variable("w", initializer=np.array([0.5, -1.0]))
        per_token = (tf.tensordot(x, w, 1) - y) ** 2
        tokens = tf.reduce_sum(mask)
        loss = tf.reduce_sum(per_token * mask) / tokens  # token mean of a micro-batch
        return (x, y, mask), w, loss, tokens

    with tf.Graph().as_default():
        ph, w, loss, tokens = build()
        acc = tf1_accum.build_accumulation(
            loss, v1.train.GradientDescentOptimizer(0.1), weight=tokens
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            tf1_accum.run_accumulation(sess, acc, [dict(zip(ph, b)) for b in batches])
            got = sess.run(w)
    with tf.Graph().as_default():
        ph, w, loss, _ = build()
        train = v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        padded = [np.concatenate(part) for part in zip(*batches)]
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train, dict(zip(ph, padded)))
            want = sess.run(w)
    assert np.abs(got - np.array([0.5, -1.0])).max() > 1e-3
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_zero_weight_window_is_skipped_and_a_negative_weight_raises():
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        scale = v1.placeholder(tf.float64, [])
        step = v1.train.get_or_create_global_step()
        acc = tf1_accum.build_accumulation(
            model.loss, OPTIMIZERS["sgd"](tf.float64), global_step=step, weight=scale
        )
        batches = make_batches(tf.float64, False, 2, 4)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            before = values_by_name(sess, acc.var_list)
            # 0 / 0 has no mean: the window is skipped and counted.
            tf1_accum.run_accumulation(sess, acc, [{**model.feed(b), scale: 0.0} for b in batches])
            assert sess.run([step, acc.skipped_windows, acc.counter]) == [0, 1, 0]
            feeds = [{**model.feed(b), scale: w} for b, w in zip(batches, [1.0, -1.0])]
            with pytest.raises(
                tf.errors.InvalidArgumentError, match="(?s)micro-batch 1 .*weight is negative"
            ):
                tf1_accum.run_accumulation(sess, acc, feeds)
            assert sess.run(acc.counter) == 0
            after = values_by_name(sess, acc.var_list)
            # Training goes on.
            tf1_accum.run_accumulation(sess, acc, [{**model.feed(b), scale: 1.0} for b in batches])
            assert sess.run(step) == 1
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value)


@pytest.mark.parametrize(
    "weight, error, message",
    [
        (3.0, TypeError, r"weight must be a scalar tensor .*got 3.0"),
        ("tokens", TypeError, "weight must be a scalar tensor"),
    ],
)
def test_bad_weight_is_rejected(weight, error, message):
    with tf.Graph().as_default():
        model = Model(tf.float32, False)
        with pytest.raises(error, match=message):
            tf1_accum.build_accumulation(model.loss, OPTIMIZERS["sgd"](tf.float32), weight=weight)
        with pytest.raises(error, match=message):
            tf1_accum.AccumulationOptimizer(OPTIMIZERS["sgd"](tf.float32), 2, weight=weight)
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []


def test_non_scalar_or_non_real_weight_is_rejected():
    with tf.Graph().as_default():
        model = Model(tf.float32, False)
        opt = OPTIMIZERS["sgd"](tf.float32)
        with pytest.raises(ValueError, match=r"weight must be a scalar .*shape \[None\]"):
            tf1_accum.build_accumulation(model.loss, opt, weight=model.labels[:, 0])
        with pytest.raises(TypeError, match="real number tensor, got .* string"):
            tf1_accum.build_accumulation(model.loss, opt, weight=tf.constant("a"))
        with pytest.raises(TypeError, match="weight must be a callable taking one dataset element"):
            tf1_accum.build_dataset_accumulation(
                lambda b: model.loss, opt, tf.data.Dataset.range(3), 2, weight=tf.constant(1.0)
            )
