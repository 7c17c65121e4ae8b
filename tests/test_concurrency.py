"""Concurrency: threads running accum_op on one session lose no gradient.

Queue-runner style feeding runs ``accum_op`` from several Python threads on
one session at once; ``Session.run`` releases the GIL, so the adds really
overlap. In float64, the accumulators must then hold the sum of every fed
micro-batch's gradient (each computed on its own), the counter the number of
runs, and the apply must equal large-batch training on all of them.
"""

import threading

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import Model
from _helpers import RTOL
from _helpers import assert_same_values
from _helpers import make_batches
from _helpers import pending
from _helpers import plain_training
from _helpers import values_by_name

v1 = tf.compat.v1

THREADS = 4
RUNS_PER_THREAD = 25
DTYPE = tf.float64


def _dense(gradient, shape):
    """A fetched gradient (an array, or IndexedSlicesValue) as a dense array."""
    if isinstance(gradient, np.ndarray):
        return gradient
    dense = np.zeros(shape, gradient.values.dtype)
    np.add.at(dense, gradient.indices, gradient.values)  # repeated ids add up
    return dense


def _run_in_threads(sess, op, feeds):
    """Runs ``op`` once per feed, the feeds dealt round-robin to THREADS threads."""
    start = threading.Barrier(THREADS)
    errors = []

    def worker(mine):
        try:
            start.wait()
            for feed in mine:
                sess.run(op, feed)
        except Exception as error:  # reported by the test thread
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(feeds[t::THREADS],)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a feeding thread hung"
    assert not errors, errors


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_threads_feeding_accum_op_lose_no_gradient(sparse):
    batches = make_batches(DTYPE, sparse, THREADS * RUNS_PER_THREAD, 5)
    with tf.Graph().as_default():
        model = Model(DTYPE, sparse)
        acc = tf1_accum.build_accumulation(
            model.loss,
            v1.train.AdamOptimizer(0.05),
            global_step=v1.train.get_or_create_global_step(),
        )
        gradients = tf.gradients(model.loss, acc.var_list)
        assert isinstance(gradients[0], tf.IndexedSlices) == sparse
        shapes = [v.shape.as_list() for v in acc.var_list]
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            # Each micro-batch's gradient on its own, one run at a time.
            expected = [np.zeros(shape) for shape in shapes]
            for batch in batches:
                for total, g, shape in zip(
                    expected, sess.run(gradients, model.feed(batch)), shapes
                ):
                    total += _dense(g, shape)
            assert all(np.abs(total).max() > 0 for total in expected)

            _run_in_threads(sess, acc.accum_op, [model.feed(b) for b in batches])

            assert sess.run(acc.counter) == len(batches)
            for var, total, want in zip(acc.var_list, sess.run(acc.accumulators), expected):
                # The adds ran in another order than the sum above: equal up
                # to float64 rounding, and a lost micro-batch is far larger.
                np.testing.assert_allclose(
                    total, want, rtol=0, atol=RTOL[DTYPE] * np.abs(want).max(), err_msg=var.op.name
                )

            sess.run(acc.apply_op)
            got = values_by_name(sess, tf1_accum.plain_variables())

    (want,) = plain_training("adam", DTYPE, sparse, [batches])
    assert_same_values(got, want, RTOL[DTYPE], f"{THREADS} feeding threads")
    assert got["global_step"] == 1


# Exact ledgers: in the models below each micro-batch's gradient is what it
# feeds (small integers), so every sum is exact in float64 and any micro-batch
# lost or applied twice shows as an exact difference, whatever the order.
DIM = 3
WIDE = 20000  # columns of w: adds, reads and resets long enough to overlap
ROWS = 6
LEARNING_RATE = 1.0


