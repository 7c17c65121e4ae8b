"""tf1_accum.Saver: checkpoints written while threads accumulate are never torn.

A model whose gradients are known exactly: ``w`` (``SIZE`` elements) gets the
fed value ``x`` in each element, ``u`` gets 1, SGD with learning rate 1 applies
their sum (``average=False``). From a checkpoint alone, micro-batches applied
(``u0 - u``) plus pending (``counter``, ``u``'s accumulator) give how many
were fed, ``n``, and ``w`` with its accumulator must hold the sum of the
first ``n`` values fed, in every element: a checkpoint that read the counter
before an add and an accumulator after it (or the weights after an apply and
the accumulators before its reset) breaks one of these equalities. Every
value is a small integer in float64: every comparison is exact.
"""

import os
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import tf1_accum
from _ways import BY_NAME

v1 = tf.compat.v1

SIZE = 20000  # elements of w: an add takes long enough to be caught in the middle
STEPS = 4  # micro-batches per window
U0 = 1000.0


def _values(count, seed=0):
    """The x fed to micro-batch i, and the sum of the first n for every n."""
    values = np.random.RandomState(seed).randint(1, 5, size=count).astype(np.float64)
    return values, np.concatenate([[0.0], np.cumsum(values)])


# The ways whose windows a thread feeds op by op here; the others run the
# same ops (see _ways.WayIn.window_ops).
SAVER_WAYS = (BY_NAME["ops"], BY_NAME["optimizer"])


class _Graph:
    """The model and one way in, built in a graph of its own."""

    def __init__(self, way, size=SIZE, max_to_keep=None):
        self.graph = tf.Graph()
        with self.graph.as_default():

            def model_fn(inputs):
                (self.x,) = inputs
                self.w = v1.get_variable("w", initializer=np.zeros(size))
                self.u = v1.get_variable("u", initializer=np.float64(U0))
                return tf.reduce_sum(self.w) * self.x + self.u

            built = way.build(
                model_fn,
                v1.train.GradientDescentOptimizer(1.0),
                [(np.float64(0.0),)],
                STEPS,
                global_step=v1.train.get_or_create_global_step(),
                average=False,
            )
            self.window, self.counter = built.window, built.counter
            self.accumulate, self.last, self.apply_op = way.window_ops(built)
            self.saver = tf1_accum.Saver(max_to_keep=max_to_keep)
            self.init = v1.global_variables_initializer()
        self.sess = v1.Session(graph=self.graph)
        self.sess.run(self.init)

    def feed(self, value, index):
        """Runs micro-batch ``index`` (from 0), and the apply when its window is full."""
        end = (index + 1) % STEPS == 0
        self.sess.run(self.last if end else self.accumulate, {self.x: value})
        if end and self.apply_op is not None:
            self.sess.run(self.apply_op)


def _fed(values, w, u, counter, w_accumulator, u_accumulator):
    """Checks one window state for agreement; returns how many micro-batches it holds."""
    if counter == 0:
        # An empty window: a dense accumulator keeps the last window's sums,
        # which nothing reads (the next add assigns).
        w_accumulator, u_accumulator = np.zeros_like(w_accumulator), 0.0
    assert u_accumulator == counter, f"counter {counter} but u's accumulator {u_accumulator}"
    applied = U0 - u
    n = int(applied + counter)
    assert applied == int(applied) and 0 <= n < len(values[1])
    held = -w + w_accumulator  # every element: the sum of the first n values
    np.testing.assert_array_equal(held, np.full(held.shape, values[1][n]), err_msg=f"n = {n}")
    return n


def _read(path):
    reader = tf.train.load_checkpoint(path)
    names = {name for name in reader.get_variable_to_shape_map()}
    accumulator = {name.split("/")[0]: name for name in names if name.endswith("accumulator")}
    counter = next(name for name in names if name.endswith("counter"))
    return (
        reader.get_tensor("w"),
        reader.get_tensor("u"),
        reader.get_tensor(counter),
        reader.get_tensor(accumulator["w"]),
        reader.get_tensor(accumulator["u"]),
    )


@pytest.mark.parametrize("way", SAVER_WAYS, ids=str)
def test_checkpoints_saved_while_a_thread_accumulates_are_whole(way, tmp_path):
    count = 20000  # the feeder runs at most 150 micro-batches ahead per checkpoint written
    values = _values(count)
    model = _Graph(way)
    started = done = 0
    stop = threading.Event()
    checked = []

    def accumulate():
        nonlocal started, done
        for index, value in enumerate(values[0]):
            # Paced, so that a loaded machine's slow saves cannot let it run out of values.
            while len(checked) < index // 150 and not stop.is_set():
                time.sleep(0.001)
            if stop.is_set():
                return
            started = index + 1
            model.feed(value, index)
            done = index + 1

    feeder = threading.Thread(target=accumulate)
    feeder.start()
    try:
        while feeder.is_alive() and len(checked) < 100:
            low = done
            path = model.saver.save(model.sess, str(tmp_path / "ckpt"), global_step=len(checked))
            high = started
            n = _fed(values, *_read(path))
            assert low <= n <= high, f"checkpoint holds {n} micro-batches, fed {low} to {high}"
            checked.append((path, n))
            for suffix in (".index", ".data-00000-of-00001"):
                if len(checked) % 25:
                    os.remove(path + suffix)
    finally:
        stop.set()
        feeder.join()
    assert len(checked) == 100 and len({n for _, n in checked}) > 5
    # Restored into a graph of its own, each kept checkpoint finishes its window.
    for path, n in checked[24::25]:  # the checkpoints kept
        other = _Graph(way)
        other.saver.restore(other.sess, path)
        pending = int(other.sess.run(other.counter))
        end = n + STEPS - pending
        for index in range(n, end):
            other.sess.run(other.accumulate, {other.x: values[0][index]})
        if other.apply_op is not None:  # saved after its window's last add, or later
            other.sess.run(other.apply_op)
        np.testing.assert_array_equal(other.sess.run(other.w), np.full(SIZE, -values[1][end]))
        assert other.sess.run(other.u) == U0 - end
        other.sess.close()
    model.sess.close()


ACTIONS = st.one_of(
    st.tuples(st.just("feed"), st.integers(1, 9)),  # a thread feeds that many, in the background
    st.tuples(st.just("save"), st.just(0)),  # while it feeds
    st.tuples(st.just("restore"), st.integers(0, 50)),  # the thread done: a checkpoint saved
)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    actions=st.lists(ACTIONS, min_size=1, max_size=10),
    way=st.sampled_from(SAVER_WAYS),
)
def test_threads_checkpoints_and_restores_keep_applied_plus_pending_equal_to_fed(
    actions, way, tmp_path_factory
):
    """Checkpoints mid-feed hold what was fed; after a restore, feeding goes on from there."""
    directory = tmp_path_factory.mktemp("ckpt")
    values = _values(200, seed=len(actions))
    model = _Graph(way, size=2000)
    fed = started = done = 0  # micro-batches: fed before the current thread; its progress
    feeder = None
    saved = []

    def feed(first, count):
        nonlocal started, done
        for index in range(first, first + count):
            started = index + 1
            model.feed(values[0][index], index)
            done = index + 1

    def join():
        nonlocal feeder, fed
        if feeder is not None:
            feeder.join()
            feeder, fed = None, done

    try:
        for action, argument in actions:
            if action == "feed":
                join()
                started = done = fed
                feeder = threading.Thread(target=feed, args=(fed, argument))
                feeder.start()
            elif action == "save":
                low = done if feeder is not None else fed
                path = model.saver.save(model.sess, str(directory / "c"), global_step=len(saved))
                high = started if feeder is not None else fed
                n = _fed(values, *_read(path))
                assert low <= n <= high
                saved.append((path, n))
            elif saved:
                join()
                path, n = saved[argument % len(saved)]
                model.saver.restore(model.sess, path)
                fed = done = started = n
        join()
        state = model.sess.run([model.w, model.u, model.counter])
        accumulators = {
            v.op.name.split("/")[0]: v
            for v in model.graph.get_collection(tf1_accum.STATE_COLLECTION)
            if v.op.name.endswith("accumulator")
        }
        held = model.sess.run([accumulators["w"], accumulators["u"]])
        assert _fed(values, *state, *held) == fed
    finally:
        join()
        model.sess.close()


def test_monitored_training_session_saves_with_it_from_the_savers_collection(tmp_path):
    """In SAVERS, it is the saver of MonitoredTrainingSession and of the wrapper's hook."""
    values = _values(3 * STEPS)
    partial = 2 * STEPS + 2  # two windows, and two micro-batches of the third
    model = _Graph(BY_NAME["optimizer"], size=10, max_to_keep=5)  # the hook saves again
    model.sess.close()
    with model.graph.as_default():
        v1.add_to_collection(v1.GraphKeys.SAVERS, model.saver)
        with v1.train.MonitoredTrainingSession(
            checkpoint_dir=str(tmp_path),
            save_checkpoint_steps=1,
            save_summaries_steps=None,
            hooks=[model.window.make_session_run_hook()],
        ) as sess:
            for index in range(partial):
                sess.run(model.accumulate, {model.x: values[0][index]})
    path = tf.train.latest_checkpoint(str(tmp_path))
    assert _fed(values, *_read(path)) == partial  # the hook saved the partial window
    resumed = _Graph(BY_NAME["optimizer"], size=10)
    resumed.saver.restore(resumed.sess, path)
    assert resumed.sess.run(resumed.counter) == 2
    for index in range(partial, 3 * STEPS):
        resumed.feed(values[0][index], index)
    w, u, counter = resumed.sess.run([resumed.w, resumed.u, resumed.counter])
    resumed.sess.close()
    assert counter == 0 and u == U0 - 3 * STEPS
    np.testing.assert_array_equal(w, np.full(10, -values[1][3 * STEPS]))


def test_built_again_it_locks_once():
    """A Scaffold calls build() on its saver again: a second lock made the save hang."""
    model = _Graph(BY_NAME["ops"], size=10)
    with model.graph.as_default():
        model.saver.build()
    locks = [op for op in model.graph.get_operations() if op.type == "MutexLock"]
    assert sorted(op.name for op in locks if op.name.startswith("save/")) == [
        "save/restore_lock",
        "save/save_lock",
    ]
    model.sess.close()
