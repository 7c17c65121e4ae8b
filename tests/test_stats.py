"""Gradient statistics, the micro-batch recommendation and running averages."""

import logging

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import OPTIMIZERS
from _helpers import Model
from _helpers import make_batches
from _statistics import assert_statistics
from _statistics import dense
from _statistics import numpy_ema
from _statistics import numpy_statistics
from _ways import BY_NAME
from _ways import WAYS

v1 = tf.compat.v1

# Linear regression with known gradient noise. x ~ N(0, I_d), y = x.w* + eps,
# eps ~ N(0, s^2), loss = mean 0.5 (x.w - y)^2, w held at w* + r. The
# per-example gradient x (x.r - eps) has mean G = r and covariance
# (|r|^2 + s^2) I + r r^T (Isserlis), so tr(Sigma) = (d + 1) |r|^2 + d s^2.
D = 4
NOISE = 1.0
WINDOWS = 300


def _regression_estimates(mode):
    """Runs WINDOWS windows at fixed parameters; returns (estimates, |G|^2, tr(Sigma))."""
    rng = np.random.RandomState(0)
    w_star = rng.randn(D)
    r = rng.randn(D)
    truth_square = float(r @ r)
    truth_trace = (D + 1) * truth_square + D * NOISE**2
    n, b = 8, 64
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float64, [None, D])
        y = v1.placeholder(tf.float64, [None])
        w = v1.get_variable("w", initializer=w_star + r)
        loss = tf.reduce_mean(0.5 * (tf.linalg.matvec(x, w) - y) ** 2)
        sgd = v1.train.GradientDescentOptimizer(0.0)  # parameters stay at w* + r
        if mode == "weighted":
            size = tf.cast(tf.shape(x)[0], tf.float64)
            acc = tf1_accum.build_accumulation(loss, sgd, weight=size, statistics=True)
        else:
            acc = tf1_accum.build_accumulation(
                loss, sgd, average=mode != "sum", statistics=True, micro_batch_size=b
            )
        stats = acc.statistics
        fetch = [stats.gradient_square, stats.noise_trace, stats.noise_scale_ema]
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            rows = []
            for _ in range(WINDOWS):
                # Weighted: micro-batches of different sizes, mean size b.
                sizes = rng.randint(b // 2, 3 * b // 2 + 1, n) if mode == "weighted" else [b] * n
                for size in sizes:
                    bx = rng.randn(size, D)
                    sess.run(acc.accum_op, {x: bx, y: bx @ w_star + NOISE * rng.randn(size)})
                rows.append(sess.run([acc.apply_op] + fetch)[1:])
            np.testing.assert_allclose(sess.run(w), w_star + r, rtol=0, atol=0)
    return np.array(rows), truth_square, truth_trace


@pytest.mark.parametrize("mode", ["mean", "sum", "weighted"])
def test_estimates_are_unbiased_on_linear_regression(mode):
    rows, truth_square, truth_trace = _regression_estimates(mode)
    square, trace, ema = rows.T
    # The estimators vary from window to window (they are not constants)...
    assert np.std(square) > 0.05 * truth_square and np.std(trace) > 0.05 * truth_trace
    # ...and their means over the windows lie within 10% of the truth.
    np.testing.assert_allclose(np.mean(square), truth_square, rtol=0.1)
    np.testing.assert_allclose(np.mean(trace), truth_trace, rtol=0.1)
    np.testing.assert_allclose(
        np.mean(trace) / np.mean(square), truth_trace / truth_square, rtol=0.1
    )
    # The moving average is the ratio of the averaged trace and |G|^2.
    np.testing.assert_allclose(ema[-1], numpy_ema(trace) / numpy_ema(square), rtol=1e-10)


def _dense(value):
    """A fetched gradient (ndarray or IndexedSlicesValue) as a dense ndarray."""
    if isinstance(value, np.ndarray):
        return value
    dense = np.zeros(value.dense_shape)
    np.add.at(dense, value.indices, value.values)
    return dense


# Float32: the gradients are float32 and the statistics float64, so they
# carry the gradients' rounding; the estimates subtract, so get more room.
TOLERANCES = {tf.float64: (1e-10, 1e-8), tf.float32: (1e-5, 1e-4)}


@pytest.mark.parametrize(
    "dtype, average",
    [(tf.float64, True), (tf.float64, False), (tf.float32, True)],
    ids=["float64-mean", "float64-sum", "float32-mean"],
)
@pytest.mark.parametrize("weighted", [False, True], ids=["counted", "weighted"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_statistics_equal_numpy_on_the_fetched_gradients(sparse, weighted, dtype, average):
    sizes = [3, 7, 5, 9] if weighted else [5] * 4
    # Ids repeat within a micro-batch: the sparse gradient names rows twice.
    batches = make_batches(dtype, sparse, len(sizes), sizes)
    stray = make_batches(dtype, sparse, 2, 4, seed=7)  # discarded by zero_op
    with tf.Graph().as_default():
        model = Model(dtype, sparse)
        size = tf.cast(tf.shape(model.labels)[0], tf.float32)
        acc = tf1_accum.build_accumulation(
            model.loss,
            OPTIMIZERS["sgd"](dtype),
            average=average,
            weight=size if weighted else None,
            micro_batch_size=None if weighted else 5,
            statistics=True,
            clip_norm=0.01,  # statistics are of the gradient before clipping
        )
        grads = tf.gradients(model.loss, acc.var_list)
        stats = acc.statistics
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for batch in stray:
                sess.run(acc.accum_op, model.feed(batch))
            sess.run(acc.zero_op)
            micro = []
            for batch in batches:
                _, g = sess.run([acc.accum_op, grads], model.feed(batch))
                micro.append([_dense(v).astype(np.float64) for v in g])
            got = sess.run([acc.apply_op, stats])[1]
    weights = np.array(sizes, np.float64) if weighted else np.ones(len(sizes))
    mean = [
        sum(w * g[i] for w, g in zip(weights, micro)) / weights.sum() for i in range(len(micro[0]))
    ]
    big = sum(np.sum(m**2) for m in mean)
    small = sum(w * sum(np.sum(p**2) for p in g) for w, g in zip(weights, micro)) / weights.sum()
    n = len(sizes)
    b_small = weights.sum() / n if weighted else 5.0
    b_big = n * b_small
    square = (b_big * big - b_small * small) / (b_big - b_small)
    trace = (small - big) / (1 / b_small - 1 / b_big)
    rtol, estimate_rtol = TOLERANCES[dtype]
    np.testing.assert_allclose(got.global_norm, np.sqrt(big), rtol=rtol)
    np.testing.assert_allclose(got.variable_norms, [np.linalg.norm(m) for m in mean], rtol=rtol)
    np.testing.assert_allclose(got.micro_batch_square_norm, small, rtol=rtol)
    np.testing.assert_allclose(got.micro_batch_size, b_small, rtol=rtol)
    assert got.micro_batches == n
    np.testing.assert_allclose(got.gradient_square, square, rtol=estimate_rtol)
    np.testing.assert_allclose(got.noise_trace, trace, rtol=estimate_rtol)
    np.testing.assert_allclose(got.noise_scale, trace / square, rtol=estimate_rtol)
    np.testing.assert_allclose(got.noise_scale_ema, trace / square, rtol=estimate_rtol)
    assert big > 1e-3 and trace != 0.0  # not a test on zero gradients


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_a_finite_micro_batch_beyond_the_float32_range_has_finite_statistics(sparse):
    # Each float32 gradient element is finite, but its sum of squares
    # overflows float32: each micro-batch's squared norm is taken again in
    # float64 (as the window's is), not reported as Inf.
    scale = 1e19
    # Sparse: row 0 is looked up twice, and its two rows are summed first.
    ids = [0, 0, 2]
    micro_inputs = [
        np.array([[3.0, -4.0], [3.0, -4.0], [1.0, 2.0]]),
        np.array([[1.0, 2.0], [-2.0, 1.0], [5.0, 0.5]]),
    ]
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [3, 2])
        table = v1.get_variable("table", initializer=np.ones([3, 2], np.float32))
        rows = tf.gather(table, ids) if sparse else tf.stack([table[i] for i in ids])
        loss = tf.constant(scale, tf.float32) * tf.reduce_sum(rows * x)
        acc = tf1_accum.build_accumulation(
            loss, v1.train.GradientDescentOptimizer(0.0), statistics=True, micro_batch_size=3
        )
        (grad,) = tf.gradients(loss, acc.var_list)
        assert isinstance(grad, tf.IndexedSlices) is sparse
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            micro = []
            for inputs in micro_inputs:
                _, g = sess.run([acc.accum_op, grad], {x: inputs})
                micro.append([dense(g)])
            got = sess.run([acc.apply_op, acc.statistics])[1]
    want = numpy_statistics(micro, micro_batch_size=3)
    # Every micro-batch's squared norm is beyond float32, and finite in float64.
    assert min(np.sum(g**2) for (g,) in micro) > 2.0 * float(np.finfo(np.float32).max)
    assert_statistics(got, want, rtol=1e-5, where="float32 beyond its range")
    np.testing.assert_allclose(got.noise_scale_ema, want["noise_scale"], rtol=1e-5)


def test_one_micro_batch_has_no_estimate_and_leaves_the_average():
    batches = make_batches(tf.float64, False, 3, 4)
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        acc = tf1_accum.build_accumulation(
            model.loss, OPTIMIZERS["sgd"](tf.float64), statistics=True, micro_batch_size=4
        )
        stats = acc.statistics
        fetch = [acc.apply_op, stats.noise_scale, stats.noise_scale_ema, stats.global_norm]
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(acc.accum_op, model.feed(batches[0]))
            _, alone, ema_alone, norm = sess.run(fetch)
            for batch in batches[1:]:
                sess.run(acc.accum_op, model.feed(batch))
            _, pair, ema_pair, _ = sess.run(fetch)
            sess.run(acc.accum_op, model.feed(batches[0]))
            _, alone_again, ema_after, _ = sess.run(fetch)
    assert np.isnan(alone) and np.isnan(ema_alone) and np.isnan(alone_again)
    assert norm > 0.0  # the norms exist for one micro-batch
    assert np.isfinite(pair)
    np.testing.assert_allclose(ema_pair, pair, rtol=1e-12)
    assert ema_after == ema_pair


def test_summary_op_holds_every_scalar():
    batches = make_batches(tf.float32, False, 2, 4)
    with tf.Graph().as_default():
        model = Model(tf.float32, False)
        acc = tf1_accum.build_accumulation(
            model.loss, OPTIMIZERS["adam"](tf.float32), statistics=True, micro_batch_size=4
        )
        assert v1.get_collection(v1.GraphKeys.SUMMARIES) == []
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for batch in batches:
                sess.run(acc.accum_op, model.feed(batch))
            _, serialized, stats = sess.run(
                [acc.apply_op, acc.statistics.summary_op, acc.statistics]
            )
    summary = v1.Summary.FromString(serialized)
    values = {v.tag.split("statistics/", 1)[1]: v.simple_value for v in summary.value}
    names = [
        "global_norm",
        "micro_batch_square_norm",
        "micro_batch_size",
        "gradient_square",
        "noise_trace",
        "noise_scale",
        "noise_scale_ema",
    ]
    assert set(values) == set(names) | {f"gradient_norm/{n}" for n in ("w1", "b1", "w2")}
    for name in names:
        np.testing.assert_allclose(values[name], getattr(stats, name), rtol=1e-6)
    np.testing.assert_allclose(values["gradient_norm/w2"], stats.variable_norms[2], rtol=1e-6)


class _RecordingSession:
    """Wraps a session and keeps what each ``run`` returned."""

    def __init__(self, sess):
        self.sess = sess
        self.results = []

    def run(self, fetches, feed_dict=None):
        self.results.append(self.sess.run(fetches, feed_dict=feed_dict))
        return self.results[-1]


@pytest.mark.parametrize("fused", [False, True])
def test_run_accumulation_logs_the_recommendation(caplog, fused):
    rng = np.random.RandomState(3)
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        acc = tf1_accum.build_accumulation(
            model.loss,
            OPTIMIZERS["sgd"](tf.float64),
            statistics=True,
            micro_batch_size=2,
            fused=fused,
        )
        verbosity = v1.logging.get_verbosity()
        v1.logging.set_verbosity(v1.logging.INFO)
        try:
            with v1.Session() as sess, caplog.at_level(logging.INFO, logger="tensorflow"):
                sess.run(v1.global_variables_initializer())
                one = [model.feed((rng.randn(2, 4), rng.randn(2, 1)))]
                tf1_accum.run_accumulation(sess, acc, one)
                feeds = [model.feed((rng.randn(2, 4), rng.randn(2, 1))) for _ in range(6)]
                recording = _RecordingSession(sess)
                tf1_accum.run_accumulation(recording, acc, feeds)
        finally:
            v1.logging.set_verbosity(verbosity)
    # 6 micro-batches and the apply; fused: the last micro-batch with the apply.
    assert len(recording.results) == (6 if fused else 7)
    noise_scale, ema, size = recording.results[-1][-1]
    assert size == 2.0 and np.isfinite(noise_scale)
    np.testing.assert_allclose(ema, noise_scale, rtol=1e-12)  # the first estimate
    messages = [r.getMessage() for r in caplog.records if "tf1_accum" in r.getMessage()]
    assert len(messages) == 2
    assert "no estimate yet" in messages[0]
    expected = tf1_accum.recommend_micro_batches(float(ema), 2)
    assert f"recommend {expected} micro-batches of 2 examples" in messages[1]
    assert f"{ema:.4g}" in messages[1]


@pytest.mark.parametrize(
    "noise_scale, size, expected",
    [(1000.0, 64, 16), (1024, 64, 16), (1025.0, 64, 17), (10.0, 64, 1), (0.0, 8, 1), (7.5, 2.5, 3)],
)
def test_recommend_micro_batches(noise_scale, size, expected):
    got = tf1_accum.recommend_micro_batches(noise_scale, size)
    assert got == expected and type(got) is int
    assert got * size >= noise_scale and (got == 1 or (got - 1) * size < noise_scale)


@pytest.mark.parametrize(
    "noise_scale, size, error, message",
    [
        (float("nan"), 8, ValueError, "noise_scale must be a finite number of at least 0, got nan"),
        (-3.0, 8, ValueError, "noise_scale must be a finite number of at least 0, got -3.0"),
        (float("inf"), 8, ValueError, "no usable estimate yet"),
        (10.0, 0, ValueError, "micro_batch_size must be a positive number, got 0"),
        ("10", 8, TypeError, "noise_scale must be a number, got '10'"),
        (10.0, True, TypeError, "micro_batch_size must be a number, got True"),
    ],
)
def test_recommend_micro_batches_rejects(noise_scale, size, error, message):
    with pytest.raises(error, match=message):
        tf1_accum.recommend_micro_batches(noise_scale, size)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (
            {"statistics": True},
            ValueError,
            r"statistics=True needs micro_batch_size= \(examples per micro-batch\) or weight=",
        ),
        ({"statistics": 1, "micro_batch_size": 4}, TypeError, "statistics must be True or False"),
        (
            {"statistics": True, "micro_batch_size": "4"},
            TypeError,
            "micro_batch_size must be a positive number of examples, got '4'",
        ),
        (
            {"statistics": True, "micro_batch_size": 0},
            ValueError,
            "micro_batch_size must be a positive number of examples, got 0",
        ),
        ({"micro_batch_size": 4}, ValueError, "micro_batch_size is used only by the gradient"),
        (
            {"statistics": True, "micro_batch_size": 4, "weight": "size"},
            ValueError,
            "Pass weight= or micro_batch_size=, not both",
        ),
    ],
)
def test_bad_statistics_options(kwargs, error, message):
    with tf.Graph().as_default():
        model = Model(tf.float32, False)
        if kwargs.get("weight") == "size":
            kwargs["weight"] = tf.cast(tf.shape(model.labels)[0], tf.float32)
        with pytest.raises(error, match=message):
            tf1_accum.build_accumulation(model.loss, OPTIMIZERS["sgd"](tf.float32), **kwargs)
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []


