"""Tests of run_accumulation."""

import sys
import typing

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import OPTIMIZERS
from _helpers import RTOL
from _helpers import CountingSession
from _helpers import Model
from _helpers import concat
from _helpers import assert_same_values
from _helpers import make_batches
from _helpers import plain_training
from _helpers import values_by_name

v1 = tf.compat.v1


def _one_sgd_step(batches):
    """Variables after one plain SGD step on the micro-batches joined."""
    with tf.Graph().as_default():
        big = Model(tf.float64, sparse=False)
        train = v1.train.GradientDescentOptimizer(0.1).minimize(big.loss)
        with v1.Session() as plain:
            plain.run(v1.global_variables_initializer())
            plain.run(train, big.feed(concat(batches)))
            return values_by_name(plain, v1.trainable_variables())


def _assert_one_sgd_step(got, batches):
    """``got`` (variable name: value) is one plain SGD step on ``batches`` joined."""
    expected = _one_sgd_step(batches)
    for name in got:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-12)


@pytest.fixture
def sgd_window():
    """A float64 model, its accumulation, a session, and 3 micro-batches."""
    yield from _sgd_window(fused=False)


@pytest.fixture
def fused_window():
    """The same, built with fused=True."""
    yield from _sgd_window(fused=True)


def _sgd_window(fused):
    with tf.Graph().as_default():
        model = Model(tf.float64, sparse=False)
        acc = tf1_accum.build_accumulation(
            model.loss,
            v1.train.GradientDescentOptimizer(0.1),
            global_step=v1.train.get_or_create_global_step(),
            fused=fused,
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
    tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in batches])
    _assert_one_sgd_step(values_by_name(sess, acc.var_list), batches)


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
    after = values_by_name(sess, acc.var_list)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])
    # The next window starts clean: it equals one step on its own batches.
    tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in batches[1:]])
    got = values_by_name(sess, acc.var_list)
    _assert_one_sgd_step(got, batches[1:])


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
    _assert_one_sgd_step(got, batches)


def test_fused_takes_n_runs_and_equals_the_unfused_path_bit_for_bit():
    batches = make_batches(tf.float32, True, 8, 5)
    results = {}
    for fused in (False, True):
        with tf.Graph().as_default():
            model = Model(tf.float32, sparse=True)
            acc = tf1_accum.build_accumulation(
                model.loss,
                v1.train.AdamOptimizer(0.05),
                global_step=v1.train.get_or_create_global_step(),
                fused=True,
            )
            with v1.Session() as sess:
                sess.run(v1.global_variables_initializer())
                counting = CountingSession(sess)
                losses = []
                for window in (batches[:4], batches[4:]):
                    feeds = (model.feed(b) for b in window)
                    losses += tf1_accum.run_accumulation(
                        counting, acc, feeds, fetches=model.loss, fused=fused
                    )
                assert len(counting.calls) == (8 if fused else 10)
                assert sess.run(acc.counter) == 0
                results[fused] = (losses, values_by_name(sess, v1.global_variables()))
    assert results[True][0] == results[False][0]
    for name, value in results[False][1].items():
        np.testing.assert_array_equal(results[True][1][name], value, err_msg=name)
    assert results[True][1]["global_step"] == 2


def test_fused_names_the_failing_micro_batch(fused_window):
    model, acc, sess, batches = fused_window
    before = values_by_name(sess, acc.var_list)

    def feeds():
        yield model.feed(batches[0])
        yield model.feed(batches[1])
        raise OSError("disk went away")

    with pytest.raises(OSError, match="micro-batch 2 of the window failed"):
        tf1_accum.run_accumulation(sess, acc, feeds(), fused=True)
    assert sess.run(acc.counter) == 0
    with pytest.raises(ValueError, match="micro-batch 1 of the window failed"):
        tf1_accum.run_accumulation(
            sess, acc, [model.feed(batches[0]), _bad_shape(model, batches[1])], fused=True
        )
    after = values_by_name(sess, acc.var_list)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])


def _sgd_at_a_fed_rate(model, sess):
    """A second accumulation of ``model`` in ``sess``: plain SGD at a fed rate placeholder."""
    with sess.graph.as_default():
        rate = v1.placeholder(tf.float64, [], name="rate")
        acc = tf1_accum.build_accumulation(
            model.loss, v1.train.GradientDescentOptimizer(rate), name="scheduled"
        )
        sess.run(v1.variables_initializer(v1.get_collection(tf1_accum.STATE_COLLECTION)))
    return rate, acc


