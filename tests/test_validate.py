"""Honest failures: one warning for a variable without gradient, and a failed build
leaves the graph as it was (or says exactly what remains), in every way in."""

import sys
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import Model
from _helpers import concat
from _helpers import make_batches
from _ways import WAYS

v1 = tf.compat.v1


def _snapshot(graph, every_collection=True):
    """Op count, global variables and collections of ``graph``, to compare."""
    keys = graph.get_all_collection_keys() if every_collection else _VARIABLE_KEYS
    return (
        len(graph.get_operations()),
        [v.op.name for v in graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES)],
        {key: list(graph.get_collection(key)) for key in keys},
    )


_VARIABLE_KEYS = [
    v1.GraphKeys.GLOBAL_VARIABLES,
    v1.GraphKeys.LOCAL_VARIABLES,
    v1.GraphKeys.TRAINABLE_VARIABLES,
    v1.GraphKeys.UPDATE_OPS,
    tf1_accum.STATE_COLLECTION,
]


def _model():
    """A float64 linear model: (placeholder x, variable w, scalar loss)."""
    x = v1.placeholder(tf.float64, [None, 2], name="x")
    w = v1.get_variable("w", initializer=np.array([1.0, -2.0]))
    return x, w, tf.reduce_mean(tf.tensordot(x, w, 1) ** 2)


def _loose(x):
    """A variable of undefined shape that the loss reads."""
    loose = v1.Variable(
        tf.ones([2], tf.float64), shape=tf.TensorShape(None), name="loose", use_resource=False
    )
    return loose, tf.reduce_mean(tf.tensordot(x, tf.reshape(loose, [2]), 1) ** 2)


def _sgd():
    return v1.train.GradientDescentOptimizer(0.1)


# ---- one warning, the same text, from every way in ----------------------------------


def _warnings_from(build):
    with tf.Graph().as_default():
        x, w, loss = _model()
        v1.get_variable("unused", initializer=np.ones(3))
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            build(loss)
    return [w for w in record if "no gradient" in str(w.message)]


@pytest.mark.parametrize(
    "way_in",
    ["build_accumulation", "minimize", "apply_gradients", "dataset"],
)
def test_a_variable_without_gradient_is_named_in_one_warning_by_every_way_in(way_in):
    def build(loss):
        if way_in == "build_accumulation":
            tf1_accum.build_accumulation(loss, _sgd())
        elif way_in == "minimize":
            tf1_accum.AccumulationOptimizer(_sgd(), 2).minimize(loss)
        elif way_in == "apply_gradients":
            opt = tf1_accum.AccumulationOptimizer(_sgd(), 2)
            opt.apply_gradients(opt.compute_gradients(loss))
        else:
            data = tf.data.Dataset.from_tensor_slices(np.ones((4, 3, 2))).batch(2)

            def loss_fn(b):
                w2 = v1.get_variable("w2", initializer=np.ones(2), dtype=tf.float64)
                returned.append(tf.reduce_mean(tf.tensordot(b, w2, 1)))
                return returned[-1]

            tf1_accum.build_dataset_accumulation(loss_fn, _sgd(), data, 2)

    returned = []  # the dataset loop's loss, as loss_fn returns it inside the loop

    record = _warnings_from(build)
    assert len(record) == 1, [str(w.message) for w in record]
    # The dataset's loss reads a variable of its own, not the model's w.
    left = "w, unused" if way_in == "dataset" else "unused"
    loss = {
        "build_accumulation": " for loss Mean:0",
    }.get(way_in, "")
    if way_in == "dataset":
        loss = f" for loss {returned[0].name}"
    assert str(record[0].message) == (
        f"tf1_accum: these variables have no gradient{loss} and are left untouched: {left}."
    )
    # The warning points at the caller's line, not into tf1_accum or TensorFlow.
    assert record[0].filename == __file__


