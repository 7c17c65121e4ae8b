"""Tests of build_dataset_accumulation, the in-graph loop."""

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import FEATURES
from _helpers import OPTIMIZERS
from _helpers import RTOL
from _helpers import Model
from _helpers import assert_same_values
from _helpers import dataset_of as _dataset
from _helpers import dataset_training as _train_in_graph
from _helpers import loss_fn_of as _loss_fn
from _helpers import make_batches
from _helpers import plain_training
from _helpers import values_by_name
from _keras import keras
from _statistics import assert_statistics
from _statistics import dense
from _statistics import numpy_ema
from _statistics import numpy_statistics

v1 = tf.compat.v1


def test_variables_are_created_once_with_plain_names():
    batches = make_batches(tf.float32, True, 4, 2)
    with tf.Graph().as_default():
        Model(tf.float32, True)
        plain = sorted(v.op.name for v in v1.trainable_variables())
    with tf.Graph().as_default():
        acc = tf1_accum.build_dataset_accumulation(
            _loss_fn(tf.float32, True),
            v1.train.GradientDescentOptimizer(0.1),
            _dataset(batches),
            2,
        )
        assert sorted(v.op.name for v in v1.trainable_variables()) == plain
        assert sorted(v.op.name for v in acc.var_list) == plain


def test_update_ops_run_once_per_micro_batch_and_the_loss_is_the_window_mean():
    batches = make_batches(tf.float64, False, 6, 4)

    def loss_fn(batch):
        inputs, labels = batch
        seen = v1.get_variable(
            "examples_seen", initializer=np.float64(0.0), dtype=tf.float64, trainable=False
        )
        v1.add_to_collection(
            v1.GraphKeys.UPDATE_OPS,
            seen.assign_add(tf.cast(tf.shape(inputs)[0], tf.float64)),
        )
        return Model(tf.float64, False, inputs=inputs, labels=labels).loss

    with tf.Graph().as_default():
        acc = tf1_accum.build_dataset_accumulation(
            loss_fn, v1.train.GradientDescentOptimizer(0.1), _dataset(batches), 3
        )
        # Nothing the loop adds can be fetched from outside it.
        assert v1.get_collection(v1.GraphKeys.UPDATE_OPS) == []
        seen = [v for v in v1.global_variables() if v.op.name == "examples_seen"][0]
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            _, loss = sess.run([acc.train_op, acc.loss])
            assert sess.run(seen) == 12.0
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            expected = np.mean([sess.run(model.loss, model.feed(b)) for b in batches[:3]])
    np.testing.assert_allclose(loss, expected, rtol=1e-12)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"loss_fn": 3}, TypeError, r"loss_fn must be a callable .*got 3"),
        ({"dataset": [1, 2]}, TypeError, r"dataset must be a tf.data.Dataset, got \[1, 2\]"),
        ({"steps": 0}, ValueError, "steps must be at least 1"),
        ({"optimizer": "sgd"}, TypeError, "optimizer must be a tf.compat.v1.train.Optimizer"),
    ],
    ids=["loss_fn", "dataset", "steps", "optimizer"],
)
def test_bad_arguments(kwargs, error, message):
    with tf.Graph().as_default():
        args = {
            "loss_fn": _loss_fn(tf.float32, False),
            "optimizer": v1.train.GradientDescentOptimizer(0.1),
            "dataset": _dataset(make_batches(tf.float32, False, 2, 2)),
            "steps": 2,
        }
        args.update(kwargs)
        with pytest.raises(error, match=message):
            tf1_accum.build_dataset_accumulation(**args)
        assert v1.global_variables() == []


def test_equals_the_helper_on_the_same_micro_batches():
    batches = make_batches(tf.float32, False, 4, 3)
    got = _train_in_graph(
        lambda: v1.train.MomentumOptimizer(0.1, 0.9), tf.float32, False, batches, 4
    )
    with tf.Graph().as_default():
        model = Model(tf.float32, False)
        acc = tf1_accum.build_accumulation(model.loss, v1.train.MomentumOptimizer(0.1, 0.9))
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in batches])
            helper = values_by_name(sess, tf1_accum.plain_variables())
    assert_same_values(got[0][1], helper, RTOL[tf.float32], "dataset loop vs helper")


def _weighted_dataset(batches, weights):
    """The micro-batches as dataset elements (inputs, labels, weight)."""
    inputs = np.stack([b[0] for b in batches])
    labels = np.stack([b[1] for b in batches])
    return tf.data.Dataset.from_tensor_slices((inputs, labels, np.asarray(weights, np.float64)))


