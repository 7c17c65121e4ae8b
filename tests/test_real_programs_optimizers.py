"""The real-program examples on custom optimizers and per-update work.

Each script under examples/real_programs trains the accumulating program and
its plain large-batch original; these tests run them with small settings, in
the test's graph mode, and assert on the values they return.
"""

import argparse
import importlib.util
import pathlib

import numpy as np

PROGRAMS = pathlib.Path(__file__).resolve().parent.parent / "examples" / "real_programs"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"real_program_{name}", PROGRAMS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bert_style_optimizer_and_its_own_global_step_increment(capsys):
    program = _load("bert_style_optimizer")
    result = program.main(["--steps", "3", "--micro-batch", "4", "--updates", "5"])
    assert "largest relative difference" in capsys.readouterr().out
    assert result["max_rel_diff"] <= program.TOLERANCE
    # The hand-written increment ran once per update, not once per run.
    assert result["global_step"] == 5
    # The optimizer's moments exist once each, named as in plain training.
    assert sorted(result["accumulated"]) == sorted(result["plain"])
    moments = [name for name in result["accumulated"] if name.endswith("/adam_m")]
    assert len(moments) == 5
    # The schedule moved the weights: the comparison is not between starts.
    start = np.random.RandomState(0).randn(program.FEATURES, program.HIDDEN) / 3.0
    assert np.abs(result["plain"]["dense/kernel"] - start).max() > 1e-3


def test_bert_style_loop_with_the_increment_left_to_the_wrapper():
    program = _load("bert_style_optimizer")
    plain = program.train(False, 3, 4, 4)
    accumulated = program.train(True, 3, 4, 4, own_increment=False)
    assert accumulated["global_step"] == 4
    for name, expected in plain.items():
        scale = np.abs(expected).max() or 1.0
        assert np.abs(accumulated[name] - expected).max() <= program.TOLERANCE * scale, name


def test_ema_steps_once_per_update(capsys):
    program = _load("ema")
    result = program.main(["--steps", "3", "--micro-batch", "4", "--updates", "5"])
    assert "shadow vs EMA" in capsys.readouterr().out
    assert result["global_step"] == 5
    assert result["max_rel_diff"] <= program.TOLERANCE


def test_ema_left_stepping_every_run_is_a_different_average():
    """The cifar10 pattern unchanged steps its average once per micro-batch."""
    program = _load("ema")
    start, plain, _, _ = program.train(False, 3, 4, 4)
    expected = program.numpy_ema(start, plain)
    _, _, unchanged, step = program.train(True, 3, 4, 4, per_update=False)
    assert step == 4
    assert max(np.abs(unchanged[k] - expected[k]).max() for k in expected) > 1e-3


def test_summaries_are_written_once_per_update(tmp_path, capsys):
    program = _load("summaries")
    result = program.main(
        ["--logdir", str(tmp_path), "--steps", "3", "--micro-batch", "4", "--updates", "4"]
    )
    assert "summaries written at steps [1, 2, 3, 4]" in capsys.readouterr().out
    assert result["steps_ok"]
    assert sorted(result["written"]) == [1, 2, 3, 4]
    assert result["max_rel_diff"] <= program.TOLERANCE
    assert result["max_rel_diff_written"] <= program.SUMMARY_TOLERANCE
    assert min(result["expected"]) > 0.0


def test_thumt_token_mean_is_warned_without_weight_and_exact_with_it(capsys):
    program = _load("token_mean")
    for dtype, tolerance in program.TOLERANCE.items():
        result = program.main(["--dtype", dtype])
        assert result["weighted"] <= tolerance, dtype
        # Micro-batches of different token counts: the plain mean is off, and was warned of.
        assert result["unweighted"] > 1e-3, dtype
        [text] = result["warned"]
        assert text.startswith("tf1_accum: the loss divides by tokens:0 (Sum), the Sum of fed")
        assert "AccumulationOptimizer(optimizer, steps, weight=<the tensor tokens:0>)" in text
    assert "with weight=tf.reduce_sum(target_length): " in capsys.readouterr().out


def test_thumt_mean_over_all_positions_needs_no_weight(recwarn):
    """A mean over batch x length positions, a fixed count: silent, and exact without weight=."""
    program = _load("token_mean")
    args = argparse.Namespace(micro_batch=4, steps=4, updates=5)
    data = program.make_data(80, seed=1)
    expected = program.large_batch(data, args, "float64", token_mean=False)
    values = program.train(data, args, "float64", weighted=False, token_mean=False)
    assert program.difference(values, expected) <= program.TOLERANCE["float64"]
    assert not [w for w in recwarn if "TFA014" in str(w.message)]
    start = np.random.RandomState(0).randn(program.VOCABULARY, program.WIDTH)
    assert np.abs(values["embedding"] - start).max() > 1e-3
