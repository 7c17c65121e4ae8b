"""The Keras 2 the tests use: the tf_keras package on TensorFlow 2, TensorFlow 1.15's own tf.keras.

A test module that imports it is skipped on TensorFlow 2 without tf_keras,
as with ``pytest.importorskip("tf_keras")``.
"""

import pytest
import tensorflow as tf

#: Whether this is TensorFlow 1.x: no tf_keras, no Keras 3.
TF1 = tf.__version__.startswith("1.")

keras = tf.keras if TF1 else pytest.importorskip("tf_keras")
#: Keras 2's ``OptimizerV2`` classes (Adam, SGD, ...), which tf_keras calls legacy.
legacy = keras.optimizers if TF1 else keras.optimizers.legacy
if TF1:
    # Keras optimizers that are no OptimizerV2: 1.15's Keras 1 style ones.
    from tensorflow.python.keras import optimizers as not_legacy
else:
    not_legacy = keras.optimizers  # tf_keras's new ones
#: What the library's messages call ``keras`` and ``legacy``, the names a user writes.
KERAS_NAME = "tf.keras" if TF1 else "tf_keras"
LEGACY_NAME = "tf.keras.optimizers" if TF1 else "tf_keras.optimizers.legacy"