@pytest.mark.parametrize("horizon", [None, 1, 3])
def test_running_average_equals_numpy(horizon):
    rng = np.random.RandomState(5)
    values = [(rng.randn(3, 2), rng.randn()) for _ in range(8)]
    resets = {5}  # reset_op before the 6th update
    with tf.Graph().as_default():
        a = v1.placeholder(tf.float64, [3, 2])
        b = v1.placeholder(tf.float64, [])
        avg = tf1_accum.build_running_average([a, b], horizon=horizon)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            since = []
            for k, (va, vb) in enumerate(values):
                if k in resets:
                    sess.run(avg.reset_op)
                    since = []
                if horizon is not None and len(since) == horizon:
                    since = []
                since.append((va, vb))
                sess.run(avg.update_op, {a: va, b: vb})
                got_a, got_b, count = sess.run(avg.averages + [avg.count])
                assert count == len(since), f"update {k}"
                np.testing.assert_allclose(
                    got_a, np.mean([s[0] for s in since], axis=0), rtol=1e-12, err_msg=f"update {k}"
                )
                np.testing.assert_allclose(got_b, np.mean([s[1] for s in since]), rtol=1e-12)


def test_running_average_of_window_gradients_sparse_and_single_tensor():
    batches = make_batches(tf.float64, True, 3, 4)
    with tf.Graph().as_default():
        model = Model(tf.float64, True)
        grads = tf.gradients(model.loss, [v1.trainable_variables()[0]])
        assert isinstance(grads[0], tf.IndexedSlices)
        avg = tf1_accum.build_running_average(grads[0])
        dense = tf.convert_to_tensor(grads[0])
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            seen = [sess.run([avg.update_op, dense], model.feed(batch))[1] for batch in batches]
            got = sess.run(avg.averages[0])
    assert np.abs(np.mean(seen, axis=0)).max() > 0.0
    np.testing.assert_allclose(got, np.mean(seen, axis=0), rtol=1e-12)


