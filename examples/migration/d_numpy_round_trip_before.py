"""Before, pattern (d): gradients fetched to numpy, summed there, fed back.

Each micro-batch's gradients are fetched with ``sess.run``, summed in numpy,
and the mean is fed through placeholders to an ``apply_gradients`` built on
them. The numbers are right, but every gradient value crosses from the graph
to Python once per micro-batch, and back once per update: (N + 1) copies of
the whole model per update, which on a GPU are device-to-host transfers and
Python-side arithmetic between every two ``session.run`` calls.

Run:  python examples/migration/d_numpy_round_trip_before.py
"""

import numpy as np
import tensorflow.compat.v1 as tf

import common


def main():
    windows = common.make_windows()
    with tf.Graph().as_default():
        x, y, loss = common.build_model()
        opt = tf.train.AdamOptimizer(common.LEARNING_RATE)
        tvs = tf.trainable_variables()
        grads = [g for g, v in opt.compute_gradients(loss, tvs)]
        grad_placeholders = [tf.placeholder(g.dtype, g.shape) for g in grads]
        train_step = opt.apply_gradients(zip(grad_placeholders, tvs))  # <- TFA004
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            params = [common.read_params(sess)]
            values_copied = []
            for window in windows:
                copied = 0
                accumulated = [np.zeros(v.shape.as_list(), np.float32) for v in tvs]
                for batch_x, batch_y in window:
                    values = sess.run(grads, feed_dict={x: batch_x, y: batch_y})
                    accumulated = [a + g for a, g in zip(accumulated, values)]
                    copied += sum(g.size for g in values)
                means = [a / len(window) for a in accumulated]
                sess.run(train_step, feed_dict=dict(zip(grad_placeholders, means)))
                copied += sum(m.size for m in means)
                values_copied.append(copied)
                params.append(common.read_params(sess))
    return {"params": params, "values_copied": values_copied}


if __name__ == "__main__":
    tf.disable_v2_behavior()
    result = main()
    common.report("(d) before: gradients through numpy", result["params"])
    print("  gradient values copied between graph and Python per update:", result["values_copied"])
