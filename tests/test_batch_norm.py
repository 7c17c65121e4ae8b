"""update_ops: batch-norm moving statistics see every micro-batch exactly once.

A real ``tf.compat.v1.layers.batch_normalization`` layer (tf_keras, see
conftest.py) normalizes the inputs of a small MLP. Its moving mean and
variance must equal, after each window, the exponential moving averages over
the statistics of each micro-batch in turn, computed here in NumPy.
"""

import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import FEATURES
from _helpers import HIDDEN
from _helpers import make_batches
from _ways import WAYS

v1 = tf.compat.v1

MOMENTUM = 0.75  # 1 - momentum is exact in float32, in which the layer computes it
STEPS = 3


def _model(inputs=None, labels=None):
    """An MLP on batch-normalized inputs; returns (inputs, labels, loss)."""
    rng = np.random.RandomState(0)
    if inputs is None:
        inputs = v1.placeholder(tf.float64, [None, FEATURES], name="x")
        labels = v1.placeholder(tf.float64, [None, 1], name="y")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the layer's deprecation notice
        normalized = v1.layers.batch_normalization(
            inputs, momentum=MOMENTUM, training=True, name="bn"
        )
    w1 = v1.get_variable("w1", initializer=rng.randn(FEATURES, HIDDEN), dtype=tf.float64)
    w2 = v1.get_variable("w2", initializer=rng.randn(HIDDEN, 1), dtype=tf.float64)
    hidden = tf.tanh(tf.matmul(normalized, w1))
    return inputs, labels, tf.reduce_mean((tf.matmul(hidden, w2) - labels) ** 2)


def _moving(graph):
    """The layer's (moving_mean, moving_variance) variables."""
    by_name = {v.op.name: v for v in graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES)}
    return by_name["bn/moving_mean"], by_name["bn/moving_variance"]


def _expected_statistics(batches):
    """Moving (mean, variance) after one update per micro-batch, in order.

    The layer updates each with ``moving -= (moving - batch value) * (1 -
    momentum)``, from the batch's mean and its variance over the batch
    (dividing by the batch size), starting at 0 and 1.
    """
    mean, variance = np.zeros(FEATURES), np.ones(FEATURES)
    for inputs, _ in batches:
        mean = mean - (mean - inputs.mean(axis=0)) * (1 - MOMENTUM)
        variance = variance - (variance - inputs.var(axis=0)) * (1 - MOMENTUM)
    return mean, variance


def _train(way, windows, update_ops=None):
    """Trains through ``way``; returns the moving statistics after each window."""
    kwargs = {} if update_ops is None else {"update_ops": update_ops}
    with tf.Graph().as_default() as graph:
        step = v1.train.get_or_create_global_step()
        built = way.build(
            lambda b: _model(b[0], b[1])[2],
            v1.train.AdamOptimizer(0.05),
            [b for window in windows for b in window],
            STEPS,
            global_step=step,
            **kwargs,
        )
        moving = _moving(graph)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            results = []
            for window in windows:
                way.run_window(sess, built, window)
                results.append(sess.run(moving))
            assert sess.run(step) == len(windows)  # the windows were applied
    return results


def _windows(count=2):
    batches = make_batches(tf.float64, False, count * STEPS, 4)
    return [batches[i * STEPS : (i + 1) * STEPS] for i in range(count)]


@pytest.mark.parametrize("way", WAYS, ids=str)
def test_moving_statistics_see_each_micro_batch_once(way):
    windows = _windows()
    got = _train(way, windows)
    for w, (mean, variance) in enumerate(got):
        seen = [b for window in windows[: w + 1] for b in window]
        want_mean, want_variance = _expected_statistics(seen)
        np.testing.assert_allclose(mean, want_mean, rtol=1e-12, err_msg=f"{way}, window {w}")
        np.testing.assert_allclose(
            variance, want_variance, rtol=1e-12, err_msg=f"{way}, window {w}"
        )
    # Neither the large batch's statistics nor one update too many.
    big = _expected_statistics([tuple(np.concatenate(p) for p in zip(*windows[0]))])
    assert not np.allclose(got[0][0], big[0], rtol=1e-3)
    extra = _expected_statistics(windows[0] + windows[0][-1:])
    assert not np.allclose(got[0][0], extra[0], rtol=1e-3)


@pytest.mark.parametrize("way", WAYS, ids=str)
def test_an_empty_list_runs_no_update(way):
    mean, variance = _train(way, _windows(1), update_ops=[])[0]
    np.testing.assert_array_equal(mean, np.zeros(FEATURES))
    np.testing.assert_array_equal(variance, np.ones(FEATURES))


