"""Property tests: accumulation equals large-batch training, whatever the setup.

Hypothesis draws the model's shapes (and whether its input goes through an
embedding table, for sparse gradients), the dtype, the optimizer, N, the
micro-batch sizes, the weighting and the way the window runs. The examples are
derandomized (the same on every run, in CI too) and few, because each one
builds two graphs: the accumulating one and its large-batch reference.

Weighting, for micro-batch i of B_i examples and mean loss L_i:

* ``equal``: no ``weight=``, equal sizes; the reference is the plain mean
  over the window's examples;
* ``size``: ``weight = B_i``, sizes differ; the reference is again the plain
  mean over all examples;
* ``random``: any positive ``weight = w_i``; the reference weighs each example
  of micro-batch i by w_i / (B_i * sum w), which makes its loss
  sum(w_i L_i) / sum(w_i), the mean that the apply uses.

A second property keeps books: accumulate, apply, zero, flush, save and
restore drawn in any order, some phases from several threads at once, and
after each phase the applied plus the accumulated equals what was fed, exactly,
with the global step counting the updates.
"""

import os
import tempfile
import threading

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import tf1_accum
from _helpers import OPTIMIZERS
from _helpers import RTOL
from _helpers import assert_same_values
from _helpers import pending
from _helpers import relative_error
from _helpers import values_by_name

v1 = tf.compat.v1

WINDOWS = 2


@st.composite
def setups(draw):
    n = draw(st.integers(1, 4), label="N")
    weighting = draw(st.sampled_from(["equal", "size", "random"]), label="weighting")
    if weighting == "equal":
        size = draw(st.integers(1, 6))
        sizes = [[size] * n for _ in range(WINDOWS)]
    else:
        sizes = draw(
            st.lists(
                st.lists(st.integers(1, 6), min_size=n, max_size=n),
                min_size=WINDOWS,
                max_size=WINDOWS,
            ),
            label="sizes",
        )
    weights = [[float(b) for b in window] for window in sizes]
    if weighting == "random":
        weights = draw(
            st.lists(
                st.lists(st.floats(0.1, 3.0), min_size=n, max_size=n),
                min_size=WINDOWS,
                max_size=WINDOWS,
            ),
            label="weights",
        )
    return dict(
        dtype=draw(st.sampled_from([tf.float32, tf.float64]), label="dtype"),
        optimizer=draw(st.sampled_from(sorted(OPTIMIZERS)), label="optimizer"),
        features=draw(st.integers(1, 5), label="features"),
        hidden=draw(st.integers(1, 6), label="hidden"),
        outputs=draw(st.integers(1, 3), label="outputs"),
        vocab=draw(st.one_of(st.none(), st.integers(2, 12)), label="vocab (None: dense input)"),
        fused=draw(st.booleans(), label="fused"),
        weighting=weighting,
        sizes=sizes,
        weights=weights,
        seed=draw(st.integers(0, 2**16), label="seed"),
    )


def _data(setup):
    """Per window, per micro-batch: (inputs, targets), from the setup's seed."""
    rng = np.random.RandomState(setup["seed"])
    np_dtype = setup["dtype"].as_numpy_dtype
    windows = []
    for window in setup["sizes"]:
        batches = []
        for size in window:
            if setup["vocab"]:
                inputs = rng.randint(0, setup["vocab"], size=size).astype(np.int32)
            else:
                inputs = rng.randn(size, setup["features"]).astype(np_dtype)
            batches.append((inputs, rng.randn(size, setup["outputs"]).astype(np_dtype)))
        windows.append(batches)
    return windows


