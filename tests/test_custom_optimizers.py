"""Optimizers not built like TensorFlow's own, through every way in.

BERT's ``AdamWeightDecayOptimizer`` and LAMB- or LARS-style optimizers
subclass ``tf.compat.v1.train.Optimizer`` but replace ``apply_gradients``: they
create their state inside it (``get_variable`` without reuse, ``tf.Variable``,
or the base class's slots), exclude variables from weight decay by name, and
ignore ``global_step`` or increment it themselves. The optimizers below are
written in those styles.
"""

import functools

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import RTOL
from _helpers import Model
from _helpers import assert_same_values
from _helpers import concat
from _helpers import make_batches
from _helpers import values_by_name
from _ways import BY_NAME
from _ways import WAYS

v1 = tf.compat.v1

DECAY_EXCLUDED = ("b1",)  # like BERT's ["LayerNorm", "layer_norm", "bias"]


def _decays(param, excluded=DECAY_EXCLUDED):
    return not any(part in param.op.name for part in excluded)


class AdamWeightDecay(v1.train.Optimizer):
    """BERT style: moments by ``get_variable`` (no reuse), no bias correction,
    decoupled weight decay, ``global_step`` ignored."""

    def __init__(self, learning_rate, weight_decay=0.01, beta_1=0.9, beta_2=0.999):
        super().__init__(False, "AdamWeightDecay")
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, 1e-6

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        assignments = []
        for grad, param in grads_and_vars:
            if grad is None:
                continue
            grad = tf.convert_to_tensor(grad)
            name_ = param.op.name
            m = v1.get_variable(
                name_ + "/adam_m",
                shape=param.shape.as_list(),
                dtype=param.dtype.base_dtype,
                trainable=False,
                initializer=tf.zeros_initializer(),
            )
            v = v1.get_variable(
                name_ + "/adam_v",
                shape=param.shape.as_list(),
                dtype=param.dtype.base_dtype,
                trainable=False,
                initializer=tf.zeros_initializer(),
            )
            next_m = self.beta_1 * m + (1.0 - self.beta_1) * grad
            next_v = self.beta_2 * v + (1.0 - self.beta_2) * tf.square(grad)
            update = next_m / (tf.sqrt(next_v) + self.epsilon)
            if _decays(param):
                update += self.weight_decay * param
            assignments += [
                param.assign(param - self.learning_rate * update),
                m.assign(next_m),
                v.assign(next_v),
            ]
        return tf.group(*assignments, name=name)


class Lamb(v1.train.Optimizer):
    """LAMB style: moments by ``tf.Variable`` (callable initial values), bias
    correction from ``global_step``, a per-layer trust ratio, and
    ``global_step`` incremented by the optimizer itself."""

    def __init__(self, learning_rate, weight_decay=0.01, beta_1=0.9, beta_2=0.99):
        super().__init__(False, "Lamb")
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, 1e-6

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        assignments = []
        for grad, param in grads_and_vars:
            grad = tf.convert_to_tensor(grad)
            dtype = param.dtype.base_dtype
            zeros = functools.partial(tf.zeros, param.shape.as_list(), dtype)
            m = v1.Variable(zeros, trainable=False, name=param.op.name + "/lamb_m")
            v = v1.Variable(zeros, trainable=False, name=param.op.name + "/lamb_v")
            t = tf.cast(global_step, dtype) + 1.0
            next_m = self.beta_1 * m + (1.0 - self.beta_1) * grad
            next_v = self.beta_2 * v + (1.0 - self.beta_2) * tf.square(grad)
            m_hat = next_m / (1.0 - tf.pow(tf.constant(self.beta_1, dtype), t))
            v_hat = next_v / (1.0 - tf.pow(tf.constant(self.beta_2, dtype), t))
            update = m_hat / (tf.sqrt(v_hat) + self.epsilon)
            if _decays(param):
                update += self.weight_decay * param
            w_norm, u_norm = tf.norm(param), tf.norm(update)
            ratio = tf.where(
                tf.logical_and(w_norm > 0, u_norm > 0), w_norm / u_norm, tf.ones_like(w_norm)
            )
            assignments += [
                param.assign(param - self.learning_rate * ratio * update),
                m.assign(next_m),
                v.assign(next_v),
            ]
        with tf.control_dependencies(assignments):
            return global_step.assign_add(1, name=name).op


