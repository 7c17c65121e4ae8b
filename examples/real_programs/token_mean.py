"""A THUMT-shaped trainer: a loss averaged over tokens needs ``weight=`` its tokens.

A neural machine translation trainer (THUMT's Transformer, shrunk to an
embedding and a softmax layer) reads padded sequences of different lengths
from ``tf.data`` and trains in a ``MonitoredTrainingSession`` loop; its loss
is the cross entropy averaged over the real (non-padding) tokens. Each
micro-batch holds another number of tokens, so the plain mean of the
micro-batch means is not the large batch's token mean: the edit passes
``weight=`` the micro-batch's tokens, and the accumulated updates equal
large-batch training. Without it, building the train op warns, naming the
count and the ``weight=`` to pass.

The script trains with and without ``weight=``, and on batches N times
larger, and prints how far each is from the large batch.

Run:  python examples/real_programs/token_mean.py
"""

import os

# TensorFlow's C++ log stays quiet; TF_CPP_MIN_LOG_LEVEL=0 shows all of it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse
import sys
import warnings

import numpy as np
import tensorflow as tf

import tf1_accum

v1 = tf.compat.v1
VOCABULARY, WIDTH, LENGTH = 11, 6, 7
TOLERANCE = {"float64": 1e-10, "float32": 1e-5}


def make_data(sequences, seed):
    """Token ids padded with 0 to LENGTH, their targets, and their lengths (1 to LENGTH)."""
    rng = np.random.RandomState(seed)
    lengths = rng.randint(1, LENGTH + 1, size=sequences)
    padding = np.arange(LENGTH) >= lengths[:, None]
    source = np.where(padding, 0, rng.randint(1, VOCABULARY, size=(sequences, LENGTH)))
    target = np.where(padding, 0, (3 * source + rng.randint(0, 2, size=source.shape)) % VOCABULARY)
    return {
        "source": source.astype(np.int32),
        "target": target.astype(np.int32),
        "target_length": lengths.astype(np.int32),
    }


def build_model(features, dtype, token_mean=True):
    """The loss: cross entropy averaged over the real tokens (or over all positions)."""
    rng = np.random.RandomState(0)
    embedding = v1.get_variable("embedding", initializer=rng.randn(VOCABULARY, WIDTH).astype(dtype))
    softmax = v1.get_variable(
        "softmax", initializer=(rng.randn(WIDTH, VOCABULARY) / np.sqrt(WIDTH)).astype(dtype)
    )
    hidden = tf.tanh(tf.nn.embedding_lookup(embedding, features["source"]))
    logits = tf.tensordot(hidden, softmax, 1)
    xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=features["target"], logits=logits)
    if not token_mean:
        return tf.reduce_mean(xent)  # over batch x LENGTH positions: a fixed count
    mask = tf.sequence_mask(features["target_length"], tf.shape(xent)[1], dtype=tf.as_dtype(dtype))
    return tf.reduce_sum(xent * mask) / tf.reduce_sum(mask, name="tokens")


def batches(data, size):
    return v1.data.make_one_shot_iterator(
        tf.data.Dataset.from_tensor_slices(data).batch(size)
    ).get_next()


def train(data, args, dtype, weighted=True, token_mean=True):
    """Accumulates ``args.steps`` micro-batches per update; the trained variables."""
    with tf.Graph().as_default():
        features = batches(data, args.micro_batch)
        loss = build_model(features, dtype, token_mean)
        # [train]
        tokens = tf.reduce_sum(features["target_length"])
        optimizer = tf1_accum.AccumulationOptimizer(
            v1.train.GradientDescentOptimizer(0.5), args.steps, weight=tokens if weighted else None
        )
        global_step = v1.train.get_or_create_global_step()
        train_op = optimizer.minimize(loss, global_step=global_step)
        hooks = [v1.train.StopAtStepHook(last_step=args.updates), optimizer.make_session_run_hook()]
        # [/train]
        final = v1.train.FinalOpsHook({v.op.name: v for v in v1.trainable_variables()})
        with v1.train.MonitoredTrainingSession(hooks=hooks + [final]) as sess:
            while not sess.should_stop():
                sess.run(train_op)
        return final.final_ops_values


def large_batch(data, args, dtype, token_mean=True):
    """Plain training on batches ``args.steps`` times larger; the trained variables."""
    with tf.Graph().as_default():
        loss = build_model(batches(data, args.micro_batch * args.steps), dtype, token_mean)
        train_op = v1.train.GradientDescentOptimizer(0.5).minimize(loss)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for _ in range(args.updates):
                sess.run(train_op)
            return sess.run({v.op.name: v for v in v1.trainable_variables()})


def difference(values, expected):
    """The largest difference, relative to each variable's largest value."""
    return max(np.abs(values[k] - v).max() / np.abs(v).max() for k, v in expected.items())


def main(argv=()):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4, help="micro-batches per update")
    parser.add_argument("--updates", type=int, default=5)
    parser.add_argument("--dtype", default="float64", choices=sorted(TOLERANCE))
    args = parser.parse_args(list(argv))
    data = make_data(args.micro_batch * args.steps * args.updates, seed=1)
    expected = large_batch(data, args, args.dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        unweighted = difference(train(data, args, args.dtype, weighted=False), expected)
    warned = [str(w.message) for w in caught if "TFA014" in str(w.message)]
    weighted = difference(train(data, args, args.dtype), expected)
    print(f"without weight=: {unweighted:.3g} off the large batch, warned: {warned}")
    print(f"with weight=tf.reduce_sum(target_length): {weighted:.3g}")
    return {"unweighted": unweighted, "weighted": weighted, "warned": warned, "dtype": args.dtype}


if __name__ == "__main__":
    result = main(sys.argv[1:])
    sys.exit(0 if result["weighted"] <= TOLERANCE[result["dtype"]] else 1)
