"""Tests of _compat: every private TensorFlow name it uses, on this TensorFlow, and its guards.

Each supported TensorFlow (1.15, 2.15 to 2.21) runs this module; a release
that renames a private method or changes its signature fails here first.
"""

import ast
import inspect
import pathlib
import warnings

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.client import session as tf_session
from tensorflow.python.ops import cond_v2

from tf1_accum import _compat
from tf1_accum._locking import reference_control_flow
from tf1_accum.check._compat import parse  # the tree as Python 3.9 gives it

v1 = tf.compat.v1
PACKAGE = pathlib.Path(_compat.__file__).parent


def _parameters(method):
    return list(inspect.signature(method).parameters)


def test_the_fetch_handler_reads_a_runs_targets_with_the_signature_patched():
    assert _parameters(tf_session._FetchHandler.__init__) == [
        "self",
        "graph",
        "fetches",
        "feeds",
        "feed_handles",
    ]
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [])
        train = tf.group(tf.identity(x), name="train")
        handler = tf_session._FetchHandler(graph, [train, x], {})
        assert handler.targets() == [train]


def test_keras_makes_its_callables_from_options_with_the_signature_patched():
    assert _parameters(tf_session.BaseSession._make_callable_from_options) == [
        "self",
        "callable_options",
    ]


def test_the_checkpoint_saver_hook_keeps_its_step_and_last_save_where_read(tmp_path):
    assert _parameters(v1.train.CheckpointSaverHook.end) == ["self", "session"]
    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        increment = v1.assign_add(step, 1)
        hook = v1.train.CheckpointSaverHook(str(tmp_path), save_steps=2)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            for _ in range(3):
                sess.run(increment)
            tensor, last_save = _compat.saver_hook_state(hook)
            assert sess.run(tensor) == 3
            # Saved after the run that made the step 2 (the step before it was 1).
            assert last_save == 2


def test_operations_take_control_inputs_after_they_are_built():
    with tf.Graph().as_default():
        a, b, c = (tf.no_op(name=name) for name in "abc")
        op = tf.no_op(name="op")
        _compat.add_control_inputs(op, [a, b])
        assert set(op.control_inputs) == {a, b}
        _compat.set_control_inputs(op, [c])
        assert op.control_inputs == [c]
        x, y = tf.constant(1.0), tf.constant(2.0)
        double = tf.identity(x)
        _compat.set_input(double.op, 0, y)
        assert list(double.op.inputs) == [y]
        with v1.Session() as sess:
            assert sess.run(double) == 2.0


def test_an_ops_version_1_control_flow_context_is_read():
    with tf.Graph().as_default():
        pred = v1.placeholder(tf.bool, [])
        outside = tf.constant(1.0)
        inside = []

        def branch():
            inside.append(tf.identity(outside))
            return inside[0]

        with reference_control_flow([], references=True):  # a version 1 cond
            v1.cond(pred, branch, lambda: outside)
        assert _compat.control_flow_context(outside.op) is None
        assert _compat.control_flow_context(inside[0].op) is not None


def test_a_resource_variables_update_gives_the_write_that_made_it():
    with tf.Graph().as_default():
        var = v1.get_variable("table", [3], use_resource=True)
        added = var.scatter_add(tf.IndexedSlices(tf.ones([1]), tf.constant([1])))
        write = _compat.write_of(added)
        assert isinstance(write, tf.Operation) and write.type == "ResourceScatterAdd"
        assert _compat.write_of(write) is write  # anything else is itself


