"""Before, pattern (c): the apply, fed the last micro-batch, accumulates it again.

The forum recipe divides the results of the ``assign_add`` ops,
``norm_accums = [accum_op / float(batchsize) for accum_op in accum_ops]``, and
applies those. Fetching the apply then runs the ``assign_add`` ops once more,
with whatever is fed, and the loop feeds it the last micro-batch: that
micro-batch is counted twice in every update.

Run:  python examples/migration/c_last_batch_twice_before.py
"""

import tensorflow.compat.v1 as tf

import common


def main():
    windows = common.make_windows()
    batchsize = common.STEPS  # micro-batches per update
    with tf.Graph().as_default():
        x, y, loss = common.build_model()
        opt = tf.train.GradientDescentOptimizer(common.LEARNING_RATE)
        tvs = tf.trainable_variables()
        accum_vars = [tf.Variable(tf.zeros_like(tv), trainable=False) for tv in tvs]
        zero_ops = [av.assign(tf.zeros_like(av)) for av in accum_vars]
        gvs = opt.compute_gradients(loss, tvs)
        accum_ops = [accum_vars[i].assign_add(gv[0]) for i, gv in enumerate(gvs)]
        norm_accums = [accum_op / float(batchsize) for accum_op in accum_ops]
        train_step = opt.apply_gradients(zip(norm_accums, tvs))  # <- TFA003
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            params = [common.read_params(sess)]
            for window in windows:
                sess.run(zero_ops)
                for batch_x, batch_y in window:
                    feed_dict = {x: batch_x, y: batch_y}
                    sess.run(accum_ops, feed_dict=feed_dict)
                sess.run(train_step, feed_dict=feed_dict)
                params.append(common.read_params(sess))
    return {"params": params}


if __name__ == "__main__":
    tf.disable_v2_behavior()
    common.report("(c) before: the last micro-batch counted twice", main()["params"])
