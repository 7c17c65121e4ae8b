"""Tests of run_accumulation given the large batch: its split and its memory fit.

The machine the tests run on has no memory limit to run into, so the models
here make one: a micro-batch of r rows whose largest ``cost`` is c needs
r x c floats of scratch, and above a budget it asks for 2**44 times more,
which no allocator can give (``cost`` plays the padded length of a
sequence: the memory of a micro-batch follows its longest row). By default
NumPy allocates the scratch inside a ``tf.numpy_function``: its
``MemoryError`` reaches ``session.run`` as ``ResourceExhaustedError`` in
milliseconds. One test lets TensorFlow's own CPU allocator refuse it (about
10 s: it waits for memory to be freed before it gives up). The scratch feeds
the model's input (adding 0), so every gradient, and every ``accum_op``,
needs it.
"""

import contextlib
import logging
import threading
import types

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import OPTIMIZERS
from _helpers import RTOL
from _helpers import CountingSession
from _helpers import Model
from _helpers import assert_same_values
from _helpers import concat
from _helpers import dataset_of
from _helpers import loss_fn_of
from _helpers import make_batches
from _helpers import plain_training
from _helpers import values_by_name

v1 = tf.compat.v1
SizeChange = tf1_accum.SizeChange

ROWS = 12  # rows of each large batch
BUDGET = 8  # scratch floats a micro-batch may take (rows x its largest cost)
IMPOSSIBLE = 2**44  # times more than the budget, once over it: petabytes


def _guarded(inputs, cost, budget, allocator="numpy"):
    """``inputs`` plus 0, after a scratch allocation that runs out of memory above ``budget``."""
    rows = tf.shape(inputs, out_type=tf.int64)[0]
    check = v1.assert_non_negative(cost, message="cost must not be negative")
    with tf.control_dependencies([check]):
        need = rows * tf.reduce_max(cost)
    if allocator == "numpy":

        def scratch_of(need):
            elements = need * IMPOSSIBLE if need > budget else need
            return np.zeros(elements, np.float32).sum(dtype=np.float32)

        scratch = tf.numpy_function(scratch_of, [need], tf.float32, name="scratch")
        scratch.set_shape([])
    else:
        elements = tf.where(need > budget, need * IMPOSSIBLE, need)
        scratch = tf.reduce_sum(tf.zeros(tf.reshape(elements, [1]), tf.float32))
    return inputs + tf.cast(scratch, inputs.dtype)


@contextlib.contextmanager
def _accumulating(
    optimizer_name="adam",
    dtype=tf.float64,
    sparse=False,
    budget=BUDGET,
    weighted=True,
    statistics=False,
    session=None,
    allocator="numpy",
    **options,
):
    """The `_helpers.Model`, fed through a memory guard, and its accumulation in a session.

    Yields a namespace: ``feed(batch, cost)`` makes the large batch's feed
    dict; ``acc``, ``sess``, ``step``, ``model``.
    """
    with tf.Graph().as_default():
        if sparse:
            inputs = v1.placeholder(tf.int32, [None], name="ids")
        else:
            inputs = v1.placeholder(dtype, [None, 4], name="x")
        labels = v1.placeholder(dtype, [None, 1], name="y")
        cost = v1.placeholder(tf.int64, [None], name="cost")
        guarded = _guarded(inputs, cost, budget, allocator)
        model = Model(dtype, sparse, inputs=guarded, labels=labels)
        step = v1.train.get_or_create_global_step()
        weight = tf.shape(labels)[0] if weighted else None
        if statistics and not weighted:
            options.setdefault("micro_batch_size", 5)
        acc = tf1_accum.build_accumulation(
            model.loss,
            OPTIMIZERS[optimizer_name](dtype),
            global_step=step,
            weight=weight,
            statistics=statistics,
            **options,
        )

        def feed(batch, costs=None):
            rows = len(batch[1])
            costs = np.ones(rows, np.int64) if costs is None else np.asarray(costs, np.int64)
            return {inputs: batch[0], labels: batch[1], cost: costs}

        with session() if session else v1.Session() as sess:
            if not session:
                sess.run(v1.global_variables_initializer())
            yield types.SimpleNamespace(feed=feed, acc=acc, sess=sess, step=step, model=model)


class _Recording(CountingSession):
    """A `CountingSession` that also keeps the feeds of the runs that add a micro-batch."""

    def __init__(self, sess, acc):
        super().__init__(sess)
        self.adds = []
        self._ops = {acc.accum_op, acc.accum_apply_op} - {None}

    def run(self, fetches, feed_dict=None, **kwargs):
        first = fetches[0] if isinstance(fetches, tuple) else fetches
        if first in self._ops:
            self.adds.append(feed_dict)
        return super().run(fetches, feed_dict=feed_dict, **kwargs)


def _costs(expensive_row, rows=ROWS, cost=3):
    costs = np.ones(rows, np.int64)
    if expensive_row is not None:
        costs[expensive_row] = cost
    return costs


def _assert_large_batch(t, expected, where, dtype=tf.float64):
    """Every variable the plain run has (slots, global step) equals it."""
    got = values_by_name(t.sess, v1.global_variables())
    assert_same_values(got, expected, RTOL[dtype], where)


@pytest.mark.parametrize("allocator", ["numpy", "tensorflow"])
def test_the_guard_raises_a_real_resource_exhausted_error_in_accum_op(allocator):
    """What the memory fit reacts to reaches session.run as ResourceExhaustedError."""
    batch = make_batches(tf.float64, False, 1, ROWS)[0]
    said = {"numpy": "MemoryError: Unable to allocate", "tensorflow": "OOM when allocating"}
    with _accumulating(allocator=allocator) as t:
        small = t.feed((batch[0][:2], batch[1][:2]), _costs(0, rows=2))  # 2 x 3 <= 8
        t.sess.run(t.acc.accum_op, small)
        assert t.sess.run(t.acc.counter) == 1
        with pytest.raises(tf.errors.ResourceExhaustedError, match=said[allocator]):
            t.sess.run(t.acc.accum_op, t.feed(batch, _costs(0)))  # 12 x 3 > 8
        assert t.sess.run(t.acc.counter) == 1


def test_the_fit_reacts_to_tensorflows_own_allocator():
    batches = make_batches(tf.float64, False, 2, ROWS)
    expected = plain_training("adam", tf.float64, False, [[b] for b in batches])
    fit = tf1_accum.MemoryFit()
    with _accumulating(allocator="tensorflow") as t:
        for w, batch in enumerate(batches):
            tf1_accum.run_accumulation(
                t.sess, t.acc, t.feed(batch, _costs(5)), micro_batch_size=4, memory_fit=fit
            )
            _assert_large_batch(t, expected[w], f"TensorFlow's allocator, window {w}")
    assert fit.changes == (
        SizeChange(0, None, 4, "first window"),
        SizeChange(0, 4, 2, "out of memory"),
    )


