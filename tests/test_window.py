"""The window: its global norm (one pass per gradient, float64 only on overflow), and
reference variables among resource variables."""

import copy

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _imports import find_cycle
from _imports import package_imports
from _ways import BY_NAME
from _ways import HOOK
from _ways import WAYS

v1 = tf.compat.v1


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16])
def test_a_finite_window_beyond_the_float32_range_is_applied(dtype):
    # Each gradient element is finite in its dtype, but the sum of squares
    # overflows float32: the norm is taken again in float64, not reported as
    # Inf, and the window is applied.
    x = np.array([3.0, -4.0])
    scale = 1e30 if dtype == tf.float32 else 1e4
    with tf.Graph().as_default():
        w = v1.get_variable("w", initializer=np.array([1.0, 2.0], dtype.as_numpy_dtype))
        loss = tf.cast(scale, dtype) * tf.reduce_sum(w * x.astype(dtype.as_numpy_dtype))
        acc = tf1_accum.build_accumulation(loss, v1.train.GradientDescentOptimizer(0.5 / scale))
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(acc.accum_op)
            _, norm = sess.run([acc.apply_op, acc.global_norm])
            assert sess.run(acc.skipped_windows) == 0
            got = sess.run(w)
    np.testing.assert_allclose(norm, 5.0 * scale, rtol=1e-3)
    np.testing.assert_allclose(got, [1.0 - 1.5, 2.0 + 2.0], rtol=1e-3)


def _mixed_loss(batch):
    """A model with one reference variable among resource variables."""
    x, y = batch
    rng = np.random.RandomState(0)
    w1 = v1.get_variable("w1", initializer=rng.randn(4, 5), dtype=tf.float64, use_resource=False)
    b1 = v1.get_variable("b1", initializer=0.1 * rng.randn(5), dtype=tf.float64, use_resource=True)
    w2 = v1.get_variable("w2", initializer=rng.randn(5, 1), dtype=tf.float64, use_resource=True)
    assert w1.dtype != w1.dtype.base_dtype and w2.dtype == w2.dtype.base_dtype
    return tf.reduce_mean((tf.matmul(tf.tanh(tf.matmul(x, w1) + b1), w2) - y) ** 2)


def _mixed_batches():
    """Two windows, of 3 and 2 micro-batches of 2 examples."""
    rng = np.random.RandomState(3)
    return [[(rng.randn(2, 4), rng.randn(2, 1)) for _ in range(n)] for n in (3, 2)]


def _mixed_values(sess):
    return {v.op.name: sess.run(v) for v in tf1_accum.plain_variables()}


def _large_batch_values(windows, train_op, x, y, feed=lambda window: {}):
    """The variables after each window, trained by ``train_op`` on the window's batch."""
    with v1.Session() as sess:
        sess.run(v1.global_variables_initializer())
        expected = []
        for window in windows:
            xs, ys = (np.concatenate(part) for part in zip(*window))
            sess.run(train_op, {x: xs, y: ys, **feed(window)})
            expected.append(_mixed_values(sess))
    return expected


def _assert_each_window_equals(way, built, windows, expected, check=None):
    """Runs ``windows`` through ``way``; after each, the variables equal ``expected``."""
    with way.session() as sess:
        for w, window in enumerate(windows):
            way.run_window(sess, built, window)
            got = _mixed_values(sess)
            if check is not None:
                check(w, got)
            for name, want in expected[w].items():
                np.testing.assert_allclose(
                    got[name], want, rtol=1e-10, atol=0, err_msg=f"{way}, window {w}: {name}"
                )


@pytest.mark.parametrize("way", WAYS, ids=str)
def test_reference_and_resource_variables_in_one_graph_train_as_plain_training(way):
    """A reference variable needs version 1 conditionals: every way in builds them.

    The second window is shorter than ``steps``: the wrapper flushes it, the
    dataset loop applies it when the data ends.
    """
    windows = _mixed_batches()
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float64, [None, 4])
        y = v1.placeholder(tf.float64, [None, 1])
        step = v1.train.get_or_create_global_step()
        train_op = v1.train.MomentumOptimizer(0.1, 0.9).minimize(
            _mixed_loss((x, y)), global_step=step
        )
        expected = _large_batch_values(windows, train_op, x, y)

    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        built = way.build(
            _mixed_loss,
            v1.train.MomentumOptimizer(0.1, 0.9),
            [b for window in windows for b in window],
            3,
            global_step=step,
        )

        def counts_updates(w, got):
            assert got["global_step"] == w + 1

        _assert_each_window_equals(way, built, windows, expected, check=counts_updates)


