"""Feed the batch you want: tf1_accum splits it into micro-batches that fit.

The quickstart's model, trained two ways on the same large batches:

1. big batch:   one plain step per large batch (what you would run with more memory).
2. split to fit: ``run_accumulation`` given each large batch whole, with a
   ``MemoryFit``: it finds the micro-batch size that fits, by running out of
   memory, and applies one update per large batch.

The update of each window equals the big batch's, however the batch was
split; the table at the end shows the largest parameter difference, and the
search prints each size it tried.

A CPU has memory to spare for this model, so the example makes a limit:
a micro-batch of more than ``--memory-rows`` rows raises ``MemoryError`` in
the graph, which reaches ``session.run`` as
``tf.errors.ResourceExhaustedError``, as an accelerator's out of memory does.
With ``--memory-rows 0`` there is no such limit: on a GPU, make the batch and
the model large enough and the real one is found the same way.

Run:  python examples/feed_the_batch.py   (add --help for the settings)
"""

import argparse
import logging
import sys

import _tensorflow_log  # noqa: F401  (before TensorFlow: its C++ log stays quiet)
import numpy as np
import tensorflow as tf

import tf1_accum

v1 = tf.compat.v1

FEATURES = 10
HIDDEN = 32


def make_data(examples, seed):
    """A noisy regression task: a random two-layer network plus noise."""
    rng = np.random.RandomState(seed)
    x = rng.randn(examples, FEATURES).astype(np.float32)
    teacher = rng.randn(FEATURES, 1).astype(np.float32)
    y = np.tanh(x @ teacher) + 0.3 * rng.randn(examples, 1).astype(np.float32)
    return x, y


def memory_limited(x, memory_rows):
    """``x``, after a check that runs out of memory above ``memory_rows`` rows."""
    if not memory_rows:
        return x

    def scratch(rows):
        if rows > memory_rows:
            raise MemoryError(f"{rows} rows, over this example's made-up limit of {memory_rows}")
        return np.float32(0)

    used = tf.numpy_function(scratch, [tf.shape(x)[0]], tf.float32, name="scratch")
    used.set_shape([])
    return x + used  # adds 0: the gradients need the scratch, as they need activations


def build_model(seed, memory_rows):
    """Placeholders, an MLP with seeded initial values, its mean loss and the rows fed."""
    rng = np.random.RandomState(seed)
    x = v1.placeholder(tf.float32, [None, FEATURES], name="x")
    y = v1.placeholder(tf.float32, [None, 1], name="y")
    w1 = v1.get_variable(
        "w1", initializer=(rng.randn(FEATURES, HIDDEN) / np.sqrt(FEATURES)).astype(np.float32)
    )
    b1 = v1.get_variable("b1", initializer=np.zeros(HIDDEN, np.float32))
    w2 = v1.get_variable(
        "w2", initializer=(rng.randn(HIDDEN, 1) / np.sqrt(HIDDEN)).astype(np.float32)
    )
    hidden = tf.tanh(tf.matmul(memory_limited(x, memory_rows), w1) + b1)
    loss = tf.reduce_mean((tf.matmul(hidden, w2) - y) ** 2)
    return x, y, loss


def train(mode, data, args):
    """Trains one update per large batch; returns (params, the MemoryFit or None)."""
    features, labels = data
    order = np.random.RandomState(args.seed + 1)
    fit = None
    with tf.Graph().as_default():
        x, y, loss = build_model(args.seed, args.memory_rows if mode == "split to fit" else 0)
        optimizer = v1.train.AdamOptimizer(args.learning_rate)
        if mode == "split to fit":
            # Each micro-batch weighs its rows: the shorter last one too.
            accumulation = tf1_accum.build_accumulation(loss, optimizer, weight=tf.shape(x)[0])
            fit = tf1_accum.MemoryFit(probe_every=args.probe_every)
        else:
            train_op = optimizer.minimize(loss)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for _ in range(args.updates):
                picks = order.randint(0, len(features), size=args.batch)
                batch = {x: features[picks], y: labels[picks]}
                if fit is None:
                    sess.run(train_op, batch)
                else:
                    tf1_accum.run_accumulation(sess, accumulation, batch, memory_fit=fit)
            params = sess.run(v1.trainable_variables())
    return params, fit


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=120, help="rows of each large batch")
    parser.add_argument(
        "--memory-rows",
        type=int,
        default=35,
        help="the largest micro-batch that fits (0: no made-up limit)",
    )
    parser.add_argument("--probe-every", type=int, default=5, help="windows between probes")
    parser.add_argument("--updates", type=int, default=40, help="updates per run")
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument("--examples", type=int, default=4096, help="size of the made-up data set")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    v1.disable_eager_execution()
    data = make_data(args.examples, args.seed)
    print(
        f"Training a {FEATURES}-{HIDDEN}-1 MLP with Adam: {args.updates} updates of "
        f"{args.batch} rows; micro-batches of more than {args.memory_rows or 'any'} rows "
        "run out of memory."
    )
    big, _ = train("big batch", data, args)
    split, fit = train("split to fit", data, args)
    largest = max(float(np.max(np.abs(a - b))) for a, b in zip(split, big))
    print()
    print(f"{'window':>6} {'rows':<9} why")  # rows: the micro-batch size, old -> new
    for change in fit.changes:
        rows = f"{change.old or '-'} -> {change.new}"
        print(f"{change.window:>6} {rows:<9} {change.reason}")
    print(f"\nmicro-batch size in use: {fit.micro_batch_size} rows")
    print(f"after {fit.windows} windows; largest parameter")
    print(f"difference from the big batch: {largest:.3g}")
    return {"fit": fit, "max_param_diff": largest}


if __name__ == "__main__":
    # The memory fit logs each change: warnings for out of memory, info for the rest.
    logging.getLogger("tensorflow").setLevel(logging.INFO)
    main(sys.argv[1:])
