"""Puts the test process in TF1 graph mode before anything imports tf1_accum.

Legacy code enters graph mode in one of three ways, and the switch is
process-wide, so one pytest run tests one of them, chosen by
``TF1_ACCUM_GRAPH_MODE``:

* ``v1`` (the default): ``disable_v2_behavior()``, reference variables as
  under TensorFlow 1.x. Every test runs.
* ``resource``: only ``disable_eager_execution()``, resource variables (on
  TensorFlow 1.15, ``enable_resource_variables()`` as well). Tests
  marked ``graph_mode_independent`` (the source checker, the docs, scripts
  that start their own processes) are skipped: the ``v1`` run has them.
* ``ref_v2``: ``disable_eager_execution()`` and
  ``disable_resource_variables()``, reference variables under version 2
  control flow (``tf.cond`` builds functional ``If`` ops, which cannot take a
  reference input). This changes only how the window's variables,
  conditionals and loops are built: the modules in `REFERENCE_V2_MODULES`
  run, the others are deselected.

``scripts/test`` runs the three, one pytest process each; ``python -m
pytest`` alone runs one, with ``-k``, ``-x`` and ``-n`` (pytest-xdist) as usual.
"""

import os

try:
    import importlib.metadata as metadata
except ImportError:  # Python 3.7, where pytest brings the backport
    import importlib_metadata as metadata

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# tf.compat.v1.layers (batch normalization in tests/test_batch_norm.py) needs
# the tf_keras package in place of Keras 3; read when TensorFlow is imported.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import pytest

GRAPH_MODES = ("v1", "resource", "ref_v2")
GRAPH_MODE = os.environ.get("TF1_ACCUM_GRAPH_MODE", "v1")
if GRAPH_MODE not in GRAPH_MODES:
    raise ValueError(
        f"TF1_ACCUM_GRAPH_MODE must be 'v1', 'resource' or 'ref_v2', got {GRAPH_MODE!r}."
    )

# The modules that build and run windows: they run in the ref_v2 mode too.
REFERENCE_V2_MODULES = (
    "tests/test_equivalence.py",
    "tests/test_accumulation.py",
    "tests/test_session.py",
    "tests/test_optimizer.py",
    "tests/test_dataset.py",
    "tests/test_memory.py",
    "tests/test_nonfinite.py",
    "tests/test_window.py",
    "tests/test_concurrency.py",
    "tests/test_checkpoints.py",
    "tests/test_crash_safety.py",
    "tests/test_properties.py",
)


def _enter_graph_mode():
    import tensorflow as tf

    if GRAPH_MODE == "v1":
        tf.compat.v1.disable_v2_behavior()
    else:
        tf.compat.v1.disable_eager_execution()
        if GRAPH_MODE == "ref_v2":
            tf.compat.v1.disable_resource_variables()
        else:
            tf.compat.v1.enable_resource_variables()  # TensorFlow 1.15's default is reference
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "graph_mode_independent: runs in the v1 graph mode only (it does not depend on the mode)",
    )
    # A pytest-xdist controller runs no test: only its workers need TensorFlow
    # (about 6 s to import).
    distributing = config.getoption("numprocesses", None) and config.getoption("dist") != "no"
    if not distributing or os.environ.get("PYTEST_XDIST_WORKER"):
        _enter_graph_mode()


def pytest_report_header(config):
    for distribution in ("tensorflow", "tensorflow-cpu"):
        try:
            version = metadata.version(distribution)
            break
        except metadata.PackageNotFoundError:
            version = "not installed"
    return f"tf1_accum graph mode: {GRAPH_MODE} (TensorFlow {version})"


def _module(config, item):
    return item.path.relative_to(config.rootpath).as_posix()


def pytest_collection_modifyitems(config, items):
    if GRAPH_MODE == "ref_v2":
        kept, deselected = [], []
        for item in items:
            (kept if _module(config, item) in REFERENCE_V2_MODULES else deselected).append(item)
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = kept
    elif GRAPH_MODE != "v1":
        skip = pytest.mark.skip(reason="does not depend on the graph mode: runs in the v1 mode")
        for item in items:
            if item.get_closest_marker("graph_mode_independent"):
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _doctest_namespace(doctest_namespace, request):
    import tensorflow as tf

    import tf1_accum

    keras_example = request.node.name == "tf1_accum._keras_optimizer.KerasAccumulationOptimizer"
    if keras_example and tf.__version__.startswith("1."):
        pytest.skip(
            "the example imports tf_keras, which TensorFlow 1.15 has not (its tf.keras "
            "is Keras 2, which tests/test_keras_optimizer.py runs there)"
        )
    doctest_namespace["tf"] = tf
    doctest_namespace["tf1_accum"] = tf1_accum
