"""A BERT-style optimizer and training loop, migrated to gradient accumulation.

BERT's fine-tuning code trains with its own ``AdamWeightDecayOptimizer``: a
``tf.compat.v1.train.Optimizer`` subclass that replaces ``apply_gradients``,
creates its moments there with ``get_variable``, leaves some variables out of
weight decay by name, and ignores ``global_step``. The loop increments
``global_step`` by hand, next to the train op, and a learning-rate schedule
(warmup, then linear decay) reads it.

The migrated loop wraps the optimizer in ``tf1_accum.AccumulationOptimizer``
and hangs the hand-written increment on ``applied``, so that ``global_step``
counts updates and the schedule follows them. The script trains both and
checks that N micro-batches per update equal one step on N-times-larger
batches, in float64, and that ``global_step`` equals the number of updates.

Run:  python examples/real_programs/bert_style_optimizer.py
"""

import os

# TensorFlow's C++ log stays quiet; TF_CPP_MIN_LOG_LEVEL=0 shows all of it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse
import re
import sys

import numpy as np
import tensorflow as tf

import tf1_accum

v1 = tf.compat.v1

FEATURES = 8
HIDDEN = 16
TOLERANCE = 1e-10


class AdamWeightDecayOptimizer(v1.train.Optimizer):
    """Adam with decoupled weight decay, in the style of BERT's optimizer."""

    def __init__(
        self,
        learning_rate,
        weight_decay_rate=0.0,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-6,
        exclude_from_weight_decay=None,
        name="AdamWeightDecayOptimizer",
    ):
        super().__init__(False, name)
        self.learning_rate = learning_rate
        self.weight_decay_rate = weight_decay_rate
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon
        self.exclude_from_weight_decay = exclude_from_weight_decay or []

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        assignments = []
        for grad, param in grads_and_vars:
            if grad is None or param is None:
                continue
            param_name = param.op.name
            m = v1.get_variable(
                name=param_name + "/adam_m",
                shape=param.shape.as_list(),
                dtype=param.dtype.base_dtype,
                trainable=False,
                initializer=tf.zeros_initializer(),
            )
            v = v1.get_variable(
                name=param_name + "/adam_v",
                shape=param.shape.as_list(),
                dtype=param.dtype.base_dtype,
                trainable=False,
                initializer=tf.zeros_initializer(),
            )
            next_m = self.beta_1 * m + (1.0 - self.beta_1) * grad
            next_v = self.beta_2 * v + (1.0 - self.beta_2) * tf.square(grad)
            update = next_m / (tf.sqrt(next_v) + self.epsilon)
            if self._do_use_weight_decay(param_name):
                update += self.weight_decay_rate * param
            assignments.extend(
                [
                    param.assign(param - self.learning_rate * update),
                    m.assign(next_m),
                    v.assign(next_v),
                ]
            )
        return tf.group(*assignments, name=name)

    def _do_use_weight_decay(self, param_name):
        if not self.weight_decay_rate:
            return False
        return not any(re.search(r, param_name) for r in self.exclude_from_weight_decay)


def make_data(examples, seed):
    rng = np.random.RandomState(seed)
    x = rng.randn(examples, FEATURES)
    y = np.tanh(x @ rng.randn(FEATURES, 1)) + 0.1 * rng.randn(examples, 1)
    return x, y


def build_model(x, y):
    """A dense layer, a layer norm and an output layer, named as BERT names them."""
    rng = np.random.RandomState(0)
    with v1.variable_scope("dense"):
        kernel = v1.get_variable("kernel", initializer=rng.randn(FEATURES, HIDDEN) / 3.0)
        bias = v1.get_variable("bias", initializer=np.zeros(HIDDEN))
    with v1.variable_scope("LayerNorm"):
        gamma = v1.get_variable("gamma", initializer=np.ones(HIDDEN))
        beta = v1.get_variable("beta", initializer=np.zeros(HIDDEN))
    with v1.variable_scope("output"):
        weights = v1.get_variable("kernel", initializer=rng.randn(HIDDEN, 1) / 4.0)
    hidden = tf.tanh(tf.matmul(x, kernel) + bias)
    mean, variance = tf.nn.moments(hidden, axes=[1], keepdims=True)
    hidden = (hidden - mean) * tf.math.rsqrt(variance + 1e-6) * gamma + beta
    return tf.reduce_mean((tf.matmul(hidden, weights) - y) ** 2)


