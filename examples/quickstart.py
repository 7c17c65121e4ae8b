"""Quickstart: one model trained three ways, to see what accumulation buys.

1. small batch:  B examples per update (what fits in memory): noisy.
2. accumulated:  N micro-batches of B, one update (tf1_accum).
3. big batch:    N x B examples per update (what you would run with more memory).

The accumulated run makes the same updates as the big-batch run; the table at
the end shows the largest parameter difference between them, and the plot
shows their loss curves on top of each other, with the small-batch curve
beside them. The data is made here, from a fixed seed: nothing is downloaded.

Run:  python examples/quickstart.py   (add --help for the settings)
"""

import argparse
import sys
import time

import _figure
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
    teacher_1 = rng.randn(FEATURES, 16).astype(np.float32)
    teacher_2 = rng.randn(16, 1).astype(np.float32)
    y = np.tanh(x @ teacher_1) @ teacher_2 / 4.0
    y += 0.5 * rng.randn(examples, 1).astype(np.float32)
    return x, y


def build_model(seed):
    """Placeholders, an MLP with seeded initial values, and its mean loss."""
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
    prediction = tf.matmul(tf.tanh(tf.matmul(x, w1) + b1), w2)
    loss = tf.reduce_mean((prediction - y) ** 2)
    return x, y, loss


def train(mode, data, args):
    """Trains for args.updates updates; returns (loss per update, final loss, params)."""
    features, labels = data
    per_update = args.micro_batch if mode == "small batch" else args.micro_batch * args.steps
    order = np.random.RandomState(args.seed + 1)
    with tf.Graph().as_default():
        x, y, loss = build_model(args.seed)
        optimizer = v1.train.AdamOptimizer(args.learning_rate)
        if mode == "accumulated":
            accumulation = tf1_accum.build_accumulation(loss, optimizer)
        else:
            train_op = optimizer.minimize(loss)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            curve = []
            for update in range(args.updates):
                picks = order.randint(0, len(features), size=per_update)
                if mode == "accumulated":
                    feeds = (
                        {x: features[part], y: labels[part]} for part in np.split(picks, args.steps)
                    )
                    losses = tf1_accum.run_accumulation(sess, accumulation, feeds, fetches=loss)
                    curve.append(float(np.mean(losses)))
                else:
                    value, _ = sess.run([loss, train_op], {x: features[picks], y: labels[picks]})
                    curve.append(float(value))
                if (update + 1) % max(1, args.updates // 5) == 0:
                    print(
                        f"  {mode:12s} update {update + 1:4d}/{args.updates}: loss {curve[-1]:.4f}",
                        flush=True,
                    )
            final = float(sess.run(loss, {x: features, y: labels}))
            params = sess.run(v1.trainable_variables())
    return curve, final, params


def plot(curves, args):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[examples]'): no plot written.")
        return
    for path, narrow in ((args.plot, False), (args.narrow_plot, True)):
        if path:
            font = _figure.NARROW_POINTS if narrow else 10
            with plt.rc_context({"font.size": font, "axes.titlesize": "large"}):
                _draw(plt, curves, args, path, narrow)
            print(f"wrote {path}")


def _draw(plt, curves, args, path, narrow):
    import matplotlib.ticker

    # 5.2 x 4 inches for a desktop's column; narrow, for a phone's: 358 px
    # wide, its 12-point text at the size of the page's. The legend sits
    # under the axes, off the curves.
    size = (_figure.NARROW_INCHES, 4.4) if narrow else (5.2, 4.0)
    fig, ax = plt.subplots(figsize=size)
    styles = {
        "small batch": dict(color="tab:gray", alpha=0.6, linewidth=1),
        "big batch": dict(color="tab:blue", linewidth=4, alpha=0.5, zorder=2),
        "accumulated": dict(color="tab:orange", linewidth=1.5, linestyle="--", zorder=3),
    }
    labels = {
        "small batch": f"small batch, B={args.micro_batch}",
        "big batch": f"big batch, {args.steps} x {args.micro_batch}",
        "accumulated": f"accumulated, {args.steps} micro-batches of {args.micro_batch}",
    }
    for mode, curve in curves.items():
        ax.plot(np.arange(1, len(curve) + 1), curve, label=labels[mode], **styles[mode])
    ax.set_xlabel("update")
    ax.set_ylabel("training loss of the update's examples")
    ax.set_yscale("log")
    # Plain numbers on the log axis (0.3, not 3 x 10^-1), a few of them.
    low, high = ax.get_ylim()
    ax.set_yticks([tick for tick in (0.1, 0.15, 0.2, 0.3, 0.4, 0.6, 1, 1.5) if low <= tick <= high])
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    title = "Accumulated training follows the big batch"
    ax.set_title(title.replace(" follows", "\nfollows") if narrow else title)
    _figure.legend_below(fig)
    _figure.save(fig, path, dpi=200)
    plt.close(fig)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--micro-batch", type=int, default=16, help="B, examples per micro-batch")
    parser.add_argument("--steps", type=int, default=8, help="N, micro-batches per update")
    parser.add_argument("--updates", type=int, default=150, help="updates per run")
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument("--examples", type=int, default=4096, help="size of the made-up data set")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default="quickstart.png", help="PNG to write ('' for none)")
    parser.add_argument(
        "--narrow-plot", default="", help="the same plot drawn for a phone's width (default: none)"
    )
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    v1.disable_eager_execution()
    data = make_data(args.examples, args.seed)
    print(
        f"Training a {FEATURES}-{HIDDEN}-1 MLP with Adam for {args.updates} updates, three ways "
        f"(B={args.micro_batch}, N={args.steps}):"
    )
    curves, finals, params = {}, {}, {}
    for mode in ("small batch", "accumulated", "big batch"):
        start = time.perf_counter()
        curves[mode], finals[mode], params[mode] = train(mode, data, args)
        print(f"  {mode} done in {time.perf_counter() - start:.1f} s", flush=True)
    largest = max(
        float(np.max(np.abs(a - b))) for a, b in zip(params["accumulated"], params["big batch"])
    )
    print()
    print(f"{'run':<14}{'examples/update':>16}{'final loss (all data)':>24}")
    for mode in curves:
        per_update = args.micro_batch * (1 if mode == "small batch" else args.steps)
        print(f"{mode:<14}{per_update:>16}{finals[mode]:>24.6f}")
    print(f"\nlargest parameter difference, accumulated vs big batch: {largest:.3g}")
    if args.plot or args.narrow_plot:
        plot(curves, args)
    return {"final_loss": finals, "max_param_diff": largest, "curves": curves}


if __name__ == "__main__":
    main(sys.argv[1:])
