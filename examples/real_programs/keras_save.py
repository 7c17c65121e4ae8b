"""A Keras 2 CNN trained with ``fit``, saved with ``model.save()``, loaded and trained on.

The shape of Keras 2's ``examples/cifar10_cnn.py`` under tf_keras (or
TensorFlow 1.15's ``tf.keras``) in a TF1 graph (``TF_USE_LEGACY_KERAS=1``,
``disable_v2_behavior()``), on random images: RMSprop with a decay,
``categorical_crossentropy``, ``fit`` with validation data,
``model.save('....h5')``. The edit: the optimizer given to
``compile`` is wrapped in ``tf1_accum.KerasAccumulationOptimizer``, and
``fit``'s batch size is the micro-batch.

The script trains the first epochs, saves with a window open, loads the file
in a new graph and trains the remaining epochs; it checks that the weights
equal those of the same training without the interruption, and those of
plain ``fit`` on batches N times larger, of 32 examples: TensorFlow 1.15's
Keras divides the loss by the batch size in float32, exact for powers of two
only (other sizes differ by about 1e-8).

Run:  python examples/real_programs/keras_save.py
"""

import os

# tf.keras must be tf_keras (Keras 2): read when TensorFlow is imported.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# TensorFlow's C++ log stays quiet; TF_CPP_MIN_LOG_LEVEL=0 shows all of it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse
import sys
import tempfile

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
CLASSES = 4


def make_data(examples, seed):
    rng = np.random.RandomState(seed)
    x = rng.randn(examples, 8, 8, 3)
    y = tf_keras.utils.to_categorical(rng.randint(CLASSES, size=examples), CLASSES)
    return x, y


def build_model():
    glorot = tf_keras.initializers.glorot_uniform
    layers = tf_keras.layers
    return tf_keras.Sequential(
        [
            layers.Conv2D(
                8, (3, 3), padding="same", input_shape=(8, 8, 3), kernel_initializer=glorot(1)
            ),
            layers.Activation("relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Flatten(),
            layers.Dense(16, kernel_initializer=glorot(2)),
            layers.Activation("relu"),
            layers.Dense(CLASSES, kernel_initializer=glorot(3)),
            layers.Activation("softmax"),
        ]
    )


def compile_model(model, args, accumulate):
    # [compile]
    opt = legacy.RMSprop(learning_rate=args.learning_rate, decay=1e-3)
    if accumulate:
        opt = tf1_accum.KerasAccumulationOptimizer(opt, steps=args.steps)
    model.compile(loss="categorical_crossentropy", optimizer=opt, metrics=["accuracy"])
    # [/compile]


def fit(model, data, args, epochs, batch_size):
    x, y, validation = data
    model.fit(
        x,
        y,
        batch_size=batch_size,
        epochs=epochs,
        validation_data=validation,
        shuffle=False,
        verbose=0,
    )


def train_with_a_save(data, args, path):
    """The first epochs, model.save(), then load_model in a new graph and the rest."""
    with tf.Graph().as_default(), v1.Session():
        model = build_model()
        compile_model(model, args, accumulate=True)
        # [save]
        fit(model, data, args, args.epochs_before_save, args.micro_batch)
        model.save(path)  # HDF5: the optimizer's state and the open window with it
        # [/save]
        pending = int(tf_keras.backend.get_value(model.optimizer.window.counter))
    with tf.Graph().as_default(), v1.Session():
        # [load]
        model = tf_keras.models.load_model(
            path,
            custom_objects={"KerasAccumulationOptimizer": tf1_accum.KerasAccumulationOptimizer},
        )
        fit(model, data, args, args.epochs - args.epochs_before_save, args.micro_batch)
        # [/load]
        updates = int(tf_keras.backend.get_value(model.optimizer.iterations))
        return model.get_weights(), updates, pending


def train_uninterrupted(data, args):
    with tf.Graph().as_default(), v1.Session():
        model = build_model()
        compile_model(model, args, accumulate=True)
        fit(model, data, args, args.epochs, args.micro_batch)
        return model.get_weights()


def train_large_batch(data, args):
    """Plain fit, one epoch over all the epochs' examples in a row, batches N times larger."""
    x, y, validation = data
    repeated = (np.concatenate([x] * args.epochs), np.concatenate([y] * args.epochs), validation)
    with tf.Graph().as_default(), v1.Session():
        model = build_model()
        compile_model(model, args, accumulate=False)
        fit(model, repeated, args, 1, args.steps * args.micro_batch)
        return model.get_weights(), int(tf_keras.backend.get_value(model.optimizer.iterations))


def relative_difference(weights, reference):
    return max(float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(weights, reference))


def main(argv=()):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4, help="micro-batches per update")
    parser.add_argument("--examples", type=int, default=48, help="an epoch's examples")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--epochs-before-save", type=int, default=1)
    parser.add_argument("--learning-rate", type=float, default=0.01)
    args = parser.parse_args(list(argv))
    if (args.epochs * args.examples) % (args.steps * args.micro_batch):
        parser.error("the epochs' examples must make whole windows, to compare with large batches")
    tf_keras.backend.set_floatx("float64")
    try:
        x, y = make_data(args.examples, seed=0)
        data = (x, y, make_data(16, seed=1))
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "keras_cifar10_trained_model.h5")
            resumed, updates, pending = train_with_a_save(data, args, path)
        whole = train_uninterrupted(data, args)
        large_batch, large_updates = train_large_batch(data, args)
    finally:
        tf_keras.backend.set_floatx("float32")
    result = {
        "resumed_vs_uninterrupted": relative_difference(resumed, whole),
        "resumed_vs_large_batch": relative_difference(resumed, large_batch),
        "updates": updates,
        "large_batch_updates": large_updates,
        "micro_batches_open_at_save": pending,
    }
    print(
        f"saved with {pending} micro-batches of an open window; updates: {updates} "
        f"accumulated, {large_updates} with batches of {args.steps * args.micro_batch}"
    )
    print(
        "largest relative weight difference: resumed vs uninterrupted "
        f"{result['resumed_vs_uninterrupted']:.3g}, resumed vs large batch "
        f"{result['resumed_vs_large_batch']:.3g}"
    )
    return result


if __name__ == "__main__":
    v1.disable_v2_behavior()
    result = main(sys.argv[1:])
    ok = result["resumed_vs_uninterrupted"] == 0 and result["resumed_vs_large_batch"] <= TOLERANCE
    sys.exit(0 if ok else 1)
