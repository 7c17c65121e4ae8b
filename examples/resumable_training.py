"""Resumable training: accumulate, checkpoint anywhere, resume after a crash.

A model (an embedding table and an MLP) trains by accumulation over windows
of N micro-batches, with a checkpoint every few micro-batches, wherever that
falls: inside a window, between the last micro-batch and the apply, or (with
--save-after-apply) right after an apply. Killed at any point and run again
with the same arguments, it resumes from its last checkpoint and ends with
exactly the variables (and optimizer slots, and global_step) of a run that was
never interrupted, without applying any window twice.

What makes that work, and what to copy into your own loop:

1. The data position is a variable, saved with the model: ``position``
   counts the micro-batches consumed, and it advances in the same
   ``session.run`` as ``accum_op``, so a checkpoint never holds one without
   the other.
2. A default ``Saver`` saves tf1_accum's accumulators and counter too, so a
   checkpoint inside a window resumes the window.
3. Whether an apply is due comes from the restored counter, not from the
   position: a checkpoint taken after the N-th micro-batch but before the
   apply restores a full window (counter == N), which is applied once, first
   thing. The apply increments global_step and resets the counter in one
   ``session.run``, so a checkpoint holds either both or neither.

The data is made here from a fixed seed; micro-batch p is rows
[p * B, (p + 1) * B) of it, so the position alone says what to feed next.

Run:  python examples/resumable_training.py --checkpoint-dir /tmp/resumable
To try a crash: add --simulate-crash-after-micro-batch 11 (the process kills
itself with SIGKILL there), then run again without it: it resumes.
"""

import argparse
import os
import signal
import sys


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--steps", type=int, default=4, help="micro-batches per window (N)")
    parser.add_argument("--micro-batch", type=int, default=8, help="examples per micro-batch")
    parser.add_argument("--windows", type=int, default=4, help="windows (updates) in all")
    parser.add_argument(
        "--save-every", type=int, default=3, help="checkpoint after every k-th micro-batch"
    )
    parser.add_argument(
        "--save-after-apply", action="store_true", help="also checkpoint right after each apply"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--simulate-crash-after-micro-batch",
        type=int,
        metavar="P",
        help="kill this process with SIGKILL once the P-th micro-batch is accumulated",
    )
    parser.add_argument(
        "--simulate-crash-after-apply",
        type=int,
        metavar="W",
        help="kill this process with SIGKILL right after the W-th apply",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    parse_args(sys.argv[1:])  # --help and a usage error, without waiting for TensorFlow

import _tensorflow_log  # noqa: E402, F401  (before TensorFlow: its C++ log stays quiet)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf1_accum  # noqa: E402

v1 = tf.compat.v1

VOCAB = 50
EMBEDDING = 4
FEATURES = 3
HIDDEN = 8


def make_data(examples, seed):
    """Ids, dense features and regression targets, from a fixed seed."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, VOCAB, size=examples).astype(np.int32)
    features = rng.randn(examples, FEATURES).astype(np.float32)
    targets = rng.randn(examples, 1).astype(np.float32)
    return ids, features, targets


def build_model(seed):
    """Placeholders, seeded variables and the mean loss of one micro-batch."""
    rng = np.random.RandomState(seed)
    ids = v1.placeholder(tf.int32, [None], name="ids")
    features = v1.placeholder(tf.float32, [None, FEATURES], name="features")
    targets = v1.placeholder(tf.float32, [None, 1], name="targets")
    table = v1.get_variable("embedding", initializer=rng.randn(VOCAB, EMBEDDING).astype(np.float32))
    w1 = v1.get_variable(
        "w1", initializer=(0.5 * rng.randn(EMBEDDING + FEATURES, HIDDEN)).astype(np.float32)
    )
    b1 = v1.get_variable("b1", initializer=np.zeros(HIDDEN, np.float32))
    w2 = v1.get_variable("w2", initializer=(0.5 * rng.randn(HIDDEN, 1)).astype(np.float32))
    inputs = tf.concat([tf.nn.embedding_lookup(table, ids), features], axis=1)
    prediction = tf.matmul(tf.tanh(tf.matmul(inputs, w1) + b1), w2)
    loss = tf.reduce_mean((prediction - targets) ** 2)
    return (ids, features, targets), loss


def _crash():
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv=None):
    """Trains (or resumes) to the end; returns a summary and the final variables.

    Returns:
        A dict: ``resumed_from`` (None, or the restored position, counter and
        global_step), ``applies`` (windows applied by this process) and
        ``variables`` ({name: value} of every global variable at the end).
    """
    args = parse_args(argv)
    total = args.steps * args.windows
    ids, features, targets = make_data(total * args.micro_batch, args.seed + 1)

    with tf.Graph().as_default():
        (ids_in, features_in, targets_in), loss = build_model(args.seed)
        global_step = v1.train.get_or_create_global_step()
        acc = tf1_accum.build_accumulation(
            loss, v1.train.AdamOptimizer(0.05), global_step=global_step
        )
        # The data position, saved with the model, advancing with accum_op.
        position = v1.Variable(0, dtype=tf.int64, trainable=False, name="micro_batch_position")
        accumulate = tf.group(acc.accum_op, position.assign_add(1))
        saver = v1.train.Saver(max_to_keep=3)
        os.makedirs(args.checkpoint_dir, exist_ok=True)

        def save(tag):
            saver.save(sess, os.path.join(args.checkpoint_dir, f"model-{tag}"))

        def feed(p):
            rows = slice(p * args.micro_batch, (p + 1) * args.micro_batch)
            return {ids_in: ids[rows], features_in: features[rows], targets_in: targets[rows]}

        with v1.Session() as sess:
            resumed_from = None
            latest = tf.train.latest_checkpoint(args.checkpoint_dir)
            if latest:
                saver.restore(sess, latest)
                resumed_from = dict(
                    zip(
                        ("position", "counter", "global_step"),
                        (int(v) for v in sess.run([position, acc.counter, global_step])),
                    )
                )
                print(f"resumed from {os.path.basename(latest)}: {resumed_from}")
            else:
                sess.run(v1.global_variables_initializer())

            done, pending = (int(v) for v in sess.run([position, acc.counter]))
            applies = 0
            while True:
                if pending == args.steps:  # a full window, possibly just restored
                    sess.run(acc.apply_op)
                    pending = 0
                    applies += 1
                    step = int(sess.run(global_step))
                    print(f"applied window {step} after micro-batch {done}", flush=True)
                    if args.simulate_crash_after_apply == step:
                        _crash()
                    if args.save_after_apply:
                        save(f"{done}-applied")
                if done == total:
                    break
                sess.run(accumulate, feed(done))
                done += 1
                pending += 1
                if args.simulate_crash_after_micro_batch == done:
                    _crash()
                if done % args.save_every == 0:
                    save(str(done))

            variables = v1.global_variables()
            values = dict(zip([v.op.name for v in variables], sess.run(variables)))
            print(
                f"done: {done} micro-batches, global_step {values['global_step']}, "
                f"loss on the last micro-batch {sess.run(loss, feed(total - 1)):.6f}"
            )
    return {"resumed_from": resumed_from, "applies": applies, "variables": values}


if __name__ == "__main__":
    v1.disable_eager_execution()
    main()