def _model(setup):
    """Placeholders, seeded variables, and the loss of each example, shape [batch]."""
    dtype, features = setup["dtype"], setup["features"]
    rng = np.random.RandomState(setup["seed"] + 1)
    np_dtype = dtype.as_numpy_dtype

    def variable(name, *shape):
        return v1.get_variable(name, initializer=rng.randn(*shape).astype(np_dtype), dtype=dtype)

    if setup["vocab"]:
        inputs = v1.placeholder(tf.int32, [None], name="ids")
        table = variable("embedding", setup["vocab"], features)
        x = tf.nn.embedding_lookup(table, inputs)
    else:
        inputs = v1.placeholder(dtype, [None, features], name="x")
        x = inputs
    targets = v1.placeholder(dtype, [None, setup["outputs"]], name="y")
    w1 = variable("w1", features, setup["hidden"])
    hidden = tf.tanh(tf.matmul(x, w1) + variable("b1", setup["hidden"]))
    prediction = tf.matmul(hidden, variable("w2", setup["hidden"], setup["outputs"]))
    per_example = tf.reduce_sum((prediction - targets) ** 2, axis=1)
    return inputs, targets, per_example


def _large_batch(setup, data):
    """Plain minimize, one step per window on its examples; values after each."""
    with tf.Graph().as_default():
        inputs, targets, per_example = _model(setup)
        coefficients = v1.placeholder(setup["dtype"], [None], name="coefficients")
        loss = tf.reduce_sum(coefficients * per_example)
        optimizer = OPTIMIZERS[setup["optimizer"]](setup["dtype"])
        train_op = optimizer.minimize(loss, global_step=v1.train.get_or_create_global_step())
        results = []
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for batches, weights in zip(data, setup["weights"]):
                if setup["weighting"] == "random":
                    parts = [np.full(len(b[0]), w / len(b[0])) for b, w in zip(batches, weights)]
                    c = np.concatenate(parts) / sum(weights)
                else:
                    total = sum(len(b[0]) for b in batches)
                    c = np.full(total, 1.0 / total)
                feed = {
                    inputs: np.concatenate([b[0] for b in batches]),
                    targets: np.concatenate([b[1] for b in batches]),
                    coefficients: c,
                }
                sess.run(train_op, feed)
                results.append(values_by_name(sess, v1.global_variables()))
    return results


def _accumulated(setup, data):
    """build_accumulation and run_accumulation; values after each window."""
    with tf.Graph().as_default():
        inputs, targets, per_example = _model(setup)
        weight = None
        if setup["weighting"] != "equal":
            weight = v1.placeholder(setup["dtype"], [], name="weight")
        acc = tf1_accum.build_accumulation(
            tf.reduce_mean(per_example),
            OPTIMIZERS[setup["optimizer"]](setup["dtype"]),
            global_step=v1.train.get_or_create_global_step(),
            weight=weight,
            fused=setup["fused"],
        )
        results = []
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for batches, weights in zip(data, setup["weights"]):
                feeds = []
                for (x, y), w in zip(batches, weights):
                    feeds.append({inputs: x, targets: y})
                    if weight is not None:
                        feeds[-1][weight] = w
                tf1_accum.run_accumulation(sess, acc, feeds)
                results.append(values_by_name(sess, tf1_accum.plain_variables()))
    return results


@settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(setups())
def test_accumulation_equals_large_batch_training(setup):
    data = _data(setup)
    expected = _large_batch(setup, data)
    actual = _accumulated(setup, data)
    for w, (got, want) in enumerate(zip(actual, expected)):
        assert_same_values(got, want, RTOL[setup["dtype"]], f"window {w} of {setup}")
        assert got["global_step"] == w + 1


# The ledger property: accumulate, apply, zero, flush, save and restore in any
# order, from one thread or several, and nothing is lost or applied twice.
# Each micro-batch's gradient is what it feeds (small integers, SGD at rate 1,
# average=False): every sum is exact in float64, in any order.
LEDGER_DIM = 3
LEDGER_WIDE = 20000  # adds, reads and resets long enough to overlap across threads
LEDGER_ROWS = 5
LEDGER_STEPS = 3