class Ledger:
    """A model whose gradients are its inputs, and the values fed to it.

    ``w`` (dense) gets gradient ``x`` in each column; ``table`` (sparse) gets ``x[0]`` in
    each row of ``ids``; ``c`` gets 1 per micro-batch, so its ledger counts
    micro-batches (or, averaged, updates).
    """

    def __init__(self, prefix=""):
        self.x = v1.placeholder(tf.float64, [DIM], name=prefix + "x")
        self.ids = v1.placeholder(tf.int32, [2], name=prefix + "ids")
        self.w = v1.get_variable(
            prefix + "w", initializer=np.tile(0.5 * np.arange(1.0, DIM + 1)[:, None], [1, WIDE])
        )
        self.table = v1.get_variable(prefix + "table", initializer=np.full([ROWS, 1], 0.25))
        self.c = v1.get_variable(prefix + "c", initializer=np.float64(0.125))
        self.loss = (
            tf.reduce_sum(self.w * self.x[:, None])
            + tf.reduce_sum(tf.gather(self.table, self.ids)) * self.x[0]
            + self.c
        )
        self.variables = [self.w, self.table, self.c]

    def feeds(self, count, seed):
        rng = np.random.RandomState(seed)
        return [
            {
                self.x: rng.randint(1, 65, size=DIM).astype(np.float64),
                self.ids: rng.randint(0, ROWS, size=2).astype(np.int32),
            }
            for _ in range(count)
        ]

    def fed(self, feeds):
        """Per variable, the sum of the gradients of ``feeds``."""
        w = np.zeros([DIM, WIDE])
        table = np.zeros([ROWS, 1])
        for feed in feeds:
            w += feed[self.x][:, None]
            np.add.at(table, feed[self.ids], feed[self.x][0])  # repeated ids add up
        return [w, table, np.float64(len(feeds))]

    def applied(self, sess, start):
        """Per variable, what the updates subtracted (SGD, learning rate 1)."""
        return [s - v for s, v in zip(start, sess.run(self.variables))]


def _accumulators(variables):
    by_name = {v.op.name: v for v in v1.get_collection(tf1_accum.STATE_COLLECTION)}
    return [by_name[v.op.name + "/accumulator"] for v in variables]


def _assert_exact(got, want, what):
    for name, g, w in zip(["w", "table", "c"], got, want):
        np.testing.assert_array_equal(g, w, err_msg=f"{what}: {name}")


def _threads(work, count=THREADS):
    """Runs ``work(t)`` in ``count`` threads started together; returns their errors."""
    start = threading.Barrier(count)
    errors = [[] for _ in range(count)]

    def run(t):
        start.wait()
        try:
            work(t)
        except Exception as error:  # reported by the test thread
            errors[t].append(error)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads), "a thread hung"
    return errors


N = 4  # micro-batches per window: a power of two, so means are exact too
WINDOWS_PER_THREAD = 12


@pytest.mark.parametrize("repeat", range(2))
@pytest.mark.parametrize("fused", [False, True], ids=["n_plus_1_runs", "fused"])
def test_threads_calling_run_accumulation_run_whole_windows(fused, repeat):
    """Each call's window holds exactly its N micro-batches: its mean is exact."""
    with tf.Graph().as_default():
        model = Ledger()
        step = v1.train.get_or_create_global_step()
        acc = tf1_accum.build_accumulation(
            model.loss,
            v1.train.GradientDescentOptimizer(LEARNING_RATE),
            global_step=step,
            fused=fused,
        )
        feeds = model.feeds(THREADS * WINDOWS_PER_THREAD * N, seed=repeat)
        windows = [feeds[i : i + N] for i in range(0, len(feeds), N)]
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            start = sess.run(model.variables)

            def work(t):
                for window in windows[t::THREADS]:
                    tf1_accum.run_accumulation(sess, acc, window)

            errors = _threads(work)
            assert not any(errors), errors
            assert sess.run([step, acc.counter]) == [len(windows), 0]
            # Every window applied the mean of its own N micro-batches; one
            # holding another thread's micro-batch would divide by another count.
            applied = [a * N for a in model.applied(sess, start)]
            _assert_exact(applied, model.fed(feeds), "applied")


def test_a_window_failing_among_threads_is_discarded_as_its_message_says():
    with tf.Graph().as_default():
        model = Ledger()
        step = v1.train.get_or_create_global_step()
        acc = tf1_accum.build_accumulation(
            model.loss, v1.train.GradientDescentOptimizer(LEARNING_RATE), global_step=step
        )
        feeds = model.feeds(THREADS * WINDOWS_PER_THREAD * N, seed=7)
        windows = [feeds[i : i + N] for i in range(0, len(feeds), N)]
        failing = THREADS * 3  # thread 0's fourth window
        bad = dict(windows[failing][2])
        bad[model.ids] = np.array([ROWS + 3, 0], np.int32)  # out of range: the run fails
        windows[failing] = windows[failing][:2] + [bad] + windows[failing][3:]
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            start = sess.run(model.variables)

            def work(t):
                for window in windows[t::THREADS]:
                    try:
                        tf1_accum.run_accumulation(sess, acc, window)
                    except tf.errors.InvalidArgumentError as error:
                        if t == 0:
                            raised.append(str(error))
                        else:
                            raise

            raised = []
            errors = _threads(work)
            assert not any(errors), errors
            assert len(raised) == 1
            assert (
                "micro-batch 2 of the window failed so the window was discarded "
                "(accumulators and counter reset, no update applied)" in raised[0]
            )
            # True under threads: none of its micro-batches was applied, and
            # every other window was, whole.
            assert sess.run([step, acc.counter]) == [len(windows) - 1, 0]
            kept = [f for i, w in enumerate(windows) if i != failing for f in w]
            applied = [a * N for a in model.applied(sess, start)]
            _assert_exact(applied, model.fed(kept), "applied")


