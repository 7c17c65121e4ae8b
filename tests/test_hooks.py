"""AccumulationOptimizer.make_session_run_hook under MonitoredTrainingSession."""

import logging
import warnings

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.platform import tf_logging

import tf1_accum
from _helpers import RTOL
from _helpers import Model
from _helpers import assert_same_values
from _helpers import concat
from _helpers import make_batches

v1 = tf.compat.v1

N = 3  # micro-batches per update
LAST_STEP = 4  # updates in a whole run
BATCHES = make_batches(tf.float64, False, N * LAST_STEP, 4)


class _Runs(v1.train.SessionRunHook):
    """Counts the session's runs."""

    count = 0

    def after_run(self, run_context, run_values):
        self.count += 1


def _train(directory, start, stop, hook=None, placement="hooks", runs=None):
    """A training loop as programs write it; returns the next micro-batch to feed.

    Feeds micro-batches ``start``, ``start + 1``, ... until StopAtStepHook
    stops the session or micro-batch ``stop`` is reached, then closes the
    session without an error (the input ran out). ``hook`` is None (no
    accumulation hook) or the arguments of make_session_run_hook;
    ``placement`` is the MonitoredTrainingSession argument it goes in;
    ``runs`` a `_Runs` to count the runs with.
    """
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        step = v1.train.get_or_create_global_step()
        opt = tf1_accum.AccumulationOptimizer(v1.train.AdamOptimizer(0.05), N)
        train_op = opt.minimize(model.loss, global_step=step)
        hooks = [
            v1.train.StopAtStepHook(last_step=LAST_STEP),
            v1.train.StepCounterHook(every_n_steps=1, output_dir=directory),
        ] + ([runs] if runs else [])
        chief_only_hooks = []
        if hook is not None:
            (hooks if placement == "hooks" else chief_only_hooks).append(
                opt.make_session_run_hook(**hook)
            )
        used = start
        with v1.train.MonitoredTrainingSession(
            checkpoint_dir=directory,
            save_checkpoint_steps=2,
            hooks=hooks,
            chief_only_hooks=chief_only_hooks,
            log_step_count_steps=None,
        ) as sess:
            while not sess.should_stop() and used < stop:
                sess.run(train_op, model.feed(BATCHES[used]))
                used += 1
    return used


def _final_checkpoint(directory):
    """{variable name: value} of the latest checkpoint in ``directory``."""
    path = tf.train.latest_checkpoint(directory)
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(path)}


@pytest.mark.parametrize("placement", ["hooks", "chief_only_hooks"])
def test_a_run_resumed_after_a_mid_window_exit_ends_bit_identical(tmp_path, placement):
    whole = str(tmp_path / "whole")
    assert _train(whole, 0, len(BATCHES), {}, placement) == N * LAST_STEP
    uninterrupted = _final_checkpoint(whole)
    assert uninterrupted["global_step"] == LAST_STEP

    parts = str(tmp_path / "parts")
    stopped = 2 * N + 1  # two updates and one micro-batch of the third window
    assert _train(parts, 0, stopped, {}, placement) == stopped
    saved = _final_checkpoint(parts)
    assert saved["global_step"] == 2 and saved["Accumulation/counter"] == 1
    assert np.any(saved["w1/accumulator"] != 0)
    assert _train(parts, stopped, len(BATCHES), {}, placement) == N * LAST_STEP
    resumed = _final_checkpoint(parts)

    assert set(resumed) == set(uninterrupted)
    for name, value in uninterrupted.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)


def test_without_the_hook_the_final_checkpoint_misses_the_partial_window(tmp_path):
    # What the hook is for: CheckpointSaverHook.end() does not save, because
    # global_step did not move since its save at step 2.
    directory = str(tmp_path / "plain_hooks")
    with pytest.warns(UserWarning, match="CheckpointSaverHook writes no final checkpoint"):
        _train(directory, 0, 2 * N + 1)
    saved = _final_checkpoint(directory)
    # An empty window: the micro-batch after the second update is not in it.
    assert saved["global_step"] == 2 and saved["Accumulation/counter"] == 0


def _session_warnings(directory, stop, hook=None, placement="hooks"):
    """``(message, runs before it)`` of each tf1_accum warning of `_train` from 0 to ``stop``."""
    runs, seen = _Runs(), []

    def show(message, *args, **kwargs):
        if str(message).startswith("tf1_accum"):
            seen.append((str(message), runs.count))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        _train(directory, 0, stop, hook, placement, runs)
    return seen


def _session_end_warnings(directory, stop, hook=None, placement="hooks"):
    """The tf1_accum warnings of `_train` from micro-batch 0 to ``stop``, after its first run."""
    return [
        message for message, runs in _session_warnings(directory, stop, hook, placement) if runs
    ]


