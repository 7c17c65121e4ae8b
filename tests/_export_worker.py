"""Loads what tests/test_export.py exported, in a fresh process, as a server would.

Usage: python _export_worker.py OUT_DIR

OUT_DIR holds ``names.json`` (the tensors' and ops' names), ``inputs.npz``
(the examples to predict and the micro-batches that finish the window),
the SavedModel ``saved_model/`` and the checkpoint ``mid`` with its
``.meta``. This process:

* loads the SavedModel with ``tf.compat.v1.saved_model.loader.load`` and
  predicts the examples (``served`` in ``OUT_DIR/loaded.npz``);
* with ``TF1_ACCUM_EXPORT_EAGER=1`` instead, runs eagerly and loads the
  SavedModel with ``tf.saved_model.load`` (version 2), as a TensorFlow 2 server would, and
  predicts the examples (``served`` in ``OUT_DIR/eager.npz``);
* imports ``mid.meta`` with ``import_meta_graph``, restores ``mid`` (a window
  left partly accumulated), runs the window's remaining micro-batches and its
  apply through the imported ops, by name, and writes every global variable's
  value after that (``resumed/<name>``) and the predictions then.

The graph mode comes from TF1_ACCUM_GRAPH_MODE, as in the test process.
"""

import json
import os
import sys

import _graph_mode
import numpy as np
import tensorflow as tf

# With TF1_ACCUM_EXPORT_EAGER=1 the process runs eagerly, as a TensorFlow 2
# server does, and only loads the SavedModel with tf.saved_model.load.
EAGER = os.environ.get("TF1_ACCUM_EXPORT_EAGER") == "1"
_graph_mode.enter(eager=EAGER)

v1 = tf.compat.v1


def main(out_dir):
    with open(os.path.join(out_dir, "names.json")) as f:
        names = json.load(f)
    data = np.load(os.path.join(out_dir, "inputs.npz"))
    out = {}

    with tf.Graph().as_default() as graph, v1.Session() as sess:
        meta = v1.saved_model.loader.load(sess, ["serve"], os.path.join(out_dir, "saved_model"))
        signature = meta.signature_def["serving_default"]
        x = graph.get_tensor_by_name(signature.inputs["x"].name)
        y = graph.get_tensor_by_name(signature.outputs["y"].name)
        out["served"] = sess.run(y, {x: data["examples"]})

    with tf.Graph().as_default() as graph, v1.Session() as sess:
        saver = v1.train.import_meta_graph(os.path.join(out_dir, "mid.meta"))
        saver.restore(sess, os.path.join(out_dir, "mid"))
        x = graph.get_tensor_by_name(names["x"])
        labels = graph.get_tensor_by_name(names["labels"])
        variables = {v.op.name: v for v in v1.global_variables()}
        out["counter_restored"] = sess.run(variables[names["counter"]])
        remaining = len([k for k in data.files if k.startswith("inputs_")])
        for i in range(remaining):
            feed = {x: data[f"inputs_{i}"], labels: data[f"labels_{i}"]}
            op = names["last"] if i == remaining - 1 else names["accumulate"]
            sess.run(graph.get_operation_by_name(op), feed)
        if names.get("apply"):
            sess.run(graph.get_operation_by_name(names["apply"]))
        for var in v1.global_variables():
            out[f"resumed/{var.op.name}"] = sess.run(var)
        out["predicted_after"] = sess.run(
            graph.get_tensor_by_name(names["y"]), {x: data["examples"]}
        )

    np.savez(os.path.join(out_dir, "loaded.npz"), **out)


def serve_eagerly(out_dir):
    """Loads the SavedModel with ``tf.saved_model.load`` and predicts (``eager.npz``)."""
    data = np.load(os.path.join(out_dir, "inputs.npz"))
    loaded = tf.compat.v2.saved_model.load(os.path.join(out_dir, "saved_model"))
    outputs = loaded.signatures["serving_default"](x=tf.constant(data["examples"]))
    np.savez(os.path.join(out_dir, "eager.npz"), served=outputs["y"].numpy())


if __name__ == "__main__":
    (serve_eagerly if EAGER else main)(sys.argv[1])
