"""Summaries written once per update, not once per micro-batch.

A TF1 loop fetches its merged summary with the train op and writes it with a
``FileWriter`` at ``global_step``. With ``tf1_accum.AccumulationOptimizer``
most runs only accumulate: the loop fetches ``applied`` too and writes the
summary only in the runs that applied an update. The gradient norm written is
``global_norm``, the norm of the window's mean gradient, which is the norm of
the large batch's gradient.

The script trains with accumulation, writing summaries, and checks that the
event file holds one value per update, at steps 1, 2, ..., equal to the
gradient norms of large-batch training.

Run:  python examples/real_programs/summaries.py --logdir /tmp/per_update
"""

import os

# TensorFlow's C++ log stays quiet; TF_CPP_MIN_LOG_LEVEL=0 shows all of it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse
import sys
import tempfile

import numpy as np
import tensorflow as tf

import tf1_accum

v1 = tf.compat.v1

FEATURES = 5
TOLERANCE = 1e-10  # the norms fetched, in float64
SUMMARY_TOLERANCE = 1e-6  # the values in the event file, stored as float32


def make_data(examples, seed):
    rng = np.random.RandomState(seed)
    x = rng.randn(examples, FEATURES)
    return x, x @ rng.randn(FEATURES, 1) + 0.5 * rng.randn(examples, 1)


def build_model(x, y):
    w = v1.get_variable("w", initializer=np.zeros((FEATURES, 1)))
    b = v1.get_variable("b", initializer=np.zeros(1))
    return tf.reduce_mean((tf.matmul(x, w) + b - y) ** 2)


def train_with_summaries(logdir, steps, micro_batch, updates, seed=1):
    """Accumulating training that writes a summary per update.

    Returns the gradient norms fetched in the runs that applied an update.
    """
    x_data, y_data = make_data(steps * micro_batch * updates, seed)
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float64, [None, FEATURES])
        y = v1.placeholder(tf.float64, [None, 1])
        loss = build_model(x, y)
        global_step = v1.train.get_or_create_global_step()
        opt = tf1_accum.AccumulationOptimizer(v1.train.AdamOptimizer(0.1), steps)
        train_op = opt.minimize(loss, global_step=global_step)
        v1.summary.scalar("gradient_norm", opt.window.global_norm)
        summary_op = v1.summary.merge_all()
        writer = v1.summary.FileWriter(logdir)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            norms = []
            for start in range(0, len(x_data), micro_batch):
                feed = {
                    x: x_data[start : start + micro_batch],
                    y: y_data[start : start + micro_batch],
                }
                fetches = [train_op, opt.window.applied, summary_op, opt.window.global_norm]
                _, applied, summary, norm = sess.run(fetches, feed)
                if applied:  # the one edit: write only what an update produced
                    writer.add_summary(summary, sess.run(global_step))
                    norms.append(norm)
        writer.close()
        return norms


def large_batch_norms(steps, micro_batch, updates, seed=1):
    """The gradient norm of each large-batch step."""
    x_data, y_data = make_data(steps * micro_batch * updates, seed)
    batch = steps * micro_batch
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float64, [None, FEATURES])
        y = v1.placeholder(tf.float64, [None, 1])
        loss = build_model(x, y)
        opt = v1.train.AdamOptimizer(0.1)
        grads_and_vars = opt.compute_gradients(loss)
        norm = tf.linalg.global_norm([g for g, _ in grads_and_vars])
        train_op = opt.apply_gradients(grads_and_vars)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            norms = []
            for start in range(0, len(x_data), batch):
                feed = {x: x_data[start : start + batch], y: y_data[start : start + batch]}
                norms.append(sess.run([train_op, norm], feed)[1])
    return norms


def read_events(logdir, tag):
    """{step: value} of ``tag`` in the event files under ``logdir``."""
    values = {}
    for path in tf.io.gfile.glob(f"{logdir}/events.out.tfevents.*"):
        for event in v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == tag:
                    assert event.step not in values, f"two values at step {event.step}"
                    values[event.step] = value.simple_value
    return values


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--logdir", default=None, help="default: a new temporary directory")
    parser.add_argument("--steps", type=int, default=4, help="micro-batches per update")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--updates", type=int, default=5)
    args = parser.parse_args(argv)
    logdir = args.logdir or tempfile.mkdtemp(prefix="per_update_")
    fetched = train_with_summaries(logdir, args.steps, args.micro_batch, args.updates)
    written = read_events(logdir, "gradient_norm")
    expected = large_batch_norms(args.steps, args.micro_batch, args.updates)
    steps_ok = len(fetched) == args.updates and sorted(written) == list(range(1, args.updates + 1))
    worst = max(abs(got - want) / want for got, want in zip(fetched, expected))
    worst_written = max(
        abs(written.get(k + 1, np.inf) - want) / want for k, want in enumerate(expected)
    )
    print(f"summaries written at steps {sorted(written)}")
    print(f"largest relative difference from the large-batch gradient norms: {worst:.3g}")
    return {
        "steps_ok": steps_ok,
        "max_rel_diff": worst,
        "max_rel_diff_written": worst_written,
        "fetched": fetched,
        "expected": expected,
        "written": written,
    }


if __name__ == "__main__":
    tf.compat.v1.disable_v2_behavior()
    result = main(sys.argv[1:])
    ok = result["max_rel_diff"] <= TOLERANCE
    ok = ok and result["max_rel_diff_written"] <= SUMMARY_TOLERANCE
    sys.exit(0 if result["steps_ok"] and ok else 1)
