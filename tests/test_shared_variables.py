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

v1 = tf.compat.v1

DTYPE = tf.float64
STEPS = 3
WINDOWS = 3
WAYS = ("build_accumulation", "AccumulationOptimizer", "plain minimize")


def _losses(model):
    """Two tasks on every variable of ``model``: its loss, and one with weight decay."""
    decay = tf.add_n([tf.nn.l2_loss(v) for v in v1.trainable_variables()])
    return model.loss, 0.5 * model.loss + 0.01 * decay


def _way(way, loss, step):
    """Builds ``way`` on ``loss``; returns ``run_window(sess, model, batches)``."""
    optimizer = v1.train.AdamOptimizer(0.05)
    if way == "build_accumulation":
        acc = tf1_accum.build_accumulation(loss, optimizer, global_step=step)

        def run(sess, model, batches):
            tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in batches])

    elif way == "AccumulationOptimizer":
        train_op = tf1_accum.AccumulationOptimizer(optimizer, steps=STEPS).minimize(
            loss, global_step=step
        )

        def run(sess, model, batches):
            for batch in batches:
                sess.run(train_op, model.feed(batch))

    else:
        train_op = optimizer.minimize(loss, global_step=step)

        def run(sess, model, batches):
            sess.run(train_op, model.feed(concat(batches)))

    return run


def _train(first, second, windows):
    """Trains the two tasks in turns, a window each; returns the plain variables' values."""
    with tf.Graph().as_default():
        model = Model(DTYPE, sparse=False)
        step = v1.train.get_or_create_global_step()
        loss_a, loss_b = _losses(model)
        run_a, run_b = _way(first, loss_a, step), _way(second, loss_b, step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            values = []
            for batches_a, batches_b in windows:
                run_a(sess, model, batches_a)
                run_b(sess, model, batches_b)
                values.append(values_by_name(sess, tf1_accum.plain_variables()))
    return values


@pytest.mark.parametrize("second", WAYS)
@pytest.mark.parametrize("first", WAYS[:2])
def test_two_optimizers_of_one_class_on_shared_variables_each_train_exactly(first, second):
    batches = make_batches(DTYPE, False, 2 * STEPS * WINDOWS, 4)
    windows = [
        (batches[i : i + STEPS], batches[i + STEPS : i + 2 * STEPS])
        for i in range(0, len(batches), 2 * STEPS)
    ]
    expected = _train("plain minimize", "plain minimize", windows)
    got = _train(first, second, windows)
    assert {"w1/Adam_2", "w1/Adam_3", "beta1_power_1"} <= set(expected[0])
    for index, (want, have) in enumerate(zip(expected, got)):
        assert set(have) == set(want)
        assert_same_values(have, want, RTOL[DTYPE], f"{first} then {second}, window {index}")
    assert got[-1]["global_step"] == 2 * WINDOWS