RUNS_PER_THREAD_WRAPPED = 61
STEPS = 8


@pytest.mark.parametrize("repeat", range(2))
@pytest.mark.parametrize("average", [False, True], ids=["sum", "mean"])
def test_threads_running_the_wrappers_train_op_count_every_micro_batch_once(average, repeat):
    runs = THREADS * RUNS_PER_THREAD_WRAPPED
    updates, left = divmod(runs, STEPS)
    assert left  # the flush has something to apply
    with tf.Graph().as_default():
        model = Ledger()
        step = v1.train.get_or_create_global_step()
        opt = tf1_accum.AccumulationOptimizer(
            v1.train.GradientDescentOptimizer(LEARNING_RATE), steps=STEPS, average=average
        )
        train_op = opt.minimize(model.loss, global_step=step)
        accumulators = _accumulators(model.variables)
        feeds = model.feeds(runs, seed=10 + repeat)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            start = sess.run(model.variables)
            norms = [[] for _ in range(THREADS)]

            def work(t):
                for feed in feeds[t::THREADS]:
                    norms[t].append(sess.run([train_op, opt.window.global_norm], feed)[1])

            errors = _threads(work)
            assert not any(errors), errors
            assert sess.run([step, opt.window.counter]) == [updates, left]
            assert sum(n > 0 for ns in norms for n in ns) == updates
            scale = STEPS if average else 1
            applied = [a * scale for a in model.applied(sess, start)]
            # The accumulators hold the sum of the micro-batches since the last update.
            held = sess.run(accumulators)
            total = [a + h for a, h in zip(applied, held)]
            _assert_exact(total, model.fed(feeds), "applied + accumulated")
            assert held[2] == left

            before = sess.run(model.variables)
            sess.run(opt.flush_op)
            assert sess.run([step, opt.window.counter]) == [updates + 1, 0]
            flushed = [b - v for b, v in zip(before, sess.run(model.variables))]
            _assert_exact([f * (left if average else 1) for f in flushed], held, "the flush")


RAW_RUNS_PER_THREAD = 80


