"""Smoke test of examples/gradient_noise.py, with tiny settings, so it cannot rot."""

import importlib.util
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum

ROOT = pathlib.Path(__file__).resolve().parent.parent

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


def _load(name):
    spec = importlib.util.spec_from_file_location(
        f"example_{name}", ROOT / "examples" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gradient_noise_writes_events_and_recommends(tmp_path, capsys):
    example = _load("gradient_noise")
    logdir = tmp_path / "logs"
    plot = tmp_path / "noise.png"
    updates = 6
    result = example.main(
        ["--logdir", str(logdir), "--micro-batch", "8", "--steps", "4", "--updates",
         str(updates), "--examples", "256", "--plot", str(plot)]
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