@pytest.mark.parametrize("way_in", ["build_accumulation", "AccumulationOptimizer", "dataset"])
def test_an_optimizer_class_is_refused_saying_to_pass_an_instance(way_in):
    """A class where an instance belongs (``AdamOptimizer`` for ``AdamOptimizer(0.1)``):
    every way in says so, with the call to make, before building anything."""
    message = (
        r"optimizer must be an optimizer instance, got the class "
        r"tensorflow\.python\.training\.adam\.AdamOptimizer itself: pass "
        r"AdamOptimizer\(learning_rate=\.\.\.\)\.$"
    )
    with tf.Graph().as_default():
        x, w, loss = _model()
        with pytest.raises(TypeError, match=message):
            if way_in == "build_accumulation":
                tf1_accum.build_accumulation(loss, v1.train.AdamOptimizer)
            elif way_in == "AccumulationOptimizer":
                tf1_accum.AccumulationOptimizer(v1.train.AdamOptimizer, 2)
            else:
                data = tf.data.Dataset.from_tensor_slices(np.ones((4, 3, 2))).batch(2)
                tf1_accum.build_dataset_accumulation(
                    lambda b: tf.reduce_mean(tf.tensordot(b, w, 1)), v1.train.AdamOptimizer, data, 2
                )
        assert v1.global_variables() == [w]
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []


def test_the_optimizer_trains_the_others_and_leaves_the_unused_variable():
    with tf.Graph().as_default():
        x, w, loss = _model()
        unused = v1.get_variable("unused", initializer=np.ones(3))
        with pytest.warns(UserWarning, match="left untouched: unused"):
            train = tf1_accum.AccumulationOptimizer(_sgd(), 2).minimize(loss)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for batch in ([[1.0, 2.0]], [[3.0, -1.0]]):
                sess.run(train, {x: batch})
            assert np.abs(sess.run(w) - [1.0, -2.0]).max() > 1e-3
            np.testing.assert_array_equal(sess.run(unused), np.ones(3))


# ---- bad input: the graph as it was --------------------------------------------------


def _other_graph_tensor():
    with tf.Graph().as_default():
        return tf.constant(1.0)


def _other_graph_variable():
    with tf.Graph().as_default():
        return v1.get_variable("elsewhere", initializer=1.0)


BUILD_ACCUMULATION_ERRORS = {
    "undefined shape": (
        lambda x, w, loss: dict(loss=_loose(x)[1]),
        ValueError,
        "loose has shape .* not fully defined",
    ),
    "no gradient": (
        lambda x, w, loss: dict(loss=tf.reduce_mean(x)),
        ValueError,
        r"No gradients provided for any variable: \['w'\]",
    ),
    "non-scalar loss": (
        lambda x, w, loss: dict(loss=tf.tensordot(x, w, 1)),
        ValueError,
        r"loss must be a scalar",
    ),
    "weight of another graph": (
        lambda x, w, loss: dict(weight=_other_graph_tensor()),
        ValueError,
        "not in the graph of the loss",
    ),
    "non-scalar weight": (
        lambda x, w, loss: dict(weight=x[:, 0]),
        ValueError,
        "weight must be a scalar",
    ),
    "string weight": (
        lambda x, w, loss: dict(weight=tf.constant("a")),
        TypeError,
        "real number tensor",
    ),
    "bad global_step": (
        lambda x, w, loss: dict(global_step=3),
        TypeError,
        "global_step must be an integer tf.Variable",
    ),
    "float global_step": (
        lambda x, w, loss: dict(global_step=v1.get_variable("step", initializer=0.0)),
        TypeError,
        "global_step must be an integer variable",
    ),
    "variable of another graph": (
        lambda x, w, loss: dict(var_list=[_other_graph_variable()]),
        ValueError,
        r"var_list\[0\] elsewhere is not in the graph of the loss",
    ),
    "empty var_list": (lambda x, w, loss: dict(var_list=[]), ValueError, "var_list is empty"),
    "clip_norm": (lambda x, w, loss: dict(clip_norm=-1.0), ValueError, "clip_norm must be"),
    "average": (lambda x, w, loss: dict(average="yes"), TypeError, "average must be True"),
    "statistics": (
        lambda x, w, loss: dict(statistics=True),
        ValueError,
        r"statistics=True needs micro_batch_size= \(examples per micro-batch\) or weight=",
    ),
    "update_ops": (
        lambda x, w, loss: dict(update_ops=[_other_graph_tensor()]),
        ValueError,
        r"update_ops\[0\] .* is not in the graph of the loss",
    ),
    "micro_batch_size without statistics": (
        lambda x, w, loss: dict(micro_batch_size=2),
        ValueError,
        "micro_batch_size is used only by the gradient statistics",
    ),
}


