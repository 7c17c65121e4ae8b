"""The migration examples: what each forum-style "before" gets wrong, in numbers,
and that each tf1_accum "after" equals plain large-batch training.

The scripts under examples/migration are loaded as modules and run in this
process, in its graph mode. Updates are compared through the gradients they
apply: with SGD, update k is learning_rate * (the gradient applied), where the
gradient is computed by `common.gradient` at the parameters before update k.
"""

import importlib.util
import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

from _helpers import RTOL
from _helpers import assert_same_values
from _helpers import relative_error

MIGRATION = pathlib.Path(__file__).resolve().parent.parent / "examples" / "migration"
TOLERANCE = RTOL[tf.float32]
# A "before" is wrong when it misses large-batch training by far more than
# the tolerance the "after" meets.
WRONG = 1e-2


def _load(name):
    if str(MIGRATION) not in sys.path:
        sys.path.insert(0, str(MIGRATION))  # the scripts import common
    spec = importlib.util.spec_from_file_location(f"migration_{name}", MIGRATION / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


common = _load("common")
sgd = lambda: tf.compat.v1.train.GradientDescentOptimizer(common.LEARNING_RATE)  # noqa: E731
adam = lambda: tf.compat.v1.train.AdamOptimizer(common.LEARNING_RATE)  # noqa: E731


def _scaled(values, factor):
    return {name: value * factor for name, value in values.items()}


def _combined(*terms):
    """sum(weight * gradient dict) over (weight, gradient dict) terms."""
    return {name: sum(w * g[name] for w, g in terms) for name in terms[0][1]}


def _applied(params, k):
    """The gradient SGD applied in update k (1-based): (before - after) / lr."""
    return {
        name: (params[k - 1][name] - params[k][name]) / common.LEARNING_RATE for name in params[k]
    }


def _largest_error(actual, expected):
    return max(relative_error(actual[name], expected[name]) for name in expected)


def _assert_matches_large_batch(params, make_optimizer, windows, where):
    expected = common.large_batch_training(make_optimizer, windows)
    for k in range(len(expected)):
        assert_same_values(params[k], expected[k], TOLERANCE, f"{where}, after update {k}")


def test_a_before_steps_n_times_too_far_or_fails_on_resource_variables():
    before = _load("a_sum_not_mean_before")
    if tf.compat.v1.resource_variables_enabled() and not tf.__version__.startswith("1."):
        # Variable.initialized_value() does not exist for TensorFlow 2's resource
        # variables (TensorFlow 1.15's have it: the recipe sums there too).
        with pytest.raises(NotImplementedError):
            before.main()
        return
    params = before.main()["params"]
    windows = common.make_windows()
    for k, window in enumerate(windows, 1):
        mean = common.gradient(params[k - 1], common.join(window))
        # The sum of N micro-batch means is N times the large batch's mean.
        assert_same_values(
            _applied(params, k), _scaled(mean, common.STEPS), TOLERANCE, f"update {k}"
        )
        assert _largest_error(_applied(params, k), mean) > WRONG, f"update {k}"
    plain = common.large_batch_training(sgd, windows[:1])
    ratio = np.linalg.norm(params[0]["w2"] - params[1]["w2"]) / np.linalg.norm(
        plain[0]["w2"] - plain[1]["w2"]
    )
    assert abs(ratio - common.STEPS) < 1e-4 * common.STEPS


def test_a_after_matches_large_batch():
    params = _load("a_sum_not_mean_after").main()["params"]
    _assert_matches_large_batch(params, sgd, common.make_windows(), "(a) after")


def test_b_before_weighs_micro_batches_equally_and_an_extra_apply_makes_nan():
    before = _load("b_counter_mean_before")
    result = before.main()
    params = result["params"]
    windows = common.make_windows(before.SIZES)
    for k, window in enumerate(windows, 1):
        per_batch = [common.gradient(params[k - 1], batch) for batch in window]
        equal_weights = _combined(*[(1.0 / len(window), g) for g in per_batch])
        assert_same_values(_applied(params, k), equal_weights, TOLERANCE, f"update {k}")
        all_examples = common.gradient(params[k - 1], common.join(window))
        assert _largest_error(_applied(params, k), all_examples) > WRONG, f"update {k}"
    # Nothing left to apply: 0 / 0 in every accumulator.
    for name, value in result["after_extra_apply"].items():
        assert np.isnan(value).all(), name


def test_b_after_matches_large_batch_and_refuses_an_empty_apply():
    after = _load("b_counter_mean_after")
    result = after.main()
    windows = common.make_windows(after.SIZES)
    _assert_matches_large_batch(result["params"], sgd, windows, "(b) after")
    assert result["extra_apply_refused"]
    assert_same_values(result["after_extra_apply"], result["params"][-1], 0.0, "empty apply")


def test_c_before_counts_the_last_micro_batch_twice():
    params = _load("c_last_batch_twice_before").main()["params"]
    windows = common.make_windows()
    n = common.STEPS
    for k, window in enumerate(windows, 1):
        mean = common.gradient(params[k - 1], common.join(window))
        last = common.gradient(params[k - 1], window[-1])
        # (g_1 + ... + g_N + g_N) / N
        twice = _combined((1.0, mean), (1.0 / n, last))
        assert_same_values(_applied(params, k), twice, TOLERANCE, f"update {k}")
        assert _largest_error(_applied(params, k), mean) > WRONG, f"update {k}"


def test_c_after_matches_large_batch():
    params = _load("c_last_batch_twice_after").main()["params"]
    _assert_matches_large_batch(params, sgd, common.make_windows(), "(c) after")


def test_d_before_is_right_but_copies_every_gradient_through_python():
    result = _load("d_numpy_round_trip_before").main()
    windows = common.make_windows()
    # The values are right: the cost is the copies, N fetches and one feed.
    _assert_matches_large_batch(result["params"], adam, windows, "(d) before")
    parameters = sum(value.size for value in common.initial_params().values())
    assert result["values_copied"] == [(common.STEPS + 1) * parameters] * len(windows)


def test_d_after_matches_large_batch():
    result = _load("d_numpy_round_trip_after").main()
    windows = common.make_windows()
    _assert_matches_large_batch(result["params"], adam, windows, "(d) after")
    assert [len(losses) for losses in result["losses"]] == [common.STEPS] * len(windows)


def test_e_before_averages_over_all_of_training_and_counts_micro_batches():
    result = _load("e_running_average_before").main()
    params = result["params"]
    windows = common.make_windows()
    own = []  # each window's own mean gradient, at the weights it was computed at
    for k, window in enumerate(windows, 1):
        own.append(common.gradient(params[k - 1], common.join(window)))
        since_start = _combined(*[(1.0 / k, g) for g in own])
        assert_same_values(_applied(params, k), since_start, TOLERANCE, f"update {k}")
        if k == 1:
            assert_same_values(_applied(params, k), own[-1], TOLERANCE, "update 1")
        else:
            assert _largest_error(_applied(params, k), own[-1]) > WRONG, f"update {k}"
    assert result["global_step"] == common.STEPS * len(windows)


def test_e_after_matches_large_batch_and_counts_updates():
    result = _load("e_running_average_after").main()
    windows = common.make_windows()
    _assert_matches_large_batch(result["params"], sgd, windows, "(e) after")
    assert result["global_step"] == len(windows)


def _plain_adam_variable_names():
    with tf.Graph().as_default():
        _, _, loss = common.build_model()
        opt = adam()
        opt.minimize(loss)
        return sorted(v.op.name for v in opt.variables())


def test_f_before_drops_the_applying_micro_batch():
    result = _load("f_cond_apply_before").main()
    params = result["params"]
    windows = common.make_windows()
    # Adam is (nearly) blind to the 1/N scale: what is left is training on
    # the first N - 1 micro-batches of each window.
    dropped = common.large_batch_training(adam, [window[:-1] for window in windows])
    full = common.large_batch_training(adam, windows)
    for k in range(1, len(windows) + 1):
        assert_same_values(params[k], dropped[k], TOLERANCE, f"after update {k}")
        assert _largest_error(params[k], full[k]) > WRONG, f"after update {k}"
    names = result["optimizer_variables"]
    if tf.compat.v1.control_flow_v2_enabled():
        assert names == _plain_adam_variable_names()
    else:
        # TensorFlow 1 control flow names the beta powers after the cond.
        assert "cond/beta1_power" in names and "cond/beta2_power" in names
        assert names != _plain_adam_variable_names()


def test_f_after_matches_large_batch_with_plain_variable_names():
    result = _load("f_cond_apply_after").main()
    _assert_matches_large_batch(result["params"], adam, common.make_windows(), "(f) after")
    assert result["optimizer_variables"] == _plain_adam_variable_names()
