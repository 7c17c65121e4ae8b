"""After, pattern (a): tf1_accum applies the mean of the micro-batch gradients.

``build_accumulation`` creates the accumulators (under resource variables
too), and its ``apply_op`` divides by the number of micro-batches
(``average=True``, the default): the update equals one step on the window's
micro-batches joined into one large batch.

Run:  python examples/migration/a_sum_not_mean_after.py
"""

import tensorflow.compat.v1 as tf

import common
import tf1_accum


def main():
    windows = common.make_windows()
    with tf.Graph().as_default():
        x, y, loss = common.build_model()
        opt = tf.train.GradientDescentOptimizer(common.LEARNING_RATE)
        accumulation = tf1_accum.build_accumulation(loss, opt)
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
    common.report("(a) after: tf1_accum, the mean", main()["params"])