def test_a_list_runs_exactly_those_ops():
    (window,) = _windows(1)
    with tf.Graph().as_default() as graph:
        x, y, loss = _model()
        update_mean = v1.get_collection(v1.GraphKeys.UPDATE_OPS)[0]
        acc = tf1_accum.build_accumulation(
            loss, v1.train.GradientDescentOptimizer(0.1), update_ops=[update_mean]
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            tf1_accum.run_accumulation(sess, acc, [{x: b[0], y: b[1]} for b in window])
            mean, variance = sess.run(_moving(graph))
    np.testing.assert_allclose(mean, _expected_statistics(window)[0], rtol=1e-12)
    np.testing.assert_array_equal(variance, np.ones(FEATURES))


def test_apply_zero_and_flush_never_run_the_updates():
    (window,) = _windows(1)
    with tf.Graph().as_default() as graph:
        x, y, loss = _model()
        acc = tf1_accum.build_accumulation(loss, v1.train.GradientDescentOptimizer(0.1))
        wrapper = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), 5)
        train_op = wrapper.minimize(loss)
        moving = _moving(graph)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for b in window:
                sess.run(acc.accum_op, {x: b[0], y: b[1]})
            after_micro_batches = sess.run(moving)
            sess.run(acc.apply_op)  # no feed: it could not run them if it tried
            for b in window[:2]:
                sess.run(acc.accum_op, {x: b[0], y: b[1]})
            sess.run(acc.zero_op)
            before_flush = sess.run(moving)
            for b in window:
                sess.run(train_op, {x: b[0], y: b[1]})
            after_train = sess.run(moving)
            sess.run(wrapper.flush_op)
            after_flush = sess.run(moving)
    np.testing.assert_allclose(after_micro_batches[0], _expected_statistics(window)[0], 1e-12)
    np.testing.assert_allclose(before_flush[0], _expected_statistics(window + window[:2])[0], 1e-12)
    np.testing.assert_array_equal(after_flush[0], after_train[0])
    np.testing.assert_array_equal(after_flush[1], after_train[1])


@pytest.mark.parametrize(
    "update_ops, error, message",
    [
        ("bn", TypeError, r"update_ops must be None .*or a list of tf.Operation .*got 'bn'"),
        (3, TypeError, r"update_ops must be None .*got 3 \(a builtins.int\)"),
        ([1.0], TypeError, r"update_ops\[0\] must be a tf.Operation or tf.Tensor .*got 1.0"),
    ],
    ids=["str", "int", "float-in-list"],
)
def test_bad_update_ops_are_rejected_everywhere(update_ops, error, message):
    with tf.Graph().as_default():
        _, _, loss = _model()
        opt = v1.train.GradientDescentOptimizer(0.1)
        with pytest.raises(error, match=message):
            tf1_accum.build_accumulation(loss, opt, update_ops=update_ops)
        with pytest.raises(error, match=message):
            tf1_accum.AccumulationOptimizer(opt, 2, update_ops=update_ops)
        dataset = tf.data.Dataset.from_tensor_slices(np.zeros((2, 3)))
        with pytest.raises(error, match=message):
            tf1_accum.build_dataset_accumulation(
                lambda b: tf.reduce_mean(b), opt, dataset, 2, update_ops=update_ops
            )
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []


def test_a_single_op_must_be_in_a_list():
    with tf.Graph().as_default():
        _, _, loss = _model()
        op = v1.get_collection(v1.GraphKeys.UPDATE_OPS)[0]
        with pytest.raises(TypeError, match=r"update_ops must be None .*got <tf.Operation"):
            tf1_accum.build_accumulation(
                loss, v1.train.GradientDescentOptimizer(0.1), update_ops=op
            )


def test_update_ops_from_another_graph_are_rejected():
    with tf.Graph().as_default():
        _model()
        foreign = v1.get_collection(v1.GraphKeys.UPDATE_OPS)
    with tf.Graph().as_default():
        _, _, loss = _model()
        opt = v1.train.GradientDescentOptimizer(0.1)
        with pytest.raises(ValueError, match=r"update_ops\[0\] .* is not in the graph of the loss"):
            tf1_accum.build_accumulation(loss, opt, update_ops=foreign)
        wrapper = tf1_accum.AccumulationOptimizer(opt, 2, update_ops=foreign)
        with pytest.raises(ValueError, match=r"update_ops\[0\] .* is not in the graph of the loss"):
            wrapper.minimize(loss)
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []


def test_the_dataset_loop_rejects_ops_built_outside_it():
    with tf.Graph().as_default():
        outside = v1.get_variable("count", initializer=0.0).assign_add(1.0)
        dataset = tf.data.Dataset.from_tensor_slices(np.zeros((2, 3)))

        def loss_fn(batch):
            w = v1.get_variable("w", initializer=1.0, dtype=tf.float64)
            return tf.reduce_mean(w * batch)

        message = (
            r"update_ops=None .*got a list of 1 ops built outside the loop: add them to "
            r"UPDATE_OPS inside loss_fn"
        )
        with pytest.raises(ValueError, match=message):
            tf1_accum.build_dataset_accumulation(
                loss_fn, v1.train.GradientDescentOptimizer(0.1), dataset, 2, update_ops=[outside]
            )
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []


@pytest.mark.parametrize("way", WAYS, ids=str)
def test_a_micro_batch_refused_for_its_weight_moves_no_statistic(way):
    # The weight is the first label: -1 in the window's first micro-batch.
    windows = _windows(1)
    bad = (windows[0][0][0], np.abs(windows[0][0][1]))
    bad[1][0, 0] = -1.0
    window = [bad] + [(x, np.abs(y)) for x, y in windows[0][1:]]
    with tf.Graph().as_default() as graph:
        built = way.build(
            lambda b: _model(b[0], b[1])[2],
            v1.train.AdamOptimizer(0.05),
            window,
            STEPS,
            weight=lambda b: b[1][0, 0],
        )
        variables = v1.global_variables()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            before = sess.run(variables)
            with pytest.raises(tf.errors.InvalidArgumentError, match="weight is negative"):
                way.run_window(sess, built, window)
            after = sess.run(variables)
            mean, variance = sess.run(_moving(graph))
    np.testing.assert_array_equal(mean, np.zeros(FEATURES))
    np.testing.assert_array_equal(variance, np.ones(FEATURES))
    for var, old, new in zip(variables, before, after):
        np.testing.assert_array_equal(new, old, err_msg=var.op.name)


def _side_model():
    """A linear model's (x, y, weight, loss, kernel), beside a batch-norm layer it never reads.

    The gradient does not depend on the layer: the training equals the large batch's.
    """
    x = v1.placeholder(tf.float64, [None, FEATURES], name="x")
    y = v1.placeholder(tf.float64, [None, 1], name="y")
    weight = v1.placeholder(tf.float64, [], name="weight")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the layer's deprecation notice
        v1.layers.batch_normalization(x, momentum=MOMENTUM, training=True, name="bn")
    rng = np.random.RandomState(0)
    kernel = v1.get_variable("kernel", initializer=rng.randn(FEATURES, 1), dtype=tf.float64)
    return x, y, weight, tf.reduce_mean((tf.matmul(x, kernel) - y) ** 2), kernel


def test_a_failed_weighted_build_leaves_the_update_ops_as_they_were():
    (window,) = _windows(1)
    with tf.Graph().as_default() as graph:
        x, y, weight, loss, kernel = _side_model()

        def failing(gradient, variable, window):
            raise RuntimeError("the transform fails")

        opt = v1.train.GradientDescentOptimizer(0.1)
        with pytest.raises(RuntimeError, match="the transform fails"):
            tf1_accum.build_accumulation(
                loss, opt, var_list=[kernel], weight=weight, transform=failing
            )
        acc = tf1_accum.build_accumulation(loss, opt, var_list=[kernel], weight=weight)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            feeds = [{x: b[0], y: b[1], weight: 2.0} for b in window]
            tf1_accum.run_accumulation(sess, acc, feeds)
            got, moving = sess.run(kernel), sess.run(_moving(graph))
            # Plain large-batch training, from the same start.
            sess.run(v1.global_variables_initializer())
            big = tuple(np.concatenate(p) for p in zip(*window))
            sess.run(opt.minimize(loss, var_list=[kernel]), {x: big[0], y: big[1]})
            want = sess.run(kernel)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=0)
    assert not np.allclose(want, np.random.RandomState(0).randn(FEATURES, 1))
    for value, expected in zip(moving, _expected_statistics(window)):
        np.testing.assert_allclose(value, expected, rtol=1e-12)


def test_two_weighted_windows_sharing_an_update_op_run_with_their_own_feeds():
    (window,) = _windows(1)
    with tf.Graph().as_default() as graph:
        x, y, weight, loss, kernel = _side_model()
        other_weight = v1.placeholder(tf.float64, [], name="other_weight")
        opt = v1.train.GradientDescentOptimizer(0.1)
        first = tf1_accum.build_accumulation(loss, opt, var_list=[kernel], weight=weight)
        second = tf1_accum.build_accumulation(loss, opt, var_list=[kernel], weight=other_weight)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            b = window[0]
            sess.run(first.accum_op, {x: b[0], y: b[1], weight: 1.0})
            sess.run(second.accum_op, {x: b[0], y: b[1], other_weight: 1.0})
            sess.run(v1.get_collection(v1.GraphKeys.UPDATE_OPS), {x: b[0]})  # no weight
            assert sess.run([first.counter, second.counter]) == [1, 1]
            moving = sess.run(_moving(graph))
    for value, expected in zip(moving, _expected_statistics([b, b, b])):
        np.testing.assert_allclose(value, expected, rtol=1e-12)
