"""tf_keras ``model.fit`` in graph mode, with N micro-batches per update.

A Keras 2 model (tf_keras, or TensorFlow 1.15's ``tf.keras``) trained in a
TF1 graph (``TF_USE_LEGACY_KERAS=1``, ``disable_v2_behavior()``): the only
edit is the optimizer given to ``compile``, wrapped in
``tf1_accum.AccumulationOptimizer``, and ``fit``'s batch size, now the
micro-batch. A callback applies the last, shorter window
of each epoch, as plain ``fit`` applies its last, shorter batch.

The script trains both ways, in float64, and checks that the weights equal
those of plain ``fit`` on batches N times larger. Its batches are of 32 and
16 examples: TensorFlow 1.15's Keras divides the loss by the batch size in
float32, exact for powers of two only (other sizes differ by about 1e-8).

Run:  python examples/real_programs/keras_fit.py
"""

import os

# tf.keras must be tf_keras (Keras 2): read when TensorFlow is imported.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# TensorFlow's C++ log stays quiet; TF_CPP_MIN_LOG_LEVEL=0 shows all of it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse
import sys

import numpy as np
import tensorflow as tf

try:
    import tf_keras
    from tf_keras.optimizers import legacy
except ImportError:  # TensorFlow 1.15: its tf.keras is Keras 2, with the legacy optimizers
    from tensorflow import keras as tf_keras
    from tensorflow.keras import optimizers as legacy

import tf1_accum

v1 = tf.compat.v1
TOLERANCE = 1e-10


def make_data(examples, seed):
    rng = np.random.RandomState(seed)
    x = rng.randn(examples, 8)
    y = np.tanh(x @ rng.randn(8, 1)) + 0.1 * rng.randn(examples, 1)
    return x, y


def build_model():
    glorot = tf_keras.initializers.glorot_uniform
    return tf_keras.Sequential(
        [
            tf_keras.layers.Dense(16, "tanh", input_shape=(8,), kernel_initializer=glorot(1)),
            tf_keras.layers.Dense(1, kernel_initializer=glorot(2)),
        ]
    )


def train(x, y, args, accumulate):
    """Fits a fresh model; returns (weights, updates made)."""
    with tf.Graph().as_default(), v1.Session():
        model = build_model()
        # [accumulate]
        optimizer = legacy.Adam(args.learning_rate)
        callbacks = []
        if accumulate:
            optimizer = tf1_accum.AccumulationOptimizer(optimizer, args.steps)

            # The last window of an epoch may be short: apply it with its own count.
            def flush(epoch, logs):
                v1.keras.backend.get_session().run(optimizer.flush_op)

            callbacks.append(tf_keras.callbacks.LambdaCallback(on_epoch_end=flush))
        model.compile(optimizer=optimizer, loss="mse")
        batch_size = args.micro_batch if accumulate else args.steps * args.micro_batch
        model.fit(
            x,
            y,
            batch_size=batch_size,
            epochs=args.epochs,
            shuffle=False,
            callbacks=callbacks,
            verbose=0,
        )
        # [/accumulate]
        updates = int(tf_keras.backend.get_value(model.optimizer.iterations))
        return model.get_weights(), updates


def main(argv=()):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4, help="micro-batches per update")
    parser.add_argument("--examples", type=int, default=112)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--learning-rate", type=float, default=0.01)
    args = parser.parse_args(list(argv))
    tf_keras.backend.set_floatx("float64")
    try:
        x, y = make_data(args.examples, seed=0)
        accumulated, updates = train(x, y, args, accumulate=True)
        large_batch, large_updates = train(x, y, args, accumulate=False)
    finally:
        tf_keras.backend.set_floatx("float32")
    diff = max(
        float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(accumulated, large_batch)
    )
    print(
        f"updates: {updates} accumulated, {large_updates} with batches of "
        f"{args.steps * args.micro_batch}"
    )
    print(f"largest relative weight difference, accumulated vs large batch: {diff:.3g}")
    return {"max_rel_diff": diff, "updates": updates, "large_batch_updates": large_updates}


if __name__ == "__main__":
    v1.disable_v2_behavior()
    result = main(sys.argv[1:])
    sys.exit(0 if result["max_rel_diff"] <= TOLERANCE else 1)
