"""tf.estimator with AccumulationOptimizer and its session hook (TensorFlow 1.15 and 2.15).

tf.estimator is gone from TensorFlow 2.16 on; CI runs this module in
TensorFlow 2.15 and 1.15 environments of their own (see .ci/run).
"""

import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import RTOL
from _helpers import Model
from _helpers import assert_same_values
from _helpers import concat
from _helpers import make_batches

pytest.importorskip(
    "tensorflow_estimator",
    reason="tf.estimator exists only up to TensorFlow 2.15 (package tensorflow-estimator)",
)
estimator = tf.compat.v1.estimator
v1 = tf.compat.v1

N, B = 3, 4  # micro-batches per update, examples per micro-batch
X, Y = concat(make_batches(tf.float64, False, 4 * N, B))  # 4 windows of data


def model_fn(features, labels, mode, params):
    model = Model(tf.float64, False, inputs=features, labels=labels)
    step = v1.train.get_or_create_global_step()
    hooks = []
    scaffold = None
    if params["accumulate"]:
        opt = tf1_accum.AccumulationOptimizer(v1.train.AdamOptimizer(0.05), N)
        train_op = opt.minimize(model.loss, global_step=step)
        if params["hook"]:
            hooks.append(opt.make_session_run_hook(flush_at_end=params["flush_at_end"]))
        if params["scaffold"]:
            scaffold = opt.make_scaffold()
    else:
        train_op = v1.train.AdamOptimizer(0.05).minimize(model.loss, global_step=step)
    return estimator.EstimatorSpec(
        mode, loss=model.loss, train_op=train_op, training_hooks=hooks, scaffold=scaffold
    )


def _estimator(directory, accumulate, flush_at_end=False, scaffold=False, hook=True):
    config = estimator.RunConfig(
        model_dir=str(directory), save_checkpoints_steps=2, save_checkpoints_secs=None
    )
    params = {
        "accumulate": accumulate,
        "flush_at_end": flush_at_end,
        "scaffold": scaffold,
        "hook": hook,
    }
    return estimator.Estimator(model_fn, config=config, params=params)


def _input_fn(first, last, batch_size, repeat=False):
    """Examples of micro-batches [first, last) in batches of batch_size."""

    def input_fn():
        rows = slice(first * B, last * B)
        data = tf.data.Dataset.from_tensor_slices((X[rows], Y[rows]))
        return (data.repeat() if repeat else data).batch(batch_size)

    return input_fn


def _values(est):
    """The variables of the estimator's latest checkpoint, by name."""
    return {name: est.get_variable_value(name) for name in est.get_variable_names()}


def _trained(est):
    """The variables plain training also has."""
    return {
        name: value
        for name, value in _values(est).items()
        if "accumulator" not in name and "Accumulation/" not in name
    }


def test_input_ending_mid_window_resumes_in_the_next_train_call(tmp_path):
    whole = _estimator(tmp_path / "whole", accumulate=True)
    whole.train(_input_fn(0, 4 * N, B))
    uninterrupted = _values(whole)

    parts = _estimator(tmp_path / "parts", accumulate=True)
    parts.train(_input_fn(0, 2 * N + 1, B))  # the input ends one micro-batch into a window
    saved = _values(parts)
    assert saved["global_step"] == 2 and saved["Accumulation/counter"] == 1
    parts.train(_input_fn(2 * N + 1, 4 * N, B))
    resumed = _values(parts)
    assert set(resumed) == set(uninterrupted)
    for name, value in uninterrupted.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)

    plain = _estimator(tmp_path / "plain", accumulate=False)
    plain.train(_input_fn(0, 4 * N, N * B))
    assert_same_values(_trained(parts), _values(plain), RTOL[tf.float64], "resumed Estimator")
    assert resumed["global_step"] == 4


def test_max_steps_counts_updates(tmp_path):
    accumulated = _estimator(tmp_path / "accumulated", accumulate=True)
    accumulated.train(_input_fn(0, 4 * N, B, repeat=True), max_steps=3)
    plain = _estimator(tmp_path / "plain", accumulate=False)
    plain.train(_input_fn(0, 4 * N, N * B, repeat=True), max_steps=3)
    got = _values(accumulated)
    assert got["global_step"] == 3 and got["Accumulation/counter"] == 0
    assert_same_values(_trained(accumulated), _values(plain), RTOL[tf.float64], "max_steps=3")


def test_flush_at_end_applies_the_last_short_window(tmp_path):
    accumulated = _estimator(tmp_path / "accumulated", accumulate=True, flush_at_end=True)
    accumulated.train(_input_fn(0, 2 * N + 2, B))
    # Plain batches of N x B over the same examples: 12, 12 and a last one of 8.
    plain = _estimator(tmp_path / "plain", accumulate=False)
    plain.train(_input_fn(0, 2 * N + 2, N * B))
    got = _values(accumulated)
    assert got["global_step"] == 3 and got["Accumulation/counter"] == 0
    assert_same_values(_trained(accumulated), _values(plain), RTOL[tf.float64], "flushed")