@pytest.mark.parametrize("case", sorted(BUILD_ACCUMULATION_ERRORS))
def test_build_accumulation_refuses_bad_input_before_building_anything(case):
    make, error, message = BUILD_ACCUMULATION_ERRORS[case]
    with tf.Graph().as_default() as graph:
        x, w, loss = _model()
        kwargs = dict(loss=loss, optimizer=_sgd())
        kwargs.update(make(x, w, loss))
        before = _snapshot(graph)
        with pytest.raises(error, match=message):
            tf1_accum.build_accumulation(**kwargs)
        assert _snapshot(graph) == before


MINIMIZE_ERRORS = {
    "undefined shape": (
        lambda x, w, loss: ((_loose(x)[1],), {}, {}),
        ValueError,
        "loose has shape .* not fully defined",
    ),
    "no gradient": (
        lambda x, w, loss: ((tf.reduce_mean(x),), {}, {}),
        ValueError,
        r"No gradients provided for any variable: \['w'\]",
    ),
    "integer loss": (
        lambda x, w, loss: ((tf.cast(loss, tf.int32),), {}, {}),
        TypeError,
        "loss must be a floating-point tensor",
    ),
    "bad global_step": (
        lambda x, w, loss: ((loss,), {"global_step": 1}, {}),
        TypeError,
        "global_step must be an integer tf.Variable",
    ),
    "weight of another graph": (
        lambda x, w, loss: ((loss,), {}, {"weight": _other_graph_tensor()}),
        ValueError,
        "not in the graph of the loss",
    ),
    "update_ops of another graph": (
        lambda x, w, loss: ((loss,), {}, {"update_ops": [_other_graph_tensor()]}),
        ValueError,
        "is not in the graph of the loss",
    ),
    "variable of another graph": (
        lambda x, w, loss: ((loss,), {"var_list": [_other_graph_variable()]}, {}),
        ValueError,
        "is not in the graph of the loss",
    ),
}


@pytest.mark.parametrize("case", sorted(MINIMIZE_ERRORS))
def test_accumulation_optimizer_minimize_refuses_bad_input_before_building_anything(case):
    make, error, message = MINIMIZE_ERRORS[case]
    with tf.Graph().as_default() as graph:
        x, w, loss = _model()
        args, kwargs, options = make(x, w, loss)
        opt = tf1_accum.AccumulationOptimizer(_sgd(), 2, **options)
        before = _snapshot(graph)
        with pytest.raises(error, match=message):
            opt.minimize(*args, **kwargs)
        assert _snapshot(graph) == before


def test_accumulation_optimizer_apply_gradients_refuses_bad_input_before_building():
    with tf.Graph().as_default() as graph:
        x, w, loss = _model()
        loose, loose_loss = _loose(x)
        (grad,) = tf.gradients(loose_loss, [loose])
        opt = tf1_accum.AccumulationOptimizer(_sgd(), 2)
        before = _snapshot(graph)
        with pytest.raises(ValueError, match="loose has shape .* not fully defined"):
            opt.apply_gradients([(grad, loose)])
        with pytest.raises(ValueError, match=r"No gradients provided for any variable: \['w'\]"):
            opt.apply_gradients([(None, w)])
        with pytest.raises(TypeError, match="global_step must be an integer tf.Variable"):
            opt.apply_gradients([(grad, loose)], global_step=1)
        assert _snapshot(graph) == before


