"""Migrating a Horovod program from ``backward_passes_per_step`` to tf1_accum.

A TF1 program under ``horovodrun`` that accumulates with Horovod's own
``hvd.DistributedOptimizer(opt, backward_passes_per_step=N)`` applies the
*sum* of its N passes (``average_aggregated_gradients`` is off by default),
so its update is N times the large batch's with SGD, and its
``global_step`` advances on every pass. The migration changes four lines:

    # before                                     # after
    opt = hvd.DistributedOptimizer(              cross = tf1_accum.HorovodAllReduce()
        opt, backward_passes_per_step=N)         acc = tf1_accum.build_accumulation(
    train_op = opt.minimize(loss, global_step)       loss, opt, global_step=step,
                                                     cross_replica=cross)
    hooks = [hvd.BroadcastGlobalVariablesHook(0)]  hooks = [cross.broadcast_hook()]
    for feed in micro_batches:                   for window in windows:
        sess.run(train_op, feed)                     tf1_accum.run_accumulation(sess, acc, window)

Each worker still trains on its own shard; every update is now the mean over
the N micro-batches of every worker, one all-reduce per window, and
``global_step`` counts updates (so schedules and ``StopAtStepHook`` keep their
meaning). This script trains both programs on the same data, from the same
start, and prints each one's result on every rank.

Run:  horovodrun -np 2 -H localhost:2 --gloo python examples/horovod_migration.py
"""

import os

import _tensorflow_log  # noqa: F401  (before TensorFlow: its C++ log stays quiet)
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

import tf1_accum

v1 = tf.compat.v1

FEATURES, MICRO_BATCH, STEPS, UPDATES = 8, 16, 3, 4  # N = STEPS


def model(seed):
    """A linear regression; ``seed`` differs per rank, as random initializers do."""
    x = v1.placeholder(tf.float32, [None, FEATURES])
    y = v1.placeholder(tf.float32, [None, 1])
    init = np.random.RandomState(seed).randn(FEATURES, 1).astype(np.float32)
    w = v1.get_variable("w", initializer=init)
    loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2)
    return x, y, w, loss


def my_micro_batches(rank, size):
    """This rank's shard: UPDATES windows of STEPS micro-batches."""
    rng = np.random.RandomState(0)
    truth = rng.randn(FEATURES, 1)
    batches = []
    for _ in range(UPDATES * STEPS * size):
        x = rng.randn(MICRO_BATCH, FEATURES)
        batches.append((x, x @ truth + 0.1 * rng.randn(MICRO_BATCH, 1)))
    return batches[rank::size]


def before(batches):
    """The program as it was: Horovod accumulates the N passes itself."""
    with tf.Graph().as_default():
        x, y, w, loss = model(seed=hvd.rank())
        step = v1.train.get_or_create_global_step()
        opt = v1.train.GradientDescentOptimizer(0.05)
        opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=STEPS)
        train_op = opt.minimize(loss, global_step=step)
        # (hvd.BroadcastGlobalVariablesHook(0) in a MonitoredTrainingSession,
        # where TensorFlow still has tf.estimator; this op elsewhere.)
        sync = hvd.broadcast_global_variables(0)
        with v1.Session() as sess:
            sess.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
            sess.run(sync)
            for b in batches:
                sess.run(train_op, {x: b[0], y: b[1]})
            return sess.run([w, step])


def after(batches):
    """The same program with tf1_accum: the large batch's update, once per window."""
    with tf.Graph().as_default():
        x, y, w, loss = model(seed=hvd.rank())
        step = v1.train.get_or_create_global_step()
        opt = v1.train.GradientDescentOptimizer(0.05)
        cross = tf1_accum.HorovodAllReduce()
        acc = tf1_accum.build_accumulation(loss, opt, global_step=step, cross_replica=cross)
        hooks = [cross.broadcast_hook()]
        with v1.train.MonitoredTrainingSession(hooks=hooks, log_step_count_steps=None) as sess:
            for start in range(0, len(batches), STEPS):
                window = [{x: b[0], y: b[1]} for b in batches[start : start + STEPS]]
                tf1_accum.run_accumulation(sess, acc, window)
            return sess.run([w, step])


def main():
    if os.environ.get("TF1_ACCUM_GRAPH_MODE", "v1") == "v1":
        v1.disable_v2_behavior()
    else:
        v1.disable_eager_execution()
    hvd.init()
    batches = my_micro_batches(hvd.rank(), hvd.size())
    for label, train in (("before", before), ("after", after)):
        w, step = train(batches)
        print(f"{label}: global_step {step}, w {np.array2string(w.ravel(), precision=5)}")


if __name__ == "__main__":
    main()