class _Ledgered:
    """One accumulating model (``w`` dense, ``table`` sparse, ``c`` counting) and its books.

    ``books`` holds, per variable, what must be applied plus accumulated: the
    sum of the gradients fed, less what ``zero_op`` discarded; ``updates`` is
    what its global step must read.
    """

    def __init__(self, prefix):
        self.x = v1.placeholder(tf.float64, [LEDGER_DIM], name=prefix + "x")
        self.ids = v1.placeholder(tf.int32, [2], name=prefix + "ids")
        self.variables = [
            v1.get_variable(
                prefix + "w",
                initializer=np.full([LEDGER_DIM, LEDGER_WIDE], 0.5),
                dtype=tf.float64,
            ),
            v1.get_variable(
                prefix + "table", initializer=np.full([LEDGER_ROWS, 1], 0.25), dtype=tf.float64
            ),
            v1.get_variable(prefix + "c", initializer=np.float64(0.125), dtype=tf.float64),
        ]
        w, table, c = self.variables
        self.loss = (
            tf.reduce_sum(w * self.x[:, None])
            + tf.reduce_sum(tf.gather(table, self.ids)) * self.x[0]
            + c
        )
        self.step = v1.get_variable(
            prefix + "step", initializer=np.int64(0), dtype=tf.int64, trainable=False
        )
        self.books = [np.zeros([LEDGER_DIM, LEDGER_WIDE]), np.zeros([LEDGER_ROWS, 1]), 0.0]
        self.updates = 0
        self.counter = None  # the window's counter, set once it is built
        self.lock = threading.Lock()  # the books, kept by several threads

    def feed(self, rng):
        return {
            self.x: rng.randint(1, 33, size=LEDGER_DIM).astype(np.float64),
            self.ids: rng.randint(0, LEDGER_ROWS, size=2).astype(np.int32),
        }

    def enter(self, feed, update=False):
        with self.lock:
            self.books[0] = self.books[0] + feed[self.x][:, None]
            table = self.books[1].copy()
            np.add.at(table, feed[self.ids], feed[self.x][0])
            self.books[1] = table
            self.books[2] += 1.0
            self.updates += int(update)

    def accumulators(self):
        by_name = {v.op.name: v for v in v1.get_collection(tf1_accum.STATE_COLLECTION)}
        return [by_name[v.op.name + "/accumulator"] for v in self.variables]

    def check(self, sess, start, where):
        values = sess.run(self.variables)
        held = pending(sess, self.accumulators(), self.counter)
        for name, s, v, h, want in zip(["w", "table", "c"], start, values, held, self.books):
            np.testing.assert_array_equal(
                (s - v) + h, want, err_msg=f"{where}: applied + accumulated != fed for {name}"
            )
        assert sess.run(self.step) == self.updates, where


_ACTIONS = ["accum", "apply", "fused", "zero", "train", "flush", "save", "restore", "threads"]
_THREAD_ACTIONS = ["accum", "apply", "fused", "train"]


