"""Peak memory and window time against N: accumulation against one big batch.

For each N, two configurations train the 1.57 M-parameter MLP of
``_models.py`` with Adam, each in its own subprocess so that peaks do not mix:

* accumulate: ``run_accumulation`` over N micro-batches of B examples (fed
  from four arrays, cycled, so the input is the same whatever N), then one
  apply;
* big batch: plain ``minimize`` on one batch of N x B examples (the same
  arrays, concatenated).

Each subprocess builds its graph, initializes the variables, resets its peak
resident set size (``/proc/self/clear_refs``, so that initializers'
temporaries do not count), runs one untimed window, times a few more, and
reports its peak resident set size (``VmHWM``: what stayed resident from
TensorFlow, the graph and the variables, plus the peak of the windows). The
target: accumulating N micro-batches peaks within (peak at N = 1) + 1.2 x the
bytes of the parameters. Each configuration is run ``--repetitions`` times, N
and the two configurations interleaved, and the table shows medians. Plots of
peak memory and window time against N go to ``--plot-dir`` (docs/_static by
default).

With ``--ways``, the peak of each way in (and of the floor, see
``_models.py``) at one N instead, each in its own subprocess, as the same
median over ``--repetitions``, and each way's peak above the helper's; and,
to tell the input pipeline's share from the accumulation's, plain training
(Adam's ``minimize``, one micro-batch per run) fed by feed dicts and by the
``tf.data`` pipeline the dataset loop reads.

Run:  python benchmarks/memory.py            (a few minutes)
      python benchmarks/memory.py --quick    (N = 1, 4, 16, once each)
      python benchmarks/memory.py --ways -n 8 --repetitions 3
"""

import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _bench  # noqa: E402
import _models  # noqa: E402

MODES = ("accumulate", "big batch")
TOLERANCE = 1.2  # parameter bytes allowed above the peak at N = 1


def child(args):
    """Runs one configuration in this process; prints a JSON line."""
    tf = _bench.enter_graph_mode(args.graph_mode)
    import tf1_accum

    v1 = tf.compat.v1
    spec = dict(_models.MODELS["mlp"])
    if args.hidden:
        spec["hidden"] = tuple(args.hidden)
    if args.features:
        spec["features"] = args.features
    n, b = args.child_steps, args.micro_batch
    if args.child in _models.WAYS + PLAIN:
        return way_child(tf, args.child, spec, n, b, args.windows)
    rng = np.random.RandomState(1)
    # A few distinct micro-batches, cycled: the input takes the same memory
    # and no time whatever N (as a streaming input pipeline would).
    pool = [
        (
            rng.randn(b, spec["features"]).astype(np.float32),
            rng.randint(0, spec["classes"], size=b).astype(np.int32),
        )
        for _ in range(4)
    ]

    x = v1.placeholder(tf.float32, [None, spec["features"]])
    y = v1.placeholder(tf.int32, [None])
    loss = _models.make_loss_fn(tf, spec)((x, y))
    opt = v1.train.AdamOptimizer(1e-4)
    if args.child == "accumulate":
        acc = tf1_accum.build_accumulation(loss, opt)

        def window():
            feeds = ({x: pool[i % 4][0], y: pool[i % 4][1]} for i in range(n))
            tf1_accum.run_accumulation(sess, acc, feeds)

    else:
        train_op = opt.minimize(loss)
        parts = [pool[i % 4] for i in range(n)]
        big = {x: np.concatenate([p[0] for p in parts]), y: np.concatenate([p[1] for p in parts])}

        def window():
            sess.run(train_op, big)

    param_bytes = sum(v.shape.num_elements() * v.dtype.size for v in v1.trainable_variables())
    sess = v1.Session(config=_bench.session_config())
    sess.run(v1.global_variables_initializer())
    reset = _bench.reset_peak_rss()
    window()
    times = []
    for _ in range(args.windows):
        start = time.perf_counter()
        window()
        times.append(time.perf_counter() - start)
    print(
        json.dumps(
            {
                "peak": _bench.peak_rss_bytes(),
                "window": statistics.median(times),
                "param_bytes": param_bytes,
                "reset": reset,
            }
        )
    )