def test_the_package_has_no_import_cycle():
    graph = package_imports()
    # Read from every form of import: "import tf1_accum._x", "from tf1_accum
    # import _x", "from tf1_accum._x import name" and relative ones, anywhere
    # in a module: inside functions and under "if TYPE_CHECKING:" too.
    assert graph["tf1_accum._accumulation"] >= {"tf1_accum._validate", "tf1_accum._window"}
    assert "tf1_accum.check._lint" in graph["tf1_accum.check._cli"]
    # The window is the spine: every way in imports it, it imports none of them.
    for way_in in ("_accumulation", "_optimizer", "_dataset"):
        assert "tf1_accum._window" in graph[f"tf1_accum.{way_in}"], way_in
    above = {"_accumulation", "_optimizer", "_dataset", "_distributed"}
    assert not graph["tf1_accum._window"] & {f"tf1_accum.{m}" for m in above}
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_the_import_graph_sees_every_form_of_import(tmp_path):
    # A package whose modules import each other in a ring, each link written
    # in another form, the last ones only for types or inside a function or
    # class: the ring is found.
    package = tmp_path / "ring"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("import ring.b\n")
    (package / "b.py").write_text("import ring.c as c\n")
    (package / "c.py").write_text("from ring import d\n")
    (package / "d.py").write_text("try:\n    from .e import name\nexcept ImportError:\n    pass\n")
    (package / "e.py").write_text(
        "import typing\nif typing.TYPE_CHECKING:\n    import ring.d\n"
        "def later():\n    import ring.c\nclass Late:\n    from ring.a import x\n"
    )
    graph = package_imports(package)
    assert graph == {
        "ring": set(),
        "ring.a": {"ring.b"},
        "ring.b": {"ring.c"},
        "ring.c": {"ring.d"},
        "ring.d": {"ring.e"},
        "ring.e": {"ring.a", "ring.c", "ring.d"},
    }
    assert find_cycle(graph) == ["ring.a", "ring.b", "ring.c", "ring.d", "ring.e", "ring.a"]
    assert find_cycle({**graph, "ring.e": set()}) is None