@st.composite
def ledger_programs(draw):
    program = []
    for _ in range(draw(st.integers(3, 14), label="phases")):
        action = draw(st.sampled_from(_ACTIONS))
        if action == "threads":
            plans = draw(
                st.lists(
                    st.lists(st.sampled_from(_THREAD_ACTIONS), min_size=1, max_size=30),
                    min_size=2,
                    max_size=3,
                ),
                label="thread plans",
            )
            program.append(("threads", plans))
        else:
            program.append((action, draw(st.integers(1, 4), label="repeats")))
    return dict(program=program, seed=draw(st.integers(0, 2**16), label="seed"))


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(ledger_programs())
def test_applied_plus_accumulated_equals_fed_whatever_the_interleaving(case):
    """build_accumulation's ops (``a``) and AccumulationOptimizer's (``b``), one graph."""
    rng = np.random.RandomState(case["seed"])
    with tf.Graph().as_default():
        a, b = _Ledgered("a_"), _Ledgered("b_")
        acc = tf1_accum.build_accumulation(
            a.loss,
            v1.train.GradientDescentOptimizer(1.0),
            var_list=a.variables,
            global_step=a.step,
            average=False,
            fused=True,
        )
        wrapper = tf1_accum.AccumulationOptimizer(
            v1.train.GradientDescentOptimizer(1.0), steps=LEDGER_STEPS, average=False
        )
        train_op = wrapper.minimize(b.loss, var_list=b.variables, global_step=b.step)
        a.counter, b.counter = acc.counter, wrapper.window.counter
        saver = v1.train.Saver()
        with v1.Session() as sess, tempfile.TemporaryDirectory() as directory:
            sess.run(v1.global_variables_initializer())
            starts = [sess.run(m.variables) for m in (a, b)]
            saved = None

            def run(action, rng):
                """Runs one action; updates the books from what the run reports."""
                if action == "accum":
                    feed = a.feed(rng)
                    sess.run(acc.accum_op, feed)
                    a.enter(feed)
                elif action == "fused":
                    feed = a.feed(rng)
                    sess.run(acc.accum_apply_op, feed)
                    a.enter(feed, update=True)
                elif action == "apply":
                    try:
                        sess.run(acc.apply_op)
                    except tf.errors.InvalidArgumentError as error:
                        # Nothing accumulated (another thread's apply took it).
                        assert "apply_op ran with nothing accumulated" in str(error)
                    else:
                        with a.lock:
                            a.updates += 1
                elif action == "train":
                    feed = b.feed(rng)
                    _, norm = sess.run([train_op, wrapper.window.global_norm], feed)
                    b.enter(feed, update=norm > 0)  # applied in this run

            for p, (action, arg) in enumerate(case["program"]):
                where = f"after phase {p} ({action}) of {case['program']}"
                if action == "threads":
                    seeds = rng.randint(0, 2**31, size=len(arg))
                    errors = []

                    def work(plan, seed, errors=errors):
                        mine = np.random.RandomState(seed)
                        try:
                            for step in plan:
                                run(step, mine)
                        except Exception as error:  # reported below
                            errors.append(error)

                    threads = [
                        threading.Thread(target=work, args=(plan, seed))
                        for plan, seed in zip(arg, seeds)
                    ]
                    for thread in threads:
                        thread.start()
                    for thread in threads:
                        thread.join(timeout=120)
                    assert not any(t.is_alive() for t in threads), f"{where}: a thread hung"
                    assert not errors, f"{where}: {errors}"
                elif action == "zero":
                    held = pending(sess, a.accumulators(), a.counter)
                    a.books = [k - h for k, h in zip(a.books, held)]
                    sess.run(acc.zero_op)
                elif action == "flush":
                    if sess.run(wrapper.window.counter) > 0:
                        b.updates += 1
                    sess.run(wrapper.flush_op)
                elif action == "save":
                    path = saver.save(sess, os.path.join(directory, "ledger"))
                    saved = (path, [(list(m.books), m.updates) for m in (a, b)])
                elif action == "restore":
                    if saved is None:
                        continue
                    saver.restore(sess, saved[0])
                    for m, (books, updates) in zip((a, b), saved[1]):
                        m.books, m.updates = list(books), updates
                else:
                    for _ in range(arg):
                        run(action, rng)
                for m, start in zip((a, b), starts):
                    m.check(sess, start, where)


# Weights of any size: one graph per dtype (and graph mode), built once and fed.
_WEIGHTED_SESSIONS = {}
_EXPONENTS = {tf.float64: (-300.0, 300.0), tf.float32: (-37.9, 38.5)}