PLAIN = ("plain, fed", "plain, dataset-fed")


def plain(tf, spec, n, b, from_dataset):
    """Plain training, one micro-batch per run: the input's share of a peak."""
    v1 = tf.compat.v1
    if from_dataset:
        dataset = _models.micro_batches(tf, spec, n, b)
        batch = v1.data.make_one_shot_iterator(dataset).get_next()
        train_op = _models.adam(tf).minimize(_models.make_loss_fn(tf, spec)(batch))
        return _models.per_micro_batch(train_op, [None] * n)
    loss, feeds = _models.fed_model(tf, spec, n, b)
    return _models.per_micro_batch(_models.adam(tf).minimize(loss), feeds)


def way_child(tf, name, spec, n, b, windows):
    """One way in (or the floor, or plain training) on the MLP; prints its peak."""
    if name in PLAIN:
        window = plain(tf, spec, n, b, name == PLAIN[1])
    else:
        window = _models.ways(tf, spec, n, b)[name][1]()
    sess = tf.compat.v1.Session(config=_bench.session_config())
    sess.run(tf.compat.v1.global_variables_initializer())
    reset = _bench.reset_peak_rss()
    for _ in range(1 + windows):
        window(sess)
    print(json.dumps({"peak": _bench.peak_rss_bytes(), "reset": reset}))


def ways_table(args):
    """Peak of each way in at one N: median over the repetitions, interleaved."""
    n = (args.steps or [8])[-1]
    repetitions = args.repetitions or (1 if args.quick else 3)
    jobs = [
        name
        for rep in range(repetitions)
        for name in (_models.WAYS + PLAIN if rep % 2 == 0 else (_models.WAYS + PLAIN)[::-1])
    ]
    peaks = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [(name, pool.submit(run_child, name, n, args)) for name in jobs]
        for name, future in futures:
            peaks.setdefault(name, []).append(future.result()["peak"])
    medians = {name: statistics.median(values) for name, values in peaks.items()}
    helper = medians["helper"]
    rows = [
        [
            name,
            medians[name] / 2**20,
            (medians[name] - helper) / 2**20,
            "{:.1f}-{:.1f}".format(min(peaks[name]) / 2**20, max(peaks[name]) / 2**20),
        ]
        for name in _models.WAYS + PLAIN
    ]
    print(
        f"# MLP, N={n}, B={args.micro_batch}, Adam, {repetitions} repetitions, graph mode "
        f"{args.graph_mode}: peak resident set size after initialization, median"
    )
    print(_bench.format_table(["way", "peak MB", "above helper MB", "range MB"], rows))
    return rows