def test_without_the_hook_a_session_ending_after_a_save_at_its_last_update_warns(tmp_path):
    # Saves at steps 0 and 2 (after the sixth micro-batch); the seventh is lost.
    directory = str(tmp_path / "lost")
    assert _session_end_warnings(directory, 2 * N + 1) == [
        "tf1_accum: the session ends with 1 micro-batches accumulated since the last "
        "update, and CheckpointSaverHook writes no final checkpoint (global_step 2, as at "
        "its last save): a resumed run starts this window over without them. "
        "Add opt.make_session_run_hook() to the session's hooks (an Estimator's: "
        "EstimatorSpec's training_hooks): it saves a partial window at the end, or applies "
        "it (flush_at_end=True)."
    ]
    saved = _final_checkpoint(directory)
    assert saved["global_step"] == 2 and saved["Accumulation/counter"] == 0


def test_without_the_hook_a_window_saved_by_luck_warns_that_it_may_be_lost(tmp_path):
    # The last save was at step 0, the session ends at step 1: the end save
    # holds the window this time.
    directory = str(tmp_path / "lucky")
    (message,) = _session_end_warnings(directory, N + 2)
    assert message.startswith(
        "tf1_accum: the session ends in the middle of an accumulation window without "
        "the accumulation hook. Its final checkpoint holds the window this time"
    )
    assert "opt.make_session_run_hook()" in message
    saved = _final_checkpoint(directory)
    assert saved["global_step"] == 1 and saved["Accumulation/counter"] == 2


def test_without_the_hook_a_session_is_warned_before_its_first_run(tmp_path):
    # It ends on an update: only the warning at its start.
    assert _session_warnings(str(tmp_path / "boundary"), 2 * N) == [
        (
            "tf1_accum: this session runs an AccumulationOptimizer's train op (window counter "
            "Accumulation/counter:0) without the accumulation hook: if it ends mid-window, "
            "that window's micro-batches may be in no checkpoint. Add "
            "opt.make_session_run_hook() to the session's hooks (an Estimator's: "
            "EstimatorSpec's training_hooks): it saves a partial window at the end, or "
            "applies it (flush_at_end=True).",
            0,
        )
    ]


def test_a_session_ending_on_an_update_warns_of_nothing_at_its_end_without_the_hook(tmp_path):
    assert _session_end_warnings(str(tmp_path / "boundary"), 2 * N) == []
    assert _session_end_warnings(str(tmp_path / "stopped"), len(BATCHES)) == []


@pytest.mark.parametrize("stop", [N + 2, 2 * N + 1], ids=["end_save", "no_end_save"])
@pytest.mark.parametrize("placement", ["hooks", "chief_only_hooks"])
@pytest.mark.parametrize("flush_at_end", [False, True], ids=["kept", "flushed"])
def test_the_hook_silences_the_warning_at_the_end(tmp_path, stop, placement, flush_at_end):
    directory = str(tmp_path / "hooked")
    hook = {"flush_at_end": flush_at_end}
    assert _session_warnings(directory, stop, hook, placement) == []
    saved = _final_checkpoint(directory)
    assert saved["Accumulation/counter"] == (0 if flush_at_end else stop % N)


def _plain_training(windows):
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        step = v1.train.get_or_create_global_step()
        train_op = v1.train.AdamOptimizer(0.05).minimize(model.loss, global_step=step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for window in windows:
                sess.run(train_op, model.feed(concat(window)))
            return dict(
                zip([v.op.name for v in v1.global_variables()], sess.run(v1.global_variables()))
            )


@pytest.mark.parametrize("placement", ["hooks", "chief_only_hooks"])
def test_flush_at_end_applies_the_partial_window_into_the_final_checkpoint(tmp_path, placement):
    directory = str(tmp_path / "flushed")
    stopped = 2 * N + 2
    _train(directory, 0, stopped, {"flush_at_end": True}, placement)
    saved = _final_checkpoint(directory)
    # Windows as cut: 3, 3, and the last 2 applied with their true count.
    expected = _plain_training([BATCHES[:N], BATCHES[N : 2 * N], BATCHES[2 * N : stopped]])
    assert saved["global_step"] == 3 and saved["Accumulation/counter"] == 0
    assert_same_values(saved, expected, RTOL[tf.float64], "flushed at the end")


def test_a_session_closed_on_a_window_boundary_is_left_as_it_is(tmp_path):
    directory = str(tmp_path / "boundary")
    _train(directory, 0, 2 * N, {"flush_at_end": True})
    saved = _final_checkpoint(directory)
    assert saved["global_step"] == 2
    expected = _plain_training([BATCHES[:N], BATCHES[N : 2 * N]])
    assert_same_values(saved, expected, RTOL[tf.float64], "closed on a boundary")


def test_hook_needs_the_train_op_and_a_bool():
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        opt = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), N)
        with pytest.raises(TypeError, match="flush_at_end must be True or False, got 'yes'"):
            opt.make_session_run_hook(flush_at_end="yes")
        hook = opt.make_session_run_hook()
        with pytest.raises(ValueError, match="has no train op in the graph of the session"):
            hook.begin()
        opt.minimize(model.loss)
        hook.begin()  # the train op exists now
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="has no train op in the graph"):
            hook.begin()  # a train op of another graph does not count


