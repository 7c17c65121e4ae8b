"""Export after training: a SavedModel and a ``.meta`` load in a fresh process.

Optimizers add their update op to the graph's ``TRAIN_OP`` collection; built
inside a version 2 conditional (resource variables: the non-finite check, the
wrapper's apply every ``steps`` runs), that op lived in the conditional's
function graph, and a graph exported with it failed to load. Here a model is
trained one window and part of the next, exported, then loaded by
tests/_export_worker.py in another process: served, its predictions must be
those of the training process, and resumed, the rest of the window must end
bit-identical to training that never stopped.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from _ways import WAYS

v1 = tf.compat.v1

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
STEPS = 3  # micro-batches per window


def _model(x, labels):
    rng = np.random.RandomState(0)
    w1 = v1.get_variable("w1", initializer=rng.randn(4, 6).astype(np.float32))
    b1 = v1.get_variable("b1", initializer=np.zeros(6, np.float32))
    w2 = v1.get_variable("w2", initializer=rng.randn(6, 1).astype(np.float32))
    y = tf.identity(tf.matmul(tf.tanh(tf.matmul(x, w1) + b1), w2), name="y")
    loss = tf.reduce_mean((y - labels) ** 2)
    return y, loss


@pytest.mark.parametrize("way", WAYS, ids=str)
def test_exported_model_serves_and_resumes_mid_window_in_a_fresh_process(way, tmp_path):
    way.require("feed_window_ops")
    rng = np.random.RandomState(1)
    batches = [
        (rng.randn(5, 4).astype(np.float32), rng.randn(5, 1).astype(np.float32))
        for _ in range(2 * STEPS)
    ]
    examples = rng.randn(7, 4).astype(np.float32)
    with tf.Graph().as_default():
        made = {}

        def model_fn(inputs):
            made["y"], loss = _model(*inputs)
            return loss

        built = way.build(
            model_fn,
            v1.train.AdamOptimizer(0.05),
            batches,
            STEPS,
            global_step=v1.train.get_or_create_global_step(),
        )
        (x, labels), y, counter = built.inputs, made["y"], built.counter
        accumulate, last, apply = way.window_ops(built)

        def run_window(window_batches, apply_at_end=True):
            for i, (inputs, targets) in enumerate(window_batches):
                end = apply_at_end and i == len(window_batches) - 1
                sess.run(last if end else accumulate, {x: inputs, labels: targets})
            if apply_at_end and apply is not None:
                sess.run(apply)

        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            initial = sess.run(y, {x: examples})
            run_window(batches[:STEPS])
            run_window(batches[STEPS : STEPS + 1], apply_at_end=False)
            assert sess.run(counter) == 1
            v1.train.Saver().save(sess, str(tmp_path / "mid"))
            builder = v1.saved_model.Builder(str(tmp_path / "saved_model"))
            signature = v1.saved_model.predict_signature_def({"x": x}, {"y": y})
            builder.add_meta_graph_and_variables(
                sess, ["serve"], signature_def_map={"serving_default": signature}
            )
            builder.save()
            exported = sess.run(y, {x: examples})
            run_window(batches[STEPS + 1 :])
            uninterrupted = {v.op.name: sess.run(v) for v in v1.global_variables()}
            predicted_after = sess.run(y, {x: examples})

    names = {
        "x": x.name,
        "labels": labels.name,
        "y": y.name,
        "counter": counter.op.name,
        "accumulate": accumulate.name,
        "last": last.name,
        "apply": None if apply is None else apply.name,
    }
    (tmp_path / "names.json").write_text(json.dumps(names))
    remaining = {}
    for i, (inputs, targets) in enumerate(batches[STEPS + 1 :]):
        remaining[f"inputs_{i}"], remaining[f"labels_{i}"] = inputs, targets
    np.savez(tmp_path / "inputs.npz", examples=examples, **remaining)

    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, str(HERE / "_export_worker.py"), str(tmp_path)],
        env=dict(os.environ, PYTHONPATH=path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = np.load(tmp_path / "loaded.npz")
    eager = subprocess.run(
        [sys.executable, str(HERE / "_export_worker.py"), str(tmp_path)],
        env=dict(os.environ, PYTHONPATH=path, TF1_ACCUM_EXPORT_EAGER="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert eager.returncode == 0, eager.stderr[-3000:]
    np.testing.assert_array_equal(np.load(tmp_path / "eager.npz")["served"], exported)

    assert not np.allclose(exported, initial), "the first window must have moved the model"
    np.testing.assert_array_equal(loaded["served"], exported)
    assert loaded["counter_restored"] == 1
    resumed = {k[len("resumed/") :]: loaded[k] for k in loaded.files if k.startswith("resumed/")}
    assert set(resumed) == set(uninterrupted)
    for name, value in uninterrupted.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)
    assert resumed["global_step"] == 2
    np.testing.assert_array_equal(loaded["predicted_after"], predicted_after)
    assert not np.allclose(predicted_after, exported)
