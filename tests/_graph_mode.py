"""The graph mode of a worker process: the one TF1_ACCUM_GRAPH_MODE names, as conftest.py enters.

A worker script imports this before TensorFlow (it sets TensorFlow's log
level), from the script's own folder, which Python puts first on sys.path.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402


def enter(eager=False):
    """Enters the graph mode of the test process (with ``eager``, TensorFlow 2's); quiets logs."""
    mode = os.environ.get("TF1_ACCUM_GRAPH_MODE", "v1")
    if eager:
        tf.compat.v1.enable_v2_behavior()  # TensorFlow 1.15 starts in graph mode
    elif mode == "v1":
        tf.compat.v1.disable_v2_behavior()
    else:
        tf.compat.v1.disable_eager_execution()
        if mode == "ref_v2":
            tf.compat.v1.disable_resource_variables()
        else:
            tf.compat.v1.enable_resource_variables()  # TensorFlow 1.15's default is reference
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
