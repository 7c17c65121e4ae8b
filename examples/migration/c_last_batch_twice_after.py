"""After, pattern (c): the apply reads the accumulators; nothing is counted twice.

``build_accumulation`` builds an ``apply_op`` that needs no feed. To save the
extra ``session.run`` that the forum recipe saved by feeding the apply, build
with ``fused=True``: ``run_accumulation`` then runs the last micro-batch's
accumulation and the apply together, and each micro-batch counts once, in N
runs per update.

Run:  python examples/migration/c_last_batch_twice_after.py
"""

import tensorflow.compat.v1 as tf

import common
import tf1_accum


def main():
    windows = common.make_windows()
    with tf.Graph().as_default():
        x, y, loss = common.build_model()
        opt = tf.train.GradientDescentOptimizer(common.LEARNING_RATE)
        accumulation = tf1_accum.build_accumulation(loss, opt, fused=True)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            params = [common.read_params(sess)]
            for window in windows:
                feeds = [{x: batch_x, y: batch_y} for batch_x, batch_y in window]
                tf1_accum.run_accumulation(sess, accumulation, feeds)
                params.append(common.read_params(sess))
    return {"params": params}


if __name__ == "__main__":
    tf.disable_eager_execution()
    common.report("(c) after: tf1_accum, fused", main()["params"])