def test_apply_feed_dict_feeds_a_learning_rate_placeholder(sgd_window):
    model, _, sess, batches = sgd_window
    rate, acc = _sgd_at_a_fed_rate(model, sess)
    feeds = [model.feed(b) for b in batches]
    with pytest.raises(TypeError, match=r"apply_feed_dict must be a dict .*got 0.1"):
        tf1_accum.run_accumulation(sess, acc, feeds, apply_feed_dict=0.1)
    assert sess.run(acc.counter) == 0
    # The reference's constant rate is a float32 0.1, cast to float64.
    tf1_accum.run_accumulation(sess, acc, feeds, apply_feed_dict={rate: np.float32(0.1)})
    got = values_by_name(sess, acc.var_list)
    _assert_one_sgd_step(got, batches)


class _ApplyRunHook(v1.train.SessionRunHook):
    """Adds ``fetch`` (and ``feed``) to the runs of ``apply_op`` alone.

    ``apply_op`` is an accumulation's ``apply_op``, or its ``accum_apply_op``:
    the op ``run_accumulation`` runs to apply.
    """

    def __init__(self, apply_op, fetch, feed=None):
        self.apply_op = apply_op
        self.fetch = fetch
        self.feed = feed

    def before_run(self, run_context):
        fetches = run_context.original_args.fetches
        # The helper fetches the op alone, or first in a tuple with what else it
        # reads; a list is left alone.
        if isinstance(fetches, tuple) and fetches:
            fetches = fetches[0]
        if fetches is self.apply_op:
            return v1.train.SessionRunArgs(self.fetch, feed_dict=self.feed)
        return None


def _monitored_window(make_hook, fused=False):
    """A float64 SGD accumulation in a MonitoredSession with ``make_hook(model, acc)``."""
    with tf.Graph().as_default():
        model = Model(tf.float64, sparse=False)
        step = v1.train.get_or_create_global_step()
        acc = tf1_accum.build_accumulation(
            model.loss, v1.train.GradientDescentOptimizer(0.1), global_step=step, fused=fused
        )
        hook = make_hook(model, acc)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            yield model, acc, step, sess


def test_a_hook_fetching_the_loss_in_every_run_is_fed_by_apply_feed_dict():
    """MonitoredSession hooks add fetches to the apply run too: feed them."""
    batches = make_batches(tf.float64, False, 3, 4)
    for model, acc, step, sess in _monitored_window(
        lambda model, acc: v1.train.NanTensorHook(model.loss)
    ):
        feeds = [model.feed(b) for b in batches]
        tf1_accum.run_accumulation(sess, acc, feeds, apply_feed_dict=feeds[-1])
        assert sess.run([step, acc.counter], feed_dict=feeds[0]) == [1, 0]
        # The hook fetches the loss in this run too: it needs a micro-batch.
        values = sess.run(acc.var_list, feed_dict=feeds[0])
        got = dict(zip([v.op.name for v in acc.var_list], values))
    _assert_one_sgd_step(got, batches)


def test_a_hook_failing_the_apply_run_before_the_update_discards_the_window():
    # The hook feeds a malformed batch: the run fails before any op runs.
    batches = make_batches(tf.float64, False, 3, 4)

    def make_hook(model, acc):
        return _ApplyRunHook(acc.apply_op, model.loss, feed=_bad_shape(model, batches[0]))

    for model, acc, step, sess in _monitored_window(make_hook):
        feeds = [model.feed(b) for b in batches]
        before = values_by_name(sess, acc.var_list)
        with pytest.raises(
            ValueError,
            match=r"apply of the window failed before the update so the window was discarded "
            r"\(accumulators and counter reset, no update applied\): Cannot feed",
        ):
            tf1_accum.run_accumulation(sess, acc, feeds)
        assert sess.run([step, acc.counter], feed_dict=feeds[0]) == [0, 0]
        after = values_by_name(sess, acc.var_list)
        for name in before:
            np.testing.assert_array_equal(after[name], before[name])


