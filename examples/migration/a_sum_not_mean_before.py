"""Before, pattern (a): accumulated gradients applied as sums, not averaged.

The forum recipe: a zero, non-trainable copy of each trainable variable made
from ``initialized_value()``, an ``assign_add`` of each micro-batch's gradient,
and ``apply_gradients`` on the accumulators as they are. The update is the sum
of the N micro-batch gradients: with SGD, a step N times the large-batch step.

With TensorFlow 2's resource variables (``disable_eager_execution()`` without
``disable_v2_behavior()``), ``initialized_value()`` raises NotImplementedError
while the graph is built.

Run:  python examples/migration/a_sum_not_mean_before.py
"""

import tensorflow.compat.v1 as tf

import common


def main():
    windows = common.make_windows()
    with tf.Graph().as_default():
        x, y, loss = common.build_model()
        opt = tf.train.GradientDescentOptimizer(common.LEARNING_RATE)
        tvs = tf.trainable_variables()
        accum_vars = [
            tf.Variable(tf.zeros_like(tv.initialized_value()), trainable=False)  # <- TFA007
            for tv in tvs
        ]
        zero_ops = [av.assign(tf.zeros_like(av)) for av in accum_vars]
        gvs = opt.compute_gradients(loss, tvs)
        accum_ops = [accum_vars[i].assign_add(gv[0]) for i, gv in enumerate(gvs)]
        train_step = opt.apply_gradients(
            [(accum_vars[i], gv[1]) for i, gv in enumerate(gvs)]  # <- TFA001
        )
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            params = [common.read_params(sess)]
            for window in windows:
                sess.run(zero_ops)
                for batch_x, batch_y in window:
                    sess.run(accum_ops, feed_dict={x: batch_x, y: batch_y})
                sess.run(train_step)
                params.append(common.read_params(sess))
    return {"params": params}


if __name__ == "__main__":
    tf.disable_v2_behavior()
    common.report("(a) before: sums applied", main()["params"])
