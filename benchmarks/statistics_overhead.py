"""What statistics=True costs: window time with and without gradient statistics.

Builds the same model twice, once with ``build_accumulation(...,
statistics=True)`` and once without, and times whole windows (N runs of
accum_op, then apply_op, fetching the statistics with it) alternately, in one
process. Prints the median window time of each and their ratio, for a dense
MLP and for a model with an embedding table (sparse gradients, whose
micro-batch norms need their repeated rows summed).

Run:  python benchmarks/statistics_overhead.py   (add --help for the settings)
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import tf1_accum

v1 = tf.compat.v1


def build(sparse, statistics, args):
    """Returns (graph, session, window function) for one model."""
    graph = tf.Graph()
    rng = np.random.RandomState(0)
    with graph.as_default():
        if sparse:
            ids = v1.placeholder(tf.int32, [None, 8])
            table = v1.get_variable(
                "embedding", initializer=0.1 * rng.randn(args.vocab, args.width).astype(np.float32)
            )
            features = tf.reduce_mean(tf.nn.embedding_lookup(table, ids), axis=1)
            inputs = ids
        else:
            inputs = v1.placeholder(tf.float32, [None, args.width])
            features = inputs
        y = v1.placeholder(tf.float32, [None, 1])
        hidden = features
        for layer in range(args.layers):
            w = v1.get_variable(
                f"w{layer}",
                initializer=(rng.randn(args.width, args.width) / np.sqrt(args.width)).astype(
                    np.float32
                ),
            )
            hidden = tf.nn.relu(tf.matmul(hidden, w))
        out = v1.get_variable(
            "out", initializer=(rng.randn(args.width, 1) / np.sqrt(args.width)).astype(np.float32)
        )
        loss = tf.reduce_mean((tf.matmul(hidden, out) - y) ** 2)
        opt = v1.train.MomentumOptimizer(0.01, 0.9)
        if statistics:
            acc = tf1_accum.build_accumulation(
                loss, opt, statistics=True, micro_batch_size=args.micro_batch
            )
            apply_fetch = (acc.apply_op, acc.statistics)
        else:
            acc = tf1_accum.build_accumulation(loss, opt)
            apply_fetch = acc.apply_op
        sess = v1.Session(graph=graph)
        sess.run(v1.global_variables_initializer())
        # A window of NaN or Inf would time the non-finite path: none may be skipped.
        healthy = tf.logical_and(
            tf.equal(acc.skipped_windows, 0),
            tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in v1.trainable_variables()]),
        )

    feeds = []
    for _ in range(args.steps):
        if sparse:
            x = rng.randint(0, args.vocab, size=(args.micro_batch, 8)).astype(np.int32)
        else:
            x = rng.randn(args.micro_batch, args.width).astype(np.float32)
        feeds.append({inputs: x, y: rng.randn(args.micro_batch, 1).astype(np.float32)})

    def window():
        for feed in feeds:
            sess.run(acc.accum_op, feed)
        sess.run(apply_fetch)

    return sess, window, lambda: bool(sess.run(healthy))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="micro-batches per window")
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=5000)
    parser.add_argument("--windows", type=int, default=20, help="timed windows per setting")
    args = parser.parse_args(argv)
    v1.disable_eager_execution()

    print(
        f"N = {args.steps} micro-batches of {args.micro_batch}, {args.layers} layers of "
        f"{args.width}; median of {args.windows} windows, measured alternately"
    )
    print(f"{'model':<10}{'without (ms)':>14}{'with (ms)':>12}{'ratio':>8}")
    rows = {}
    for sparse in (False, True):
        runs = {flag: build(sparse, flag, args) for flag in (False, True)}
        times = {False: [], True: []}
        for _, window, _ in runs.values():
            window()  # warm-up
        for _ in range(args.windows):
            for flag, (_, window, _) in runs.items():
                start = time.perf_counter()
                window()
                times[flag].append(time.perf_counter() - start)
        for flag, (sess, _, healthy) in runs.items():
            if not healthy():
                raise SystemExit(
                    f"the {'sparse' if sparse else 'dense'} model "
                    f"{'with' if flag else 'without'} statistics went non-finite: the "
                    "times would be of skipped windows. Lower the learning rate."
                )
            sess.close()
        without, with_ = (1e3 * float(np.median(times[f])) for f in (False, True))
        name = "sparse" if sparse else "dense"
        rows[name] = (without, with_, with_ / without)
        print(f"{name:<10}{without:>14.2f}{with_:>12.2f}{with_ / without:>8.3f}")
    return rows


if __name__ == "__main__":
    main()
