"""A GAN with two optimizers: per batch, one discriminator step, then two generator steps.

Migrated with one ``tf1_accum.AccumulationOptimizer`` per optimizer, each train
op runs a whole window (``steps`` micro-batches) before the other one runs: the
discriminator's on the batch's micro-batches, then the generator's on
``steps`` micro-batches of noise, once per generator step. Every update then
equals the large-batch step exactly. The loop left as it was (discriminator,
generator, generator, for each micro-batch) would update the generator in the
middle of the discriminator's window: its generator train op stops with an
error that says so.

The script trains both ways and prints the largest difference from the
large-batch GAN, and the error of the loop left as it was.

Run:  python examples/real_programs/gan.py
"""

import os

# TensorFlow's C++ log stays quiet; TF_CPP_MIN_LOG_LEVEL=0 shows all of it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse
import sys
import typing

import numpy as np
import tensorflow as tf

import tf1_accum

v1 = tf.compat.v1

FEATURES = 4
NOISE = 3
HIDDEN = 8
GENERATOR_STEPS = 2  # per discriminator step
TOLERANCE = 1e-10


class Gan(typing.NamedTuple):
    real: tf.Tensor  # placeholder of real examples
    noise: tf.Tensor  # placeholder of the generator's input
    d_train: tf.Operation
    g_train: tf.Operation
    d_opt: v1.train.Optimizer
    g_opt: v1.train.Optimizer


def build(steps=None):
    """The GAN: plain training (``steps`` None), or ``steps`` micro-batches per update."""
    rng = np.random.RandomState(0)
    real = v1.placeholder(tf.float64, [None, FEATURES], name="real_images")
    noise = v1.placeholder(tf.float64, [None, NOISE], name="noise")
    with v1.variable_scope("generator"):
        g_w = v1.get_variable("w", initializer=rng.randn(NOISE, FEATURES) / 2.0)
        g_b = v1.get_variable("b", initializer=np.zeros(FEATURES))
    with v1.variable_scope("discriminator"):
        d_w1 = v1.get_variable("w1", initializer=rng.randn(FEATURES, HIDDEN) / 2.0)
        d_b1 = v1.get_variable("b1", initializer=np.zeros(HIDDEN))
        d_w2 = v1.get_variable("w2", initializer=rng.randn(HIDDEN, 1) / 2.0)

    def discriminate(x):
        return tf.matmul(tf.tanh(tf.matmul(x, d_w1) + d_b1), d_w2)

    fake = tf.tanh(tf.matmul(noise, g_w) + g_b)
    d_loss = tf.reduce_mean(tf.nn.softplus(-discriminate(real))) + tf.reduce_mean(
        tf.nn.softplus(discriminate(fake))
    )
    g_loss = tf.reduce_mean(tf.nn.softplus(-discriminate(fake)))
    d_opt = v1.train.AdamOptimizer(0.01, beta1=0.5)
    g_opt = v1.train.AdamOptimizer(0.01, beta1=0.5)
    if steps is not None:  # the migration: one wrapper per optimizer
        d_opt = tf1_accum.AccumulationOptimizer(d_opt, steps)
        g_opt = tf1_accum.AccumulationOptimizer(g_opt, steps)
    step = v1.train.get_or_create_global_step()
    d_train = d_opt.minimize(d_loss, global_step=step, var_list=[d_w1, d_b1, d_w2])
    g_train = g_opt.minimize(g_loss, var_list=[g_w, g_b])
    return Gan(real, noise, d_train, g_train, d_opt, g_opt)


def make_batches(count, batch, seed=1):
    """``count`` batches: real examples, and noise for the discriminator and each generator step."""
    rng = np.random.RandomState(seed)
    return [
        (
            1.0 + 0.5 * rng.randn(batch, FEATURES),
            [rng.randn(batch, NOISE) for _ in range(1 + GENERATOR_STEPS)],
        )
        for _ in range(count)
    ]


def run_plain(sess, gan, real, noises):
    sess.run(gan.d_train, {gan.real: real, gan.noise: noises[0]})
    for noise in noises[1:]:
        sess.run(gan.g_train, {gan.noise: noise})


def run_windows(sess, gan, real, noises, steps):
    """The loop with accumulation: each train op runs a whole window before the other."""
    reals = np.array_split(real, steps)
    for real_part, noise_part in zip(reals, np.array_split(noises[0], steps)):
        sess.run(gan.d_train, {gan.real: real_part, gan.noise: noise_part})
    for noise in noises[1:]:
        for noise_part in np.array_split(noise, steps):
            sess.run(gan.g_train, {gan.noise: noise_part})


def run_unchanged(sess, gan, real, noises, steps):
    """The loop left as it was, per micro-batch: wrong with accumulation."""
    parts = [np.array_split(a, steps) for a in (real, *noises)]
    for real_part, d_noise, *g_noises in zip(*parts):
        sess.run(gan.d_train, {gan.real: real_part, gan.noise: d_noise})
        for noise in g_noises:
            sess.run(gan.g_train, {gan.noise: noise})


def train(batches, steps=None, loop=run_windows):
    """The variables after each batch (plain training without ``steps``)."""
    with tf.Graph().as_default():
        gan = build(steps)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            after = []
            for real, noises in batches:
                if steps is None:
                    run_plain(sess, gan, real, noises)
                else:
                    loop(sess, gan, real, noises, steps)
                after.append({v.op.name: sess.run(v) for v in v1.trainable_variables()})
    return after


def largest_difference(got, expected):
    return max(
        float(np.max(np.abs(have[name] - want[name]))) / float(np.max(np.abs(want[name])))
        for have, want in zip(got, expected)
        for name in want
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="micro-batches per update")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--batches", type=int, default=5)
    args = parser.parse_args(argv)
    batches = make_batches(args.batches, args.steps * args.micro_batch)
    expected = train(batches)
    worst = largest_difference(train(batches, args.steps), expected)
    print(f"largest relative difference from the large-batch GAN: {worst:.3g}")
    try:
        train(batches, args.steps, run_unchanged)
        error = None
    except tf.errors.InvalidArgumentError as e:
        error = e.message[e.message.index("tf1_accum:") :].split(". ")[0]
        print(f"the loop left as it was stops: {error}")
    return {"max_rel_diff": worst, "unchanged_loop_error": error}


if __name__ == "__main__":
    tf.compat.v1.disable_v2_behavior()
    result = main(sys.argv[1:])
    sys.exit(0 if result["max_rel_diff"] <= TOLERANCE else 1)
