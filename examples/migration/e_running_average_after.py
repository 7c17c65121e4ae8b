"""After, pattern (e): each update averages its own window; global_step counts updates.

``apply_op`` resets the accumulators and the counter after each update, so
the next window starts from zero, and it increments ``global_step`` once.

Run:  python examples/migration/e_running_average_after.py
"""

import tensorflow.compat.v1 as tf

import common
import tf1_accum


def main():
    windows = common.make_windows()
    with tf.Graph().as_default():
        x, y, loss = common.build_model()
        opt = tf.train.GradientDescentOptimizer(common.LEARNING_RATE)
        global_step = tf.train.get_or_create_global_step()
        accumulation = tf1_accum.build_accumulation(loss, opt, global_step=global_step)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            params = [common.read_params(sess)]
            for window in windows:
                for batch_x, batch_y in window:
                    sess.run(accumulation.accum_op, feed_dict={x: batch_x, y: batch_y})
                sess.run(accumulation.apply_op)
                params.append(common.read_params(sess))
            final_step = int(sess.run(global_step))
    return {"params": params, "global_step": final_step}


if __name__ == "__main__":
    tf.disable_eager_execution()
    result = main()
    common.report("(e) after: tf1_accum, one window per update", result["params"])
    print("  global_step:", result["global_step"])
