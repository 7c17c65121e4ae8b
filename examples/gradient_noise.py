"""Gradient noise: how many micro-batches should a window hold?

Trains a small regression MLP by accumulation with gradient statistics
(``build_accumulation(..., statistics=True)``). Every window's statistics go
to TensorBoard event files in --logdir (run ``tensorboard --logdir DIR``):
the norms, the estimates of |G|^2 and tr(Sigma), the gradient noise scale
B_simple and its moving average. At the end the script prints the number of
micro-batches at which the window reaches the noise scale, and with --plot
draws the noise scale over training. The data is made here, from a fixed
seed: nothing is downloaded.

Run:  python examples/gradient_noise.py --logdir /tmp/gradient_noise
      (add --help for the settings)
"""

import argparse
import sys

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
    teacher = rng.randn(FEATURES, 16).astype(np.float32)
    y = np.tanh(x @ teacher) @ rng.randn(16, 1).astype(np.float32) / 4.0
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
    loss = tf.reduce_mean((tf.matmul(tf.tanh(tf.matmul(x, w1) + b1), w2) - y) ** 2)
    return x, y, loss


def train(args):
    """Trains; returns the per-window history of the loss and the statistics."""
    features, labels = make_data(args.examples, args.seed)
    order = np.random.RandomState(args.seed + 1)
    history = {"loss": [], "noise_scale": [], "noise_scale_ema": [], "global_norm": []}
    with tf.Graph().as_default():
        x, y, loss = build_model(args.seed)
        step = v1.train.get_or_create_global_step()
        acc = tf1_accum.build_accumulation(
            loss,
            v1.train.AdamOptimizer(args.learning_rate),
            global_step=step,
            statistics=True,
            micro_batch_size=args.micro_batch,
        )
        stats = acc.statistics
        writer = v1.summary.FileWriter(args.logdir)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for update in range(args.updates):
                picks = order.randint(0, len(features), size=args.micro_batch * args.steps)
                losses = []
                for part in np.split(picks, args.steps):
                    _, value = sess.run([acc.accum_op, loss], {x: features[part], y: labels[part]})
                    losses.append(value)
                # The statistics describe the window being applied: fetch them with it.
                _, window, summary = sess.run([acc.apply_op, stats, stats.summary_op])
                writer.add_summary(summary, update + 1)
                history["loss"].append(float(np.mean(losses)))
                for name in ("noise_scale", "noise_scale_ema", "global_norm"):
                    history[name].append(float(getattr(window, name)))
                if (update + 1) % max(1, args.updates // 5) == 0:
                    print(
                        f"  update {update + 1:4d}/{args.updates}: loss {history['loss'][-1]:.4f}, "
                        f"noise scale {window.noise_scale:9.1f} (moving average "
                        f"{window.noise_scale_ema:7.1f})",
                        flush=True,
                    )
        writer.close()
    return history


def plot(history, args, recommended):
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
            sizes = {"font.size": font, "axes.titlesize": font, "legend.fontsize": font}
            if not narrow:
                sizes["legend.fontsize"] = 8
            with plt.rc_context(sizes):
                _draw(plt, history, args, recommended, path, narrow)
            print(f"wrote {path}")


def _draw(plt, history, args, recommended, path, narrow):
    import matplotlib.ticker

    updates = np.arange(1, len(history["loss"]) + 1)
    size = (_figure.NARROW_INCHES, 6.6) if narrow else (5.2, 5)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=size, sharex=True)
    top.plot(updates, history["loss"], color="tab:blue", linewidth=1)
    top.set_ylabel("training loss")
    top.set_yscale("log")
    per_window = np.array(history["noise_scale"])
    shown = np.where(per_window > 0, per_window, np.nan)  # negative estimates: off the log axis
    bottom.plot(
        updates, shown, ".", color="tab:gray", markersize=3, label="noise scale of one window"
    )
    bottom.plot(
        updates, history["noise_scale_ema"], color="tab:orange", linewidth=2, label="moving average"
    )
    window = args.micro_batch * args.steps
    bottom.axhline(
        window,
        color="tab:blue",
        linestyle="--",
        linewidth=1,
        label=f"window: {args.steps} x {args.micro_batch} examples",
    )
    bottom.set_yscale("log")
    # Plain numbers on the log axes (0.3 and 1000, not 3 x 10^-1 and 10^3).
    low, high = top.get_ylim()
    top.set_yticks([tick for tick in (0.1, 0.2, 0.3, 0.4, 0.6, 1, 2) if low <= tick <= high])
    for axes in (top, bottom):
        axes.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        axes.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    bottom.set_ylabel("noise scale (examples)")
    bottom.set_xlabel("update (window)")
    title = f"Gradient noise scale; recommended: {recommended} micro-batches of {args.micro_batch}"
    if narrow:  # the legend under the plots, the title on three lines
        top.set_title(title.replace("; ", "\n").replace(" micro", "\nmicro"))
        _figure.legend_below(fig)
    else:
        bottom.legend(loc="lower right")
        top.set_title(title)
        fig.tight_layout()
    _figure.save(fig, path, dpi=150)
    plt.close(fig)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logdir", required=True, help="directory for TensorBoard event files")
    parser.add_argument("--micro-batch", type=int, default=16, help="B, examples per micro-batch")
    parser.add_argument("--steps", type=int, default=8, help="N, micro-batches per update")
    parser.add_argument("--updates", type=int, default=300, help="updates (windows)")
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument("--examples", type=int, default=4096, help="size of the made-up data set")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default="", help="PNG to write (default: none)")
    parser.add_argument(
        "--narrow-plot", default="", help="the same plot drawn for a phone's width (default: none)"
    )
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    v1.disable_eager_execution()
    print(
        f"Training a {FEATURES}-{HIDDEN}-1 MLP with Adam, N={args.steps} micro-batches of "
        f"B={args.micro_batch}, statistics to {args.logdir}:"
    )
    history = train(args)
    ema = history["noise_scale_ema"][-1]
    try:
        recommended = tf1_accum.recommend_micro_batches(ema, args.micro_batch)
    except ValueError as error:  # no usable estimate (too few windows)
        print(f"no recommendation: {error}")
        recommended = None
    else:
        print(
            f"\ngradient noise scale (moving average): {ema:.1f} examples\n"
            f"recommended: {recommended} micro-batches of {args.micro_batch} "
            f"({recommended * args.micro_batch} examples per update; this run used {args.steps})"
        )
    if (args.plot or args.narrow_plot) and recommended is not None:
        plot(history, args, recommended)
    return {"history": history, "recommended": recommended}


if __name__ == "__main__":
    main(sys.argv[1:])