def _weighted_session(dtype):
    """A window of an embedding and a dense layer under SGD, weight fed as float64."""
    if dtype not in _WEIGHTED_SESSIONS:
        graph = tf.Graph()
        with graph.as_default():
            rng = np.random.RandomState(7)
            np_dtype = dtype.as_numpy_dtype
            ids = v1.placeholder(tf.int32, [None])
            targets = v1.placeholder(dtype, [None, 2])
            weight = v1.placeholder(tf.float64, [])
            table = v1.get_variable("table", initializer=rng.randn(6, 3).astype(np_dtype))
            dense = v1.get_variable("dense", initializer=rng.randn(3, 2).astype(np_dtype))
            prediction = tf.matmul(tf.nn.embedding_lookup(table, ids), dense)
            loss = tf.reduce_mean((prediction - targets) ** 2)
            acc = tf1_accum.build_accumulation(
                loss, v1.train.GradientDescentOptimizer(0.125), weight=weight
            )
            gradients = [tf.convert_to_tensor(g) for g in tf.gradients(loss, [table, dense])]
            sess = v1.Session(graph=graph)
            sess.run(v1.global_variables_initializer())
        batches = [
            (rng.randint(0, 6, size=3).astype(np.int32), rng.randn(3, 2).astype(np_dtype))
            for _ in range(4)
        ]
        feeds = [{ids: i, targets: t} for i, t in batches]
        _WEIGHTED_SESSIONS[dtype] = (sess, acc, weight, [table, dense], gradients, feeds)
    return _WEIGHTED_SESSIONS[dtype]


@st.composite
def weight_windows(draw):
    """(dtype, 1 to 4 weights): 0 sometimes, else 10**e for e anywhere in the dtype's
    range, most windows within a span of exponents that its ratios hold."""
    dtype = draw(st.sampled_from([tf.float64, tf.float32]), label="dtype")
    low, high = _EXPONENTS[dtype]
    span = draw(st.sampled_from([2.0, 30.0, high - low]), label="span of exponents")
    centre = draw(st.floats(low, high), label="centre")
    exponents = draw(
        st.lists(
            st.one_of(st.just(None), st.floats(centre - span / 2, centre + span / 2)),
            min_size=1,
            max_size=4,
        ),
        label="exponents (None: weight 0)",
    )
    if all(e is None for e in exponents):
        exponents[0] = centre
    clipped = [None if e is None else min(max(e, low), high) for e in exponents]
    return dtype, [0.0 if e is None else 10.0**e for e in clipped]


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(weight_windows())
def test_weights_of_any_size_give_the_large_batch_or_a_refusal(window):
    """Whatever the weights' size, a window whose least positive weight over its
    largest is a normal number of the dtype applies the large batch's update; one
    that is not is refused at the micro-batch that makes it so, changing nothing.
    Never a skipped window, never a NaN."""
    dtype, weights = window
    sess, acc, weight, variables, gradients, feeds = _weighted_session(dtype)
    sess.run(acc.zero_op)  # whatever an example before left
    tiny = np.finfo(dtype.as_numpy_dtype).tiny
    start = [np.asarray(v, np.float64) for v in sess.run(variables)]
    skipped = sess.run(acc.skipped_windows)
    taken = []
    for k, w in enumerate(weights):
        positive = [x for x in weights[: k + 1] if x > 0]
        refused = bool(positive) and min(positive) / max(positive) < tiny
        feed = {**feeds[k], weight: w}
        if refused:
            before = sess.run(acc.accumulators + [acc.counter])
            with pytest.raises(tf.errors.InvalidArgumentError, match="too far from the other"):
                sess.run(acc.accum_op, feed)
            for got, want in zip(sess.run(acc.accumulators + [acc.counter]), before):
                np.testing.assert_array_equal(got, want)
            sess.run(acc.zero_op)
            return
        taken.append((w, [np.asarray(g, np.float64) for g in sess.run(gradients, feed)]))
        sess.run(acc.accum_op, feed)
    sess.run(acc.apply_op)
    assert sess.run(acc.skipped_windows) == skipped, f"{weights}: the window was skipped"
    largest = max(weights)
    ratios = [w / largest for w, _ in taken]
    for i, variable in enumerate(sess.run(variables)):
        total = sum(r * g[i] for r, (_, g) in zip(ratios, taken))
        want = start[i] - 0.125 * total / sum(ratios)
        assert np.all(np.isfinite(variable)), f"{weights}: {variable}"
        error = relative_error(variable, want)
        assert error <= RTOL[dtype], f"{weights}: {variables[i].op.name} is {error:.3g} off"
