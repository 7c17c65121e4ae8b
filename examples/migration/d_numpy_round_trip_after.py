"""After, pattern (d): the gradients stay in the graph.

``build_accumulation`` keeps the accumulators next to the variables;
``run_accumulation`` runs one ``session.run`` per micro-batch and one apply,
and fetches only what is asked for (here the loss of each micro-batch). No
gradient value is copied to Python.

Run:  python examples/migration/d_numpy_round_trip_after.py
"""

import tensorflow.compat.v1 as tf

import common
import tf1_accum


def main():
    windows = common.make_windows()
    with tf.Graph().as_default():
        x, y, loss = common.build_model()
        opt = tf.train.AdamOptimizer(common.LEARNING_RATE)
        accumulation = tf1_accum.build_accumulation(loss, opt)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            params = [common.read_params(sess)]
            losses = []
            for window in windows:
                feeds = [{x: batch_x, y: batch_y} for batch_x, batch_y in window]
                losses.append(tf1_accum.run_accumulation(sess, accumulation, feeds, fetches=loss))
                params.append(common.read_params(sess))
    return {"params": params, "losses": losses}


if __name__ == "__main__":
    tf.disable_eager_execution()
    common.report("(d) after: tf1_accum, in the graph", main()["params"])
