"""Before, pattern (b): accumulators divided by a float counter variable.

The forum recipe counts micro-batches in a ``tf.Variable(0.0)`` and applies
``accumulator / counter``. Every micro-batch then weighs the same, whatever
its size: with an epoch of 27 examples in micro-batches of 8, 8, 8 and 3, the
3 examples of the last one count as much as 8, and the update is not the
gradient of the mean loss over the 27. And one apply too many, the usual
"apply what is left at the end of the epoch" with nothing left, divides 0 by
0 and turns every weight into NaN.

Run:  python examples/migration/b_counter_mean_before.py
"""

import tensorflow.compat.v1 as tf

import common

SIZES = [8, 8, 8, 3]  # one epoch of 27 examples, one update per epoch


def main():
    windows = common.make_windows(SIZES)
    with tf.Graph().as_default():
        x, y, loss = common.build_model()
        opt = tf.train.GradientDescentOptimizer(common.LEARNING_RATE)
        tvs = tf.trainable_variables()
        accum_vars = [tf.Variable(tf.zeros_like(tv), trainable=False) for tv in tvs]
        accumulation_counter = tf.Variable(0.0, trainable=False)
        gvs = opt.compute_gradients(loss, tvs)
        accum_ops = [accum_vars[i].assign_add(gv[0]) for i, gv in enumerate(gvs)]
        accum_ops.append(accumulation_counter.assign_add(1.0))
        train_step = opt.apply_gradients(
            [(accum_vars[i] / accumulation_counter, gv[1]) for i, gv in enumerate(gvs)]  # <- TFA002
        )
        zero_ops = [av.assign(tf.zeros_like(av)) for av in accum_vars]
        zero_ops.append(accumulation_counter.assign(0.0))
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            params = [common.read_params(sess)]
            for window in windows:
                for batch_x, batch_y in window:
                    sess.run(accum_ops, feed_dict={x: batch_x, y: batch_y})
                sess.run(train_step)
                sess.run(zero_ops)
                params.append(common.read_params(sess))
            # Apply the micro-batches left over at the end: there are none.
            sess.run(train_step)
            after_extra_apply = common.read_params(sess)
    return {"params": params, "after_extra_apply": after_extra_apply}


if __name__ == "__main__":
    tf.disable_v2_behavior()
    result = main()
    common.report("(b) before: every micro-batch weighs the same", result["params"])
    print("  after one apply too many:", result["after_extra_apply"]["w2"].ravel())