def _linear_model_of(batch):
    w = v1.get_variable("w", initializer=np.array([1.0, -2.0]))
    return tf.reduce_mean(tf.tensordot(batch[0], w, 1) ** 2)


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"average": "yes"}, TypeError, r"average must be True or False, got 'yes'"),
        ({"skip_nonfinite": 1}, TypeError, r"skip_nonfinite must be True or False, got 1"),
        ({"clip_norm": -1.0}, ValueError, r"clip_norm must be a positive, finite .*, got -1.0"),
        ({"clip_norm": float("inf")}, ValueError, r"or None \(no clipping\), got inf"),
        ({"clip_norm": "1"}, TypeError, r"clip_norm must be a positive, finite number or None"),
        ({"update_ops": "op"}, TypeError, r"update_ops must be None"),
    ],
)
@pytest.mark.parametrize("way", WAYS, ids=str)
def test_every_way_in_checks_the_window_options_with_one_text(way, options, error, message):
    with tf.Graph().as_default():
        sgd = v1.train.GradientDescentOptimizer(0.1)
        data = [(np.ones((2, 2)),)] * 4
        with pytest.raises(error, match=message):
            way.build(_linear_model_of, sgd, data, 2, **options)
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
@pytest.mark.parametrize("dtype", [tf.float64, tf.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("way", WAYS, ids=str)
def test_every_way_in_accumulates_the_sum_of_the_micro_batch_gradients(way, dtype, weighted):
    """The accumulators hold the window's sum (weighted: of w_i g_i over the largest
    weight rounded down to a power of two, here 2), whichever way in built them; only
    the apply divides."""
    way.require("feed_window_ops")
    rng = np.random.RandomState(5)
    data = [(rng.randn(3, 4).astype(dtype.as_numpy_dtype),) for _ in range(3)]
    weights = [3.0, 0.5, 2.0]
    start = rng.randn(4, 2).astype(dtype.as_numpy_dtype)

    def loss_of(x, w):
        return tf.reduce_mean(tf.tanh(tf.matmul(x, w)) ** 2)

    def model_fn(inputs):
        return loss_of(inputs[0], v1.get_variable("w", initializer=start))

    with tf.Graph().as_default():
        weight_in = v1.placeholder(dtype, [])
        built = way.build(
            model_fn,
            v1.train.GradientDescentOptimizer(0.1),
            data,
            steps=4,
            weight=(lambda inputs: tf.identity(weight_in)) if weighted else None,
        )
        w = [v for v in v1.global_variables() if v.op.name == "w"][0]
        accumulator = [v for v in v1.global_variables() if v.op.name == "w/accumulator"][0]
        gradient = tf.gradients(loss_of(built.inputs[0], w), w)[0]
        accumulate = way.window_ops(built).accumulate
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            expected = np.zeros_like(start)
            for batch, w_i in zip(data, weights):
                feed = {**built.feed(batch), weight_in: w_i}
                g = sess.run(gradient, feed)
                expected = expected + (w_i / 2.0 * g if weighted else g)
                sess.run(accumulate, feed)
            got = sess.run(accumulator)
            assert sess.run(built.counter) == len(data)
    np.testing.assert_allclose(got, expected, rtol=1e-10 if dtype == tf.float64 else 1e-6)


def _shrink_and_shift(gradient, variable, window):
    """A transform that reads the variable and both fields of the window."""
    shift = (
        tf.cast(window.micro_batches, gradient.dtype) * 1e-3
        + tf.cast(window.global_norm, gradient.dtype) * 1e-2
    )
    return gradient * 0.5 + shift * tf.sign(variable)


@pytest.mark.parametrize(
    "clip_norm, transform",
    [
        (None, _shrink_and_shift),
        (0.05, None),
        (0.05, [_shrink_and_shift, lambda g, v, w: g * 3.0]),
    ],
    ids=["transform", "clip_norm", "clip_then_two"],
)
@pytest.mark.parametrize("way", WAYS, ids=str)
def test_every_way_in_transforms_the_windows_mean_as_large_batch_training_would(
    way, clip_norm, transform
):
    """The transforms run on each variable's mean, after clip_norm's clipping, with the
    window's norm and count: the updates equal large-batch training that transforms its
    own (dense) gradient the same way. The second window is short (flushed, or the data's
    end). A sparse gradient reaches a transform with each row once, summed over the
    window: large-batch training's holds a row per lookup, so only a transform that
    scales every row by one factor (clip_norm's) sees the same there."""
    windows = _mixed_batches()
    transforms = [] if transform is None else transform
    transforms = transforms if isinstance(transforms, list) else [transforms]
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float64, [None, 4])
        y = v1.placeholder(tf.float64, [None, 1])
        count = v1.placeholder(tf.int64, [])
        optimizer = v1.train.MomentumOptimizer(0.1, 0.9)
        pairs = optimizer.compute_gradients(_mixed_loss((x, y)))
        norm = tf.cast(tf.linalg.global_norm([g for g, _ in pairs]), tf.float64)
        window = tf1_accum.WindowMean(norm, count)
        if clip_norm is not None:
            pairs = [(g * (clip_norm / tf.maximum(norm, clip_norm)), v) for g, v in pairs]
        for t in transforms:
            pairs = [(t(g, v, window), v) for g, v in pairs]
        train_op = optimizer.apply_gradients(pairs)
        expected = _large_batch_values(
            windows, train_op, x, y, feed=lambda batches: {count: len(batches)}
        )
    with tf.Graph().as_default():
        built = way.build(
            _mixed_loss,
            v1.train.MomentumOptimizer(0.1, 0.9),
            [b for batches in windows for b in batches],
            3,
            clip_norm=clip_norm,
            transform=transform,
        )
        _assert_each_window_equals(way, built, windows, expected)


def _cube_rows(gradient, variable, window):
    """A non-linear transform of a sparse gradient: each row's values cubed."""
    assert isinstance(gradient, tf.IndexedSlices)
    return tf.IndexedSlices(gradient.values**3, gradient.indices, gradient.dense_shape)


@pytest.mark.parametrize("way", WAYS, ids=str)
def test_a_transform_sees_a_sparse_gradient_as_each_touched_row_once_meaned_over_the_window(
    way,
):
    """A transform of an embedding's gradient gets one row per row the window touched,
    the window's sum over every lookup of it, divided by the micro-batches (the rows of
    the large batch's dense gradient): a cube of those rows, computed by NumPy. It
    differs from cubing TensorFlow's raw slices of the large batch (a row per lookup)."""
    rows, width, b, n = 6, 3, 3, 3
    rng = np.random.RandomState(7)
    # Repeated ids within a micro-batch and across them; row 5 is never looked up.
    ids = [[[0, 0], [1, 2], [0, 3]], [[2, 2], [4, 0], [1, 1]], [[3, 0], [0, 4], [2, 1]]]
    windows = [
        [(np.array(i, np.int64), rng.randn(b, 2, width)) for i in ids],
        [(np.array(i[::-1], np.int64), rng.randn(b, 2, width)) for i in ids],
    ]
    start = rng.randn(rows, width)

    def model_fn(inputs):
        looked_up, targets = inputs
        table = v1.get_variable("table", initializer=start)
        # Linear in the rows: a lookup's gradient is its target over the micro-batch size.
        return tf.reduce_mean(tf.reduce_sum(tf.gather(table, looked_up) * targets, [1, 2]))

    expected, table, per_lookup = [], start.copy(), start.copy()
    for window in windows:
        mean = np.zeros_like(start)
        raw = np.zeros_like(start)
        for looked_up, targets in window:
            np.add.at(mean, looked_up.ravel(), targets.reshape(-1, width) / (b * n))
            np.add.at(raw, looked_up.ravel(), (targets.reshape(-1, width) / (b * n)) ** 3)
        table = table - mean**3  # SGD, learning rate 1
        per_lookup = per_lookup - raw
        expected.append(table.copy())
    assert np.abs(expected[-1] - per_lookup).max() > 1e-3  # the two readings differ
    with tf.Graph().as_default():
        built = way.build(
            model_fn,
            v1.train.GradientDescentOptimizer(1.0),
            [batch for window in windows for batch in window],
            n,
            transform=_cube_rows,
        )
        variable = [v for v in v1.global_variables() if v.op.name == "table"][0]
        with way.session() as sess:
            for w, window in enumerate(windows):
                way.run_window(sess, built, window)
                np.testing.assert_allclose(
                    sess.run(variable), expected[w], rtol=1e-10, atol=1e-12, err_msg=f"window {w}"
                )


@pytest.mark.parametrize(
    "transform, error, message",
    [
        ("clip", TypeError, r"transform \(or each item of a list\) must be a callable .*'clip'"),
        ([abs, 3], TypeError, r"transform\[1\] must be a callable .*, got 3"),
        (lambda g, v, w: g[:1], ValueError, r"must return the gradient's shape \[2\] for w, got"),
        (lambda g, v, w: 1.0, TypeError, r"must return a tensor for the gradient of w, got"),
        (
            lambda g, v, w: tf.cast(g, tf.int32),
            TypeError,
            r"must return the gradient's dtype float64 for w, got int32: cast its result",
        ),
    ],
    ids=["string", "list_with_int", "shape", "float", "dtype"],
)
@pytest.mark.parametrize("way", WAYS, ids=str)
def test_a_bad_transform_is_refused_and_leaves_no_state(way, transform, error, message):
    with tf.Graph().as_default():
        sgd = v1.train.GradientDescentOptimizer(0.1)
        data = [(np.ones((2, 2)),)] * 4
        with pytest.raises(error, match=message):
            way.build(_linear_model_of, sgd, data, 2, transform=transform)
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []


def _with_get_variable(gradient, variable):
    return v1.get_variable(
        variable.op.name + "/running",
        shape=gradient.shape,
        dtype=gradient.dtype,
        initializer=tf.zeros_initializer(),
        trainable=False,
    )


def _with_variable(gradient, variable):
    return tf.Variable(lambda: tf.zeros(gradient.shape, gradient.dtype), trainable=False)


@pytest.mark.parametrize(
    "make", [_with_get_variable, _with_variable], ids=["get_variable", "Variable"]
)
@pytest.mark.parametrize("way", (*WAYS, HOOK), ids=str)
def test_a_transform_with_state_runs_once_per_apply_as_in_plain_training(way, make):
    """A transform that creates a variable and updates it (a running average of the
    gradient) builds in every way in, and runs once per window: the updates equal
    plain training with the same transform. Every apply a way builds (a flush, a fused
    apply) shares the variable, as its optimizer's state."""

    def running(gradient, variable, window):
        state = make(gradient, variable)
        return tf.identity(state.assign(0.5 * state + gradient))

    windows = _mixed_batches()
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float64, [None, 4])
        y = v1.placeholder(tf.float64, [None, 1])
        optimizer = v1.train.MomentumOptimizer(0.1, 0.9)
        pairs = optimizer.compute_gradients(_mixed_loss((x, y)))
        window = tf1_accum.WindowMean(tf.constant(0.0, tf.float64), tf.constant(0, tf.int64))
        train_op = optimizer.apply_gradients([(running(g, v, window), v) for g, v in pairs])
        expected = [
            {k: v for k, v in values.items() if k in ("w1", "b1", "w2")}
            for values in _large_batch_values(windows, train_op, x, y)
        ]
    with tf.Graph().as_default():
        built = way.build(
            _mixed_loss,
            v1.train.MomentumOptimizer(0.1, 0.9),
            [b for batches in windows for b in batches],
            3,
            transform=running,
        )
        _assert_each_window_equals(way, built, windows, expected)


