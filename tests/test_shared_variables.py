"""Several optimizers of one class on shared variables: two tasks, a GAN's two Adams.

Plain TensorFlow names the second optimizer's slots ``w/Adam_2`` (after
``w/Adam`` and ``w/Adam_1``) and its beta powers ``beta1_power_1``. Each way
in builds its optimizer's state with exactly those names, whichever comes
first, so each of two accumulations sharing variables trains exactly as its
plain counterpart, and a checkpoint interchanges with plain training.
"""

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
