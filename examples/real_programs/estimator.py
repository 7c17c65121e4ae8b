"""tf.estimator: accumulation in a model_fn, with the input ending mid-window.

``tf.estimator`` exists only up to TensorFlow 2.15 (package
``tensorflow-estimator``); it is gone from TensorFlow 2.16 on. The model_fn
wraps its optimizer in ``tf1_accum.AccumulationOptimizer`` and returns the
optimizer's session hook in ``training_hooks``; ``max_steps`` and
``global_step`` count updates. Here the input ends two micro-batches into a
window and the hook, built with ``flush_at_end=True``, applies them at the
end of ``train()``: the final checkpoint (which ``get_variable_value`` reads)
equals plain training on the same examples in batches N times larger, whose
last batch is shorter too.

Run (TensorFlow 2.15):  python examples/real_programs/estimator.py
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


def make_data(examples, seed):
    rng = np.random.RandomState(seed)
    x = rng.randn(examples, 6)
    y = np.sin(x @ rng.randn(6, 1)) + 0.1 * rng.randn(examples, 1)
    return x, y


def model_fn(features, labels, mode, params):
    rng = np.random.RandomState(0)
    w1 = v1.get_variable("w1", initializer=rng.randn(6, 12) / np.sqrt(6))
    w2 = v1.get_variable("w2", initializer=rng.randn(12, 1) / np.sqrt(12))
    loss = tf.reduce_mean((tf.matmul(tf.tanh(tf.matmul(features, w1)), w2) - labels) ** 2)
    optimizer = v1.train.AdamOptimizer(0.01)
    hooks = []
    if params["steps"] > 1:
        optimizer = tf1_accum.AccumulationOptimizer(optimizer, params["steps"])
        hooks.append(optimizer.make_session_run_hook(flush_at_end=True))
    train_op = optimizer.minimize(loss, global_step=v1.train.get_or_create_global_step())
    return v1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op, training_hooks=hooks)


def train(model_dir, data, batch_size, steps):
    """Trains an Estimator on ``data`` once through; returns its variables."""
    config = v1.estimator.RunConfig(model_dir=model_dir, save_checkpoints_steps=2)
    estimator = v1.estimator.Estimator(model_fn, config=config, params={"steps": steps})
    estimator.train(lambda: tf.data.Dataset.from_tensor_slices(data).batch(batch_size))
    return {name: estimator.get_variable_value(name) for name in estimator.get_variable_names()}


def main(argv=()):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4, help="micro-batches per update")
    parser.add_argument("--windows", type=int, default=3, help="full windows of input")
    args = parser.parse_args(list(argv))
    # The input ends 2 micro-batches into a window.
    data = make_data((args.windows * args.steps + 2) * args.micro_batch, seed=1)
    with tempfile.TemporaryDirectory() as accumulating, tempfile.TemporaryDirectory() as plain:
        got = train(accumulating, data, args.micro_batch, args.steps)
        want = train(plain, data, args.steps * args.micro_batch, 1)
    diff = max(
        float(np.max(np.abs(got[k] - v)) / np.max(np.abs(v)))
        for k, v in want.items()
        if k != "global_step"
    )
    print(f"updates: {got['global_step']} accumulated, {want['global_step']} large batches")
    print(f"largest relative difference, accumulated vs large batch: {diff:.3g}")
    if got["global_step"] != want["global_step"]:
        diff = float("inf")
    return {"max_rel_diff": diff, "global_step": int(got["global_step"])}


if __name__ == "__main__":
    if not hasattr(tf, "estimator") or not hasattr(v1, "estimator"):
        sys.exit("tf.estimator is gone from TensorFlow 2.16 on: run this on TensorFlow 2.15.")
    v1.disable_v2_behavior()
    result = main(sys.argv[1:])
    sys.exit(0 if result["max_rel_diff"] <= TOLERANCE else 1)
