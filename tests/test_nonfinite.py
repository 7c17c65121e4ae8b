"""skip_nonfinite: a window holding a NaN or an Inf is skipped, in every way in."""

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import OPTIMIZERS
from _helpers import RTOL
from _helpers import RTOL_TIGHT
from _helpers import Model
from _helpers import assert_same_values
from _helpers import concat
from _helpers import make_batches
from _helpers import plain_training
from _helpers import values_by_name
from _ways import WAYS
from _ways import BY_NAME
from tf1_accum._window import reference_control_flow

v1 = tf.compat.v1
HELPER = BY_NAME["helper"]


def _poisoned(batch):
    inputs, labels = batch
    return inputs, np.full_like(labels, np.nan)


def _run(way, windows, skip_nonfinite=True):
    """Adam through ``way``; returns (values after each window, skipped counts)."""
    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        built = way.build(
            lambda b: Model(tf.float64, True, inputs=b[0], labels=b[1]).loss,
            OPTIMIZERS["adam"](tf.float64),
            [b for window in windows for b in window],
            len(windows[0]),
            global_step=step,
            skip_nonfinite=skip_nonfinite,
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            values, counts = [], []
            for window in windows:
                way.run_window(sess, built, window)
                values.append(values_by_name(sess, v1.global_variables()))
                counts.append(int(sess.run(built.skipped_windows)))
                assert sess.run(built.counter) == 0
    return values, counts


@pytest.mark.parametrize("way", WAYS, ids=str)
def test_a_nan_window_is_skipped_and_training_goes_on(way):
    batches = make_batches(tf.float64, True, 6, 4)
    bad = [batches[0], _poisoned(batches[1]), batches[2]]
    good = batches[3:]
    values, counts = _run(way, [bad, good])
    expected = plain_training("adam", tf.float64, True, [good])[0]
    # After the skipped window nothing moved (global_step included), so the
    # next window equals one large-batch step from the start.
    assert counts == [1, 1]
    assert values[0]["global_step"] == 0
    assert_same_values(values[1], expected, RTOL[tf.float64], f"{way}: window after the skip")


def test_without_skipping_a_nan_window_is_applied_as_plain_training_would():
    batches = make_batches(tf.float64, True, 3, 4)
    values, counts = _run(HELPER, [[batches[0], _poisoned(batches[1]), batches[2]]], False)
    assert counts == [1]  # counted all the same
    assert values[0]["global_step"] == 1
    assert np.isnan(values[0]["w2"]).all()


def test_dynamic_loss_scale_lowers_on_an_overflowing_window_and_training_goes_on():
    batches = make_batches(tf.float32, False, 6, 4)
    with tf.Graph().as_default():
        model = Model(tf.float32, False)
        inner = v1.train.experimental.MixedPrecisionLossScaleOptimizer(
            v1.train.GradientDescentOptimizer(0.1), loss_scale="dynamic"
        )
        scale = inner._loss_scale()
        wrapper = tf1_accum.AccumulationOptimizer(inner, 3)
        train_op = wrapper.minimize(model.loss)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            start_scale = sess.run(scale)
            before = values_by_name(sess, v1.trainable_variables())
            inputs, labels = batches[1]
            overflowing = (inputs, np.full_like(labels, np.inf))
            for batch in [batches[0], overflowing, batches[2]]:
                sess.run(train_op, model.feed(batch))
            after_bad = values_by_name(sess, v1.trainable_variables())
            assert sess.run(scale) == start_scale / 2
            assert sess.run(wrapper.window.skipped_windows) == 1
            for batch in batches[3:]:
                sess.run(train_op, model.feed(batch))
            after_good = values_by_name(sess, v1.trainable_variables())
    for name, value in before.items():
        np.testing.assert_array_equal(after_bad[name], value, err_msg=name)
        assert np.isfinite(after_good[name]).all()
        assert np.abs(after_good[name] - value).max() > 1e-4, name


def test_skip_nonfinite_must_be_a_bool():
    with tf.Graph().as_default():
        model = Model(tf.float32, False)
        opt = OPTIMIZERS["sgd"](tf.float32)
        with pytest.raises(TypeError, match="skip_nonfinite must be True or False, got 'no'"):
            tf1_accum.build_accumulation(model.loss, opt, skip_nonfinite="no")
        with pytest.raises(TypeError, match="skip_nonfinite must be True or False"):
            tf1_accum.AccumulationOptimizer(opt, 2, skip_nonfinite=1)


def test_a_fixed_loss_scale_gets_the_guard_like_any_optimizer():
    batches = make_batches(tf.float32, False, 3, 4)
    with tf.Graph().as_default():
        model = Model(tf.float32, False)
        opt = v1.train.experimental.MixedPrecisionLossScaleOptimizer(
            v1.train.GradientDescentOptimizer(0.1), loss_scale=128.0
        )
        acc = tf1_accum.build_accumulation(model.loss, opt)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            before = values_by_name(sess, acc.var_list)
            feeds = [model.feed(batches[0]), model.feed(_poisoned(batches[1]))]
            tf1_accum.run_accumulation(sess, acc, feeds)
            assert sess.run(acc.skipped_windows) == 1
            after = values_by_name(sess, acc.var_list)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)


