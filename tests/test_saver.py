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

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum

v1 = tf.compat.v1

SIZE = 20000  # elements of w: an add takes long enough to be caught in the middle
STEPS = 4  # micro-batches per window
U0 = 1000.0


def _values(count, seed=0):
    """The x fed to micro-batch i, and the sum of the first n for every n."""
    values = np.random.RandomState(seed).randint(1, 5, size=count).astype(np.float64)
    return values, np.concatenate([[0.0], np.cumsum(values)])


class _Graph:
    """The model and one way in, built in a graph of its own."""

    def __init__(self, way):
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.x = v1.placeholder(tf.float64, [])
            self.w = v1.get_variable("w", initializer=np.zeros(SIZE))
            self.u = v1.get_variable("u", initializer=np.float64(U0))
            loss = tf.reduce_sum(self.w) * self.x + self.u
            optimizer = v1.train.GradientDescentOptimizer(1.0)
            if way == "AccumulationOptimizer":
                opt = tf1_accum.AccumulationOptimizer(optimizer, STEPS, average=False)
                self.train_op = opt.minimize(loss)
                self.counter = opt.micro_step
                self.apply_op = None
            else:
                acc = tf1_accum.build_accumulation(loss, optimizer, average=False)
                self.train_op, self.apply_op, self.counter = acc.accum_op, acc.apply_op, acc.counter
            self.saver = tf1_accum.Saver(max_to_keep=None)
            self.init = v1.global_variables_initializer()
        self.sess = v1.Session(graph=self.graph)
        self.sess.run(self.init)

    def feed(self, value, index):
        """Runs micro-batch ``index`` (from 0), and the apply when its window is full."""
        self.sess.run(self.train_op, {self.x: value})
        if self.apply_op is not None and (index + 1) % STEPS == 0:
            self.sess.run(self.apply_op)


def _fed(values, w, u, counter, w_accumulator, u_accumulator):
    """Checks one window state for agreement; returns how many micro-batches it holds."""
    assert u_accumulator == counter, f"counter {counter} but u's accumulator {u_accumulator}"
    applied = U0 - u
    n = int(applied + counter)
    assert applied == int(applied) and 0 <= n < len(values[1])
    held = -w + w_accumulator  # every element: the sum of the first n values
    np.testing.assert_array_equal(held, np.full(SIZE, values[1][n]), err_msg=f"n = {n}")
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


@pytest.mark.parametrize("way", ["build_accumulation", "AccumulationOptimizer"])
def test_checkpoints_saved_while_a_thread_accumulates_are_whole(way, tmp_path):
    count = 20000  # more than the feeder runs while 100 checkpoints are written
    values = _values(count)
    model = _Graph(way)
    started = done = 0
    stop = threading.Event()

    def accumulate():
        nonlocal started, done
        for index, value in enumerate(values[0]):
            if stop.is_set():
                return
            started = index + 1
            model.feed(value, index)
            done = index + 1

    feeder = threading.Thread(target=accumulate)
    feeder.start()
    checked = []
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
            other.sess.run(other.train_op, {other.x: values[0][index]})
        if other.apply_op is not None:  # saved after its window's last add, or later
            other.sess.run(other.apply_op)
        np.testing.assert_array_equal(other.sess.run(other.w), np.full(SIZE, -values[1][end]))
        assert other.sess.run(other.u) == U0 - end
        other.sess.close()
    model.sess.close()