def _model_loss(sparse):
    return lambda b: Model(tf.float64, sparse, inputs=b[0], labels=b[1]).loss


@pytest.mark.parametrize("weighted", [False, True], ids=["counted", "weighted"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_statistics_of_each_window_equal_numpy(sparse, weighted):
    """Three windows, the last cut short by the end of the data."""
    steps = 3
    windows = [[0, 1, 2], [3, 4, 5], [6, 7]]
    # Ids repeat within a micro-batch: the sparse gradient names rows twice.
    batches = make_batches(tf.float64, sparse, 8, 5)
    weights = [3.0, 7.0, 5.0, 6.0, 2.0, 4.0, 9.0, 1.0] if weighted else [1.0] * 8
    with tf.Graph().as_default():
        acc = tf1_accum.build_dataset_accumulation(
            _model_loss(sparse),
            OPTIMIZERS["momentum"](tf.float64),
            _weighted_dataset(batches, weights),
            steps,
            weight=(lambda b: b[2]) if weighted else None,
            statistics=True,
            micro_batch_size=None if weighted else 5,
        )
        # The same model fed by placeholders, for each micro-batch's gradient
        # at the parameters the window starts from.
        with v1.variable_scope(v1.get_variable_scope(), reuse=True):
            model = Model(tf.float64, sparse)
        grads = tf.gradients(model.loss, acc.var_list)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            micro, got = [], []
            for window in windows:
                micro.append(
                    [[dense(g) for g in sess.run(grads, model.feed(batches[k]))] for k in window]
                )
                fetched = sess.run([acc.train_op, acc.statistics, acc.micro_batches])
                got.append(fetched[1])
                assert fetched[2] == len(window)
            with pytest.raises(tf.errors.OutOfRangeError):
                sess.run(acc.train_op)
    traces, squares = [], []
    for w, (window, have) in enumerate(zip(windows, got)):
        want = numpy_statistics(micro[w], [weights[k] for k in window] if weighted else None, 5)
        assert_statistics(have, want, 1e-10, f"window {w}")
        assert have.micro_batches == len(window)
        traces.append(want["noise_trace"])
        squares.append(want["gradient_square"])
        np.testing.assert_allclose(
            have.noise_scale_ema, numpy_ema(traces) / numpy_ema(squares), rtol=1e-10
        )
    summary = v1.Summary.FromString(got[-1].summary_op)
    assert len(summary.value) == 7 + len(got[-1].variable_norms)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_with_statistics_it_trains_like_large_batches(sparse):
    """With statistics the loss is not prescaled; the updates are the same."""
    batches = make_batches(tf.float64, sparse, 8, 5)
    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        acc = tf1_accum.build_dataset_accumulation(
            _model_loss(sparse),
            OPTIMIZERS["momentum"](tf.float64),
            _dataset(batches),
            3,
            global_step=step,
            statistics=True,
            micro_batch_size=5,
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            got = []
            for _ in range(3):
                sess.run(acc.train_op)
                got.append(values_by_name(sess, tf1_accum.plain_variables()))
    expected = plain_training(
        "momentum", tf.float64, sparse, [batches[:3], batches[3:6], batches[6:]]
    )
    for w, (have, want) in enumerate(zip(got, expected)):
        assert_same_values(have, want, RTOL[tf.float64], f"window {w}")


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (
            {"statistics": True},
            ValueError,
            r"statistics=True needs micro_batch_size= \(examples per micro-batch\) or weight=",
        ),
        ({"statistics": "yes", "micro_batch_size": 4}, TypeError, "statistics must be True"),
        (
            {"statistics": True, "micro_batch_size": -2},
            ValueError,
            "micro_batch_size must be a positive number of examples, got -2",
        ),
        ({"micro_batch_size": 4}, ValueError, "micro_batch_size is used only by the gradient"),
        (
            {"statistics": True, "micro_batch_size": 4, "weight": lambda b: b[2]},
            ValueError,
            "Pass weight= or micro_batch_size=, not both",
        ),
    ],
    ids=["no size", "not a bool", "negative size", "size alone", "size and weight"],
)
def test_bad_statistics_options_leave_the_graph_as_it_was(kwargs, error, message):
    with tf.Graph().as_default() as graph:
        data = _weighted_dataset(make_batches(tf.float64, False, 2, 2), [1.0, 1.0])
        ops = len(graph.get_operations())
        with pytest.raises(error, match=message):
            tf1_accum.build_dataset_accumulation(
                _model_loss(False), OPTIMIZERS["sgd"](tf.float64), data, 2, **kwargs
            )
        assert len(graph.get_operations()) == ops
        assert v1.global_variables() == []


@pytest.mark.parametrize("statistics", [False, True], ids=["plain", "statistics"])
def test_applied_is_false_for_the_window_skipped_as_non_finite(statistics):
    batches = make_batches(tf.float64, False, 8, 4)
    batches[4] = (batches[4][0], np.full_like(batches[4][1], np.nan))  # in the second window
    with tf.Graph().as_default():
        acc = tf1_accum.build_dataset_accumulation(
            _model_loss(False),
            OPTIMIZERS["sgd"](tf.float64),
            _dataset(batches),
            3,
            statistics=statistics,
            micro_batch_size=4 if statistics else None,
        )
        assert (acc.statistics is not None) == statistics
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            runs = []
            for _ in range(3):
                before = sess.run(acc.var_list)
                fetches = [acc.train_op, acc.applied, acc.micro_batches]
                if statistics:
                    fetches.append(acc.statistics)
                runs.append(sess.run(fetches)[1:])
                moved = [not np.array_equal(a, b) for a, b in zip(sess.run(acc.var_list), before)]
                assert all(moved) == runs[-1][0] and any(moved) == runs[-1][0]
            assert sess.run(acc.skipped_windows) == 1
    assert [bool(run[0]) for run in runs] == [True, False, True]
    assert [int(run[1]) for run in runs] == [3, 3, 2]
    if statistics:
        first, skipped, last = (run[2] for run in runs)
        assert np.isfinite(first.noise_scale) and np.isnan(skipped.noise_scale)
        assert skipped.noise_scale_ema == first.noise_scale_ema
        assert np.isfinite(last.noise_scale) and last.noise_scale_ema != first.noise_scale_ema


# ---- the model is built once, inside the loop ----------------------------------------


def _counting(fn, calls):
    def counted(batch):
        calls.append(batch)
        return fn(batch)

    return counted


def test_loss_fn_and_weight_are_called_once():
    batches = make_batches(tf.float64, False, 5, 4)
    weights = [2.0, 1.0, 3.0, 1.0, 4.0]
    loss_calls, weight_calls = [], []
    with tf.Graph().as_default():
        acc = tf1_accum.build_dataset_accumulation(
            _counting(_model_loss(False), loss_calls),
            OPTIMIZERS["sgd"](tf.float64),
            _weighted_dataset(batches, weights),
            3,
            weight=_counting(lambda b: b[2], weight_calls),
        )
        assert (len(loss_calls), len(weight_calls)) == (1, 1)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            losses = [sess.run([acc.train_op, acc.loss])[1] for _ in range(2)]
    assert (len(loss_calls), len(weight_calls)) == (1, 1)
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            first = [sess.run(model.loss, model.feed(b)) for b in batches[:3]]
    np.testing.assert_allclose(losses[0], np.average(first, weights=weights[:3]), rtol=1e-12)


def _constants_equal_to(graph, value):
    """The Const ops that hold ``value``, in the graph and in its functions (loop bodies)."""
    graph_def = graph.as_graph_def()
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes += list(function.node_def)
    found = []
    for node in nodes:
        if node.op == "Const" and node.attr["value"].tensor.tensor_shape.dim:
            held = tf.make_ndarray(node.attr["value"].tensor)
            if held.shape == value.shape and np.array_equal(held, value):
                found.append(node.name)
    return found


def test_a_large_constant_of_loss_fn_is_in_the_graph_once():
    """The model is built once: no second copy of its constants outside the loop."""
    rng = np.random.RandomState(3)
    table = rng.randn(257, FEATURES)  # looked up by the loss: a constant of the model
    start = rng.randn(FEATURES, 1)  # a variable's initial value
    batches = make_batches(tf.float64, False, 4, 5)

    def loss_fn(batch):
        inputs, labels = batch
        w = v1.get_variable("w", initializer=start)
        offsets = tf.gather(tf.constant(table), tf.range(tf.shape(inputs)[0]))
        return tf.reduce_mean((tf.matmul(inputs + offsets, w) - labels) ** 2)

    with tf.Graph().as_default() as graph:
        acc = tf1_accum.build_dataset_accumulation(
            loss_fn, OPTIMIZERS["sgd"](tf.float64), _dataset(batches), 2
        )
        assert len(_constants_equal_to(graph, table)) == 1
        assert len(_constants_equal_to(graph, start)) == 1
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            loss = sess.run([acc.train_op, acc.loss])[1]
    inputs = [b[0] + table[:5] for b in batches[:2]]
    expected = np.mean([np.mean((x @ start - b[1]) ** 2) for x, b in zip(inputs, batches)])
    np.testing.assert_allclose(loss, expected, rtol=1e-12)


def _linear_loss(kind, kernel, bias):
    """A linear model on one micro-batch, its variables made as ``kind`` says."""

    def loss_fn(batch):
        inputs, labels = batch
        if kind == "keras":
            predictions = keras.layers.Dense(
                1,
                kernel_initializer=keras.initializers.Constant(kernel),
                bias_initializer=keras.initializers.Constant(bias),
                dtype=tf.float64,
            )(inputs)
        else:
            with v1.variable_scope("linear"):
                w = v1.get_variable(
                    "kernel",
                    kernel.shape,
                    tf.float64,
                    initializer=v1.constant_initializer(kernel),
                )
                b = v1.get_variable(
                    "bias", bias.shape, tf.float64, initializer=v1.zeros_initializer()
                )
            predictions = tf.matmul(inputs, w) + b
        return tf.reduce_mean((predictions - labels) ** 2)

    return loss_fn


def _two_windows_of_two(loss_fn, batches):
    """Trains ``loss_fn`` by the dataset loop (steps=2) and by large batches of 2 micro-batches.

    Returns ``(loop, large, names, initial)``: the variables after each of
    the two windows, by each way, the variable names the loop trained and
    their initial values in the loop's graph.
    """
    with tf.Graph().as_default():
        acc = tf1_accum.build_dataset_accumulation(
            loss_fn, OPTIMIZERS["momentum"](tf.float64), _dataset(batches), 2
        )
        names = sorted(v.op.name for v in acc.var_list)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            initial = values_by_name(sess, acc.var_list)
            loop = []
            for _ in range(2):
                sess.run(acc.train_op)
                loop.append(values_by_name(sess, acc.var_list))
    with tf.Graph().as_default():
        inputs = v1.placeholder(tf.float64, [None, FEATURES])
        labels = v1.placeholder(tf.float64, [None, 1])
        train = OPTIMIZERS["momentum"](tf.float64).minimize(loss_fn((inputs, labels)))
        assert sorted(v.op.name for v in v1.trainable_variables()) == names
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            large = []
            for window in (batches[:2], batches[2:]):
                x, y = (np.concatenate(part) for part in zip(*window))
                sess.run(train, {inputs: x, labels: y})
                large.append(values_by_name(sess, v1.trainable_variables()))
    return loop, large, names, initial


@pytest.mark.parametrize("kind", ["initializer objects", "keras"])
def test_variables_made_inside_the_loop_train_like_large_batches(kind):
    """Initializers given as objects, and a tf_keras layer built on its first call."""
    kernel = np.random.RandomState(5).randn(FEATURES, 1)
    bias = np.zeros(1)
    batches = make_batches(tf.float64, False, 4, 3)
    got, expected, _, _ = _two_windows_of_two(_linear_loss(kind, kernel, bias), batches)
    for w, (have, want) in enumerate(zip(got, expected)):
        assert_same_values(have, want, RTOL[tf.float64], f"{kind}, window {w}")


@pytest.mark.parametrize("maker", ["get_variable", "Variable"])
def test_a_variable_initialized_from_a_tensor_of_loss_fn_trains_like_large_batches(maker):
    """Its initial value is computed from nothing of the loop: it is built again outside."""
    batches = make_batches(tf.float64, False, 4, 3)
    start = (np.arange(FEATURES, dtype=np.float64) / 4.0 - 0.3).reshape(FEATURES, 1)

    def loss_fn(batch):
        inputs, labels = batch
        # tf.range, a cast, a reshape: several ops, built inside loss_fn.
        initial = tf.reshape(tf.cast(tf.range(FEATURES), tf.float64) / 4.0 - 0.3, [-1, 1])
        if maker == "get_variable":
            w = v1.get_variable("w", initializer=initial)
        else:
            w = v1.Variable(initial, name="w")
        return tf.reduce_mean((tf.matmul(inputs, w) - labels) ** 2)

    got, expected, names, initial = _two_windows_of_two(loss_fn, batches)
    assert names == ["w"]
    np.testing.assert_array_equal(initial["w"], start)
    for w, (have, want) in enumerate(zip(got, expected)):
        assert_same_values(have, want, RTOL[tf.float64], f"{maker}, window {w}")


@pytest.mark.parametrize("reads", ["micro-batch", "variable"])
@pytest.mark.parametrize("maker", ["get_variable", "Variable"])
def test_a_variable_initialized_from_a_value_of_the_loop_is_refused(maker, reads):
    def loss_fn(batch):
        inputs, labels = batch
        if reads == "micro-batch":
            initial = tf.reshape(tf.reduce_mean(inputs, 0), [FEATURES, 1])
        else:
            initial = 2.0 * v1.get_variable("v", initializer=np.ones([FEATURES, 1]))
        if maker == "get_variable":
            w = v1.get_variable("w", initializer=initial)
        else:
            w = v1.Variable(initial, name="w")
        return tf.reduce_mean((tf.matmul(inputs, w) - labels) ** 2)

    with tf.Graph().as_default():
        data = _dataset(make_batches(tf.float64, False, 2, 2))
        with pytest.raises(
            ValueError,
            match=r"loss_fn creates the variable w from .*, which reads a value of the loop "
            r"\(the micro-batch, a variable, a value from outside loss_fn\): give its initial "
            r"value as a NumPy value or an initializer, or create it first\.",
        ):
            tf1_accum.build_dataset_accumulation(loss_fn, OPTIMIZERS["sgd"](tf.float64), data, 2)
        assert v1.global_variables() == []


def test_a_loss_fn_with_a_conditional_of_its_own_trains_like_large_batches():
    """A tf.cond inside loss_fn: one variable read in one branch, the other in both."""
    batches = make_batches(tf.float64, False, 4, 3)
    kernel = np.random.RandomState(6).randn(FEATURES, 1)

    def loss_fn(batch):
        inputs, labels = batch
        w = v1.get_variable("w", initializer=kernel)
        v = v1.get_variable("v", initializer=0.5 * kernel)
        branch = v1.get_variable("branch", initializer=True, trainable=False)
        predictions = tf.cond(
            branch, lambda: tf.matmul(inputs, w + v), lambda: tf.matmul(inputs, v)
        )
        return tf.reduce_mean((predictions - labels) ** 2)

    got, expected, names, _ = _two_windows_of_two(loss_fn, batches)
    assert names == ["v", "w"]
    for w, (have, want) in enumerate(zip(got, expected)):
        assert_same_values(have, want, RTOL[tf.float64], f"window {w}")


def test_a_global_step_of_another_graph_is_refused_before_anything_is_built():
    batches = make_batches(tf.float64, False, 2, 4)
    with tf.Graph().as_default():
        other_step = v1.train.get_or_create_global_step()
    with tf.Graph().as_default() as graph:
        dataset = _dataset(batches)
        ops = len(graph.get_operations())
        with pytest.raises(
            ValueError,
            match="global_step global_step is not in the graph of the loss",
        ):
            tf1_accum.build_dataset_accumulation(
                _loss_fn(tf.float64, False),
                v1.train.GradientDescentOptimizer(0.1),
                dataset,
                2,
                global_step=other_step,
            )
        assert len(graph.get_operations()) == ops
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []


def test_a_run_after_one_that_failed_midway_counts_what_that_run_left():
    """micro_batches counts the window applied, the failed run's micro-batch included."""
    batches = make_batches(tf.float64, False, 5, 4)
    batches[1] = (batches[1][0], np.full_like(batches[1][1], 1e6))  # fails the check

    def checked_loss(batch):
        check = tf.debugging.assert_less(batch[1], np.float64(100.0), message="label out of range")
        with tf.control_dependencies([check]):
            return tf.identity(_model_loss(False)(batch))

    expected = plain_training("sgd", tf.float64, False, [[batches[0], batches[2], batches[3]]])
    with tf.Graph().as_default():
        acc = tf1_accum.build_dataset_accumulation(
            checked_loss, OPTIMIZERS["sgd"](tf.float64), _dataset(batches), 3
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            before = values_by_name(sess, acc.var_list)
            with pytest.raises(tf.errors.InvalidArgumentError, match="label out of range"):
                sess.run(acc.train_op)
            assert sess.run(acc.counter) == 1  # micro-batch 0, added before the failure
            assert_same_values(values_by_name(sess, acc.var_list), before, 0, "failed run")
            _, micro_batches = sess.run([acc.train_op, acc.micro_batches])
            got = values_by_name(sess, acc.var_list)
    assert micro_batches == 3
    want = {name: expected[0][name] for name in got}
    assert_same_values(got, want, RTOL[tf.float64], "the window after the failure")