def test_dataset_loop_skips_a_zero_weight_window_and_goes_on():
    batches = make_batches(tf.float64, False, 4, 3)
    weights = np.array([0.0, 0.0, 1.0, 1.0])
    with tf.Graph().as_default():
        dataset = tf.data.Dataset.from_tensor_slices(
            (np.stack([b[0] for b in batches]), np.stack([b[1] for b in batches]), weights)
        )
        step = v1.train.get_or_create_global_step()
        acc = tf1_accum.build_dataset_accumulation(
            lambda b: Model(tf.float64, False, inputs=b[0], labels=b[1]).loss,
            OPTIMIZERS["sgd"](tf.float64),
            dataset,
            2,
            global_step=step,
            weight=lambda b: b[2],
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(acc.train_op)
            assert sess.run([step, acc.skipped_windows, acc.counter]) == [0, 1, 0]
            sess.run(acc.train_op)
            assert sess.run([step, acc.skipped_windows]) == [1, 1]
            got = values_by_name(sess, tf1_accum.plain_variables())
    expected = plain_training("sgd", tf.float64, False, [batches[2:]])[0]
    assert_same_values(got, expected, RTOL[tf.float64], "the window after the skipped one")


def _dynamic_loss_scaled_adam():
    return v1.train.experimental.MixedPrecisionLossScaleOptimizer(
        OPTIMIZERS["adam"](tf.float32), loss_scale="dynamic"
    )


def _loss_scaled_large_batch(batches):
    """Variables after one large-batch step of loss-scaled Adam, without the scale's."""
    with tf.Graph().as_default():
        model = Model(tf.float32, False)
        step = v1.train.get_or_create_global_step()
        # Its apply sits in a tf.cond of its own: with reference variables
        # under control flow v2, plain training builds only as version 1.
        with reference_control_flow(v1.global_variables()):
            train_op = _dynamic_loss_scaled_adam().minimize(model.loss, global_step=step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train_op, model.feed(concat(batches)))
            values = values_by_name(sess, v1.global_variables())
    return {k: v for k, v in values.items() if k not in ("current_loss_scale", "good_steps")}


def test_dynamic_loss_scale_through_build_accumulation_and_the_helper():
    """An overflowing window lowers the scale and is skipped; the next one trains.

    float32: the loss-scale optimizer scales in float32 only.
    """
    batches = make_batches(tf.float32, False, 6, 4)
    inputs, labels = batches[1]
    overflowing = (inputs, np.full_like(labels, np.inf))  # an Inf gradient
    good = batches[3:]
    with tf.Graph().as_default():
        model = Model(tf.float32, False)
        step = v1.train.get_or_create_global_step()
        opt = _dynamic_loss_scaled_adam()
        scale = opt._loss_scale()
        acc = tf1_accum.build_accumulation(model.loss, opt, global_step=step)
        plain = tf1_accum.plain_variables()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            start_scale = sess.run(scale)
            before = values_by_name(sess, plain)
            feeds = [model.feed(b) for b in (batches[0], overflowing, batches[2])]
            tf1_accum.run_accumulation(sess, acc, feeds)
            after_bad = values_by_name(sess, plain)
            assert sess.run([scale, acc.skipped_windows, acc.counter]) == [start_scale / 2, 1, 0]
            tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in good])
            after_good = values_by_name(sess, plain)
            assert sess.run([scale, acc.skipped_windows]) == [start_scale / 2, 1]
    # Large-batch training through the same optimizer, which names Adam's
    # beta powers its own way. The scale halved is a power of two: exact.
    expected = _loss_scaled_large_batch(good)
    # Skipped: weights, Adam's slots and beta powers, global_step all as they
    # were (the loss scale's own variables moved, as checked above).
    trained = {name: before[name] for name in expected}
    assert any(name.endswith("/Adam") for name in trained)
    assert_same_values(after_bad, trained, 0.0, "the overflowing window")
    assert_same_values(
        after_good, expected, RTOL_TIGHT[tf.float32], "the window after the overflow"
    )
    assert after_good["global_step"] == 1


