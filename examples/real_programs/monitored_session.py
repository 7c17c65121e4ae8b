"""A MonitoredTrainingSession loop that stops in the middle of a window and resumes.

The loop is the usual one: ``MonitoredTrainingSession`` with a checkpoint
directory and step-based checkpoints, ``StopAtStepHook``, ``StepCounterHook``,
micro-batches fed through placeholders. The optimizer is wrapped in
``tf1_accum.AccumulationOptimizer``, and its ``make_session_run_hook()`` joins
the hooks: when the session closes in the middle of a window (here, the input
of the first run ends there), the final checkpoint holds that partial window,
and the run resumed from it ends bit-identical to an uninterrupted run.

The script trains three times (uninterrupted; stopped mid-window and resumed;
plain training on batches N times larger), and checks that the resumed run
equals the uninterrupted one exactly and large-batch training to 1e-10.

Run:  python examples/real_programs/monitored_session.py
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
TOLERANCE = 1e-10


def make_data(micro_batches, size, seed):
    rng = np.random.RandomState(seed)
    x = rng.randn(micro_batches, size, 6)
    y = np.sin(x @ rng.randn(6, 1)) + 0.1 * rng.randn(micro_batches, size, 1)
    return list(zip(x, y))


def build_model():
    rng = np.random.RandomState(0)
    x = v1.placeholder(tf.float64, [None, 6], name="x")
    y = v1.placeholder(tf.float64, [None, 1], name="y")
    w1 = v1.get_variable("w1", initializer=rng.randn(6, 12) / np.sqrt(6))
    w2 = v1.get_variable("w2", initializer=rng.randn(12, 1) / np.sqrt(12))
    loss = tf.reduce_mean((tf.matmul(tf.tanh(tf.matmul(x, w1)), w2) - y) ** 2)
    return x, y, loss


def train(checkpoint_dir, batches, first, last, args):
    """Feeds batches[first:] until StopAtStepHook stops or batch ``last``; returns the next."""
    with tf.Graph().as_default():
        x, y, loss = build_model()
        # [loop]
        global_step = v1.train.get_or_create_global_step()
        optimizer = tf1_accum.AccumulationOptimizer(v1.train.AdamOptimizer(0.01), args.steps)
        train_op = optimizer.minimize(loss, global_step=global_step)
        hooks = [
            v1.train.StopAtStepHook(last_step=args.updates),  # counts updates
            v1.train.StepCounterHook(output_dir=checkpoint_dir),
            optimizer.make_session_run_hook(),  # keeps a partial window in the last checkpoint
        ]
        used = first
        with v1.train.MonitoredTrainingSession(
            checkpoint_dir=checkpoint_dir, save_checkpoint_steps=2, hooks=hooks
        ) as sess:
            while not sess.should_stop() and used < last:
                inputs, labels = batches[used]
                sess.run(train_op, {x: inputs, y: labels})
                used += 1
        # [/loop]
    return used


def checkpoint_values(checkpoint_dir):
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(checkpoint_dir))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def large_batch(batches, args):
    with tf.Graph().as_default():
        x, y, loss = build_model()
        global_step = v1.train.get_or_create_global_step()
        train_op = v1.train.AdamOptimizer(0.01).minimize(loss, global_step=global_step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for u in range(args.updates):
                window = batches[u * args.steps : (u + 1) * args.steps]
                sess.run(
                    train_op,
                    {
                        x: np.concatenate([b[0] for b in window]),
                        y: np.concatenate([b[1] for b in window]),
                    },
                )
            return dict(
                zip([v.op.name for v in v1.global_variables()], sess.run(v1.global_variables()))
            )


def main(argv=()):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4, help="micro-batches per update")
    parser.add_argument("--updates", type=int, default=6)
    args = parser.parse_args(list(argv))
    batches = make_data(args.steps * args.updates, args.micro_batch, seed=1)
    stop = 2 * args.steps + 1  # the first run's input ends one micro-batch into a window
    with tempfile.TemporaryDirectory() as whole, tempfile.TemporaryDirectory() as parts:
        train(whole, batches, 0, len(batches), args)
        uninterrupted = checkpoint_values(whole)
        train(parts, batches, 0, stop, args)
        pending = int(checkpoint_values(parts)["Accumulation/counter"])
        train(parts, batches, stop, len(batches), args)
        resumed = checkpoint_values(parts)
    exact = all(np.array_equal(resumed[k], v) for k, v in uninterrupted.items())
    plain = large_batch(batches, args)
    diff = max(
        float(np.max(np.abs(resumed[k] - v)) / np.max(np.abs(v)))
        for k, v in plain.items()
        if k != "global_step"
    )
    print(f"micro-batches in the checkpoint of the stopped run: {pending}")
    print(f"resumed run equals the uninterrupted run exactly: {exact}")
    print(f"largest relative difference, resumed vs large batch: {diff:.3g}")
    return {
        "max_rel_diff": diff if exact else float("inf"),
        "pending": pending,
        "exact": exact,
        "global_step": int(resumed["global_step"]),
    }


if __name__ == "__main__":
    v1.disable_v2_behavior()
    result = main(sys.argv[1:])
    sys.exit(0 if result["max_rel_diff"] <= TOLERANCE else 1)