@pytest.mark.parametrize(
    "make, horizon, error, message",
    [
        (lambda: [], None, ValueError, "values is empty"),
        (lambda: {"a": 1}, None, TypeError, "values must be a tensor or a list of tensors"),
        (lambda: [np.zeros(2)], None, TypeError, r"values\[0\] must be a floating-point tensor of"),
        (lambda: [tf.constant([1, 2])], None, TypeError, "got Const.* of dtype int32"),
        (
            lambda: [v1.placeholder(tf.float32, [None])],
            None,
            ValueError,
            "which is not fully defined",
        ),
        (lambda: [tf.constant(1.0)], 0, ValueError, "horizon must be at least 1"),
        (lambda: [tf.constant(1.0)], 2.0, TypeError, "horizon must be an int"),
    ],
)
def test_running_average_rejects(make, horizon, error, message):
    with tf.Graph().as_default():
        with pytest.raises(error, match=message):
            tf1_accum.build_running_average(make(), horizon=horizon)
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []


def test_running_average_needs_graph_mode():
    from tensorflow.python.eager import context

    with context.eager_mode():
        with pytest.raises(RuntimeError, match="build_running_average builds TF1 graph-mode ops"):
            tf1_accum.build_running_average([tf.constant(1.0)])


def _initial_values(sparse):
    """The model's trainable values before any update."""
    with tf.Graph().as_default():
        Model(tf.float64, sparse)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            return sess.run(v1.trainable_variables())


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_statistics_leave_training_unchanged(sparse):
    batches = make_batches(tf.float64, sparse, 8, 5)
    results = {}
    for statistics in (False, True):
        with tf.Graph().as_default():
            model = Model(tf.float64, sparse)
            kwargs = {"statistics": True, "micro_batch_size": 5} if statistics else {}
            opt = OPTIMIZERS["adam"](tf.float64)
            acc = tf1_accum.build_accumulation(model.loss, opt, **kwargs)
            with v1.Session() as sess:
                sess.run(v1.global_variables_initializer())
                for window in (batches[:4], batches[4:]):
                    tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in window])
                results[statistics] = sess.run(v1.trainable_variables())
    for without, with_, initial in zip(results[False], results[True], _initial_values(sparse)):
        np.testing.assert_array_equal(with_, without)
        assert not np.array_equal(with_, initial)  # it trained


