"""The Keras 2 that legacy graph-mode code uses: tf_keras on TensorFlow 2, tf.keras on 1.15."""

import tensorflow as tf

if tf.__version__.startswith("1."):
    keras = tf.keras
else:
    import tf_keras as keras

__all__ = ["keras"]
