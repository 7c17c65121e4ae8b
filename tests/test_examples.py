"""Smoke tests of the examples, with tiny settings, so they cannot rot."""

import ast
import importlib.util
import os
import pathlib
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum

ROOT = pathlib.Path(__file__).resolve().parent.parent
# As when an example runs as a script: its directory is on the path, for
# examples/_tensorflow_log.py.
if str(ROOT / "examples") not in sys.path:
    sys.path.insert(0, str(ROOT / "examples"))


def _load(name):
    spec = importlib.util.spec_from_file_location(
        f"example_{name}", ROOT / "examples" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quickstart(tmp_path, capsys):
    quickstart = _load("quickstart")
    plot, narrow = tmp_path / "curves.png", tmp_path / "curves_narrow.png"
    result = quickstart.main(
        [
            "--micro-batch",
            "4",
            "--steps",
            "3",
            "--updates",
            "5",
            "--examples",
            "64",
            "--plot",
            str(plot),
            "--narrow-plot",
            str(narrow),
        ]
    )
    out = capsys.readouterr().out
    assert "largest parameter difference, accumulated vs big batch" in out
    for mode in ("small batch", "accumulated", "big batch"):
        assert mode in out
        assert len(result["curves"][mode]) == 5
    assert result["max_param_diff"] < 1e-5
    np.testing.assert_allclose(
        result["curves"]["accumulated"], result["curves"]["big batch"], rtol=1e-5
    )
    # The three runs really trained: losses moved from where they started.
    assert result["curves"]["big batch"][0] != result["curves"]["big batch"][-1]
    pytest.importorskip("matplotlib")
    png = plot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    # 5.2 x 4 inches at 200 dpi, 10-point text, for a desktop's column; for a
    # phone's, 3.6 inches and 12-point text: shown 358 px wide, text at 16 px.
    assert struct.unpack(">II", png[16:24]) == (1040, 800)
    assert b"tEXtSmallest text\x0010 pt" in png
    png = narrow.read_bytes()
    assert struct.unpack(">II", png[16:24]) == (720, 880)
    assert b"tEXtSmallest text\x0012 pt" in png


# A line of TensorFlow's C++ log (absl's format, TensorFlow's own, or that of
# TensorFlow 1.15), e.g.
# "I0000 00:00:1795624486.98 27574 port.cc:153] oneDNN custom operations are on" or
# "2026-11-29 05:19:47.594264: I tensorflow/core/platform/cpu_feature_guard.cc:142] ...".
TENSORFLOW_LOG = re.compile(
    r"^([IWEF]\d{4} |WARNING: All log messages before absl|\d{4}-\d\d-\d\d [\d:.]+: [IWEF] )",
    re.M,
)
# A notice TensorFlow 1.15 prints when its own code calls a function it
# deprecated (the gradient of ``x ** 2`` calls its version 1 ``where``), e.g.
# "WARNING:tensorflow:From .../tensorflow_core/python/ops/math_grad.py:1375: where
# (from tensorflow.python.ops.array_ops) is deprecated ...": neither the example's
# nor tf1_accum's (a notice for a call of theirs names their file).
TENSORFLOW_OWN_DEPRECATION = re.compile(
    r"^WARNING:tensorflow:From \S*/tensorflow(_core)?/\S+: .* is deprecated .*\n"
    r"Instructions for updating:\n.*\n",
    re.M,
)


@pytest.mark.graph_mode_independent
def test_quickstart_prints_its_own_lines_first_and_tensorflow_log_on_request():
    command = [sys.executable, str(ROOT / "examples" / "quickstart.py")]
    command += ["--updates", "2", "--steps", "2", "--examples", "64", "--plot", ""]
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's tf1_accum
    quiet = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    assert quiet.stdout.startswith("Training a 10-32-1 MLP with Adam for 2 updates, three ways")
    # Nothing else: no C++ log, and no deprecation warning from tf1_accum's build.
    assert TENSORFLOW_OWN_DEPRECATION.sub("", quiet.stderr) == ""
    # The documented way back: with TF_CPP_MIN_LOG_LEVEL=0 set, importing
    # TensorFlow the examples' way shows its log (TensorFlow 1.15 logs nothing
    # at import: its first session logs the CPU it runs on).
    env["TF_CPP_MIN_LOG_LEVEL"] = "0"
    loud = subprocess.run(
        [
            sys.executable,
            "-c",
            "import _tensorflow_log, tensorflow as tf; tf.compat.v1.Session().close()",
        ],
        cwd=ROOT / "examples",
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert TENSORFLOW_LOG.search(loud.stderr), loud.stderr


# Starts its own worker processes: run in the v1 mode only.
@pytest.mark.graph_mode_independent
def test_distributed_launcher_trains_two_equal_workers(capsys):
    distributed = _load("distributed")
    result = distributed.main(["--local", "2", "--updates", "4", "--steps", "3"])
    assert "largest parameter difference between workers" in capsys.readouterr().out
    assert result["spread"] == 0.0
    for worker in result["results"]:
        assert worker["after"] < 0.5 * worker["before"]


# The gradient statistics the example writes to TensorBoard.
TAGS = (
    "global_norm",
    "micro_batch_square_norm",
    "micro_batch_size",
    "gradient_square",
    "noise_trace",
    "noise_scale",
    "noise_scale_ema",
    "gradient_norm/w1",
    "gradient_norm/b1",
    "gradient_norm/w2",
)


def test_gradient_noise_writes_events_and_recommends(tmp_path, capsys):
    example = _load("gradient_noise")
    logdir = tmp_path / "logs"
    plot = tmp_path / "noise.png"
    updates = 6
    result = example.main(
        [
            "--logdir",
            str(logdir),
            "--micro-batch",
            "8",
            "--steps",
            "4",
            "--updates",
            str(updates),
            "--examples",
            "256",
            "--plot",
            str(plot),
            "--narrow-plot",
            str(tmp_path / "noise_narrow.png"),
        ]
    )
    out = capsys.readouterr().out
    history, recommended = result["history"], result["recommended"]
    assert type(recommended) is int and recommended >= 1
    ema = history["noise_scale_ema"][-1]
    assert recommended == tf1_accum.recommend_micro_batches(ema, 8)
    assert f"recommended: {recommended} micro-batches of 8" in out

    events = list(logdir.glob("events.out.tfevents.*"))
    assert len(events) == 1
    written = {}
    for event in tf.compat.v1.train.summary_iterator(str(events[0])):
        for value in event.summary.value:
            written.setdefault(value.tag, {})[event.step] = value.simple_value
    assert set(written) == {f"accumulation/statistics/{tag}" for tag in TAGS}
    for tag in written.values():
        assert sorted(tag) == list(range(1, updates + 1))
    for name in ("noise_scale", "noise_scale_ema", "global_norm"):
        got = [written[f"accumulation/statistics/{name}"][k] for k in range(1, updates + 1)]
        np.testing.assert_allclose(got, history[name], rtol=1e-6)
    assert min(history["global_norm"]) > 0.0
    pytest.importorskip("matplotlib")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    png = (tmp_path / "noise_narrow.png").read_bytes()
    assert struct.unpack(">II", png[16:24]) == (540, 990)  # 3.6 inches at 150 dpi
    assert b"tEXtSmallest text\x0012 pt" in png


def test_feed_the_batch_finds_the_size_that_fits_and_matches_the_big_batch(capsys):
    example = _load("feed_the_batch")
    result = example.main(["--updates", "12", "--examples", "512"])
    out = capsys.readouterr().out
    fit = result["fit"]
    assert [(c.window, c.old, c.new, c.reason) for c in fit.changes] == [
        (0, None, 120, "first window"),
        (0, 120, 60, "out of memory"),
        (0, 60, 30, "out of memory"),
        (5, 30, 45, "probe"),
        (5, 45, 30, "out of memory"),
        (10, 30, 37, "probe"),
        (10, 37, 30, "out of memory"),
    ]
    assert fit.micro_batch_size == 30 and fit.windows == 12
    assert "    10 37 -> 30  out of memory" in out
    assert "micro-batch size in use: 30 rows\nafter 12 windows;" in out
    assert result["max_param_diff"] < 1e-5


def _imported(node):
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return [node.module] if isinstance(node, ast.ImportFrom) and node.module else []


@pytest.mark.parametrize(
    "path", sorted(p.name for p in (ROOT / "examples").glob("*.py") if p.name[0] != "_")
)
def test_example_imports_tensorflow_after_quieting_its_log(path):
    tree = ast.parse((ROOT / "examples" / path).read_text(encoding="utf-8"))
    imports = sorted(
        (node.lineno, name)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for name in _imported(node)
    )
    names = [name.split(".")[0] for _, name in imports]
    loud = [names.index(name) for name in ("tensorflow", "horovod", "tf1_accum") if name in names]
    assert loud, f"{path} imports no TensorFlow: drop it from this test"
    assert "_tensorflow_log" in names[: min(loud)], imports


def _run_example(name, *args):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's tf1_accum
    command = [sys.executable, str(ROOT / "examples" / f"{name}.py"), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.graph_mode_independent
def test_feed_the_batch_prints_no_tensorflow_log_and_names_its_made_up_limit():
    done = _run_example("feed_the_batch", "--updates", "2", "--examples", "256")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Training a 10-32-1 MLP with Adam: 2 updates of 120 rows")
    assert not TENSORFLOW_LOG.search(done.stderr), done.stderr
    # What stderr holds is the memory fit's own log, which names the example's limit.
    assert "PiB" not in done.stderr
    assert (
        "a micro-batch of 120 rows ran out of memory "
        "(MemoryError: 120 rows, over this example's made-up limit of 35)" in done.stderr
    )


@pytest.mark.graph_mode_independent
def test_resumable_training_prints_its_usage_before_importing_tensorflow():
    script = (
        "import runpy, sys\n"
        f"sys.argv = [{str(ROOT / 'examples' / 'resumable_training.py')!r}]\n"
        "try:\n"
        "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "except SystemExit as exit:\n"
        "    print('exit', exit.code, 'tensorflow' in sys.modules)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.stdout == "exit 2 False\n", done.stderr
    assert "error: the following arguments are required: --checkpoint-dir" in done.stderr


def test_gan_trains_as_the_large_batch_gan_and_the_unchanged_loop_stops(capsys):
    gan = _load("real_programs/gan")
    result = gan.main(["--steps", "3", "--micro-batch", "4", "--batches", "3"])
    out = capsys.readouterr().out
    assert "largest relative difference from the large-batch GAN" in out
    assert result["max_rel_diff"] <= gan.TOLERANCE
    assert result["unchanged_loop_error"].startswith(
        "tf1_accum: the train op Accumulation_1 (training generator/b, generator/w) ran while "
        "the window of Accumulation"
    )