def test_nonfinite_window_leaves_the_moving_average():
    batches = make_batches(tf.float64, False, 4, 4)
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        acc = tf1_accum.build_accumulation(
            model.loss, OPTIMIZERS["sgd"](tf.float64), statistics=True, micro_batch_size=4
        )
        fetch = [acc.apply_op, acc.statistics.noise_scale, acc.statistics.noise_scale_ema]
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for batch in batches[:2]:
                sess.run(acc.accum_op, model.feed(batch))
            _, first, ema_first = sess.run(fetch)
            bad = (batches[2][0], np.full_like(batches[2][1], np.nan))
            for batch in (bad, batches[3]):
                sess.run(acc.accum_op, model.feed(batch))
            _, skipped, ema_skipped = sess.run(fetch)
            assert sess.run(acc.skipped_windows) == 1
    assert np.isfinite(first) and np.isnan(skipped)
    assert ema_skipped == ema_first


STATS_STEPS = 3


def _statistics_batches(weighted):
    sizes = [3, 6, 4, 5, 2, 7] if weighted else [4] * 6
    return make_batches(tf.float64, False, len(sizes), sizes)


def _window_statistics(way, weighted):
    """The statistics ``way`` reads in the apply runs of two windows of 3 micro-batches."""
    batches = _statistics_batches(weighted)
    with tf.Graph().as_default():
        built = way.build(
            lambda b: Model(tf.float64, False, inputs=b[0], labels=b[1]).loss,
            OPTIMIZERS["momentum"](tf.float64),
            batches,
            STATS_STEPS,
            weight=(lambda b: tf.cast(tf.shape(b[1])[0], tf.float64)) if weighted else None,
            statistics=True,
            micro_batch_size=None if weighted else 4,
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            return [
                way.run_window(sess, built, batches[k : k + STATS_STEPS], fetch=built.statistics)
                for k in range(0, len(batches), STATS_STEPS)
            ]


@pytest.mark.parametrize("way", WAYS, ids=str)
@pytest.mark.parametrize("weighted", [False, True], ids=["counted", "weighted"])
def test_statistics_equal_the_builders_in_every_way_in(weighted, way):
    way.require("fetch_at_apply")
    want_windows = _window_statistics(BY_NAME["ops"], weighted)
    got = _window_statistics(way, weighted)
    assert len(got) == len(want_windows) == 2
    for w, (want, have) in enumerate(zip(want_windows, got)):
        for field in tf1_accum.GradientStatistics._fields:
            if field != "summary_op":
                np.testing.assert_allclose(
                    getattr(have, field),
                    getattr(want, field),
                    rtol=1e-10,
                    err_msg=f"{way}, window {w}: {field}",
                )
        assert have.micro_batches == STATS_STEPS and np.isfinite(have.noise_scale_ema)
    summary = v1.Summary.FromString(got[1].summary_op)
    assert len(summary.value) == 7 + 3


@pytest.mark.parametrize("weighted", [False, True], ids=["counted", "weighted"])
def test_optimizer_statistics_in_accumulating_runs_are_empty(weighted):
    batches = _statistics_batches(weighted)
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        size = tf.cast(tf.shape(model.labels)[0], tf.float64) if weighted else None
        wrapper = tf1_accum.AccumulationOptimizer(
            OPTIMIZERS["momentum"](tf.float64),
            STATS_STEPS,
            weight=size,
            statistics=True,
            micro_batch_size=None if weighted else 4,
        )
        train_op = wrapper.minimize(model.loss)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for k, batch in enumerate(batches):
                _, value = sess.run([train_op, wrapper.window.statistics], model.feed(batch))
                if (k + 1) % STATS_STEPS:  # an accumulating run: no statistics
                    assert value.micro_batches == 0 and value.summary_op == b""
                    assert np.isnan(value.noise_scale) and np.isnan(value.global_norm)
                else:
                    assert value.micro_batches == STATS_STEPS


def test_optimizer_statistics_options():
    opt = OPTIMIZERS["sgd"](tf.float32)
    with pytest.raises(
        ValueError,
        match=r"statistics=True needs micro_batch_size= \(examples per micro-batch\) or weight=",
    ):
        tf1_accum.AccumulationOptimizer(opt, 2, statistics=True)
    with pytest.raises(TypeError, match="micro_batch_size must be a positive number of examples"):
        tf1_accum.AccumulationOptimizer(opt, 2, statistics=True, micro_batch_size=[4])
    with tf.Graph().as_default():
        model = Model(tf.float32, False)
        wrapper = tf1_accum.AccumulationOptimizer(OPTIMIZERS["sgd"](tf.float32), 2)
        with pytest.raises(ValueError, match="window exists once the train op is built"):
            _ = wrapper.window
        wrapper.minimize(model.loss)
        assert wrapper.window.statistics is None and wrapper.window.flush_statistics is None


@pytest.mark.parametrize("how", ["build_accumulation", "optimizer"])
def test_a_failed_build_with_statistics_leaves_no_state(how):
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [None])
        fixed = v1.get_variable("fixed", initializer=1.0)
        loose = v1.Variable(tf.ones([2]), shape=tf.TensorShape(None), name="loose")
        loss = tf.reduce_mean(fixed * x) + tf.reduce_sum(loose)
        before = list(v1.global_variables())
        opt = v1.train.GradientDescentOptimizer(0.1)
        with pytest.raises(ValueError, match="loose has shape .* not fully defined"):
            if how == "optimizer":
                tf1_accum.AccumulationOptimizer(
                    opt, 2, statistics=True, micro_batch_size=4
                ).minimize(loss)
            else:
                tf1_accum.build_accumulation(loss, opt, statistics=True, micro_batch_size=4)
        assert v1.global_variables() == before
        assert v1.local_variables() == []
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []


@pytest.mark.parametrize("weighted", [False, True], ids=["counted", "weighted"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_fused_statistics_equal_numpy(sparse, weighted):
    """accum_apply_op's statistics: the last micro-batch's add and the apply in one run."""
    sizes = [[3, 7, 5], [6, 2, 4]] if weighted else [[5] * 3, [5] * 3]
    batches = make_batches(tf.float64, sparse, 6, sum(sizes, []))
    with tf.Graph().as_default():
        model = Model(tf.float64, sparse)
        size = tf.cast(tf.shape(model.labels)[0], tf.float64)
        acc = tf1_accum.build_accumulation(
            model.loss,
            OPTIMIZERS["momentum"](tf.float64),
            weight=size if weighted else None,
            micro_batch_size=None if weighted else 5,
            statistics=True,
            fused=True,
        )
        assert acc.statistics is not None and acc.accum_apply_statistics is not None
        grads = tf.gradients(model.loss, acc.var_list)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            windows, got = [], []
            for w, window in enumerate(sizes):
                micro = []
                for k in range(len(window)):
                    batch = batches[3 * w + k]
                    # The gradients at the window's parameters, before its update.
                    micro.append([dense(g) for g in sess.run(grads, model.feed(batch))])
                    if k < len(window) - 1:
                        sess.run(acc.accum_op, model.feed(batch))
                    else:
                        fetched = sess.run(
                            [acc.accum_apply_op, acc.accum_apply_statistics], model.feed(batch)
                        )
                        got.append(fetched[1])
                windows.append(micro)
            assert sess.run(acc.counter) == 0
    traces, squares = [], []
    for w, (micro, have) in enumerate(zip(windows, got)):
        want = numpy_statistics(micro, sizes[w] if weighted else None, 5)
        assert_statistics(have, want, 1e-10, f"window {w}")
        assert have.micro_batches == 3
        traces.append(want["noise_trace"])
        squares.append(want["gradient_square"])
        np.testing.assert_allclose(
            have.noise_scale_ema, numpy_ema(traces) / numpy_ema(squares), rtol=1e-10
        )


@pytest.mark.parametrize("weighted", [False, True], ids=["counted", "weighted"])
def test_flushed_window_statistics_equal_numpy(weighted):
    """flush_statistics: the statistics of the partial window flush_op applies."""
    steps = 3
    sizes = [3, 6, 4, 5, 2] if weighted else [4] * 5  # a full window, then two left over
    batches = make_batches(tf.float64, False, len(sizes), sizes)
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        size = tf.cast(tf.shape(model.labels)[0], tf.float64) if weighted else None
        wrapper = tf1_accum.AccumulationOptimizer(
            OPTIMIZERS["momentum"](tf.float64),
            steps,
            weight=size,
            statistics=True,
            micro_batch_size=None if weighted else 4,
        )
        train_op = wrapper.minimize(model.loss)
        grads = tf.gradients(model.loss, v1.trainable_variables())
        flush = [wrapper.flush_op, wrapper.window.flush_statistics]
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            idle = sess.run(flush)[1]  # nothing accumulated: nothing flushed
            micro = []
            for k, batch in enumerate(batches):
                micro.append([dense(g) for g in sess.run(grads, model.feed(batch))])
                _, full = sess.run([train_op, wrapper.window.statistics], model.feed(batch))
                if k == steps - 1:
                    first = full
            flushed = sess.run(flush)[1]
            assert sess.run(wrapper.window.counter) == 0
    assert idle.micro_batches == 0 and idle.summary_op == b""
    assert np.isnan(idle.global_norm) and np.isnan(idle.noise_scale)
    weights = sizes if weighted else None
    want_first = numpy_statistics(micro[:steps], weights and weights[:steps], 4)
    want = numpy_statistics(micro[steps:], weights and weights[steps:], 4)
    assert_statistics(first, want_first, 1e-10, "the full window")
    assert_statistics(flushed, want, 1e-10, "the flushed window")
    assert flushed.micro_batches == 2
    traces = [want_first["noise_trace"], want["noise_trace"]]
    squares = [want_first["gradient_square"], want["gradient_square"]]
    np.testing.assert_allclose(
        flushed.noise_scale_ema, numpy_ema(traces) / numpy_ema(squares), rtol=1e-10
    )
    summary = v1.Summary.FromString(flushed.summary_op)
    assert len(summary.value) == 7 + 3