def test_a_hook_failing_the_apply_run_after_the_update_says_it_was_applied():
    # The hook's check waits for the apply, then fails.
    batches = make_batches(tf.float64, False, 3, 4)

    def make_hook(model, acc):
        with tf.control_dependencies([acc.apply_op]):
            # The counter is never negative: the check always fails.
            check = tf.debugging.assert_negative(
                tf.identity(acc.counter), message="the hook check failed"
            )
        return _ApplyRunHook(acc.apply_op, check)

    for model, acc, step, sess in _monitored_window(make_hook):
        feeds = [model.feed(b) for b in batches]
        with pytest.raises(
            tf.errors.InvalidArgumentError,
            match=r"apply of the window failed after the update: the window was applied "
            r"\(or skipped as non-finite\); do not apply again: "
            r"(.|\n)*the hook check failed",
        ):
            tf1_accum.run_accumulation(sess, acc, feeds)
        assert sess.run([step, acc.counter], feed_dict=feeds[0]) == [1, 0]
        got = values_by_name(sess, acc.var_list)
    _assert_one_sgd_step(got, batches)


def test_fused_failure_in_the_last_run_before_the_apply_discards_the_window(fused_window):
    model, acc, sess, batches = fused_window
    step = v1.train.get_global_step()
    before = values_by_name(sess, acc.var_list)
    # A malformed last micro-batch: its run fails before any op runs.
    feeds = [model.feed(batches[0]), model.feed(batches[1]), _bad_shape(model, batches[2])]
    with pytest.raises(
        ValueError, match=r"micro-batch 2 of the window failed so the window was discarded"
    ):
        tf1_accum.run_accumulation(sess, acc, feeds, fused=True)
    assert sess.run([step, acc.counter]) == [0, 0]
    after = values_by_name(sess, acc.var_list)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])


def test_fused_failure_in_the_last_run_after_the_apply_says_it_ran():
    # The guard runs in the last run only, after the accumulate-and-apply, and
    # fails: the labels are NaN.
    batches = make_batches(tf.float64, False, 3, 4)

    def make_hook(model, acc):
        with tf.control_dependencies([acc.accum_apply_op]):
            guard = tf.debugging.assert_all_finite(model.labels, "labels are not finite")
        return _ApplyRunHook(acc.accum_apply_op, guard)

    for model, acc, step, sess in _monitored_window(make_hook, fused=True):
        inputs, labels = batches[2]
        feeds = [model.feed(b) for b in batches[:2]] + [model.feed((inputs, labels * np.nan))]
        before = values_by_name(sess, acc.var_list)
        with pytest.raises(
            tf.errors.InvalidArgumentError,
            match=r"micro-batch 2 of the window failed after the update: the window was applied "
            r"\(or skipped as non-finite\); do not apply again: "
            r"(.|\n)*labels are not finite",
        ):
            tf1_accum.run_accumulation(sess, acc, feeds, fused=True)
        # The labels are NaN: the window was skipped as non-finite.
        assert sess.run([step, acc.skipped_windows, acc.counter]) == [0, 1, 0]
        after = values_by_name(sess, acc.var_list)
        for name in before:
            np.testing.assert_array_equal(after[name], before[name])


def test_fused_needs_the_fused_op(sgd_window, fused_window):
    model, acc, sess, batches = sgd_window
    with pytest.raises(
        ValueError,
        match=r"fused=True needs accum_apply_op: build_accumulation\(\.\.\., fused=True\)",
    ):
        tf1_accum.run_accumulation(sess, acc, [model.feed(batches[0])], fused=True)
    assert acc.accum_apply_op is None
    model, acc, sess, batches = fused_window
    counting = CountingSession(sess)
    tf1_accum.run_accumulation(counting, acc, [model.feed(b) for b in batches], fused=False)
    assert len(counting.calls) == 4 and counting.calls[-1] is None


def test_sync_replicas_optimizer_allows_no_fused_op():
    with tf.Graph().as_default():
        model = Model(tf.float64, sparse=False)
        sync = v1.train.SyncReplicasOptimizer(
            v1.train.GradientDescentOptimizer(0.1), replicas_to_aggregate=1
        )
        with pytest.raises(
            ValueError, match="fused=True builds two applies, and SyncReplicasOptimizer allows one"
        ):
            tf1_accum.build_accumulation(
                model.loss, sync, global_step=v1.train.get_or_create_global_step(), fused=True
            )


