"""AccumulationOptimizer.make_scaffold: a MonitoredTrainingSession program migrated in
a directory that plain training wrote starts from its checkpoint."""

import numpy as np
import pytest
import tensorflow as tf

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
WINDOWS = [concat(BATCHES[i : i + N]) for i in range(0, len(BATCHES), N)]


def _plain(directory, updates):
    """Plain large-batch training under MonitoredTrainingSession, one window per run."""
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        step = v1.train.get_or_create_global_step()
        train_op = v1.train.AdamOptimizer(0.05).minimize(model.loss, global_step=step)
        with v1.train.MonitoredTrainingSession(
            checkpoint_dir=directory,
            save_checkpoint_steps=1,
            hooks=[v1.train.StopAtStepHook(last_step=updates)],
            log_step_count_steps=None,
        ) as sess:
            for window in WINDOWS:
                if sess.should_stop():
                    break
                sess.run(train_op, model.feed(window))


def _accumulating(directory, start, stop, scaffold=True):
    """The migrated loop: micro-batches ``start``... until LAST_STEP updates or ``stop``."""
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        step = v1.train.get_or_create_global_step()
        opt = tf1_accum.AccumulationOptimizer(v1.train.AdamOptimizer(0.05), N)
        train_op = opt.minimize(model.loss, global_step=step)
        used = start
        with v1.train.MonitoredTrainingSession(
            checkpoint_dir=directory,
            save_checkpoint_steps=2,
            scaffold=opt.make_scaffold() if scaffold else None,
            hooks=[v1.train.StopAtStepHook(last_step=LAST_STEP), opt.make_session_run_hook()],
            log_step_count_steps=None,
        ) as sess:
            while not sess.should_stop() and used < stop:
                sess.run(train_op, model.feed(BATCHES[used]))
                used += 1
    return used


def _checkpoint(directory):
    path = tf.train.latest_checkpoint(directory)
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(path)}


def test_a_plain_checkpoint_is_continued_as_uninterrupted_large_batch_training(tmp_path):
    whole = str(tmp_path / "whole")
    _plain(whole, LAST_STEP)
    expected = _checkpoint(whole)
    assert expected["global_step"] == LAST_STEP

    directory = str(tmp_path / "migrated")
    _plain(directory, 2)
    assert _accumulating(directory, 2 * N, len(BATCHES)) == len(BATCHES)
    got = _checkpoint(directory)
    assert got["global_step"] == LAST_STEP and got["Accumulation/counter"] == 0
    assert set(expected) < set(got)
    assert_same_values(
        {k: got[k] for k in expected}, expected, RTOL[tf.float64], "continued from plain"
    )


def test_without_the_scaffold_a_plain_checkpoint_cannot_be_restored(tmp_path):
    directory = str(tmp_path / "migrated")
    _plain(directory, 2)
    with pytest.raises(tf.errors.NotFoundError, match="Accumulation/counter not found"):
        _accumulating(directory, 2 * N, len(BATCHES), scaffold=False)


def test_with_the_scaffold_a_mid_window_exit_still_resumes_bit_identical(tmp_path):
    whole = str(tmp_path / "whole")
    _accumulating(whole, 0, len(BATCHES))
    uninterrupted = _checkpoint(whole)
    parts = str(tmp_path / "parts")
    stopped = 2 * N + 1
    assert _accumulating(parts, 0, stopped) == stopped
    saved = _checkpoint(parts)
    assert saved["global_step"] == 2 and saved["Accumulation/counter"] == 1
    _accumulating(parts, stopped, len(BATCHES))
    resumed = _checkpoint(parts)
    assert set(resumed) == set(uninterrupted)
    for name, value in uninterrupted.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)


def test_a_checkpoint_of_another_accumulation_is_refused(tmp_path):
    directory = str(tmp_path / "other")
    _accumulating(directory, 0, 2 * N + 1)
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        step = v1.train.get_or_create_global_step()
        # Statistics add state that the checkpoint does not hold.
        opt = tf1_accum.AccumulationOptimizer(
            v1.train.AdamOptimizer(0.05), N, statistics=True, micro_batch_size=4
        )
        opt.minimize(model.loss, global_step=step)
        scaffold = opt.make_scaffold()
        with pytest.raises(ValueError, match="holds part of tf1_accum's state but not"):
            with v1.train.MonitoredTrainingSession(checkpoint_dir=directory, scaffold=scaffold):
                pass


def test_make_scaffold_arguments():
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        opt = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), N)
        with pytest.raises(ValueError, match="make_scaffold exists once the train op is built"):
            opt.make_scaffold()
        opt.minimize(model.loss)
        with pytest.raises(TypeError, match="not saver="):
            opt.make_scaffold(saver=v1.train.Saver())
        with pytest.raises(TypeError, match="max_to_keep must be an int, got '5'"):
            opt.make_scaffold(max_to_keep="5")
        scaffold = opt.make_scaffold(max_to_keep=2)
        assert v1.get_collection(v1.GraphKeys.SAVERS) == [scaffold.saver]
        with pytest.raises(ValueError, match="already has 1 saver"):
            opt.make_scaffold()
