"""Tests of run_accumulation."""

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import OPTIMIZERS
from _helpers import CountingSession
from _helpers import Model
from _helpers import check_equivalence
from _helpers import concat
from _helpers import make_batches
from _helpers import values_by_name

v1 = tf.compat.v1


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("dtype", [tf.float64, tf.float32], ids=lambda d: d.name)
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_helper_equals_large_batch_training(optimizer_name, dtype, sparse):
    check_equivalence(optimizer_name, dtype, sparse, path="helper")


def _one_sgd_step(batches):
    """Variables after one plain SGD step on the micro-batches joined."""
    with tf.Graph().as_default():
        big = Model(tf.float64, sparse=False)
        train = v1.train.GradientDescentOptimizer(0.1).minimize(big.loss)
        with v1.Session() as plain:
            plain.run(v1.global_variables_initializer())
            plain.run(train, big.feed(concat(batches)))
            return values_by_name(plain, v1.trainable_variables())


@pytest.fixture
def sgd_window():
    """A float64 model, its accumulation, a session, and 3 micro-batches."""
    with tf.Graph().as_default():
        model = Model(tf.float64, sparse=False)
        acc = tf1_accum.build_accumulation(
            model.loss,
            v1.train.GradientDescentOptimizer(0.1),
            global_step=v1.train.get_or_create_global_step(),
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            yield model, acc, sess, make_batches(tf.float64, False, 3, 4)


def test_n_plus_one_runs_fetches_in_the_same_run_and_apply_is_unfed(sgd_window):
    model, acc, sess, batches = sgd_window
    counting = CountingSession(sess)
    losses = tf1_accum.run_accumulation(
        counting, acc, [model.feed(b) for b in batches], fetches=model.loss
    )
    assert len(counting.calls) == len(batches) + 1
    assert counting.calls[-1] is None  # the apply is never fed
    assert len(losses) == 3
    # The fetched losses are those of the variables before the update.
    with tf.Graph().as_default():
        check = Model(tf.float64, sparse=False)
        with v1.Session() as fresh:
            fresh.run(v1.global_variables_initializer())
            expected = [fresh.run(check.loss, check.feed(b)) for b in batches]
    np.testing.assert_allclose(losses, expected, rtol=1e-12)
    assert sess.run(v1.train.get_global_step()) == 1
    assert sess.run(acc.counter) == 0


def test_without_fetches_returns_one_none_per_micro_batch(sgd_window):
    model, acc, sess, batches = sgd_window
    assert tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in batches]) == [
        None,
        None,
        None,
    ]


def test_generator_of_feed_dicts(sgd_window):
    model, acc, sess, batches = sgd_window
    before = values_by_name(sess, acc.var_list)
    out = tf1_accum.run_accumulation(
        sess, acc, (model.feed(b) for b in batches), fetches={"loss": model.loss}
    )
    assert [sorted(o) for o in out] == [["loss"]] * 3
    after = values_by_name(sess, acc.var_list)
    assert all(np.abs(after[k] - before[k]).max() > 1e-4 for k in before)


def test_last_batch_counted_once(sgd_window):
    """The forum bug: the apply fetched with the last feed re-runs accumulation."""
    model, acc, sess, batches = sgd_window
    before = values_by_name(sess, acc.var_list)
    tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in batches])
    after = values_by_name(sess, acc.var_list)
    expected = _one_sgd_step(batches)
    for name in before:
        np.testing.assert_allclose(after[name], expected[name], rtol=1e-12)


@pytest.mark.parametrize(
    "feed_dicts, error, message",
    [
        ([], ValueError, "holds no micro-batch"),
        (iter([]), ValueError, "holds no micro-batch"),
        ({"x": 1}, TypeError, "got a single dict"),
        (5, TypeError, r"iterable of feed dicts.*got 5 \(a builtins.int\)"),
    ],
    ids=["empty-list", "empty-generator", "one-dict", "not-iterable"],
)
def test_bad_feed_dicts_are_rejected_and_nothing_runs(sgd_window, feed_dicts, error, message):
    model, acc, sess, batches = sgd_window
    sess.run(acc.accum_op, model.feed(batches[0]))  # a window in progress
    counting = CountingSession(sess)
    with pytest.raises(error, match=message):
        tf1_accum.run_accumulation(counting, acc, feed_dicts)
    assert counting.calls == []
    assert sess.run(acc.counter) == 1


def test_a_bad_entry_in_a_list_is_rejected_before_anything_runs(sgd_window):
    model, acc, sess, batches = sgd_window
    counting = CountingSession(sess)
    feeds = [model.feed(batches[0]), [1, 2]]
    with pytest.raises(TypeError, match=r"feed_dicts\[1\] must be a dict .*got \[1, 2\]"):
        tf1_accum.run_accumulation(counting, acc, feeds)
    assert counting.calls == []


def test_wrong_accumulation_argument(sgd_window):
    model, acc, sess, batches = sgd_window
    with pytest.raises(TypeError, match="must be a tf1_accum.Accumulation"):
        tf1_accum.run_accumulation(sess, acc.apply_op, [model.feed(batches[0])])


def _bad_shape(model, batch):
    inputs, labels = batch
    return {model.inputs: inputs[:, :2], model.labels: labels}


def test_failing_micro_batch_is_named_and_the_window_discarded(sgd_window):
    model, acc, sess, batches = sgd_window
    step = v1.train.get_global_step()
    before = values_by_name(sess, acc.var_list)
    feeds = [model.feed(batches[0]), model.feed(batches[1]), _bad_shape(model, batches[2])]
    with pytest.raises(ValueError, match=r"micro-batch 2 of the window failed.*no update applied"):
        tf1_accum.run_accumulation(sess, acc, feeds)
    assert sess.run(acc.counter) == 0
    assert sess.run(step) == 0
    assert not any(sess.run(a).any() for a in acc.accumulators)
    after = values_by_name(sess, acc.var_list)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])
    # The next window starts clean: it equals one step on its own batches.
    tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in batches[1:]])
    got = values_by_name(sess, acc.var_list)
    expected = _one_sgd_step(batches[1:])
    for name in got:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-12)


def test_op_error_in_a_micro_batch_keeps_its_type(sgd_window):
    model, acc, sess, batches = sgd_window
    guard = tf.debugging.assert_all_finite(model.loss, "loss is not finite")
    inputs, labels = batches[1]
    nan_batch = (inputs, np.full_like(labels, np.nan))
    feeds = [model.feed(batches[0]), model.feed(nan_batch)]
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="micro-batch 1 of the window failed"
    ) as info:
        tf1_accum.run_accumulation(sess, acc, feeds, fetches=guard)
    assert isinstance(info.value.__cause__, tf.errors.InvalidArgumentError)
    assert sess.run(acc.counter) == 0


def test_generator_raising_is_named(sgd_window):
    model, acc, sess, batches = sgd_window

    def feeds():
        yield model.feed(batches[0])
        raise OSError("disk went away")

    with pytest.raises(OSError, match="micro-batch 1 of the window failed.*disk went away"):
        tf1_accum.run_accumulation(sess, acc, feeds())
    assert sess.run(acc.counter) == 0


def test_continues_a_window_left_partly_accumulated(sgd_window):
    model, acc, sess, batches = sgd_window
    sess.run(acc.accum_op, model.feed(batches[0]))
    tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in batches[1:]])
    got = values_by_name(sess, acc.var_list)
    expected = _one_sgd_step(batches)
    for name in got:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-12)