def test_a_weight_callable_refused_after_it_built_says_what_remains():
    with tf.Graph().as_default() as graph:
        x, w, loss = _model()
        (grad,) = tf.gradients(loss, [w])
        opt = tf1_accum.AccumulationOptimizer(_sgd(), 2, weight=lambda: tf.reduce_sum(x, 1))
        before = _snapshot(graph, every_collection=False)
        with pytest.raises(ValueError, match=r"weight must be a scalar .*shape \[None\]") as info:
            opt.apply_gradients([(grad, w)])
        built = len(graph.get_operations()) - before[0]
        assert built > 0
        assert _snapshot(graph, every_collection=False)[1:] == before[1:]
    assert _notes(info) == [
        f"tf1_accum: AccumulationOptimizer.apply_gradients failed after building {built} ops, "
        "which stay unused; the graph's collections are as they were."
    ]


def test_a_gradient_none_where_the_loss_reads_the_variable_says_what_remains():
    """argmax has no gradient: found only once the gradients are built."""
    with tf.Graph().as_default() as graph:
        x, w, _ = _model()
        loss = tf.reduce_sum(x) * tf.cast(tf.argmax(w), tf.float64)
        before = _snapshot(graph, every_collection=False)
        with pytest.raises(ValueError, match=r"No gradients provided for any variable") as info:
            tf1_accum.build_accumulation(loss, _sgd())
        built = len(graph.get_operations()) - before[0]
        assert _snapshot(graph, every_collection=False)[1:] == before[1:]
    assert _notes(info) == [
        f"tf1_accum: build_accumulation failed after building {built} ops, which stay "
        "unused; the graph's collections are as they were."
    ]


def test_a_gradient_none_where_the_loss_reads_the_variable_in_minimize_says_what_remains():
    with tf.Graph().as_default() as graph:
        x, w, _ = _model()
        loss = tf.reduce_sum(x) * tf.cast(tf.argmax(w), tf.float64)
        before = _snapshot(graph, every_collection=False)
        opt = tf1_accum.AccumulationOptimizer(_sgd(), 2)
        with pytest.raises(ValueError, match=r"No gradients provided for any variable") as info:
            opt.minimize(loss)
        built = len(graph.get_operations()) - before[0]
        assert _snapshot(graph, every_collection=False)[1:] == before[1:]
    assert _notes(info) == [
        f"tf1_accum: AccumulationOptimizer.minimize failed after building {built} ops, which "
        "stay unused; the graph's collections are as they were."
    ]


@pytest.mark.parametrize("way_in", ["build_accumulation", "minimize"])
def test_a_keras_optimizer_refuses_a_reference_variable_before_building_anything(way_in):
    from _keras import legacy  # Keras 2's optimizers: tf_keras's, or 1.15's tf.keras ones

    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float64, [None, 2], name="x")
        w = v1.get_variable("w", initializer=np.array([1.0, -2.0]), use_resource=False)
        loss = tf.reduce_mean(tf.tensordot(x, w, 1) ** 2)
        before = _snapshot(graph)
        with pytest.raises(TypeError, match="updates resource variables only, but w is a ref"):
            if way_in == "minimize":
                tf1_accum.AccumulationOptimizer(legacy.SGD(0.1), 2).minimize(loss)
            else:
                tf1_accum.build_accumulation(loss, legacy.SGD(0.1))
        assert _snapshot(graph) == before