def _lars(gradient, variable, window):
    """Each gradient scaled to norm 1: NaN where a variable's gradient is 0."""
    return gradient / tf.norm(gradient)


def _gated_loss(batch):
    """A linear model, and a variable whose gradient is the mean of a gate column."""
    x, gate, y = batch
    w = v1.get_variable("w", initializer=np.array([[1.0], [-2.0]]))
    bias = v1.get_variable("bias", initializer=np.array([0.5]))
    return tf.reduce_mean((tf.matmul(x, w) - y) ** 2) + tf.reduce_mean(gate) * bias[0]


def _trained():
    return [v for v in tf1_accum.plain_variables() if v.op.name in ("w", "bias")]


@pytest.mark.parametrize("way", (*WAYS, BY_NAME["hook"]), ids=str)
def test_a_transform_that_returns_a_nan_skips_the_window(way):
    """The check reads what the transforms return: a window whose mean is finite but
    whose transformed gradient is not (LARS on a zero gradient) is skipped and counted;
    the next window is applied as plain training with the same transform would."""
    rng = np.random.RandomState(4)

    def batch(gate):
        return rng.randn(3, 2), np.full((3, 1), gate), rng.randn(3, 1)

    windows = [[batch(0.0), batch(0.0)], [batch(1.0), batch(2.0)]]
    with tf.Graph().as_default():
        inputs = tuple(v1.placeholder(tf.float64, [None, n]) for n in (2, 1, 1))
        sgd = v1.train.GradientDescentOptimizer(0.1)
        pairs = sgd.compute_gradients(_gated_loss(inputs))
        train_op = sgd.apply_gradients([(_lars(g, v, None), v) for g, v in pairs])
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            start = values_by_name(sess, v1.global_variables())
            sess.run(train_op, dict(zip(inputs, concat(windows[1]))))
            expected = values_by_name(sess, v1.global_variables())
    with tf.Graph().as_default():
        built = way.build(
            _gated_loss,
            v1.train.GradientDescentOptimizer(0.1),
            [b for window in windows for b in window],
            2,
            transform=_lars,
        )
        with way.session() as sess:
            way.run_window(sess, built, windows[0])
            assert sess.run(built.skipped_windows) == 1
            assert_same_values(values_by_name(sess, _trained()), start, 0.0, f"{way}")
            way.run_window(sess, built, windows[1])
            assert sess.run(built.skipped_windows) == 1
            got = values_by_name(sess, _trained())
    assert_same_values(got, expected, RTOL[tf.float64], f"{way}: the window after the skip")