@pytest.mark.parametrize("repeat", range(2))
def test_raw_ops_from_threads_lose_and_double_nothing(repeat):
    """accum_op, apply_op and accum_apply_op at random from several threads.

    An apply that finds the window empty (another thread applied it) fails
    and changes nothing; every other apply is one update.
    """
    with tf.Graph().as_default():
        model = Ledger()
        step = v1.train.get_or_create_global_step()
        acc = tf1_accum.build_accumulation(
            model.loss,
            v1.train.GradientDescentOptimizer(LEARNING_RATE),
            global_step=step,
            average=False,
            fused=True,
        )
        feeds = model.feeds(THREADS * RAW_RUNS_PER_THREAD, seed=20 + repeat)
        plans = np.random.RandomState(repeat).choice(
            ["accum", "apply", "fused"], p=[0.7, 0.2, 0.1], size=len(feeds)
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            start = sess.run(model.variables)
            updates = [0] * THREADS
            empty = [0] * THREADS

            def work(t):
                for feed, plan in zip(feeds[t::THREADS], plans[t::THREADS]):
                    if plan == "fused":
                        sess.run(acc.accum_apply_op, feed)
                        updates[t] += 1
                        continue
                    sess.run(acc.accum_op, feed)
                    if plan == "apply":
                        try:
                            sess.run(acc.apply_op)
                            updates[t] += 1
                        except tf.errors.InvalidArgumentError as error:
                            assert "apply_op ran with nothing accumulated" in str(error)
                            empty[t] += 1

            errors = _threads(work)
            assert not any(errors), errors
            assert sess.run(step) == sum(updates)
            held = pending(sess, acc.accumulators, acc.counter)
            assert sess.run(acc.counter) == held[2]
            total = [a + h for a, h in zip(model.applied(sess, start), held)]
            _assert_exact(total, model.fed(feeds), "applied + accumulated")
            # The window is left as the ops left it: zero_op empties it.
            sess.run(acc.zero_op)
            assert sess.run(acc.counter) == 0
            held = pending(sess, acc.accumulators, acc.counter)
            assert not np.any(np.concatenate([np.ravel(a) for a in held]))


DATASET_WINDOWS = 40


@pytest.mark.parametrize("repeat", range(2))
def test_threads_running_the_dataset_loop_draw_each_micro_batch_once(repeat):
    rng = np.random.RandomState(30 + repeat)
    count = DATASET_WINDOWS * N
    xs = rng.randint(1, 65, size=(count, DIM)).astype(np.float64)

    def loss_fn(x):
        w = v1.get_variable("w", initializer=0.5 * np.arange(1.0, DIM + 1), dtype=tf.float64)
        c = v1.get_variable("c", initializer=np.float64(0.125), dtype=tf.float64)
        return tf.reduce_sum(w * x) + c

    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        acc = tf1_accum.build_dataset_accumulation(
            loss_fn,
            v1.train.GradientDescentOptimizer(LEARNING_RATE),
            tf.data.Dataset.from_tensor_slices(xs),
            steps=N,
            global_step=step,
            average=False,
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            start = sess.run(acc.var_list)
            drawn = [[] for _ in range(THREADS)]

            def work(t):
                while True:
                    try:
                        drawn[t].append(sess.run([acc.train_op, acc.micro_batches])[1])
                    except tf.errors.OutOfRangeError:
                        return

            errors = _threads(work)
            assert not any(errors), errors
            assert sorted(n for ns in drawn for n in ns) == [N] * DATASET_WINDOWS
            assert sess.run([step, acc.counter]) == [DATASET_WINDOWS, 0]
            w, c = [s - v for s, v in zip(start, sess.run(acc.var_list))]
            np.testing.assert_array_equal(w, xs.sum(axis=0))
            assert c == count


def test_a_window_started_inside_its_own_window_is_refused():
    """A feed-dict generator that calls run_accumulation again would wait forever."""
    with tf.Graph().as_default():
        model = Ledger()
        acc = tf1_accum.build_accumulation(
            model.loss, v1.train.GradientDescentOptimizer(LEARNING_RATE)
        )
        outer, inner = model.feeds(2, seed=40), model.feeds(2, seed=41)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            start = sess.run(model.variables)

            def feeds():
                yield outer[0]
                tf1_accum.run_accumulation(sess, acc, inner)
                yield outer[1]

            with pytest.raises(
                RuntimeError,
                match="micro-batch 1 of the window failed so the window was discarded.*"
                "run_accumulation called from a window of the same accumulation .* would wait "
                "forever: run the second window after the first returns",
            ):
                tf1_accum.run_accumulation(sess, acc, feeds())
            assert sess.run(acc.counter) == 0
            _assert_exact(model.applied(sess, start), [0 * s for s in start], "applied")
            # The lock was released: the next window runs.
            tf1_accum.run_accumulation(sess, acc, outer)
            _assert_exact([a * 2 for a in model.applied(sess, start)], model.fed(outer), "applied")


def _behind_a_tensor(*ops):
    with tf.control_dependencies(ops):
        return tf.identity(tf.constant(0))


def test_ops_of_one_window_behind_one_tensor_take_turns():
    """Two locking ops run by one fetched tensor run one after the other, in either order.

    Fetched side by side or grouped by tf.group, a run refuses them
    (test_guard.py); behind a tensor's control dependencies it does not see
    them: they must not wait for each other's lock.
    """
    with tf.Graph().as_default():
        model = Ledger()
        step = v1.train.get_or_create_global_step()
        acc = tf1_accum.build_accumulation(
            model.loss,
            v1.train.GradientDescentOptimizer(LEARNING_RATE),
            global_step=step,
            average=False,
            fused=True,
        )
        first, second, third = model.feeds(3, seed=50)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            start = sess.run(model.variables)
            sess.run(acc.accum_op, first)
            done = []
            # accum_op and apply_op in one run, then a fused op and accum_op:
            # neither may wait for the other's lock forever.
            both = _behind_a_tensor(acc.accum_op, acc.apply_op)
            runner = threading.Thread(target=lambda: done.append(sess.run(both, second)))
            runner.start()
            runner.join(timeout=60)
            assert done, "accum_op and apply_op in one run hung"
            assert sess.run(step) == 1
            held = pending(sess, acc.accumulators, acc.counter)
            total = [a + h for a, h in zip(model.applied(sess, start), held)]
            _assert_exact(total, model.fed([first, second]), "applied + accumulated")

            sess.run(_behind_a_tensor(acc.accum_apply_op, acc.accum_op), third)
            assert sess.run(step) == 2
            held = pending(sess, acc.accumulators, acc.counter)
            total = [a + h for a, h in zip(model.applied(sess, start), held)]
            _assert_exact(total, model.fed([first, second, third, third]), "applied + accumulated")