def create_optimizer(global_step, init_lr, num_train_steps, num_warmup_steps):
    """BERT's schedule: linear warmup, then linear decay, both driven by global_step."""
    learning_rate = v1.train.polynomial_decay(
        tf.constant(init_lr, tf.float64), global_step, num_train_steps, end_learning_rate=0.0
    )
    step = tf.cast(global_step, tf.float64)
    warmup_rate = init_lr * step / num_warmup_steps
    learning_rate = tf.where(step < num_warmup_steps, warmup_rate, learning_rate)
    return AdamWeightDecayOptimizer(
        learning_rate,
        weight_decay_rate=0.01,
        exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"],
    )


def plain_train_op(loss, num_train_steps):
    """The loop as BERT writes it (one batch per update)."""
    global_step = v1.train.get_or_create_global_step()
    optimizer = create_optimizer(global_step, 0.01, num_train_steps, 2)
    tvars = v1.trainable_variables()
    grads = tf.gradients(loss, tvars)
    grads, _ = tf.clip_by_global_norm(grads, clip_norm=1.0)
    train_op = optimizer.apply_gradients(zip(grads, tvars), global_step=global_step)
    # The optimizer ignores global_step: the loop increments it by hand.
    # (BERT groups the two unordered; ordered here so that runs repeat exactly.)
    with tf.control_dependencies([train_op]):
        new_global_step = global_step + 1
        train_op = tf.group(train_op, [global_step.assign(new_global_step)])
    return train_op


def accumulating_train_op(loss, num_train_steps, steps, own_increment=True):
    """The same loop, accumulating ``steps`` micro-batches per update.

    ``own_increment=False`` shows the other way: the wrapper increments
    ``global_step`` and the hand-written increment goes.
    """
    global_step = v1.train.get_or_create_global_step()
    optimizer = create_optimizer(global_step, 0.01, num_train_steps, 2)
    # Edit 1: wrap the optimizer. Clip the window's mean gradient, as the
    # large batch's is clipped, not each micro-batch's.
    optimizer = tf1_accum.AccumulationOptimizer(optimizer, steps, clip_norm=1.0)
    tvars = v1.trainable_variables()
    grads = tf.gradients(loss, tvars)
    if not own_increment:
        # Edit 2': global_step to the wrapper, no hand-written increment.
        return optimizer.apply_gradients(zip(grads, tvars), global_step=global_step), optimizer
    # Edit 2: no global_step here: the loop below increments it itself.
    train_op = optimizer.apply_gradients(zip(grads, tvars))
    # Edit 3: the hand-written increment runs once per update, not per run,
    # as assign_add: an assign(global_step + 1) loses counts between
    # asynchronous workers sharing the step.
    increment = tf.cond(
        optimizer.window.applied,
        lambda: global_step.assign_add(1),
        global_step.read_value,
    )
    return tf.group(train_op, increment), optimizer


def train(accumulate, steps, micro_batch, updates, seed=1, own_increment=True):
    """Returns the trained variables (global_step among them), by name."""
    x_data, y_data = make_data(steps * micro_batch * updates, seed)
    batch = micro_batch if accumulate else steps * micro_batch
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float64, [None, FEATURES])
        y = v1.placeholder(tf.float64, [None, 1])
        loss = build_model(x, y)
        if accumulate:
            train_op, _ = accumulating_train_op(loss, updates, steps, own_increment)
        else:
            train_op = plain_train_op(loss, updates)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for start in range(0, len(x_data), batch):
                feed = {x: x_data[start : start + batch], y: y_data[start : start + batch]}
                sess.run(train_op, feed)
            names = [v.op.name for v in tf1_accum.plain_variables()]
            values = dict(zip(names, sess.run(tf1_accum.plain_variables())))
    return values


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="micro-batches per update")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--updates", type=int, default=6)
    args = parser.parse_args(argv)
    plain = train(False, args.steps, args.micro_batch, args.updates)
    accumulated = train(True, args.steps, args.micro_batch, args.updates)
    worst = 0.0
    for name, expected in plain.items():
        scale = max(float(np.max(np.abs(expected))), 1e-300)
        worst = max(worst, float(np.max(np.abs(accumulated[name] - expected))) / scale)
    print(f"variables: {len(accumulated)}; global_step: {accumulated['global_step']}")
    print(f"largest relative difference, accumulated vs big batch: {worst:.3g}")
    return {
        "max_rel_diff": worst,
        "global_step": int(accumulated["global_step"]),
        "plain": plain,
        "accumulated": accumulated,
    }


if __name__ == "__main__":
    tf.compat.v1.disable_v2_behavior()
    result = main(sys.argv[1:])
    sys.exit(0 if result["max_rel_diff"] <= TOLERANCE else 1)