SPLITS = [
    {"micro_batch_size": 1},
    {"micro_batch_size": 5},  # 5, 5, 2
    {"micro_batch_size": 4},  # divides 12
    {"micro_batch_size": 12},
    {"micro_batch_size": 50},
    {"micro_batches": 5},  # 3, 3, 2, 2, 2
    {"micro_batches": 3},
]


@pytest.mark.parametrize("split", SPLITS, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_any_split_of_a_weighted_accumulation_equals_the_large_batch(split, sparse):
    batches = make_batches(tf.float64, sparse, 3, ROWS)
    expected = plain_training("adam", tf.float64, sparse, [[b] for b in batches])
    with _accumulating(sparse=sparse, budget=10**6) as t:
        for w, batch in enumerate(batches):
            counting = CountingSession(t.sess)
            losses = tf1_accum.run_accumulation(
                counting, t.acc, t.feed(batch), fetches=t.model.loss, **split
            )
            size = split.get("micro_batch_size")
            count = -(-ROWS // size) if size else split["micro_batches"]
            assert len(losses) == count and len(counting.calls) == count + 1
            rows = [len(feed[t.model.labels]) for feed in counting.calls[:-1]]
            assert sum(rows) == ROWS
            _assert_large_batch(t, expected[w], f"{split}, window {w}")


@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
def test_every_optimizer_with_a_shorter_last_micro_batch(optimizer_name, fused):
    batches = make_batches(tf.float64, False, 3, ROWS)
    expected = plain_training(optimizer_name, tf.float64, False, [[b] for b in batches])
    with _accumulating(optimizer_name, budget=10**6, fused=fused) as t:
        for w, batch in enumerate(batches):
            tf1_accum.run_accumulation(t.sess, t.acc, t.feed(batch), micro_batch_size=5)
            _assert_large_batch(t, expected[w], f"{optimizer_name}, window {w}")


def test_float32_with_a_shorter_last_micro_batch():
    batches = make_batches(tf.float32, False, 3, ROWS)
    expected = plain_training("adam", tf.float32, False, [[b] for b in batches])
    with _accumulating(dtype=tf.float32, budget=10**6) as t:
        for w, batch in enumerate(batches):
            tf1_accum.run_accumulation(t.sess, t.acc, t.feed(batch), micro_batch_size=5)
            _assert_large_batch(t, expected[w], f"float32, window {w}", tf.float32)


def test_a_list_of_large_batches_is_one_window():
    batches = make_batches(tf.float64, False, 2, [10, 7])
    expected = plain_training("adam", tf.float64, False, [batches])
    with _accumulating(budget=10**6) as t:
        losses = tf1_accum.run_accumulation(
            t.sess, t.acc, [t.feed(b) for b in batches], t.model.loss, micro_batch_size=4
        )
        assert len(losses) == 3 + 2  # 4, 4, 2 and 4, 3
        _assert_large_batch(t, expected[0], "two large batches")
        assert t.sess.run(t.step) == 1


def test_an_unweighted_accumulation_splits_into_equal_micro_batches():
    batches = make_batches(tf.float64, False, 2, ROWS)
    expected = plain_training("adam", tf.float64, False, [[b] for b in batches])
    with _accumulating(budget=10**6, weighted=False) as t:
        tf1_accum.run_accumulation(t.sess, t.acc, t.feed(batches[0]), micro_batch_size=3)
        _assert_large_batch(t, expected[0], "micro_batch_size=3")
        tf1_accum.run_accumulation(t.sess, t.acc, t.feed(batches[1]), micro_batches=6)
        _assert_large_batch(t, expected[1], "micro_batches=6")


@pytest.mark.parametrize(
    "split, message",
    [
        ({"micro_batch_size": 5}, r"micro_batch_size=5 gives 2 x 5, 2 rows"),
        ({"micro_batches": 5}, r"micro_batches=5 gives 2 x 3, 3 x 2 rows"),
    ],
    ids=["size", "count"],
)
def test_an_unweighted_accumulation_refuses_unequal_micro_batches(split, message):
    batch = make_batches(tf.float64, False, 1, ROWS)[0]
    with _accumulating(budget=10**6, weighted=False) as t:
        t.sess.run(t.acc.accum_op, t.feed(batch))  # a window in progress stays
        before = values_by_name(t.sess, t.acc.var_list)
        counting = CountingSession(t.sess)
        with pytest.raises(
            ValueError, match=r"does not split into equal micro-batches \(" + message
        ):
            tf1_accum.run_accumulation(counting, t.acc, t.feed(batch), **split)
        assert counting.calls == []
        assert t.sess.run(t.acc.counter) == 1
        after = values_by_name(t.sess, t.acc.var_list)
        assert all(np.array_equal(before[k], after[k]) for k in before)


def test_statistics_built_with_a_micro_batch_size_take_only_that_size():
    batches = make_batches(tf.float64, False, 1, 10)
    expected = plain_training("adam", tf.float64, False, [batches])
    with _accumulating(budget=10**6, weighted=False, statistics=True) as t:
        counting = CountingSession(t.sess)
        with pytest.raises(ValueError, match=r"built with micro_batch_size=5, but micro_batch_"):
            tf1_accum.run_accumulation(counting, t.acc, t.feed(batches[0]), micro_batch_size=2)
        assert counting.calls == []
        tf1_accum.run_accumulation(t.sess, t.acc, t.feed(batches[0]), micro_batch_size=5)
        _assert_large_batch(t, expected[0], "statistics, micro_batch_size=5")


def test_values_that_are_not_batch_shaped_are_fed_whole_to_every_micro_batch():
    rng = np.random.RandomState(3)
    x_value, y_value = rng.randn(10, 4), rng.randn(10, 1)
    table_value, class_value = rng.randn(6, 4), rng.randn(3)

    def build():
        x = v1.placeholder(tf.float64, [None, 4], name="x")
        y = v1.placeholder(tf.float64, [None, 1], name="y")
        scale = v1.placeholder(tf.float64, [], name="scale")
        table = v1.placeholder(tf.float64, [6, 4], name="table")  # known leading size
        classes = v1.placeholder(tf.float64, [None], name="classes")  # 3 rows, not 10
        w = v1.get_variable("w", initializer=np.random.RandomState(0).randn(4, 1))
        features = x + tf.reduce_mean(table, 0)
        prediction = tf.matmul(features, w) * scale + tf.reduce_sum(classes)
        loss = tf.reduce_mean((prediction - y) ** 2)
        feed = {
            x: x_value,
            y: y_value,
            "scale:0": 1.5,
            table: table_value,
            classes: class_value,
        }
        return y, loss, w, feed

    with tf.Graph().as_default():
        _, loss, w, feed = build()
        train = v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        with v1.Session() as plain:
            plain.run(v1.global_variables_initializer())
            plain.run(train, feed)
            expected = plain.run(w)
    with tf.Graph().as_default():
        y, loss, w, feed = build()
        acc = tf1_accum.build_accumulation(
            loss, v1.train.GradientDescentOptimizer(0.1), weight=tf.shape(y)[0]
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            counting = CountingSession(sess)
            tf1_accum.run_accumulation(counting, acc, feed, micro_batch_size=4)
            np.testing.assert_allclose(sess.run(w), expected, rtol=1e-12)
    fed = counting.calls[:-1]
    assert [len(f[y]) for f in fed] == [4, 4, 2]
    for f in fed:
        assert f["scale:0"] == 1.5
        assert f[_named(f, "table")] is table_value
        assert f[_named(f, "classes")] is class_value
    np.testing.assert_array_equal(np.concatenate([f[_named(f, "x")] for f in fed]), x_value)


def _named(feed, name):
    return next(k for k in feed if getattr(k, "name", None) == f"{name}:0")


@pytest.mark.parametrize(
    "make_feed, error, message",
    [
        (lambda t, b: [], ValueError, "holds no batch"),
        (lambda t, b: [t.feed(b), 3], TypeError, r"feed_dicts\[1\] must be a feed dict"),
        (lambda t, b: 3, TypeError, r"a batch to split: a feed dict or a list of them, got 3"),
        (
            lambda t, b: {t.model.labels: 1.0, "cost:0": 1},
            ValueError,
            "feed_dicts holds nothing to split",
        ),
        (
            lambda t, b: {_named(t.feed(b), "x"): b[0], t.model.labels: b[1], **_extras(t)},
            ValueError,
            "no one batch dimension: as many arrays have 12 rows as 3",
        ),
        (
            lambda t, b: {**t.feed((b[0][:0], b[1][:0]), np.zeros(0, np.int64))},
            ValueError,
            "a batch of 0 rows",
        ),
        (lambda t, b: {"nothing:0": b[0]}, ValueError, "names no tensor"),
    ],
    ids=["empty", "not-a-dict", "not-iterable", "nothing-to-split", "tie", "no-rows", "bad-key"],
)
def test_a_large_batch_that_cannot_be_split_is_refused_before_anything_runs(
    make_feed, error, message
):
    batch = make_batches(tf.float64, False, 1, ROWS)[0]
    with _accumulating(budget=10**6) as t:
        feed_dicts = make_feed(t, batch)
        counting = CountingSession(t.sess)
        with pytest.raises(error, match=message):
            tf1_accum.run_accumulation(counting, t.acc, feed_dicts, micro_batch_size=4)
        assert counting.calls == []


def _extras(t):
    """Two placeholders of unknown leading size that the model does not read, fed 3 rows."""
    with t.acc.counter.graph.as_default():
        return {v1.placeholder(tf.float64, [None], name=n): np.zeros(3) for n in ("a", "b")}


def test_a_sparse_tensor_feed_is_refused():
    with tf.Graph().as_default():
        sparse = v1.sparse.placeholder(tf.float64, name="sparse_x")
        y = v1.placeholder(tf.float64, [None], name="y")
        w = v1.get_variable("w", initializer=np.float64(2.0))
        loss = tf.reduce_mean((w * y - 1.0) ** 2)
        acc = tf1_accum.build_accumulation(
            loss, v1.train.GradientDescentOptimizer(0.1), weight=tf.shape(y)[0]
        )
        value = v1.SparseTensorValue([[0, 0], [1, 2]], [1.0, 2.0], [2, 3])
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            counting = CountingSession(sess)
            with pytest.raises(TypeError, match=r"feeds a SparseTensor \(sparse_x\), which"):
                tf1_accum.run_accumulation(
                    counting, acc, {sparse: value, y: np.ones(2)}, micro_batch_size=1
                )
            assert counting.calls == []


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (
            {"micro_batch_size": "4"},
            TypeError,
            r"micro_batch_size must be an int, got '4'",
        ),
        (
            {"micro_batch_size": 0},
            ValueError,
            "micro_batch_size must be at least 1, got 0",
        ),
        ({"micro_batches": 2.0}, TypeError, "micro_batches must be an int, got 2.0"),
        (
            {"micro_batches": -1},
            ValueError,
            "micro_batches must be at least 1, got -1",
        ),
        ({"micro_batch_size": 4, "micro_batches": 3}, ValueError, "not both"),
        ({"memory_fit": 4}, TypeError, r"memory_fit must be a tf1_accum.MemoryFit or None, got 4"),
    ],
    ids=["size-str", "size-zero", "count-float", "count-negative", "both", "fit-int"],
)
def test_bad_split_arguments_are_refused_before_anything_runs(kwargs, error, message):
    batch = make_batches(tf.float64, False, 1, ROWS)[0]
    with _accumulating(budget=10**6) as t:
        counting = CountingSession(t.sess)
        with pytest.raises(error, match=message):
            tf1_accum.run_accumulation(counting, t.acc, t.feed(batch), **kwargs)
        assert counting.calls == []


def test_a_single_dict_without_a_split_still_says_how_to_split_it():
    batch = make_batches(tf.float64, False, 1, ROWS)[0]
    with _accumulating(budget=10**6) as t:
        with pytest.raises(TypeError, match=r"got a single dict.*micro_batch_size="):
            tf1_accum.run_accumulation(t.sess, t.acc, t.feed(batch))


@pytest.mark.parametrize(
    "probe_every, error, message",
    [
        (0, ValueError, r"probe_every must be at least 1 \(windows\), got 0"),
        ("10", TypeError, r"probe_every must be an int \(windows\), got '10'"),
        (True, TypeError, "got True"),
    ],
)
def test_memory_fit_checks_probe_every(probe_every, error, message):
    with pytest.raises(error, match=message):
        tf1_accum.MemoryFit(probe_every=probe_every)


# The memory fit.


@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
@pytest.mark.parametrize(
    "expensive_row, failing", [(0, 0), (5, 1), (11, 2)], ids=["first", "middle", "last"]
)
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_out_of_memory_reruns_the_window_with_half_the_micro_batch(
    expensive_row, failing, fused, sparse
):
    """Micro-batches of 4 rows: the one holding the row of cost 3 needs 12 > 8."""
    batches = make_batches(tf.float64, sparse, 3, ROWS)
    expected = plain_training("adam", tf.float64, sparse, [[b] for b in batches])
    fit = tf1_accum.MemoryFit()
    with _accumulating(sparse=sparse, fused=fused) as t:
        for w, batch in enumerate(batches):
            counting = _Recording(t.sess, t.acc)
            losses = tf1_accum.run_accumulation(
                counting,
                t.acc,
                t.feed(batch, _costs(expensive_row)),
                t.model.loss,
                micro_batch_size=4,
                memory_fit=fit,
            )
            assert len(losses) == 6
            _assert_large_batch(t, expected[w], f"error at micro-batch {failing}, window {w}")
            assert t.sess.run([t.step, t.acc.counter]) == [w + 1, 0]
            fed = counting.adds
            if w == 0:
                # The micro-batches up to the failing one, then the window again.
                failed = fed[: failing + 1]
                assert [len(f[t.model.labels]) for f in failed] == [4] * (failing + 1)
                assert max(failed[-1][_named(failed[-1], "cost")]) == 3
                assert [len(f[t.model.labels]) for f in fed[failing + 1 :]] == [2] * 6
            else:
                assert [len(f[t.model.labels]) for f in fed] == [2] * 6
    assert fit.micro_batch_size == 2
    assert fit.windows == 3
    assert fit.changes == (
        SizeChange(0, None, 4, "first window"),
        SizeChange(0, 4, 2, "out of memory"),
    )


def test_the_fetched_losses_are_those_of_the_micro_batches_that_made_the_update():
    batch = make_batches(tf.float64, False, 1, ROWS)[0]
    with tf.Graph().as_default():
        model = Model(tf.float64, sparse=False)
        with v1.Session() as fresh:
            fresh.run(v1.global_variables_initializer())
            expected = [
                fresh.run(model.loss, model.feed((batch[0][i : i + 2], batch[1][i : i + 2])))
                for i in range(0, ROWS, 2)
            ]
    with _accumulating() as t:
        losses = tf1_accum.run_accumulation(
            t.sess,
            t.acc,
            t.feed(batch, _costs(7)),
            t.model.loss,
            memory_fit=tf1_accum.MemoryFit(),
        )
    np.testing.assert_allclose(losses, expected, rtol=1e-12)


def test_without_a_size_the_fit_starts_with_the_whole_batch():
    batches = make_batches(tf.float64, False, 2, ROWS)
    expected = plain_training("sgd", tf.float64, False, [[b] for b in batches])
    fit = tf1_accum.MemoryFit()
    with _accumulating("sgd") as t:
        for w, batch in enumerate(batches):
            tf1_accum.run_accumulation(t.sess, t.acc, t.feed(batch), memory_fit=fit)
            _assert_large_batch(t, expected[w], f"window {w}")
    # 12 x 1 > 8, then 6 x 1 fits.
    assert fit.changes == (
        SizeChange(0, None, 12, "first window"),
        SizeChange(0, 12, 6, "out of memory"),
    )


def test_the_size_that_fits_is_probed_upward_and_a_failed_probe_goes_back():
    """probe_every=2: after two windows at 2 rows, 3 (halfway to 4) is tried: 9 > 8."""
    batches = make_batches(tf.float64, False, 6, ROWS)
    expected = plain_training("momentum", tf.float64, False, [[b] for b in batches])
    fit = tf1_accum.MemoryFit(probe_every=2)
    sizes = []
    with _accumulating("momentum") as t:
        for w, batch in enumerate(batches):
            counting = CountingSession(t.sess)
            tf1_accum.run_accumulation(
                counting, t.acc, t.feed(batch, _costs(0)), micro_batch_size=4, memory_fit=fit
            )
            _assert_large_batch(t, expected[w], f"window {w}")
            sizes.append(fit.micro_batch_size)
            if w == 1:
                assert len(counting.calls) == 1 + 6 + 1  # no search: the size was kept
    assert sizes == [2, 2, 2, 2, 2, 2]
    assert fit.changes == (
        SizeChange(0, None, 4, "first window"),
        SizeChange(0, 4, 2, "out of memory"),
        SizeChange(2, 2, 3, "probe"),
        SizeChange(2, 3, 2, "out of memory"),
    )  # then 2 fits and 3 does not: nothing left to probe


def test_a_probe_that_fits_is_kept():
    """The expensive row is in the first window only: later windows fit 3, not 4 (4 x 3 > 8)."""
    batches = make_batches(tf.float64, False, 4, ROWS)
    expected = plain_training("adam", tf.float64, False, [[b] for b in batches])
    fit = tf1_accum.MemoryFit(probe_every=1)
    with _accumulating(budget=BUDGET) as t:
        for w, batch in enumerate(batches):
            costs = _costs(0) if w == 0 else _costs(None, cost=1) * 2  # 3 x 2 = 6, 4 x 2 = 8
            tf1_accum.run_accumulation(
                t.sess, t.acc, t.feed(batch, costs), micro_batch_size=4, memory_fit=fit
            )
            _assert_large_batch(t, expected[w], f"window {w}")
    assert fit.changes == (
        SizeChange(0, None, 4, "first window"),
        SizeChange(0, 4, 2, "out of memory"),
        SizeChange(1, 2, 3, "probe"),
    )
    assert fit.micro_batch_size == 3


def test_probing_doubles_then_halves_the_gap_until_it_closes():
    """A first batch of 4 rows sets 4; the 16-row batches after it fit 8 rows (x cost 1)."""
    batches = make_batches(tf.float64, False, 8, [4] + [16] * 7)
    expected = plain_training("sgd", tf.float64, False, [[b] for b in batches])
    fit = tf1_accum.MemoryFit(probe_every=1)
    with _accumulating("sgd") as t:
        for w, batch in enumerate(batches):
            tf1_accum.run_accumulation(t.sess, t.acc, t.feed(batch), memory_fit=fit)
            _assert_large_batch(t, expected[w], f"window {w}")
    assert fit.changes == (
        SizeChange(0, None, 4, "first window"),
        SizeChange(1, 4, 8, "probe"),  # twice the size: nothing has failed yet
        SizeChange(2, 8, 16, "probe"),
        SizeChange(2, 16, 8, "out of memory"),  # back to the size that fit
        SizeChange(3, 8, 12, "probe"),  # halfway to the smallest that failed
        SizeChange(3, 12, 8, "out of memory"),
        SizeChange(4, 8, 10, "probe"),
        SizeChange(4, 10, 8, "out of memory"),
        SizeChange(5, 8, 9, "probe"),
        SizeChange(5, 9, 8, "out of memory"),
    )  # windows 6 and 7: 8 fits, 9 does not, nothing left to probe
    assert fit.micro_batch_size == 8 and fit.windows == 8


def test_a_micro_batch_of_one_that_does_not_fit_raises_and_discards_the_window():
    batch = make_batches(tf.float64, False, 1, ROWS)[0]
    fit = tf1_accum.MemoryFit()
    with _accumulating() as t:
        before = values_by_name(t.sess, tf1_accum.plain_variables())
        with pytest.raises(
            tf.errors.ResourceExhaustedError,
            match=r"(?s)micro-batch 2 of the window failed so the window was discarded .*a "
            r"micro-batch of one row does not fit in memory",
        ):
            tf1_accum.run_accumulation(
                t.sess, t.acc, t.feed(batch, _costs(2, cost=9)), micro_batch_size=4, memory_fit=fit
            )
        # Nothing trained, nothing counted: the window is empty (what its
        # dense accumulators keep, the next add assigns over).
        after = values_by_name(t.sess, tf1_accum.plain_variables())
        assert all(np.array_equal(before[k], after[k]) for k in before)
        assert t.sess.run(t.acc.counter) == 0
    assert [c.new for c in fit.changes] == [4, 2, 1]
    assert fit.windows == 0


def test_an_error_that_is_not_out_of_memory_is_raised_as_without_a_fit():
    batch = make_batches(tf.float64, False, 1, ROWS)[0]
    costs = _costs(6)
    costs[6] = -1
    fit = tf1_accum.MemoryFit()
    with _accumulating() as t:
        before = values_by_name(t.sess, tf1_accum.plain_variables())
        with pytest.raises(
            tf.errors.InvalidArgumentError,
            match=r"(?s)micro-batch 1 of the window failed so the window was discarded.*cost must",
        ):
            tf1_accum.run_accumulation(
                t.sess, t.acc, t.feed(batch, costs), micro_batch_size=4, memory_fit=fit
            )
        # Nothing trained, nothing counted: the window is empty (what its
        # dense accumulators keep, the next add assigns over).
        after = values_by_name(t.sess, tf1_accum.plain_variables())
        assert all(np.array_equal(before[k], after[k]) for k in before)
        assert t.sess.run(t.acc.counter) == 0
    assert fit.changes == (SizeChange(0, None, 4, "first window"),)


def test_without_a_fit_out_of_memory_is_raised_as_before():
    batch = make_batches(tf.float64, False, 1, ROWS)[0]
    with _accumulating() as t:
        with pytest.raises(
            tf.errors.ResourceExhaustedError,
            match=r"micro-batch 0 of the window failed so the window was discarded",
        ):
            tf1_accum.run_accumulation(t.sess, t.acc, t.feed(batch, _costs(0)), micro_batch_size=4)
        assert t.sess.run(t.acc.counter) == 0


def test_memory_fit_needs_a_weighted_accumulation():
    batch = make_batches(tf.float64, False, 1, ROWS)[0]
    with _accumulating(weighted=False) as t:
        counting = CountingSession(t.sess)
        with pytest.raises(
            ValueError, match=r"memory_fit needs an accumulation built with weight="
        ):
            tf1_accum.run_accumulation(
                counting, t.acc, t.feed(batch), micro_batch_size=4, memory_fit=tf1_accum.MemoryFit()
            )
        assert counting.calls == []


def test_memory_fit_refuses_a_window_already_holding_micro_batches():
    batch = make_batches(tf.float64, False, 1, ROWS)[0]
    with _accumulating() as t:
        small = t.feed((batch[0][:2], batch[1][:2]), _costs(None, rows=2))
        t.sess.run(t.acc.accum_op, small)
        with pytest.raises(ValueError, match="The window already holds 1 micro-batch, which"):
            tf1_accum.run_accumulation(
                t.sess, t.acc, t.feed(batch), memory_fit=tf1_accum.MemoryFit()
            )
        assert t.sess.run(t.acc.counter) == 1


@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
def test_with_statistics_the_discarded_attempt_leaves_no_trace(fused):
    """The statistics' moving averages equal those of the 2-row micro-batches fed by hand."""
    batches = make_batches(tf.float64, False, 3, ROWS)
    expected = plain_training("adam", tf.float64, False, [[b] for b in batches])

    def statistics_state(t):
        names = ("noise_trace_ema", "gradient_square_ema")
        owned = v1.get_collection(tf1_accum.STATE_COLLECTION)
        return t.sess.run([v for v in owned if v.op.name.rsplit("/", 1)[-1] in names])

    fit = tf1_accum.MemoryFit()
    with _accumulating(statistics=True, fused=fused) as t:
        for w, batch in enumerate(batches):
            tf1_accum.run_accumulation(
                t.sess, t.acc, t.feed(batch, _costs(w * 5)), micro_batch_size=6, memory_fit=fit
            )
            _assert_large_batch(t, expected[w], f"statistics, window {w}")
        got = statistics_state(t)
    with _accumulating(statistics=True, budget=10**6) as t:
        for batch in batches:
            for i in range(0, ROWS, 2):
                part = (batch[0][i : i + 2], batch[1][i : i + 2])
                t.sess.run(t.acc.accum_op, t.feed(part, _costs(None, rows=2)))
            t.sess.run(t.acc.apply_op)
        want = statistics_state(t)
    assert len(got) == 2 and np.all(np.isfinite(got)) and np.all(np.abs(want) > 0)
    np.testing.assert_allclose(got, want, rtol=1e-10)
    # 6 x 3 > 8, 3 x 3 > 8, 2 x 3 fits.
    assert [c.new for c in fit.changes] == [6, 3, 2]


def test_in_a_monitored_training_session_with_hooks():
    batches = make_batches(tf.float64, False, 3, ROWS)
    expected = plain_training("adam", tf.float64, False, [[b] for b in batches])
    fit = tf1_accum.MemoryFit()

    def session():
        return v1.train.MonitoredTrainingSession(
            hooks=[v1.train.StopAtStepHook(last_step=10)],
            save_checkpoint_secs=None,
            save_summaries_steps=None,
            log_step_count_steps=None,
        )

    with _accumulating(session=session) as t:
        for w, batch in enumerate(batches):
            tf1_accum.run_accumulation(
                t.sess, t.acc, t.feed(batch, _costs(3)), micro_batch_size=4, memory_fit=fit
            )
            got = values_by_name(t.sess, tf1_accum.plain_variables())
            want = {k: v for k, v in expected[w].items() if k in got}
            assert_same_values(got, want, RTOL[tf.float64], f"monitored, window {w}")
    assert fit.micro_batch_size == 2


class _ListHandler(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_each_change_is_logged():
    batches = make_batches(tf.float64, False, 3, ROWS)
    costs = [_costs(0), _costs(None), _costs(None)]  # 4 x 3 > 8, then 3 x 1 fits
    fit = tf1_accum.MemoryFit(probe_every=2)
    logger = tf.get_logger()
    level = logger.level
    handler = _ListHandler()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with _accumulating() as t:
            for batch, cost in zip(batches, costs):
                tf1_accum.run_accumulation(
                    t.sess, t.acc, t.feed(batch, cost), micro_batch_size=4, memory_fit=fit
                )
    finally:
        logger.setLevel(level)
        logger.removeHandler(handler)
    messages = [(r.levelname, r.getMessage()) for r in handler.records]
    messages = [m for m in messages if m[1].startswith("tf1_accum: ")]
    assert len(messages) == 3
    assert messages[0] == (
        "INFO",
        "tf1_accum: micro-batches of 4 rows from window 0 (the largest allowed).",
    )
    level_name, text = messages[1]
    assert level_name == "WARNING"
    assert text.startswith(
        "tf1_accum: a micro-batch of 4 rows ran out of memory (MemoryError: Unable to allocate"
    )
    assert text.endswith("runs again with micro-batches of 2 rows (window 0).")
    assert messages[2] == (
        "INFO",
        "tf1_accum: micro-batches of 3 rows from window 2 (a probe: 2 rows fit for 2 windows).",
    )
    assert [c.new for c in fit.changes] == [4, 2, 3]


def test_the_split_feeds_each_row_once_in_order():
    """The split feeds each row once, in order: the joined micro-batches are the batch."""
    batch = make_batches(tf.float64, False, 1, ROWS)[0]
    with _accumulating(budget=10**6) as t:
        counting = CountingSession(t.sess)
        tf1_accum.run_accumulation(counting, t.acc, t.feed(batch), micro_batch_size=5)
    parts = [(f[_named(f, "x")], f[t.model.labels]) for f in counting.calls[:-1]]
    for joined, original in zip(concat(parts), batch):
        np.testing.assert_array_equal(joined, original)


def test_a_weighted_sum_is_the_large_batch_sum_for_any_split():
    """average=False with weight=rows applies the gradient of the summed loss."""
    batches = make_batches(tf.float64, False, 2, ROWS)
    with tf.Graph().as_default():
        model = Model(tf.float64, sparse=False)
        rows = tf.cast(tf.shape(model.labels)[0], tf.float64)
        train = v1.train.GradientDescentOptimizer(0.01).minimize(model.loss * rows)
        with v1.Session() as plain:
            plain.run(v1.global_variables_initializer())
            expected = []
            for batch in batches:
                plain.run(train, model.feed(batch))
                expected.append(values_by_name(plain, v1.trainable_variables()))
    with tf.Graph().as_default():
        model = Model(tf.float64, sparse=False)
        acc = tf1_accum.build_accumulation(
            model.loss,
            v1.train.GradientDescentOptimizer(0.01),
            average=False,
            weight=tf.shape(model.labels)[0],
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for w, (batch, size) in enumerate(zip(batches, (5, 7))):
                tf1_accum.run_accumulation(sess, acc, model.feed(batch), micro_batch_size=size)
                got = values_by_name(sess, acc.var_list)
                assert_same_values(got, expected[w], RTOL[tf.float64], f"sum, window {w}")


@pytest.mark.parametrize("micro_batch_size", [5, 4])
def test_the_in_graph_loop_splits_large_batches_with_a_dataset_transformation(micro_batch_size):
    """The recipe of the guide: flat_map each large batch into micro-batches, steps=ceil."""
    batches = make_batches(tf.float64, False, 3, ROWS)
    expected = plain_training("adam", tf.float64, False, [[b] for b in batches])
    steps = -(-ROWS // micro_batch_size)
    with tf.Graph().as_default():
        large = dataset_of(batches)  # elements: large batches of 12 rows
        micro = large.flat_map(
            lambda x, y: tf.data.Dataset.from_tensor_slices((x, y)).batch(micro_batch_size)
        )
        step = v1.train.get_or_create_global_step()
        acc = tf1_accum.build_dataset_accumulation(
            loss_fn_of(tf.float64, False),
            OPTIMIZERS["adam"](tf.float64),
            micro,
            steps,
            global_step=step,
            weight=lambda element: tf.shape(element[1])[0],
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for w in range(len(batches)):
                _, drawn = sess.run([acc.train_op, acc.micro_batches])
                assert drawn == steps
                got = values_by_name(sess, v1.global_variables())
                assert_same_values(got, expected[w], RTOL[tf.float64], f"dataset, window {w}")
            with pytest.raises(tf.errors.OutOfRangeError):
                sess.run(acc.train_op)


def test_each_accumulation_of_a_graph_is_split_by_its_own_weighting():
    """Two accumulations of one loss: only the one built with weight= takes unequal ones."""
    batch = make_batches(tf.float64, False, 1, 10)[0]
    with tf.Graph().as_default():
        model = Model(tf.float64, sparse=False)
        plain = tf1_accum.build_accumulation(model.loss, v1.train.GradientDescentOptimizer(0.1))
        weighted = tf1_accum.build_accumulation(
            model.loss,
            v1.train.GradientDescentOptimizer(0.1),
            weight=tf.shape(model.labels)[0],
            name="weighted",
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            with pytest.raises(ValueError, match="does not split into equal micro-batches"):
                tf1_accum.run_accumulation(sess, plain, model.feed(batch), micro_batch_size=4)
            tf1_accum.run_accumulation(sess, weighted, model.feed(batch), micro_batch_size=4)
            got = values_by_name(sess, weighted.var_list)
    expected = plain_training("sgd", tf.float64, False, [[batch]])[0]
    expected = {name: expected[name] for name in got}
    assert sorted(expected) == ["b1", "w1", "w2"]
    assert_same_values(got, expected, RTOL[tf.float64], "the weighted accumulation")


def _token_model(budget):
    """A per-token mean loss over padded sequences, its placeholders and its token count."""
    rng = np.random.RandomState(0)
    tokens = v1.placeholder(tf.float64, [None, 6, 3], name="tokens")
    mask = v1.placeholder(tf.float64, [None, 6], name="mask")
    targets = v1.placeholder(tf.float64, [None, 6], name="targets")
    cost = v1.placeholder(tf.int64, [None], name="cost")
    w = v1.get_variable("w", initializer=rng.randn(3, 1))
    prediction = tf.squeeze(tf.tensordot(_guarded(tokens, cost, budget), w, 1), -1)
    per_token = (tf.tanh(prediction) - targets) ** 2
    loss = tf.reduce_sum(per_token * mask) / tf.reduce_sum(mask)
    return (tokens, mask, targets, cost), loss, tf.reduce_sum(mask)


def test_a_token_weight_splits_a_per_token_mean_exactly():
    """weight= the micro-batch's tokens: any split, with a search, gives the large batch's."""
    rng = np.random.RandomState(5)
    batches = []
    for _ in range(3):
        lengths = rng.randint(0, 7, size=ROWS)  # some rows all padding
        mask = (np.arange(6)[None, :] < lengths[:, None]).astype(np.float64)
        batches.append((rng.randn(ROWS, 6, 3), mask, rng.randn(ROWS, 6), _costs(4)))
    with tf.Graph().as_default():
        placeholders, loss, _ = _token_model(10**6)
        train = v1.train.AdamOptimizer(0.05).minimize(loss)
        with v1.Session() as plain:
            plain.run(v1.global_variables_initializer())
            expected = []
            for batch in batches:
                plain.run(train, dict(zip(placeholders, batch)))
                expected.append(values_by_name(plain, v1.global_variables()))
    fit = tf1_accum.MemoryFit()
    with tf.Graph().as_default():
        placeholders, loss, tokens = _token_model(BUDGET)
        acc = tf1_accum.build_accumulation(loss, v1.train.AdamOptimizer(0.05), weight=tokens)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for w, batch in enumerate(batches):
                tf1_accum.run_accumulation(
                    sess, acc, dict(zip(placeholders, batch)), micro_batch_size=5, memory_fit=fit
                )
                got = values_by_name(sess, v1.global_variables())
                assert_same_values(got, expected[w], RTOL[tf.float64], f"tokens, window {w}")
    assert [c.new for c in fit.changes] == [5, 3, 2]  # 5 x 3 and 3 x 3 > 8


def test_threads_sharing_one_fit_lose_and_double_no_example():
    """A loss linear in w: SGD's result is the sum of the windows' gradients, in any order."""
    rng = np.random.RandomState(7)
    batches = [(rng.randn(ROWS, 4), rng.randn(ROWS, 1)) for _ in range(6)]
    w0 = rng.randn(4, 1)
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float64, [None, 4], name="x")
        y = v1.placeholder(tf.float64, [None, 1], name="y")
        cost = v1.placeholder(tf.int64, [None], name="cost")
        w = v1.get_variable("w", initializer=w0)
        loss = tf.reduce_mean(tf.matmul(_guarded(x, cost, BUDGET), w) * y)
        step = v1.train.get_or_create_global_step()
        acc = tf1_accum.build_accumulation(
            # 0.125: the same in float32, in which the optimizer holds it, and float64.
            loss,
            v1.train.GradientDescentOptimizer(0.125),
            global_step=step,
            weight=tf.shape(y)[0],
        )
        fit = tf1_accum.MemoryFit()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())

            def train(mine):
                for bx, by in mine:
                    feed = {x: bx, y: by, cost: _costs(0)}
                    tf1_accum.run_accumulation(sess, acc, feed, micro_batch_size=4, memory_fit=fit)

            threads = [threading.Thread(target=train, args=(batches[i::2],)) for i in (0, 1)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            got, steps, counter = sess.run([w, step, acc.counter])
    gradients = [bx.T @ by / ROWS for bx, by in batches]  # d mean(x w y) / dw
    np.testing.assert_allclose(got, w0 - 0.125 * np.sum(gradients, axis=0), rtol=1e-12)
    assert (steps, counter, fit.windows) == (6, 0, 6)
    assert fit.changes == (
        SizeChange(0, None, 4, "first window"),
        SizeChange(0, 4, 2, "out of memory"),
    )


def test_memory_fit_with_micro_batches_and_a_list_of_large_batches():
    """micro_batches=3 allows ceil(rows / 3) rows; each large batch is split at the size found."""
    batches = make_batches(tf.float64, False, 4, [12, 9, 12, 9])
    windows = [batches[:2], batches[2:]]
    expected = plain_training("adam", tf.float64, False, windows)
    fit = tf1_accum.MemoryFit()
    with _accumulating() as t:
        for w, window in enumerate(windows):
            counting = _Recording(t.sess, t.acc)
            feeds = [t.feed(window[0], _costs(6)), t.feed(window[1], _costs(None, rows=9))]
            tf1_accum.run_accumulation(counting, t.acc, feeds, micro_batches=3, memory_fit=fit)
            _assert_large_batch(t, expected[w], f"window {w}")
            rows = [len(f[t.model.labels]) for f in counting.adds]
            if w == 0:  # 4, 4 (the second holds the row of cost 3: 12 > 8), then at 2 rows
                assert rows == [4, 4] + [2] * 6 + [2] * 4 + [1]
            else:
                assert rows == [2] * 6 + [2] * 4 + [1]
    assert fit.changes == (
        SizeChange(0, None, 4, "first window"),
        SizeChange(0, 4, 2, "out of memory"),
    )


def _built_for_one_batch_size(x, y, features):
    """An accumulation of a float64 model on ``features``, a feed of ``ROWS`` rows, the loss."""
    w = v1.get_variable("w", initializer=np.random.RandomState(0).randn(4, 1))
    loss = tf.reduce_mean((tf.matmul(features, w) - y) ** 2)
    acc = tf1_accum.build_accumulation(
        loss, v1.train.GradientDescentOptimizer(0.1), weight=tf.shape(y)[0]
    )
    inputs, labels = make_batches(tf.float64, False, 1, ROWS)[0]
    return acc, {x: inputs.reshape([ROWS] + x.shape.as_list()[1:]), y: labels}, loss


@pytest.mark.parametrize("labels", [None, "fixed"], ids=["labels-any", "labels-fixed"])
@pytest.mark.parametrize("fixed", [ROWS, 4], ids=["at-the-batch", "at-the-micro-batch"])
@pytest.mark.parametrize(
    "split, cut",
    [
        ({"micro_batch_size": 4}, "micro_batch_size=4 cuts the batch into micro-batches of 3 x 4"),
        ({"memory_fit": tf1_accum.MemoryFit}, "memory_fit cuts the batch into smaller"),
    ],
    ids=["size", "fit"],
)
def test_a_placeholder_built_for_one_batch_size_is_refused_before_anything_runs(
    labels, fixed, split, cut
):
    # Fixed at the micro-batch size too: TensorFlow's own error, which names no fix, comes later.
    split = {k: v() if k == "memory_fit" else v for k, v in split.items()}
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float64, [fixed, 4], name="x")
        y = v1.placeholder(tf.float64, [fixed if labels else None, 1], name="y")
        acc, feed, _ = _built_for_one_batch_size(x, y, x)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            held = int(fixed == ROWS)  # a window in progress, where the graph takes the batch
            if held:
                sess.run(acc.accum_op, feed)
            before = values_by_name(sess, acc.var_list)
            counting = CountingSession(sess)
            message = (
                rf"x:0 is a placeholder of shape \[{fixed}, 4\]: its batch dimension is fixed at "
                rf"{fixed} rows, and {cut}.* \(the batch fed to it has 12 rows.*None as its "
                r"first dimension \(\[None, 4\]\)"
            )
            with pytest.raises(ValueError, match=message):
                tf1_accum.run_accumulation(counting, acc, feed, **split)
            assert counting.calls == []
            assert sess.run(acc.counter) == held
            assert_same_values(values_by_name(sess, acc.var_list), before, 0, "refused")


def test_a_reshape_to_one_batch_size_fails_with_a_hint_and_discards_the_window():
    def build():
        x = v1.placeholder(tf.float64, [None, 2, 2], name="x")
        y = v1.placeholder(tf.float64, [None, 1], name="y")
        return _built_for_one_batch_size(x, y, tf.reshape(x, [ROWS, 4]))

    with tf.Graph().as_default():
        _, feed, loss = build()
        train = v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train, feed)
            expected = values_by_name(sess, v1.trainable_variables())
    with tf.Graph().as_default():
        acc, feed, _ = build()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            before = values_by_name(sess, acc.var_list)
            with pytest.raises(
                tf.errors.InvalidArgumentError,
                match=r"micro-batch 0 of the window failed so the window was discarded (.|\n)*"
                r"The large batch has 12 rows: a graph built for one batch size \(a reshape to a "
                r"fixed batch, such as tf.reshape\(x, \[12, -1\]\)\) cannot take smaller",
            ):
                tf1_accum.run_accumulation(sess, acc, feed, micro_batch_size=4)
            assert sess.run(acc.counter) == 0
            assert_same_values(values_by_name(sess, acc.var_list), before, 0, "failed window")
            # The whole batch, one micro-batch, fits the graph: one plain step.
            tf1_accum.run_accumulation(sess, acc, feed, micro_batch_size=ROWS)
            got = values_by_name(sess, acc.var_list)
    assert_same_values(got, expected, RTOL[tf.float64], "the whole batch after the failure")


def _codebook_model():
    """A model reading a [13, 3] codebook beside its batch: (x, y, codebook, loss)."""
    x = v1.placeholder(tf.float64, [None, 3], name="x")
    y = v1.placeholder(tf.float64, [None, 1], name="y")
    codebook = v1.placeholder(tf.float64, [13, 3], name="codebook")
    w = v1.get_variable("w", initializer=np.random.RandomState(0).randn(13, 1))
    scores = tf.tanh(tf.matmul(x, codebook, transpose_b=True))
    return x, y, codebook, tf.reduce_mean((tf.matmul(scores, w) - y) ** 2)


@pytest.mark.parametrize("named", ["tensor", "name"])
def test_a_feed_declared_unbatched_is_fed_whole_to_every_micro_batch(named):
    # The batch happens to have as many rows as the codebook: 13.
    rng = np.random.RandomState(4)
    inputs, labels, table = rng.randn(13, 3), rng.randn(13, 1), rng.randn(13, 3)
    with tf.Graph().as_default():
        x, y, codebook, loss = _codebook_model()
        train = v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train, {x: inputs, y: labels, codebook: table})
            expected = values_by_name(sess, v1.trainable_variables())
    with tf.Graph().as_default():
        x, y, codebook, loss = _codebook_model()
        acc = tf1_accum.build_accumulation(
            loss, v1.train.GradientDescentOptimizer(0.1), weight=tf.shape(y)[0]
        )
        feed = {x: inputs, y: labels, codebook: table}
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            before = values_by_name(sess, acc.var_list)
            with pytest.raises(
                ValueError,
                match=r"codebook:0 is a placeholder of shape \[13, 3\]: its batch dimension is "
                r"fixed at 13 rows.* if it is not batch data, name it in "
                r"unbatched_feeds=\['codebook:0'\] to feed it whole",
            ):
                tf1_accum.run_accumulation(sess, acc, feed, micro_batch_size=4)
            assert_same_values(values_by_name(sess, acc.var_list), before, 0, "refused")
            whole = codebook if named == "tensor" else "codebook:0"
            tf1_accum.run_accumulation(sess, acc, feed, micro_batch_size=4, unbatched_feeds=[whole])
            got = values_by_name(sess, acc.var_list)
    assert_same_values(got, expected, RTOL[tf.float64], "the split with the codebook whole")
    assert not np.allclose(got["w"], before["w"])


@pytest.mark.parametrize(
    "unbatched, split, error, message",
    [
        (
            "codebook:0",
            {"micro_batch_size": 4},
            TypeError,
            r"unbatched_feeds must be a list of "
            r"feed dict keys \(placeholders or their names\) fed whole to every micro-batch, "
            r"got 'codebook:0'",
        ),
        (
            ["other:0"],
            {"micro_batch_size": 4},
            ValueError,
            r"unbatched_feeds names other:0, "
            r"which no feed dict of the batch feeds",
        ),
        (
            ["nothing:0"],
            {"micro_batch_size": 4},
            ValueError,
            r"unbatched_feeds has a key "
            r"'nothing:0' that names no tensor",
        ),
        (
            ["codebook:0"],
            {},
            ValueError,
            r"unbatched_feeds needs a split of the large batch, and none is asked for: pass "
            r"micro_batch_size=, micro_batches= or memory_fit=, or leave it out",
        ),
    ],
    ids=["a-string", "not-fed", "no-tensor", "no-split"],
)
def test_bad_unbatched_feeds_are_refused_before_anything_runs(unbatched, split, error, message):
    rng = np.random.RandomState(4)
    with tf.Graph().as_default():
        x, y, codebook, loss = _codebook_model()
        v1.placeholder(tf.float64, [2], name="other")
        acc = tf1_accum.build_accumulation(
            loss, v1.train.GradientDescentOptimizer(0.1), weight=tf.shape(y)[0]
        )
        feed = {x: rng.randn(8, 3), y: rng.randn(8, 1), codebook: rng.randn(13, 3)}
        feeds = feed if split else [feed]
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            counting = CountingSession(sess)
            with pytest.raises(error, match=message):
                tf1_accum.run_accumulation(counting, acc, feeds, unbatched_feeds=unbatched, **split)
            assert counting.calls == []
            assert sess.run(acc.counter) == 0