def test_estimator_example(capsys):
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "real_programs"
    spec = importlib.util.spec_from_file_location("real_programs_est", path / "estimator.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    # 2 full windows of 4 micro-batches, then 2 more: 3 updates, the last one flushed.
    result = example.main(["--windows", "2"])
    assert result["global_step"] == 3
    assert result["max_rel_diff"] <= 1e-10
    assert "accumulated vs large batch" in capsys.readouterr().out


def test_a_plain_model_dir_is_continued_with_the_scaffold(tmp_path):
    # The program trained without accumulation, then migrated in the same model_dir.
    plain = _estimator(tmp_path / "plain", accumulate=False)
    plain.train(_input_fn(0, 4 * N, N * B))
    migrated_dir = tmp_path / "migrated"
    _estimator(migrated_dir, accumulate=False).train(_input_fn(0, 2 * N, N * B))
    migrated = _estimator(migrated_dir, accumulate=True, scaffold=True)
    migrated.train(_input_fn(2 * N, 4 * N, B))
    got = _values(migrated)
    assert got["global_step"] == 4 and got["Accumulation/counter"] == 0
    assert_same_values(_trained(migrated), _values(plain), RTOL[tf.float64], "continued")
    # Resumed from its own checkpoint next time, the state included.
    migrated.train(_input_fn(0, N + 1, B))
    assert _values(migrated)["Accumulation/counter"] == 1


def test_a_plain_model_dir_without_the_scaffold_fails_to_restore(tmp_path):
    _estimator(tmp_path, accumulate=False).train(_input_fn(0, 2 * N, N * B))
    with pytest.raises(tf.errors.NotFoundError, match="Accumulation/counter not found"):
        _estimator(tmp_path, accumulate=True).train(_input_fn(2 * N, 4 * N, B))


class _Runs(v1.train.SessionRunHook):
    """Counts the session's runs."""

    count = 0

    def after_run(self, run_context, run_values):
        self.count += 1


def _warnings(est, input_fn):
    """``(message, runs before it)`` of each tf1_accum warning of ``est.train(input_fn)``."""
    runs, seen = _Runs(), []

    def show(message, *args, **kwargs):
        if str(message).startswith("tf1_accum"):
            seen.append((str(message), runs.count))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        est.train(input_fn, hooks=[runs])
    return seen


def _end_warnings(est, input_fn):
    """The tf1_accum warnings of ``est.train(input_fn)`` after its first run."""
    return [message for message, runs in _warnings(est, input_fn) if runs]


def test_without_the_hook_training_is_warned_before_its_first_run(tmp_path):
    est = _estimator(tmp_path / "unhooked", accumulate=True, hook=False)
    # The input ends on an update: only the warning at the start.
    [(message, runs)] = _warnings(est, _input_fn(0, 2 * N, B))
    assert runs == 0
    assert message.startswith(
        "tf1_accum: this session runs an AccumulationOptimizer's train op (window counter "
        "Accumulation/counter:0) without the accumulation hook"
    )
    assert "EstimatorSpec's training_hooks" in message
    assert _values(est)["global_step"] == 2


def test_without_the_hook_an_input_ending_after_a_save_at_the_last_update_warns(tmp_path):
    # Checkpoints at steps 0 and 2; the input ends one micro-batch later.
    est = _estimator(tmp_path / "lost", accumulate=True, hook=False)
    (message,) = _end_warnings(est, _input_fn(0, 2 * N + 1, B))
    assert message.startswith(
        "tf1_accum: the session ends with 1 micro-batches accumulated since the last "
        "update, and CheckpointSaverHook writes no final checkpoint (global_step 2, as at "
        "its last save)"
    )
    assert "EstimatorSpec's training_hooks" in message
    saved = _values(est)
    assert saved["global_step"] == 2 and saved["Accumulation/counter"] == 0
    # The resumed window starts over: the next N micro-batches make one update,
    # and a session that ends on it has nothing to warn of.
    assert _end_warnings(est, _input_fn(2 * N + 1, 3 * N + 1, B)) == []
    assert _values(est)["global_step"] == 3


def test_without_the_hook_a_window_saved_by_luck_still_warns(tmp_path):
    est = _estimator(tmp_path / "lucky", accumulate=True, hook=False)
    (message,) = _end_warnings(est, _input_fn(0, N + 2, B))
    assert "Its final checkpoint holds the window this time" in message
    saved = _values(est)
    assert saved["global_step"] == 1 and saved["Accumulation/counter"] == 2


@pytest.mark.parametrize("flush_at_end", [False, True], ids=["kept", "flushed"])
def test_with_the_hook_an_input_ending_mid_window_warns_of_nothing(tmp_path, flush_at_end):
    est = _estimator(tmp_path / "hooked", accumulate=True, flush_at_end=flush_at_end)
    assert _warnings(est, _input_fn(0, 2 * N + 1, B)) == []
    saved = _values(est)
    assert saved["Accumulation/counter"] == (0 if flush_at_end else 1)
    assert saved["global_step"] == (3 if flush_at_end else 2)
