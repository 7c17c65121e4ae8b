"""tf.compat.v1.layers under Keras 3: the error met through tf1_accum says what to do.

From TensorFlow 2.16 ``tf.keras`` is Keras 3, whose ``tf.compat.v1.layers``
raise ``AttributeError: `dense` is not available with Keras 3.`` until
``tf_keras`` is installed and ``TF_USE_LEGACY_KERAS=1`` is set. The library
meets that error where it calls the user's model code: ``loss_fn`` in
`build_dataset_accumulation`.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

import tf1_accum
from _helpers import Model
from _helpers import dataset_of
from _helpers import make_batches
from tf1_accum import _validate

HINT = (
    "tf1_accum: tf.compat.v1.layers needs Keras 2 on TensorFlow 2.16 and newer: pip install "
    "tf_keras (the release of your TensorFlow) and set TF_USE_LEGACY_KERAS=1 before TensorFlow "
    'is imported (os.environ["TF_USE_LEGACY_KERAS"] = "1" at the top of the script).'
)


def _build_with(error):
    """Builds the dataset loop with a loss_fn that makes a model, then raises ``error``."""
    graph = tf.Graph()
    with graph.as_default():
        dataset = dataset_of(make_batches(tf.float32, sparse=False, count=4, size=3))

        def loss_fn(batch):
            Model(tf.float32, False, inputs=batch[0], labels=batch[1])
            raise error  # as tf.compat.v1.layers.dense(...) raises it under Keras 3

        with pytest.raises(AttributeError) as caught:
            tf1_accum.build_dataset_accumulation(
                loss_fn, tf.compat.v1.train.GradientDescentOptimizer(0.1), dataset, steps=2
            )
        assert tf.compat.v1.global_variables() == []
    return caught.value


@pytest.mark.skipif(tf.__version__.startswith("1."), reason="TensorFlow 1.15 has no Keras 3")
def test_a_keras_3_layers_error_from_loss_fn_says_how_to_use_tf_keras():
    error = _build_with(AttributeError("`dense` is not available with Keras 3."))
    assert str(error).splitlines()[0] == "`dense` is not available with Keras 3."
    assert _validate.KERAS_3_HINT == HINT
    notes = getattr(error, "__notes__", str(error).splitlines()[1:])
    assert notes[-1] == HINT
    assert notes[0].startswith("tf1_accum: build_dataset_accumulation failed after building")


def test_another_attribute_error_from_loss_fn_gets_no_keras_hint():
    error = _build_with(AttributeError("'NoneType' object has no attribute 'shape'"))
    notes = getattr(error, "__notes__", str(error).splitlines()[1:])
    assert len(notes) == 1 and "Keras" not in notes[0]


# The real symptom, in a process of its own where tf.keras is Keras 3.
@pytest.mark.graph_mode_independent
def test_tf_compat_v1_layers_under_keras_3_fail_with_the_hint():
    major, minor = map(int, tf.__version__.split(".")[:2])
    if (major, minor) < (2, 16):
        pytest.skip(f"TensorFlow {tf.__version__} comes with Keras 2: no Keras 3 error")
    script = textwrap.dedent(
        """
        import tensorflow as tf
        import tf1_accum

        tf.compat.v1.disable_eager_execution()
        dataset = tf.data.Dataset.from_tensor_slices(
            (tf.ones([4, 2, 3]), tf.ones([4, 2, 1]))
        ).repeat()

        def loss_fn(batch):
            x, y = batch
            prediction = tf.compat.v1.layers.dense(x, 1)
            return tf.reduce_mean((prediction - y) ** 2)

        tf1_accum.build_dataset_accumulation(
            loss_fn, tf.compat.v1.train.GradientDescentOptimizer(0.1), dataset, steps=2
        )
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
        + [p for p in [env.get("PYTHONPATH")] if p]
    )
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert "AttributeError: `dense` is not available with Keras 3." in lines, done.stderr
    assert lines[-1] == HINT, done.stderr
