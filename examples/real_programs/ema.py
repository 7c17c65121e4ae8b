"""An exponential moving average of the weights, stepped once per update.

The TensorFlow cifar10 trainers keep a moving average of the weights for
evaluation: ``ExponentialMovingAverage(decay, global_step)`` applied right
after the train op, ``train_op = tf.group(apply_op, ema.apply(variables))``.
Wrapped in ``tf1_accum.AccumulationOptimizer`` as it is, that EMA would step
in every run, once per micro-batch, and average weights that have not moved.
Hung on ``applied``, it steps once per update, after it, as in large-batch
training.

The script trains both ways and checks that the shadow variables equal a
moving average computed here, in NumPy, over the large-batch trajectory.

Run:  python examples/real_programs/ema.py
"""

import os

# TensorFlow's C++ log stays quiet; TF_CPP_MIN_LOG_LEVEL=0 shows all of it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse
import sys

import numpy as np
import tensorflow as tf

import tf1_accum

v1 = tf.compat.v1

FEATURES = 6
HIDDEN = 12
MOVING_AVERAGE_DECAY = 0.9
TOLERANCE = 1e-10


def make_data(examples, seed):
    rng = np.random.RandomState(seed)
    x = rng.randn(examples, FEATURES)
    y = np.sin(x @ rng.randn(FEATURES, 1)) + 0.1 * rng.randn(examples, 1)
    return x, y


def build_model(x, y):
    rng = np.random.RandomState(0)
    w1 = v1.get_variable("w1", initializer=rng.randn(FEATURES, HIDDEN) / 2.0)
    b1 = v1.get_variable("b1", initializer=np.zeros(HIDDEN))
    w2 = v1.get_variable("w2", initializer=rng.randn(HIDDEN, 1) / 3.0)
    return tf.reduce_mean((tf.matmul(tf.tanh(tf.matmul(x, w1) + b1), w2) - y) ** 2)


def plain_train_op(loss):
    """The cifar10 pattern: update, then step the moving average."""
    global_step = v1.train.get_or_create_global_step()
    opt = v1.train.MomentumOptimizer(0.1, 0.9)
    apply_op = opt.minimize(loss, global_step=global_step)
    ema = v1.train.ExponentialMovingAverage(MOVING_AVERAGE_DECAY, global_step)
    with tf.control_dependencies([apply_op]):
        ema_op = ema.apply(v1.trainable_variables())
    return tf.group(apply_op, ema_op), ema


def accumulating_train_op(loss, steps, per_update=True):
    """The same, with ``steps`` micro-batches per update.

    ``per_update=False`` keeps the EMA as it was, stepping in every run.
    """
    global_step = v1.train.get_or_create_global_step()
    opt = tf1_accum.AccumulationOptimizer(v1.train.MomentumOptimizer(0.1, 0.9), steps)
    apply_op = opt.minimize(loss, global_step=global_step)
    ema = v1.train.ExponentialMovingAverage(MOVING_AVERAGE_DECAY, global_step)
    # The one edit: step the average only in the runs that applied an update.
    # applied is computed by the train op, so the average also reads the
    # weights after the update.
    if per_update:
        ema_op = tf.cond(opt.window.applied, lambda: ema.apply(v1.trainable_variables()), tf.no_op)
    else:
        with tf.control_dependencies([apply_op]):
            ema_op = ema.apply(v1.trainable_variables())
    return tf.group(apply_op, ema_op), ema


def train(accumulate, steps, micro_batch, updates, seed=1, per_update=True):
    """Returns (start, weights after each update, shadow values at the end, global_step)."""
    x_data, y_data = make_data(steps * micro_batch * updates, seed)
    batch = micro_batch if accumulate else steps * micro_batch
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float64, [None, FEATURES])
        y = v1.placeholder(tf.float64, [None, 1])
        loss = build_model(x, y)
        if accumulate:
            train_op, ema = accumulating_train_op(loss, steps, per_update)
        else:
            train_op, ema = plain_train_op(loss)
        weights = v1.trainable_variables()
        shadows = {w.op.name: ema.average(w) for w in weights}
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            start = {w.op.name: sess.run(w) for w in weights}
            trajectory = []
            for first in range(0, len(x_data), batch):
                feed = {x: x_data[first : first + batch], y: y_data[first : first + batch]}
                sess.run(train_op, feed)
                if (first // batch + 1) % (steps if accumulate else 1) == 0:
                    trajectory.append({w.op.name: sess.run(w) for w in weights})
            final = {name: sess.run(s) for name, s in shadows.items()}
            step = int(sess.run(v1.train.get_global_step()))
    return start, trajectory, final, step


def numpy_ema(start, trajectory):
    """The moving average of ``trajectory`` with TF's decay schedule.

    ``ExponentialMovingAverage(decay, num_updates)`` uses
    min(decay, (1 + num_updates) / (10 + num_updates)), where num_updates is
    global_step after the update, all in float32, and computes 1 - decay in
    float32. (The constants are float32 too: NumPy before 2.0 would compute
    ``1 + n`` in float64.)
    """
    shadow = {name: value.copy() for name, value in start.items()}
    one, ten = np.float32(1), np.float32(10)
    for k, weights in enumerate(trajectory):
        n = np.float32(k + 1)
        decay = min(np.float32(MOVING_AVERAGE_DECAY), (one + n) / (ten + n))
        rate = float(one - decay)
        for name, value in weights.items():
            shadow[name] = shadow[name] - (shadow[name] - value) * rate
    return shadow


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="micro-batches per update")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--updates", type=int, default=6)
    args = parser.parse_args(argv)
    start, plain, _, _ = train(False, args.steps, args.micro_batch, args.updates)
    _, _, shadows, step = train(True, args.steps, args.micro_batch, args.updates)
    expected = numpy_ema(start, plain)
    worst = 0.0
    for name, want in expected.items():
        scale = float(np.max(np.abs(want)))
        worst = max(worst, float(np.max(np.abs(shadows[name] - want))) / scale)
    print(f"updates: {step}")
    print(f"largest relative difference, shadow vs EMA of the big-batch run: {worst:.3g}")
    return {"max_rel_diff": worst, "global_step": step, "shadows": shadows, "expected": expected}


if __name__ == "__main__":
    tf.compat.v1.disable_v2_behavior()
    result = main(sys.argv[1:])
    sys.exit(0 if result["max_rel_diff"] <= TOLERANCE else 1)
