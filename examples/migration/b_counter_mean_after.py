"""After, pattern (b): tf1_accum weighs each micro-batch by its examples.

``build_accumulation(..., weight=...)`` takes a scalar computed from each
micro-batch, here its number of examples, and applies
sum(weight_i * gradient_i) / sum(weight_i): the gradient of the mean loss over
all 27 examples of the window, as one large batch would give. An
``apply_op`` run with nothing accumulated raises ``InvalidArgumentError`` and
changes no variable.

Run:  python examples/migration/b_counter_mean_after.py
"""

import tensorflow.compat.v1 as tf

import common
import tf1_accum

SIZES = [8, 8, 8, 3]  # one epoch of 27 examples, one update per epoch


def main():
    windows = common.make_windows(SIZES)
    with tf.Graph().as_default():
        x, y, loss = common.build_model()
        opt = tf.train.GradientDescentOptimizer(common.LEARNING_RATE)
        examples = tf.cast(tf.shape(x)[0], tf.float32)
        accumulation = tf1_accum.build_accumulation(loss, opt, weight=examples)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            params = [common.read_params(sess)]
            for window in windows:
                feeds = [{x: batch_x, y: batch_y} for batch_x, batch_y in window]
                tf1_accum.run_accumulation(sess, accumulation, feeds)
                params.append(common.read_params(sess))
            try:
                sess.run(accumulation.apply_op)
                extra_apply_refused = False
            except tf.errors.InvalidArgumentError:
                extra_apply_refused = True
            after_extra_apply = common.read_params(sess)
    return {
        "params": params,
        "extra_apply_refused": extra_apply_refused,
        "after_extra_apply": after_extra_apply,
    }


if __name__ == "__main__":
    tf.disable_eager_execution()
    result = main()
    common.report("(b) after: tf1_accum, weighted by examples", result["params"])
    print("  one apply too many was refused:", result["extra_apply_refused"])