class Lars(v1.train.Optimizer):
    """LARS style: momentum in the base class's slots, made inside
    ``apply_gradients``; a layer-wise rate; ``global_step`` ignored."""

    def __init__(self, learning_rate, momentum=0.9, weight_decay=0.001, eta=0.01):
        super().__init__(False, "Lars")
        self.learning_rate, self.momentum = learning_rate, momentum
        self.weight_decay, self.eta = weight_decay, eta

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        assignments = []
        for grad, param in grads_and_vars:
            grad = tf.convert_to_tensor(grad)
            velocity = self._zeros_slot(param, "momentum", self._name)
            decay = self.weight_decay if _decays(param) else 0.0
            w_norm, g_norm = tf.norm(param), tf.norm(grad)
            local = self.eta * w_norm / (g_norm + decay * w_norm)
            rate = self.learning_rate * tf.where(w_norm > 0, local, tf.ones_like(local))
            next_velocity = self.momentum * velocity + rate * (grad + decay * param)
            assignments += [velocity.assign(next_velocity), param.assign(param - next_velocity)]
        return tf.group(*assignments, name=name)


STYLES = {
    "bert": lambda: AdamWeightDecay(0.05),
    "lamb": lambda: Lamb(0.05),
    "lars": lambda: Lars(0.5),
    "adam": lambda: v1.train.AdamOptimizer(0.05),
}
# Optimizers whose apply_gradients leaves global_step alone: plain training
# increments it by hand, as BERT's loop does.
IGNORES_GLOBAL_STEP = {"bert", "lars"}
SIZES = (3, 3, 2)  # three windows, the last one short
STEPS = 3


def _plain(style, windows, sparse=False):
    """Large-batch training, one step per window; values at the start, then after each step."""
    with tf.Graph().as_default():
        model = Model(tf.float64, sparse)
        step = v1.train.get_or_create_global_step()
        train_op = STYLES[style]().minimize(model.loss, global_step=step)
        if style in IGNORES_GLOBAL_STEP:
            with tf.control_dependencies([train_op]):
                train_op = step.assign_add(1)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            values = [values_by_name(sess, v1.global_variables())]
            for window in windows:
                sess.run(train_op, model.feed(concat(window)))
                values.append(values_by_name(sess, v1.global_variables()))
    return values


def _accumulated(style, way, windows, sparse=False):
    """Trains through ``way``; values of the plain variables after each window.

    Asserts that no variable moves before a window's apply (where the way
    runs micro-batches one by one), and that the optimizer's state exists
    once, made outside any control flow.
    """
    with tf.Graph().as_default() as graph:
        step = v1.train.get_or_create_global_step()
        built = way.build(
            lambda b: Model(tf.float64, sparse, inputs=b[0], labels=b[1]).loss,
            STYLES[style](),
            [b for window in windows for b in window],
            STEPS,
            global_step=step,
        )
        names = [v.op.name for v in v1.global_variables()]
        assert len(names) == len(set(names)), names
        for v in v1.global_variables():
            assert v.graph is graph
            assert v.initializer._get_control_flow_context() is None, v.op.name
        plain = tf1_accum.plain_variables()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            values = []
            for w, window in enumerate(windows):
                before = values_by_name(sess, plain)

                def unmoved(w=w, before=before):
                    moved = values_by_name(sess, plain)
                    assert_same_values(moved, before, 0.0, f"window {w}, before apply")

                way.run_window(sess, built, window, between=unmoved)
                values.append(values_by_name(sess, plain))
    return values


@pytest.mark.parametrize("way", WAYS, ids=str)
@pytest.mark.parametrize("style", sorted(STYLES))
def test_equals_large_batch_training_and_global_step_counts_updates(style, way):
    batches = make_batches(tf.float64, False, sum(SIZES), 4)
    starts = np.cumsum((0,) + SIZES)
    windows = [batches[a:b] for a, b in zip(starts[:-1], starts[1:])]
    expected = _plain(style, windows)[1:]
    got = _accumulated(style, way, windows)
    for w, (values, want) in enumerate(zip(got, expected)):
        # The same variables, by name: the state exists once, named as plain
        # training names it, and global_step counts updates.
        assert sorted(values) == sorted(want), f"{style}, {way}: window {w}"
        assert_same_values(values, want, RTOL[tf.float64], f"{style}, {way}: window {w}")
        assert values["global_step"] == w + 1, f"{style}, {way}: window {w}"


@pytest.mark.parametrize("style", ["bert", "lamb", "lars"])
def test_sparse_gradients_through_the_optimizer(style):
    batches = make_batches(tf.float64, True, sum(SIZES), 4)
    starts = np.cumsum((0,) + SIZES)
    windows = [batches[a:b] for a, b in zip(starts[:-1], starts[1:])]
    expected = _plain(style, windows, sparse=True)[1:]
    got = _accumulated(style, BY_NAME["optimizer"], windows, sparse=True)
    for w, (values, want) in enumerate(zip(got, expected)):
        assert_same_values(values, want, RTOL[tf.float64], f"{style}, sparse: window {w}")
        assert values["global_step"] == w + 1