def test_the_bodies_of_a_version_2_cond_are_its_function_graphs():
    with tf.Graph().as_default():
        pred = v1.placeholder(tf.bool, [])
        x = tf.constant(2.0)
        out = cond_v2.cond_v2(pred, lambda: x * 3.0, lambda: x - 1.0)
        graph = v1.get_default_graph()
        (cond,) = [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")]
        bodies = _compat.function_bodies(cond)
        assert [
            sorted({op.type for op in body.get_operations()} & {"Mul", "Sub"}) for body in bodies
        ] == [["Mul"], ["Sub"]]
        with v1.Session() as sess:
            assert sess.run(out, {pred: True}) == 6.0
        assert _compat.function_bodies(x.op) == []


def test_keras_fits_callback_list_has_the_signatures_patched():
    callback_list = _compat.keras_callback_list()
    if callback_list is None:  # tf_keras not imported in this process yet
        import tf_keras  # noqa: F401

        callback_list = _compat.keras_callback_list()
    assert _parameters(callback_list.on_epoch_end) == ["self", "epoch", "logs"]
    assert _parameters(callback_list.on_train_end) == ["self", "logs"]


def test_tensorflows_wrappers_keep_the_optimizer_they_wrap_and_their_loss_scale():
    with tf.Graph().as_default():
        sgd = v1.train.GradientDescentOptimizer(0.1)
        dynamic = v1.train.experimental.MixedPrecisionLossScaleOptimizer(sgd, "dynamic")
        fixed = v1.train.experimental.MixedPrecisionLossScaleOptimizer(sgd, 128.0)
        sync = v1.train.SyncReplicasOptimizer(sgd, replicas_to_aggregate=1)
        assert [_compat.wrapped_optimizer(o) for o in (dynamic, fixed, sync, sgd)] == [
            sgd,
            sgd,
            sgd,
            None,
        ]
        names = [type(_compat.loss_scale(o)).__name__ for o in (dynamic, fixed, sgd)]
        assert names == ["DynamicLossScale", "FixedLossScale", "NoneType"]


def test_a_session_says_whether_it_was_closed():
    with tf.Graph().as_default():
        session = v1.Session()
        assert _compat.session_closed(session) is False
        session.close()
        assert _compat.session_closed(session) is True


@pytest.mark.skipif(
    tf.__version__.startswith("1."),
    reason="1.15's Keras optimizers have no _create_all_weights (Keras never calls it there)",
)
def test_a_keras_optimizer_makes_its_slots_for_the_variables_given():
    from _keras import legacy

    with tf.Graph().as_default():
        variable = v1.get_variable("w", [3], use_resource=True)
        adam = legacy.Adam(0.1)
        _compat.keras_create_all_weights(adam, [variable])
        assert sorted(w.shape.as_list() for w in adam.weights) == [[], [3], [3]]


class _Target:
    def method(self, a, b=None):
        return ("original", a, b)


def test_a_patch_wraps_once_and_keeps_the_originals_name():
    class Target(_Target):
        pass

    calls = []

    def wrapping(original):
        def method(self, a, b=None):
            calls.append(a)
            return original(self, a, b)

        return method

    _compat.patch(Target, "method", "self a b", wrapping)
    _compat.patch(Target, "method", "self a b", wrapping)  # a second time: nothing more
    assert Target().method(1, 2) == ("original", 1, 2)
    assert calls == [1]
    assert Target.method.__name__ == "method"


def test_a_changed_private_signature_warns_once_and_leaves_the_method_as_it_was():
    class Target:
        def end(self, session, extra):
            return "original"

    with pytest.warns(
        UserWarning,
        match=r"Target.end takes \(self session extra\).*not "
        r"\(self session\).*tested on \(1.15.*the warning of a session that ends "
        r"mid-window without its hook is off",
    ):
        _compat.patch(Target, "end", "self session", lambda original: None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _compat.patch(Target, "end", "self session", lambda original: None)
    assert Target().end(1, 2) == "original"


@pytest.mark.parametrize(
    "version, warned",
    [
        ("1.15.5", False),
        ("2.15.1", False),
        ("2.21.0", False),
        ("1.14.0", True),
        ("2.10.1", True),
        ("2.22.0", True),
    ],
)
def test_a_tensorflow_outside_the_tested_releases_is_named_in_one_warning(version, warned):
    message = _compat.untested(version)
    if warned:
        assert message == (
            f"tf1_accum is tested on TensorFlow 1.15 (Python 3.7) and 2.15 to 2.21; this is "
            f"TensorFlow {version}. It may work; if a build fails, install a tested release."
        )
    else:
        assert message is None


def test_the_api_is_version_2s_on_every_version():
    # tf.where broadcasts and tf.while_loop keeps its loop variables' structure,
    # as TensorFlow 2 defines them, on 1.15 too.
    with tf.Graph().as_default():
        where = _compat.tf.where([True, False, True], [1, 2, 3], 0)
        (loop,) = _compat.tf.while_loop(lambda i: i < 3, lambda i: [i + 1], [tf.constant(0)])
        with v1.Session() as sess:
            np.testing.assert_array_equal(sess.run(where), [1, 0, 3])
            assert sess.run(loop) == 3


# TensorFlow's private names that only _compat may use.
_PRIVATE = (
    "_get_control_flow_context",
    "_set_control_flow_context",
    "_vars",
    "__variable_store",
    "_add_control_input",
    "_remove_all_control_inputs",
    "_update_input",
    "_FetchHandler",
    "_make_callable_from_options",
    "_true_graph",
    "_false_graph",
    "_cond_graph",
    "_body_graph",
    "_global_step_tensor",
    "_timer",
    "_parent_op",
    "_loss_scale",
    "_closed",
    "_create_all_weights",
)


@pytest.mark.graph_mode_independent
def test_only_compat_imports_tensorflow_or_reads_its_private_names():
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_compat.py":
            continue
        tree = parse(path.read_text(encoding="utf-8"))
        where = path.relative_to(PACKAGE.parent)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                names = []
            for name in names:
                assert name.split(".")[0] != "tensorflow", f"{where}:{node.lineno} imports {name}"
            if isinstance(node, ast.Attribute):
                assert not node.attr.startswith(_PRIVATE), (
                    f"{where}:{node.lineno} reads {node.attr}"
                )
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value not in _PRIVATE, f"{where}:{node.lineno} names {node.value}"
            if isinstance(node, ast.Name):
                assert node.id != "TF1", f"{where}:{node.lineno} branches on the version"


def _names_the_package_defines(trees):
    """Every name tf1_accum defines: its modules, functions, classes, variables, attributes."""
    defined = set()
    for path, tree in trees.items():
        defined.add(path.stem)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Store):
                defined.add(node.id if isinstance(node, ast.Name) else node.attr)
            elif isinstance(node, ast.arg):
                defined.add(node.arg)
            elif isinstance(node, ast.alias):
                defined.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                defined.add(node.value)  # object.__setattr__(self, "_name", ...)
    return defined


# Private names of others the package may read outside _compat: a NamedTuple's
# _replace (public API, named so it cannot clash with a field), the frame
# walk of warnings, and the name a Keras optimizer subclass keeps of itself.
_ALLOWED = {"_replace", "sys._getframe", "self._name"}


@pytest.mark.graph_mode_independent
def test_only_compat_reads_a_private_attribute_the_package_does_not_define():
    trees = {p: parse(p.read_text(encoding="utf-8")) for p in sorted(PACKAGE.rglob("*.py"))}
    defined = _names_the_package_defines(trees)
    for path, tree in trees.items():
        if path.parent == PACKAGE and path.name == "_compat.py":
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
                continue
            owner = node.value.id if isinstance(node.value, ast.Name) else ""
            if node.attr.startswith("__") or node.attr in defined:
                continue
            assert {node.attr, f"{owner}.{node.attr}"} & _ALLOWED, (
                f"{path.relative_to(PACKAGE.parent)}:{node.lineno} reads {node.attr}, "
                "a private name of another package: read it through tf1_accum/_compat.py"
            )