@pytest.mark.parametrize("optimizer_name", ["sgd", "adam"])
def test_with_a_sync_replicas_optimizer_one_window_per_update(optimizer_name):
    """The composition with SyncReplicasOptimizer: it is the builder's optimizer.

    One worker here (the chief): each apply_op pushes the window's mean and
    waits for the chief's aggregated update, so global_step reads the update
    count right after it. num_tokens=0: the hook's default primes the token
    queue, and a pushed window then counts as stale and is dropped.
    """
    n, windows = 3, 3
    batches = make_batches(tf.float32, False, n * windows, 5)
    grouped = [batches[i * n : (i + 1) * n] for i in range(windows)]
    expected = plain_training(optimizer_name, tf.float32, False, grouped)
    with tf.Graph().as_default():
        model = Model(tf.float32, sparse=False)
        step = v1.train.get_or_create_global_step()
        sync = v1.train.SyncReplicasOptimizer(
            OPTIMIZERS[optimizer_name](tf.float32), replicas_to_aggregate=1, total_num_replicas=1
        )
        acc = tf1_accum.build_accumulation(model.loss, sync, global_step=step)
        hook = sync.make_session_run_hook(is_chief=True, num_tokens=0)
        with v1.train.MonitoredTrainingSession(
            is_chief=True,
            hooks=[hook],
            stop_grace_period_secs=1,
            save_checkpoint_secs=None,
            save_summaries_steps=None,
            log_step_count_steps=None,
        ) as sess:
            for w, window in enumerate(grouped):
                tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in window])
                got = values_by_name(sess, tf1_accum.plain_variables())
                assert got["global_step"] == w + 1
                want = {k: v for k, v in expected[w].items() if k in got}
                assert_same_values(got, want, RTOL[tf.float32], f"SyncReplicas, window {w}")


# ---- a learning rate fed with the micro-batches ----------------------------------------


def _scheduled():
    """A float64 model and Adam at a fed rate: (model, rate placeholder, optimizer)."""
    model = Model(tf.float64, sparse=False)
    rate = v1.placeholder(tf.float64, [], name="rate")
    return model, rate, v1.train.AdamOptimizer(rate)


def _plain_adam_step(batch, rate_value):
    """Variables (and the large batch's loss before the step) after plain Adam on ``batch``."""
    with tf.Graph().as_default():
        model, rate, adam = _scheduled()
        train = adam.minimize(model.loss)
        with v1.Session() as plain:
            plain.run(v1.global_variables_initializer())
            feed = {**model.feed(batch), rate: rate_value}
            loss, _ = plain.run([model.loss, train], feed)
            return loss, values_by_name(plain, v1.global_variables())


@pytest.mark.parametrize("way", ["large-batch", "feed-dicts"])
def test_a_learning_rate_fed_with_the_batch_reaches_the_apply(way):
    """Fed as plain minimize is fed, the rate is the apply's too: one plain step."""
    batches = make_batches(tf.float64, False, 3, 4)
    _, expected = _plain_adam_step(concat(batches), 0.05)
    with tf.Graph().as_default():
        model, rate, adam = _scheduled()
        acc = tf1_accum.build_accumulation(model.loss, adam, weight=tf.shape(model.labels)[0])
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            if way == "large-batch":
                feed = {**model.feed(concat(batches)), rate: 0.05}
                tf1_accum.run_accumulation(sess, acc, feed, micro_batch_size=4)
            else:
                feeds = [{**model.feed(b), rate: 0.05} for b in batches]
                tf1_accum.run_accumulation(sess, acc, feeds)
            got = values_by_name(sess, v1.global_variables())
    assert_same_values(got, expected, RTOL[tf.float64], way)


def test_micro_batches_feeding_the_apply_different_values_are_refused(sgd_window):
    model, _, sess, batches = sgd_window
    rate, acc = _sgd_at_a_fed_rate(model, sess)
    feeds = [{**model.feed(b), rate: r} for b, r in zip(batches, (0.1, 0.1, 0.2))]
    counting = CountingSession(sess)
    message = r"micro-batch 2 feeds rate:0 0.2, and micro-batch 1 fed it 0.1: the apply"
    with pytest.raises(ValueError, match=message):
        tf1_accum.run_accumulation(counting, acc, feeds)
    assert counting.calls == []
    # From a generator, the window runs until it finds out: it is discarded.
    before = values_by_name(sess, acc.var_list)
    with pytest.raises(ValueError, match=r"micro-batch 2 of the window failed so the window"):
        tf1_accum.run_accumulation(sess, acc, iter(feeds))
    assert sess.run(acc.counter) == 0
    assert_same_values(values_by_name(sess, acc.var_list), before, 0, "refused window")


