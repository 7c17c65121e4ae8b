"""Before, pattern (f): a ``tf.cond`` that accumulates or applies.

One train op per micro-batch: a ``tf.cond`` on a micro-step counter either
adds the gradients or applies the accumulated mean, building the optimizer's
``apply_gradients`` (and so its slots and Adam's beta powers) inside the
conditional. The run that applies does not accumulate: the last micro-batch
of every window is dropped, and the update is the sum of N - 1 gradients
divided by N. Under TensorFlow 1 control flow (``disable_v2_behavior()``)
the beta powers are also named ``cond/beta1_power`` and ``cond/beta2_power``,
so checkpoints of plain training do not restore into this graph, nor the
reverse.

Run:  python examples/migration/f_cond_apply_before.py
"""

import tensorflow.compat.v1 as tf

import common


def main():
    windows = common.make_windows()
    with tf.Graph().as_default():
        x, y, loss = common.build_model()
        opt = tf.train.AdamOptimizer(common.LEARNING_RATE)
        tvs = tf.trainable_variables()
        accum_vars = [tf.Variable(tf.zeros_like(tv), trainable=False) for tv in tvs]
        micro_step = tf.Variable(0, trainable=False)
        gvs = opt.compute_gradients(loss, tvs)

        def accumulate():
            accum_ops = [a.assign_add(g) for a, (g, v) in zip(accum_vars, gvs)]
            with tf.control_dependencies(accum_ops):
                return tf.identity(micro_step.assign_add(1))

        def apply():
            update = opt.apply_gradients([(a / common.STEPS, v) for a, v in zip(accum_vars, tvs)])
            with tf.control_dependencies([update]):
                zero_ops = [a.assign(tf.zeros_like(a)) for a in accum_vars]
            with tf.control_dependencies(zero_ops):
                return tf.identity(micro_step.assign(0))

        train_op = tf.cond(tf.equal(micro_step, common.STEPS - 1), apply, accumulate)  # <- TFA006
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            params = [common.read_params(sess)]
            for window in windows:
                for batch_x, batch_y in window:
                    sess.run(train_op, feed_dict={x: batch_x, y: batch_y})
                params.append(common.read_params(sess))
        optimizer_variables = sorted(v.op.name for v in opt.variables())
    return {"params": params, "optimizer_variables": optimizer_variables}


if __name__ == "__main__":
    tf.disable_v2_behavior()
    result = main()
    common.report("(f) before: the applying micro-batch is dropped", result["params"])
    print("  optimizer variables:", result["optimizer_variables"])