def run_child(mode, n, args):
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        mode,
        "--child-steps",
        str(n),
        "--micro-batch",
        str(args.micro_batch),
        "--windows",
        str(args.windows),
        "--graph-mode",
        args.graph_mode,
    ]
    if args.hidden:
        command += ["--hidden", *map(str, args.hidden)]
    if args.features:
        command += ["--features", str(args.features)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"{mode}, N={n} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def plot(results, steps, param_bytes, peak1, plot_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(plot_dir, exist_ok=True)
    paths = []
    for key, ylabel, filename in (
        ("peak", "peak resident memory (MB)", "memory_peak.png"),
        ("window", "window time (s)", "memory_window_time.png"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        for mode, marker in zip(MODES, ("o", "s")):
            values = [results[(mode, n)][key] for n in steps]
            if key == "peak":
                values = [v / 2**20 for v in values]
            ax.plot(steps, values, marker=marker, label=mode)
        if key == "peak":
            ax.axhline(
                (peak1 + TOLERANCE * param_bytes) / 2**20,
                color="grey",
                linestyle="--",
                label=f"target: peak at N=1 + {TOLERANCE} x parameter bytes",
            )
        if key == "peak":
            ax.set_xscale("log", base=2)
        else:  # linear axes: time linear in N is a straight line
            ax.set_ylim(bottom=0)
        ax.set_xlabel("N (micro-batches per window; big batch: N x B examples)")
        ax.set_ylabel(ylabel)
        ax.legend()
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        path = os.path.join(plot_dir, filename)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv=None):
    parser = _bench.parser(__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 1, 4, 16, once each")
    parser.add_argument("-n", "--steps", type=int, nargs="+", default=None)
    parser.add_argument("-b", "--micro-batch", type=int, default=32)
    parser.add_argument("--repetitions", type=int, default=None)
    parser.add_argument("--windows", type=int, default=3, help="timed windows per subprocess")
    parser.add_argument("--jobs", type=int, default=1, help="subprocesses at once (1: timing)")
    parser.add_argument("--hidden", type=int, nargs="+", default=None)
    parser.add_argument("--features", type=int, default=None)
    parser.add_argument("--plot-dir", default=os.path.join(HERE, "..", "docs", "_static"))
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--ways", action="store_true", help="peak of each way in at one N")
    parser.add_argument("--child", choices=MODES + _models.WAYS + PLAIN, help=argparse_hidden())
    parser.add_argument("--child-steps", type=int, help=argparse_hidden())
    _bench.graph_mode_argument(parser)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    if args.ways:
        return ways_table(args)

    steps = args.steps or ([1, 4, 16] if args.quick else [1, 2, 4, 8, 16, 32, 64])
    if 1 not in steps:
        steps = [1, *steps]
    repetitions = args.repetitions or (1 if args.quick else 3)
    # Interleaved: each repetition walks every N, alternating the two modes.
    jobs = [
        (mode, n)
        for rep in range(repetitions)
        for i, n in enumerate(steps)
        for mode in (MODES if (rep + i) % 2 == 0 else MODES[::-1])
    ]
    samples = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [(job, pool.submit(run_child, *job, args)) for job in jobs]
        for job, future in futures:
            samples.setdefault(job, []).append(future.result())
    results = {
        job: {
            key: statistics.median(s[key] for s in runs)
            for key in ("peak", "window", "param_bytes", "reset")
        }
        for job, runs in samples.items()
    }
    param_bytes = results[("accumulate", 1)]["param_bytes"]
    peak1 = results[("accumulate", 1)]["peak"]
    headers = [
        "N",
        "accum peak MB",
        "big peak MB",
        "accum growth / param bytes",
        "accum / big peak",
        "accum s/window",
        "big s/window",
        "accum / big time",
        "target",
        "met",
    ]
    rows = []
    for n in steps:
        acc, big = results[("accumulate", n)], results[("big batch", n)]
        growth = (acc["peak"] - peak1) / param_bytes
        rows.append(
            [
                n,
                acc["peak"] / 2**20,
                big["peak"] / 2**20,
                growth,
                acc["peak"] / big["peak"],
                acc["window"],
                big["window"],
                acc["window"] / big["window"],
                f"growth <= {TOLERANCE}",
                "yes" if growth <= TOLERANCE else "NO",
            ]
        )
    print(
        f"# MLP of {param_bytes / 4:,.0f} parameters ({param_bytes / 2**20:.1f} MB), "
        f"B={args.micro_batch}, Adam, {repetitions} repetitions, graph mode {args.graph_mode}; "
        "growth = (accum peak - accum peak at N=1) / parameter bytes; peaks "
        + (
            "after initialization"
            if all(r["reset"] for r in results.values())
            else "of the whole process (VmHWM could not be reset)"
        )
    )
    print(_bench.format_table(headers, rows))
    if not args.no_plot:
        for path in plot(results, steps, param_bytes, peak1, args.plot_dir):
            print(f"# plot: {os.path.abspath(path)}")
    return rows


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