@pytest.mark.parametrize("way", ["fused", "split"])
def test_fused_and_split_windows_feeding_different_rates_are_refused(way):
    """As unfused: the fused run would apply the last micro-batch's rate to the whole window."""
    batches = make_batches(tf.float64, False, 3, 4)
    with tf.Graph().as_default():
        model, rate, adam = _scheduled()
        acc = tf1_accum.build_accumulation(
            model.loss, adam, weight=tf.shape(model.labels)[0], fused=True
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            before = values_by_name(sess, v1.global_variables())
            counting = CountingSession(sess)
            feeds = [{**model.feed(b), rate: r} for b, r in zip(batches, (0.05, 0.05, 0.5))]
            message = (
                r"micro-batch 2 feeds rate:0 0.5, and micro-batch 1 fed it 0.05: the apply "
                r"reads it, and runs once per window, with one value\. .* with fused=False"
            )
            with pytest.raises(ValueError, match=message):
                if way == "fused":
                    tf1_accum.run_accumulation(counting, acc, feeds)
                else:  # a list of large batches, each split in one
                    tf1_accum.run_accumulation(counting, acc, feeds, micro_batch_size=4)
            assert counting.calls == []
            assert_same_values(values_by_name(sess, v1.global_variables()), before, 0, way)
            # One rate for the window: the large batch's step.
            feeds = [{**model.feed(b), rate: 0.05} for b in batches]
            tf1_accum.run_accumulation(sess, acc, feeds)
            got = values_by_name(sess, v1.global_variables())
    _, expected = _plain_adam_step(concat(batches), 0.05)
    assert_same_values(got, expected, RTOL[tf.float64], way)


def test_a_failed_apply_discards_the_window_and_the_next_call_runs(sgd_window):
    """The rate fed nowhere: the apply fails, and the helper (memory_fit too) runs on."""
    model, _, sess, batches = sgd_window
    with sess.graph.as_default():
        rate = v1.placeholder(tf.float64, [], name="rate")
        acc = tf1_accum.build_accumulation(
            model.loss,
            v1.train.GradientDescentOptimizer(rate),
            weight=tf.shape(model.labels)[0],
            name="scheduled",
        )
        sess.run(v1.variables_initializer(v1.get_collection(tf1_accum.STATE_COLLECTION)))
    before = values_by_name(sess, acc.var_list)
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"apply of the window failed before the update so the window was discarded "
        r"\(accumulators and counter reset, no update applied\): (.|\n)*rate",
    ):
        tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in batches])
    assert sess.run(acc.counter) == 0
    assert_same_values(values_by_name(sess, acc.var_list), before, 0, "failed apply")
    fit = tf1_accum.MemoryFit()
    # The reference's constant rate is a float32 0.1, cast to float64.
    feed = {**model.feed(concat(batches)), rate: np.float32(0.1)}
    tf1_accum.run_accumulation(sess, acc, feed, micro_batch_size=5, memory_fit=fit)
    _assert_one_sgd_step(values_by_name(sess, acc.var_list), batches)


# ---- the window's loss ---------------------------------------------------------------------


@pytest.mark.parametrize("weighted", [False, True], ids=["counted", "weighted"])
def test_the_mean_of_the_fetched_losses_is_the_large_batch_loss(weighted):
    sizes = [5, 5, 2] if weighted else [4, 4, 4]
    batches = make_batches(tf.float64, False, 3, sizes)
    large_loss, _ = _plain_adam_step(concat(batches), 0.05)
    with tf.Graph().as_default():
        model, rate, adam = _scheduled()
        weight = tf.shape(model.labels)[0] if weighted else None
        acc = tf1_accum.build_accumulation(model.loss, adam, weight=weight)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            feed = {**model.feed(concat(batches)), rate: 0.05}
            fetched = tf1_accum.run_accumulation(
                sess, acc, feed, fetches={"loss": model.loss}, micro_batch_size=sizes[0]
            )
            unfetched = tf1_accum.run_accumulation(sess, acc, feed, micro_batch_size=sizes[0])
    assert fetched.weights == ([5.0, 5.0, 2.0] if weighted else None)
    np.testing.assert_allclose(fetched.window_mean()["loss"], large_loss, rtol=1e-10)
    with pytest.raises(
        ValueError,
        match=r"window_mean\(\) needs fetched values, and this window fetched none: pass fetches=",
    ):
        unfetched.window_mean()


def test_the_signature_takes_one_large_batch_or_feed_dicts():
    annotation = tf1_accum.run_accumulation.__annotations__["feed_dicts"]
    assert annotation == "typing.Mapping | typing.Iterable[typing.Mapping | None]"
    if sys.version_info >= (3, 10):  # where X | Y evaluates at run time
        hints = typing.get_type_hints(tf1_accum.run_accumulation)
        assert (
            hints["feed_dicts"]
            == typing.Union[typing.Mapping, typing.Iterable[typing.Optional[typing.Mapping]]]
        )