@pytest.mark.parametrize(
    "weight, error, message",
    [
        ("vector", ValueError, r"weight must be a scalar \(computed from each micro-batch"),
        ("string", TypeError, "weight must be a real number tensor"),
        (2.0, TypeError, r"weight must be a scalar real number tf.Tensor .*got 2.0"),
    ],
)
def test_accumulation_optimizer_refuses_a_bad_weight_when_constructed(weight, error, message):
    with tf.Graph().as_default() as graph:
        x, _, _ = _model()
        weight = {"vector": x[:, 0], "string": tf.constant("a")}.get(weight, weight)
        before = _snapshot(graph)
        with pytest.raises(error, match=message):
            tf1_accum.AccumulationOptimizer(_sgd(), 2, weight=weight)
        assert _snapshot(graph) == before


def _notes(info):
    notes = getattr(info.value, "__notes__", None)
    if notes is None:  # before Python 3.11: the note ends the message
        return [str(info.value).split("\n", 1)[1]]
    return notes


# ---- the dataset loop ----------------------------------------------------------------


def _data():
    return tf.data.Dataset.from_tensor_slices(np.ones((4, 3, 2))).batch(2)


def _linear(batch):
    w = v1.get_variable("w", initializer=np.array([1.0, -2.0]))
    return tf.reduce_mean(tf.tensordot(batch, w, 1) ** 2)


DATASET_ARGUMENT_ERRORS = {
    "steps": (dict(steps=0), ValueError, "steps must be at least 1"),
    "loss_fn": (dict(loss_fn="loss"), TypeError, "loss_fn must be a callable"),
    "weight": (dict(weight=1.0), TypeError, "weight must be a callable"),
    "update_ops": (
        dict(update_ops=[tf.no_op]),
        ValueError,
        "takes update_ops=None",
    ),
    "var_list": (dict(var_list=["w"]), TypeError, r"var_list\[0\] must be a tf.Variable"),
    "global_step": (dict(global_step=2), TypeError, "global_step must be an integer"),
    "clip_norm": (dict(clip_norm=0.0), ValueError, "clip_norm must be a positive, finite number"),
}


@pytest.mark.parametrize("case", sorted(DATASET_ARGUMENT_ERRORS))
def test_the_dataset_loop_refuses_bad_arguments_before_building_anything(case):
    kwargs, error, message = DATASET_ARGUMENT_ERRORS[case]
    with tf.Graph().as_default() as graph:
        if case == "update_ops":
            kwargs = dict(update_ops=[tf.no_op()])
        args = dict(loss_fn=_linear, optimizer=_sgd(), dataset=_data(), steps=2)
        args.update(kwargs)
        before = _snapshot(graph)
        with pytest.raises(error, match=message):
            tf1_accum.build_dataset_accumulation(**args)
        assert _snapshot(graph) == before


def test_the_dataset_loop_refuses_a_var_list_of_another_graph_before_building_anything():
    elsewhere = _other_graph_variable()
    with tf.Graph().as_default() as graph:
        data = _data()
        before = _snapshot(graph)
        with pytest.raises(
            ValueError, match=r"var_list\[0\] elsewhere is not in the graph of the loss"
        ):
            tf1_accum.build_dataset_accumulation(_linear, _sgd(), data, 2, var_list=[elsewhere])
        assert _snapshot(graph) == before


def test_the_dataset_loop_refuses_a_dataset_that_captures_a_placeholder():
    with tf.Graph().as_default() as graph:
        rows = v1.placeholder(tf.float64, [None, 3, 2])
        data = tf.data.Dataset.from_tensor_slices(rows).batch(2)
        before = _snapshot(graph, every_collection=False)
        with pytest.raises(ValueError, match="(?i)capture a placeholder"):
            tf1_accum.build_dataset_accumulation(_linear, _sgd(), data, 2)
        assert _snapshot(graph, every_collection=False)[1:] == before[1:]
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []


def test_run_accumulation_refuses_a_fused_that_is_not_a_bool_before_running():
    with tf.Graph().as_default():
        x, w, loss = _model()
        acc = tf1_accum.build_accumulation(loss, _sgd())
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            feeds = [{x: np.ones((2, 2))}]
            with pytest.raises(TypeError, match="fused must be True or False, got 'yes'"):
                tf1_accum.run_accumulation(sess, acc, feeds, fused="yes")
            assert sess.run(acc.counter) == 0


def test_run_accumulation_given_a_session_on_another_graph_says_so_before_running():
    """The program shape: the model built in ``with tf.Graph().as_default():``, the
    session made outside it (on the default graph). Refused up front, naming the
    fix; the accumulation's own session then finds nothing changed."""
    with tf.Graph().as_default() as graph:
        x, w, loss = _model()
        acc = tf1_accum.build_accumulation(loss, _sgd())
    feeds = [{x: np.ones((2, 2))}] * 2
    with v1.Session(graph=tf.Graph()) as other:
        with pytest.raises(
            ValueError,
            match=r"sess runs another graph than accumulation: accumulation was built in a "
            r"graph of \d+ ops, the session runs a graph of 0 ops\. Make the session with "
            r"tf.compat.v1.Session\(graph=graph\), or inside graph.as_default\(\)",
        ):
            tf1_accum.run_accumulation(other, acc, feeds)
    with v1.Session(graph=graph) as sess:
        sess.run(v1.variables_initializer(graph.get_collection("variables")))
        with tf.Graph().as_default():
            with v1.Session() as wrong:
                with pytest.raises(ValueError, match="a graph of 0 ops"):
                    tf1_accum.run_accumulation(wrong, acc, feeds)
        assert sess.run(acc.counter) == 0
        np.testing.assert_array_equal(sess.run(w), [1.0, -2.0])
        tf1_accum.run_accumulation(sess, acc, feeds)  # the right session trains
        assert not np.array_equal(sess.run(w), [1.0, -2.0])


def _raising(batch):
    v1.get_variable("w", initializer=np.array([1.0, -2.0]))
    raise KeyError("the model code failed")


def _non_scalar(batch):
    return tf.tensordot(batch, v1.get_variable("w", initializer=np.array([1.0, -2.0])), 1)


def _undefined_shape(batch):
    loose = v1.get_variable(
        "loose", initializer=tf.ones([2], tf.float64), validate_shape=False, use_resource=False
    )
    return tf.reduce_mean(tf.tensordot(batch, tf.reshape(loose, [2]), 1))


DATASET_LOSS_FN_ERRORS = {
    "loss_fn raises": (_raising, {}, KeyError, "the model code failed", "w"),
    "non-scalar loss": (_non_scalar, {}, ValueError, "loss must be a scalar", "w"),
    "undefined shape": (_undefined_shape, {}, ValueError, "not fully defined", "loose"),
    "non-scalar weight": (
        _linear,
        {"weight": lambda b: b[:, 0, 0]},
        ValueError,
        "weight must be a scalar",
        "w",
    ),
}


@pytest.mark.parametrize("case", sorted(DATASET_LOSS_FN_ERRORS))
def test_a_failing_loss_fn_leaves_no_variable_and_says_what_remains(case):
    loss_fn, kwargs, error, message, variable = DATASET_LOSS_FN_ERRORS[case]
    with tf.Graph().as_default() as graph:
        data = _data()
        before = _snapshot(graph, every_collection=False)
        with pytest.raises(error, match=message) as info:
            tf1_accum.build_dataset_accumulation(loss_fn, _sgd(), data, 2, **kwargs)
        built = len(graph.get_operations()) - before[0]
        assert built > 0
        # No variable of the failed build is left to initialize or save.
        assert _snapshot(graph, every_collection=False)[1:] == before[1:]
        assert v1.global_variables() == []
    if error is KeyError and sys.version_info < (3, 11):
        # Before add_note, only a ValueError, TypeError or AttributeError's
        # message takes the note: the user's KeyError is raised as it was.
        assert info.value.args == (message,)
        return
    assert _notes(info) == [
        f"tf1_accum: build_dataset_accumulation failed after building {built} ops, which "
        "stay unused; the graph's collections are as they were, without the variables it made "
        f"({variable}), whose names are free."
    ]


