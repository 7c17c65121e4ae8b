"""Several optimizers of one class on shared variables: two tasks, a GAN's two Adams.

Plain TensorFlow names the second optimizer's slots ``w/Adam_2`` (after
``w/Adam`` and ``w/Adam_1``) and its beta powers ``beta1_power_1``. Each way
in builds its optimizer's state with exactly those names, whichever comes
first, so each of two accumulations sharing variables trains exactly as its
plain counterpart, and a checkpoint interchanges with plain training.
"""

import importlib.util
import pathlib

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
from _ways import WAYS
from _ways import placeholders_for

v1 = tf.compat.v1

DTYPE = tf.float64
STEPS = 3
WINDOWS = 3


class _Plain:
    """Plain ``minimize`` in the shape of a way in: a window is one step on its batches joined."""

    name = "plain minimize"

    def __repr__(self):
        return self.name

    def build(self, model_fn, optimizer, data, steps, *, global_step=None):
        inputs = placeholders_for(data[0])
        return inputs, optimizer.minimize(model_fn(inputs), global_step=global_step)

    def run_window(self, sess, built, window):
        inputs, train_op = built
        sess.run(train_op, dict(zip(inputs, concat(window))))


PLAIN = _Plain()


def _task(index):
    """The loss of task ``index`` on the shared model, built on a micro-batch's tensors.

    Task 0 is the model's loss, task 1 the same with weight decay.
    """

    def loss(inputs):
        with v1.variable_scope(v1.get_variable_scope(), reuse=v1.AUTO_REUSE):
            model = Model(DTYPE, sparse=False, inputs=inputs[0], labels=inputs[1])
        decay = tf.add_n([tf.nn.l2_loss(v) for v in v1.trainable_variables()])
        return (model.loss, 0.5 * model.loss + 0.01 * decay)[index]

    return loss


def _train(first, second, windows):
    """Trains the two tasks in turns, a window each; returns the plain variables' values."""
    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        built = [
            way.build(
                _task(i),
                v1.train.AdamOptimizer(0.05),
                [w[i][j] for w in windows for j in range(STEPS)],
                STEPS,
                global_step=step,
            )
            for i, way in enumerate((first, second))
        ]
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            values = []
            for batches in windows:
                for i, way in enumerate((first, second)):
                    way.run_window(sess, built[i], batches[i])
                values.append(values_by_name(sess, tf1_accum.plain_variables()))
    return values


@pytest.mark.parametrize("second", [*WAYS, PLAIN], ids=str)
@pytest.mark.parametrize("first", WAYS, ids=str)
def test_two_optimizers_of_one_class_on_shared_variables_each_train_exactly(first, second):
    batches = make_batches(DTYPE, False, 2 * STEPS * WINDOWS, 4)
    windows = [
        (batches[i : i + STEPS], batches[i + STEPS : i + 2 * STEPS])
        for i in range(0, len(batches), 2 * STEPS)
    ]
    expected = _train(PLAIN, PLAIN, windows)
    got = _train(first, second, windows)
    assert {"w1/Adam_2", "w1/Adam_3", "beta1_power_1"} <= set(expected[0])
    for index, (want, have) in enumerate(zip(expected, got)):
        assert set(have) == set(want)
        assert_same_values(have, want, RTOL[DTYPE], f"{first} then {second}, window {index}")
    assert got[-1]["global_step"] == 2 * WINDOWS


def _gan_example():
    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "real_programs"
    spec = importlib.util.spec_from_file_location("real_programs_gan", path / "gan.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_gan_loop_left_as_it_was_stops_before_mixing_a_window():
    """Discriminator, generator, generator per micro-batch: the generator's run stops."""
    gan = _gan_example()
    (real, noises), steps = gan.make_batches(1, 12)[0], 3
    with tf.Graph().as_default():
        built = gan.build(steps)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            before = values_by_name(sess, v1.trainable_variables())
            with pytest.raises(
                tf.errors.InvalidArgumentError,
                match=r"train op Accumulation_1 \(training generator/b, generator/w\) ran while "
                r"the window of Accumulation \(training discriminator/b1, discriminator/w1, "
                r"\.\.\.\) is partly full, and the two are coupled: Accumulation trains "
                r"discriminator/b1, which the loss of Accumulation_1 reads.*This micro-batch "
                r"was not accumulated",
            ):
                gan.run_unchanged(sess, built, real, noises, steps)
            # The generator's micro-batch was not added; nothing was applied.
            assert sess.run([built.d_opt.window.counter, built.g_opt.window.counter]) == [1, 0]
            after = values_by_name(sess, v1.trainable_variables())
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)


def test_windows_that_share_no_variable_may_interleave():
    """Two models, a wrapper each, run in turns per micro-batch: each trains as its large batch."""
    batches = make_batches(DTYPE, False, 2 * STEPS * WINDOWS, 4)

    def train(steps):
        with tf.Graph().as_default():
            models, train_ops = [], []
            for name in ("first", "second"):
                with v1.variable_scope(name):
                    model = Model(DTYPE, False)
                opt = v1.train.AdamOptimizer(0.05)
                if steps > 1:
                    opt = tf1_accum.AccumulationOptimizer(opt, steps)
                models.append(model)
                train_ops.append(opt.minimize(model.loss, var_list=v1.trainable_variables(name)))
            with v1.Session() as sess:
                sess.run(v1.global_variables_initializer())
                for start in range(0, len(batches), 2 * STEPS):
                    window = batches[start : start + 2 * STEPS]
                    runs = [window[:STEPS], window[STEPS:]]
                    if steps == 1:  # plain: one step on each model's batches joined
                        runs = [[concat(part)] for part in runs]
                    for first, second in zip(*runs):
                        sess.run(train_ops[0], models[0].feed(first))
                        sess.run(train_ops[1], models[1].feed(second))
                return values_by_name(sess, v1.trainable_variables())

    assert_same_values(train(STEPS), train(1), RTOL[DTYPE], "two models in turns")
