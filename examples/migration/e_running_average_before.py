"""Before, pattern (e): a running average of gradients keyed on the global step.

The average is updated as ``(avg * step + g) / (step + 1)`` with ``step`` the
global step, which is incremented per micro-batch and never reset. The first
update is right; every later one applies the mean of all the gradients since
training began, so old gradients, computed at old weights, keep steering. And
``global_step`` counts micro-batches, not updates: learning-rate schedules and
checkpoints keyed on it run N times too fast.

Run:  python examples/migration/e_running_average_before.py
"""

import tensorflow.compat.v1 as tf

import common


def main():
    windows = common.make_windows()
    with tf.Graph().as_default():
        x, y, loss = common.build_model()
        opt = tf.train.GradientDescentOptimizer(common.LEARNING_RATE)
        global_step = tf.train.get_or_create_global_step()
        tvs = tf.trainable_variables()
        avg_grads = [tf.Variable(tf.zeros_like(tv), trainable=False) for tv in tvs]
        gvs = opt.compute_gradients(loss, tvs)
        step = tf.cast(global_step, tf.float32)
        update_avgs = [
            avg.assign((avg * step + g) / (step + 1.0))  # <- TFA005
            for avg, (g, v) in zip(avg_grads, gvs)
        ]
        with tf.control_dependencies(update_avgs):
            accumulate = tf.assign_add(global_step, 1)
        train_step = opt.apply_gradients(zip(avg_grads, tvs))
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            params = [common.read_params(sess)]
            for window in windows:
                for batch_x, batch_y in window:
                    sess.run(accumulate, feed_dict={x: batch_x, y: batch_y})
                sess.run(train_step)
                params.append(common.read_params(sess))
            final_step = int(sess.run(global_step))
    return {"params": params, "global_step": final_step}


if __name__ == "__main__":
    tf.disable_v2_behavior()
    result = main()
    common.report("(e) before: a running average that never resets", result["params"])
    print("  global_step:", result["global_step"])