def test_monitored_session_example(capsys):
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "real_programs"
    spec = importlib.util.spec_from_file_location("real_programs_ms", path / "monitored_session.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result = example.main(["--steps", "3", "--updates", "4"])
    assert result["exact"] and result["pending"] == 1 and result["global_step"] == 4
    assert result["max_rel_diff"] <= 1e-10
    assert "resumed run equals the uninterrupted run exactly: True" in capsys.readouterr().out


@pytest.mark.parametrize("flush_at_end", [False, True], ids=["kept", "flushed"])
def test_a_session_without_checkpoints_warns_of_a_kept_window_only(flush_at_end):
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        step = v1.train.get_or_create_global_step()
        opt = tf1_accum.AccumulationOptimizer(v1.train.AdamOptimizer(0.05), N)
        train_op = opt.minimize(model.loss, global_step=step)
        hook = opt.make_session_run_hook(flush_at_end=flush_at_end)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
                for batch in BATCHES[: N + 2]:
                    sess.run(train_op, model.feed(batch))
    ours = [str(w.message) for w in caught if "tf1_accum" in str(w.message)]
    if flush_at_end:
        assert ours == []  # the window was applied: nothing is lost
    else:
        assert ours == [
            "tf1_accum: 2 micro-batches since the last update are in no checkpoint: no saver "
            "in tf.compat.v1.GraphKeys.SAVERS wrote one in this session, or there is no "
            "global step."
        ]


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _unmoved_step_warnings(directory, with_hook, fail=False):
    """The StepCounterHook warnings of one MonitoredTrainingSession run over BATCHES.

    MonitoredTrainingSession's StepCounterHook warns (5 times per process,
    counted per call site: the count is reset here) when global_step does not
    move in a run, which it does not in N - 1 of every N. ``fail`` ends the
    session with an error after the first micro-batch.
    """
    tf_logging._log_counter_per_token.clear()
    records = _Records()
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel(logging.WARNING)  # the tests log errors only
    logger.addHandler(records)
    try:
        with tf.Graph().as_default():
            model = Model(tf.float64, False)
            step = v1.train.get_or_create_global_step()
            opt = tf1_accum.AccumulationOptimizer(v1.train.AdamOptimizer(0.05), N)
            train_op = opt.minimize(model.loss, global_step=step)
            hooks = [opt.make_session_run_hook()] if with_hook else []
            with v1.train.MonitoredTrainingSession(
                checkpoint_dir=directory, hooks=hooks, log_step_count_steps=1
            ) as sess:
                for batch in BATCHES:
                    sess.run(train_op, model.feed(batch))
                    if fail:
                        raise RuntimeError("the input pipeline failed")
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    return [m for m in records.messages if m.startswith("It seems that global step")]


@pytest.mark.parametrize("with_hook", [False, True], ids=["without", "with"])
def test_the_hook_silences_the_step_counters_unmoved_step_warning(tmp_path, with_hook):
    assert len(_unmoved_step_warnings(str(tmp_path), with_hook)) == (0 if with_hook else 5)


def test_after_a_session_that_failed_the_warning_is_back_without_the_hook(tmp_path):
    # A session ending in an error calls no hook's end(): the filter stays on
    # the logger, but acts no more.
    with pytest.raises(RuntimeError, match="the input pipeline failed"):
        _unmoved_step_warnings(str(tmp_path / "failed"), True, fail=True)
    assert len(_unmoved_step_warnings(str(tmp_path / "plain"), False)) == 5


def test_a_hook_whose_begin_was_skipped_says_so():
    with tf.Graph().as_default():
        model = Model(tf.float32, sparse=False)
        opt = tf1_accum.AccumulationOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), 2)
        opt.minimize(model.loss)
        hook = opt.make_session_run_hook()
        with tf.compat.v1.Session() as sess:
            expected = r"after_create_session\(\) ran before begin\(\)"
            with pytest.raises(RuntimeError, match=expected):
                hook.after_create_session(sess, None)