def test_accumulation_optimizer_minimize_in_eager_mode_says_what_to_call():
    from tensorflow.python.eager import context

    opt = tf1_accum.AccumulationOptimizer(_sgd(), 2)
    with context.eager_mode():
        with pytest.raises(
            RuntimeError, match=r"AccumulationOptimizer.minimize builds TF1 graph-mode ops"
        ):
            opt.minimize(tf.constant(1.0))


def test_a_weight_callable_that_returns_no_number_is_refused():
    with tf.Graph().as_default():
        x, w, loss = _model()
        (grad,) = tf.gradients(loss, [w])
        opt = tf1_accum.AccumulationOptimizer(_sgd(), 2, weight=lambda: tf.constant("a"))
        with pytest.raises(TypeError, match="weight must be a real number tensor .*got .* string"):
            opt.apply_gradients([(grad, w)])
        assert v1.global_variables() == [w]


@pytest.mark.parametrize(
    "build",
    [
        lambda loss, transform: tf1_accum.build_accumulation(loss, _sgd(), transform=transform),
        lambda loss, transform: tf1_accum.AccumulationOptimizer(
            _sgd(), 2, transform=transform
        ).minimize(loss),
    ],
    ids=["build_accumulation", "AccumulationOptimizer"],
)
def test_a_build_that_fails_after_building_leaves_every_collection_as_it_was(build):
    """A transform is refused once the window and its conditionals are built: every
    collection (the conditionals' contexts, tf1_accum's own, TensorFlow's) is put back,
    and none is left that was not there."""
    with tf.Graph().as_default() as graph:
        x, w, loss = _model()
        before = _snapshot(graph)
        with pytest.raises(ValueError, match="must return the gradient's shape"):
            build(loss, lambda g, v, window: g[:1])
        assert len(graph.get_operations()) > before[0]
        assert _snapshot(graph)[1:] == before[1:]


def _halving(fails):
    """A transform holding its factor in a tf.compat.v1.get_variable; ``fails``: then raises."""

    def transform(gradient, variable, window):
        scale = v1.get_variable(
            variable.op.name.split("/")[-1] + "_scale",
            initializer=np.float64(0.5),
            trainable=False,
        )
        if fails:
            raise RuntimeError("the transform's own bug")
        return gradient * tf.cast(scale, gradient.dtype)

    return transform


@pytest.mark.parametrize("way", WAYS, ids=str)
def test_a_build_that_failed_in_a_transform_builds_again_in_the_same_graph(way):
    window = make_batches(tf.float64, False, 3, 4)

    def model_fn(batch):
        with v1.variable_scope("model", reuse=v1.AUTO_REUSE):
            return Model(tf.float64, False, inputs=batch[0], labels=batch[1]).loss

    with tf.Graph().as_default():
        inputs, labels = concat(window)
        loss = model_fn((tf.constant(inputs), tf.constant(labels)))
        train = v1.train.GradientDescentOptimizer(0.05).minimize(loss)  # 0.1, halved
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train)
            expected = sess.run(v1.trainable_variables())
    with tf.Graph().as_default():
        with pytest.raises(RuntimeError, match="the transform's own bug"):
            way.build(model_fn, _sgd(), window, 3, transform=_halving(fails=True))
        built = way.build(model_fn, _sgd(), window, 3, transform=_halving(fails=False))
        with way.session() as sess:
            way.run_window(sess, built, window)
            got = sess.run(v1.trainable_variables())
    assert len(got) == len(expected) == 3
    for value, want in zip(got, expected):
        np.testing.assert_allclose(value, want, rtol=1e-10)
