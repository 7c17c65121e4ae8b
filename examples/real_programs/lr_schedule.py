"""A learning-rate schedule counted in loop iterations, migrated to accumulation.

A trainer written for small batches decays its learning rate with
``tf.compat.v1.train.exponential_decay(..., global_step, decay_steps=...)``,
``decay_steps`` counted in loop iterations: before accumulation one iteration
was one batch and one ``global_step``. With accumulation an iteration is a
micro-batch, and ``global_step`` counts updates, one per N micro-batches: the
same ``decay_steps`` then decays N times slower. The fix divides
``decay_steps`` by N (a float division keeps a staircase schedule's steps
where they were in examples seen).

The script trains a small float64 model three ways on the same data: the
migrated trainer with its ``decay_steps`` unchanged (the bug), the same with
``decay_steps / N`` (the fix), and plain large-batch training (one
``minimize`` per N x B examples) with the schedule in updates. It prints the
largest relative difference of each from large-batch training and exits
non-zero when the fixed one differs by more than 1e-10.

Run it with ``python examples/real_programs/lr_schedule.py``.
"""

import os

# TensorFlow's C++ log stays quiet; TF_CPP_MIN_LOG_LEVEL=0 shows all of it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse
import sys

import numpy as np
import tensorflow as tf

import tf1_accum

v1 = tf.compat.v1

MICRO_BATCHES = 4  # N: micro-batches per update
MICRO_BATCH = 8  # B: examples per micro-batch
DECAY_STEPS = 6  # the trainer's decay_steps: loop iterations (batches of B) per decay
DECAY_RATE = 0.5
TOLERANCE = 1e-10


def make_data(updates, seed=0):
    """Micro-batches ``(x, y)`` for ``updates`` windows of N, from a fixed seed."""
    rng = np.random.RandomState(seed)
    batches = []
    for _ in range(updates * MICRO_BATCHES):
        x = rng.randn(MICRO_BATCH, 3)
        y = np.sin(x.sum(axis=1, keepdims=True)) + 0.1 * rng.randn(MICRO_BATCH, 1)
        batches.append((x, y))
    return batches


def model():
    """A two-layer float64 network: returns (x, y, loss), the mean over the batch."""
    rng = np.random.RandomState(1)
    x = v1.placeholder(tf.float64, [None, 3], name="x")
    y = v1.placeholder(tf.float64, [None, 1], name="y")
    w1 = v1.get_variable("w1", initializer=rng.randn(3, 5))
    w2 = v1.get_variable("w2", initializer=rng.randn(5, 1))
    loss = tf.reduce_mean((tf.matmul(tf.tanh(tf.matmul(x, w1)), w2) - y) ** 2)
    return x, y, loss


def learning_rate(global_step, decay_steps):
    """The trainer's schedule, unchanged: only ``decay_steps`` is at stake."""
    return v1.train.exponential_decay(
        tf.constant(0.1, tf.float64),
        global_step,
        decay_steps,
        DECAY_RATE,
        staircase=True,
        name="learning_rate",
    )


def train_accumulating(batches, decay_steps):
    """The migrated trainer: N micro-batches per update, ``global_step`` counts updates."""
    with tf.Graph().as_default():
        x, y, loss = model()
        global_step = v1.train.get_or_create_global_step()
        lr = learning_rate(global_step, decay_steps)
        acc = tf1_accum.build_accumulation(
            loss, v1.train.MomentumOptimizer(lr, 0.9), global_step=global_step
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            rates = []
            for start in range(0, len(batches), MICRO_BATCHES):
                window = batches[start : start + MICRO_BATCHES]
                rates.append(float(sess.run(lr)))
                tf1_accum.run_accumulation(sess, acc, [{x: bx, y: by} for bx, by in window])
            return sess.run(acc.var_list), rates


def train_large_batch(batches, decay_steps_in_updates):
    """The reference: one plain ``minimize`` per N x B examples, the schedule in updates."""
    with tf.Graph().as_default():
        x, y, loss = model()
        global_step = v1.train.get_or_create_global_step()
        lr = learning_rate(global_step, decay_steps_in_updates)
        train_op = v1.train.MomentumOptimizer(lr, 0.9).minimize(loss, global_step=global_step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            rates = []
            for start in range(0, len(batches), MICRO_BATCHES):
                window = batches[start : start + MICRO_BATCHES]
                rates.append(float(sess.run(lr)))
                big_x, big_y = (np.concatenate(part) for part in zip(*window))
                sess.run(train_op, {x: big_x, y: big_y})
            return sess.run(v1.trainable_variables()), rates


def largest_relative_difference(got, want):
    return max(float(np.abs(g - w).max() / np.abs(w).max()) for g, w in zip(got, want))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=12)
    args = parser.parse_args(argv)
    batches = make_data(args.updates)

    # [before] decay_steps as the small-batch trainer had it, in loop iterations.
    before, before_rates = train_accumulating(batches, decay_steps=DECAY_STEPS)
    # [fix] global_step counts updates now: N loop iterations make one.
    fixed, fixed_rates = train_accumulating(batches, decay_steps=DECAY_STEPS / MICRO_BATCHES)
    # [end]
    want, want_rates = train_large_batch(batches, DECAY_STEPS / MICRO_BATCHES)

    result = {
        "before": largest_relative_difference(before, want),
        "fixed": largest_relative_difference(fixed, want),
        "rates": {"before": before_rates, "fixed": fixed_rates, "large batch": want_rates},
    }
    print(f"learning rate per update, before:      {np.round(before_rates, 5).tolist()}")
    print(f"learning rate per update, fixed:       {np.round(fixed_rates, 5).tolist()}")
    print(f"learning rate per update, large batch: {np.round(want_rates, 5).tolist()}")
    print(f"largest relative difference from large-batch training, before: {result['before']:.3g}")
    print(f"largest relative difference from large-batch training, fixed:  {result['fixed']:.3g}")
    return result


if __name__ == "__main__":
    v1.disable_eager_execution()
    sys.exit(0 if main()["fixed"] <= TOLERANCE else 1)