def _poisoned(batch):
    inputs, labels = batch
    return inputs, np.full_like(labels, np.nan)


@pytest.mark.parametrize("way", WAYS, ids=str)
@pytest.mark.parametrize("style", ["bert", "lamb", "adam"])
def test_a_skipped_window_moves_nothing_not_even_global_step(style, way):
    batches = make_batches(tf.float64, False, 2 * STEPS, 4)
    bad = [batches[0], _poisoned(batches[1]), batches[2]]
    good = batches[STEPS:]
    got = _accumulated(style, way, [bad, good])
    start, expected = _plain(style, [good])
    # After the skipped window nothing moved: weights, the optimizer's state,
    # global_step. The next window is then one large-batch step from the start.
    assert_same_values(got[0], start, 0.0, f"{style}, {way}: the skipped window")
    assert got[0]["global_step"] == 0
    assert_same_values(got[1], expected, RTOL[tf.float64], f"{style}, {way}: after the skip")
    assert got[1]["global_step"] == 1


class TensorInitialValue(v1.train.Optimizer):
    """Momentum state made with ``tf.Variable(tf.zeros_like(param))``."""

    def __init__(self):
        super().__init__(False, "TensorInitialValue")

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        updates = []
        for grad, param in grads_and_vars:
            velocity = v1.Variable(tf.zeros_like(param), trainable=False, name="velocity")
            updates.append(velocity.assign(0.9 * velocity + grad))
            updates.append(param.assign_sub(0.1 * velocity))
        return tf.group(*updates, name=name)


class NewStateEachCall(AdamWeightDecay):
    """Names its moments after a call counter: each call makes new state."""

    calls = 0

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        updates = []
        for grad, param in grads_and_vars:
            m = v1.get_variable(
                f"{param.op.name}/m_{self.calls}",
                shape=param.shape.as_list(),
                dtype=param.dtype.base_dtype,
                initializer=tf.zeros_initializer(),
                trainable=False,
            )
            updates.append(param.assign_sub(0.1 * m.assign(0.9 * m + grad)))
        self.calls += 1
        return tf.group(*updates, name=name)


def _build(way, opt):
    way.build(
        lambda b: Model(tf.float64, False, inputs=b[0], labels=b[1]).loss,
        opt,
        make_batches(tf.float64, False, 2, 3),
        2,
        global_step=v1.train.get_or_create_global_step(),
    )


@pytest.mark.parametrize("way", WAYS, ids=str)
def test_state_made_from_a_tensor_inside_the_apply_is_refused_at_build_time(way):
    with tf.Graph().as_default():
        with pytest.raises(
            ValueError,
            match=r"TensorInitialValue creates variable 'velocity' inside apply_gradients "
            r"from a tensor computed there .*Pass a callable instead",
        ):
            _build(way, TensorInitialValue())


@pytest.mark.parametrize("way", [BY_NAME["fused"], BY_NAME["optimizer"]], ids=str)
def test_different_state_in_each_build_is_refused_at_build_time(way):
    with tf.Graph().as_default():
        with pytest.raises(
            ValueError,
            match=r"NewStateEachCall creates different state each time its apply_gradients "
            r"is built: the first build created no variable 'w1/m_1'",
        ):
            _build(way, NewStateEachCall(0.1))


def test_a_model_variable_is_not_handed_to_a_later_build():
    """A later build gets only what the first one created, nothing else by name."""

    class ReadsAnotherVariable(AdamWeightDecay):
        calls = 0

        def apply_gradients(self, grads_and_vars, global_step=None, name=None):
            self.calls += 1
            if self.calls == 2:  # asks for a variable of the model itself
                with v1.variable_scope(v1.get_variable_scope(), reuse=True):
                    v1.get_variable("w2", dtype=tf.float64)
            return super().apply_gradients(grads_and_vars, global_step, name)

    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="the first build created no variable 'w2'"):
            _build(BY_NAME["optimizer"], ReadsAnotherVariable(0.1))


@pytest.mark.parametrize("way", [BY_NAME["fused"], BY_NAME["optimizer"]], ids=str)
@pytest.mark.parametrize("style", ["lamb", "adam"])
def test_an_optimizer_that_increments_global_step_advances_it_once_in_every_window(style, way):
    """Forward, gradients, the optimizer's increment and the library's share one run.

    global_step is read before the optimizer's own increment and written
    after it, in every one of many windows: never twice in one.
    """
    batches = make_batches(tf.float64, False, 20 * STEPS, 2)
    windows = [batches[i : i + STEPS] for i in range(0, len(batches), STEPS)]
    got = _accumulated(style, way, windows)
    assert [values["global_step"] for values in got] == list(range(1, 21))
