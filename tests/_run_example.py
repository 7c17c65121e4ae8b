"""Runs an example's ``main`` in a process of its own, in the test's graph mode.

Usage: ``python tests/_run_example.py NAME [ARGS...]`` runs
``examples/NAME.py``'s ``main(ARGS)`` after entering graph mode as
conftest.py does for ``TF1_ACCUM_GRAPH_MODE`` (``v1``, the default, or
``resource``), so that a test that needs a process of its own (one that may be
killed) exercises the same graph mode as the test process.
"""

import importlib.util
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

ROOT = pathlib.Path(__file__).resolve().parent.parent
# As when the example runs as a script (it imports examples/_tensorflow_log.py).
sys.path.insert(0, str(ROOT / "examples"))


def enter_graph_mode():
    mode = os.environ.get("TF1_ACCUM_GRAPH_MODE", "v1")
    if mode == "v1":
        tf.compat.v1.disable_v2_behavior()
    elif mode == "resource":
        tf.compat.v1.disable_eager_execution()
    elif mode == "ref_v2":
        tf.compat.v1.disable_eager_execution()
        tf.compat.v1.disable_resource_variables()
    else:
        raise ValueError(
            f"TF1_ACCUM_GRAPH_MODE must be 'v1', 'resource' or 'ref_v2', got {mode!r}."
        )


def load_example(name):
    spec = importlib.util.spec_from_file_location(
        f"example_{name}", ROOT / "examples" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    enter_graph_mode()
    load_example(sys.argv[1]).main(sys.argv[2:])