def test_the_gradients_fetched_with_apply_op_are_the_ones_it_applied():
    """With a random transform, grads_and_vars read in the apply's run are what moved
    the variables: the transform runs once, and both read its result."""

    def noise(gradient, variable, window):
        return gradient + tf.random.normal(tf.shape(gradient), stddev=1e-3, dtype=gradient.dtype)

    (window,) = _mixed_batches()[:1]
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float64, [None, 4])
        y = v1.placeholder(tf.float64, [None, 1])
        rate = 0.5
        acc = tf1_accum.build_accumulation(
            _mixed_loss((x, y)),
            v1.train.GradientDescentOptimizer(tf.constant(rate, tf.float64)),
            transform=noise,
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            before = sess.run(acc.var_list)
            for xs, ys in window:
                sess.run(acc.accum_op, {x: xs, y: ys})
            _, applied = sess.run((acc.apply_op, [g for g, _ in acc.grads_and_vars]))
            after = sess.run(acc.var_list)
    for var, start, gradient, end in zip(acc.var_list, before, applied, after):
        np.testing.assert_allclose(end, start - rate * gradient, rtol=1e-15, err_msg=var.op.name)


def _keep(gradient, variable, window):
    return gradient


def test_the_window_options_hash_and_deep_copy():
    with tf.Graph().as_default():
        update = tf.no_op()
        options = tf1_accum.WindowOptions(transform=[_keep], update_ops=[update])
        same = tf1_accum.WindowOptions(transform=(_keep,), update_ops=(update,))
        assert options.transform == (_keep,) and options.update_ops == (update,)
        assert hash(options) == hash(same) and options == same
        assert copy.deepcopy({"options": options})["options"] is options


@pytest.mark.parametrize("way", [BY_NAME["optimizer"], BY_NAME["dataset"]], ids=str)
def test_a_transform_variable_made_from_a_tensor_of_the_apply_is_refused_saying_what_to_do(way):
    """These ways build the apply inside a conditional: a variable cannot start from a
    tensor computed there, and the error says to pass a callable."""

    def made_from_gradient(gradient, variable, window):
        return gradient + tf.Variable(tf.zeros_like(gradient), trainable=False)

    with tf.Graph().as_default():
        data = [(np.ones((2, 2)),)] * 4
        with pytest.raises(ValueError, match=r"creates a variable from a tensor computed where"):
            way.build(
                _linear_model_of,
                v1.train.GradientDescentOptimizer(0.1),
                data,
                2,
                transform=made_from_gradient,
            )
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []
