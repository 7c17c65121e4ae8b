"""Window time of every way in beside the installable peers and the floor.

The peers are the two accumulating optimizers that install from the registry
and still run on current TensorFlow, each used as its documentation and its
own training loop use it (``pip install -e .[bench]`` installs both):

tensorpack
    ``tensorpack.tfutils.optimizer.AccumGradOptimizer(AdamOptimizer, niter=N)``;
    its ``minimize`` train op is run N times per window.
gpt-2-simple
    ``gpt_2_simple.src.accumulate.AccumulatingOptimizer(AdamOptimizer,
    var_list)``, driven as ``gpt_2_simple.finetune`` drives it: one run of
    ``reset()``, N runs of ``compute_gradients(loss)``, one run of
    ``apply_gradients()``.

A peer that is not installed is left out, with a line that says so:
gpt-2-simple 0.8.1 requires TensorFlow 2.5.1 or later, so on TensorFlow 1.15
the table has tensorpack alone.

Both apply the sum of the window's gradients, not the mean, and check
nothing; the ways in apply the mean and skip non-finite windows
(``skip_nonfinite=True``, the default). Only time is measured here, for the
same work: every way trains the same model, from the same seeded initial
values, on the same N micro-batches per window (the same NumPy arrays in
feed dicts, or the same arrays through ``tf.data`` for the dataset loop).
The "applies/window" column counts the updates each way really made (from
Adam's ``beta2_power``), so that a way that skipped or doubled updates shows.

The floor is the least work any accumulation does:
N forward and backward passes, N ``assign_add`` of the gradients into
accumulators, and one Adam apply of their sum, in the run of the last
micro-batch (N runs, no reset, no counter, no check), built in ``_models.py``
with the model the memory and overhead benchmarks share.

Every way builds in its own graph and session, all in this one process; the
repetitions are interleaved (each runs every way once, in an order rotated
from the previous one) and the table shows medians. Ratios are to the faster
peer (by median) and to the floor; "IQR" is the middle half of the
per-repetition ratios to the faster peer, each taken within one repetition.
The whole measurement is made ``--runs`` times (3; 1 with ``--quick``), with
new graphs and sessions each time, and the last table gives the median of
the runs' ratios and their range; the targets are judged on those medians.

``--lock-cost`` and ``--pieces`` add rows built with parts of the window's
work left out (the lock; then the divide and the non-finite check): what
each part costs. They are measurements, not ways to use.

Run:  python benchmarks/peers.py                      (a few minutes)
      python benchmarks/peers.py --mode resource --plot peers.png
      python benchmarks/peers.py --lock-cost --pieces  (what each part costs)
      python benchmarks/peers.py --quick               (a smoke run: noisy)
"""

import dataclasses
import math
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench
import _models

MODELS = _models.MODELS
# The peers installed here (gpt-2-simple does not install beside TensorFlow 1.15).
PEERS = _models.installed_peers()
WAYS = _models.WAYS[:-1] + PEERS + ("floor",)

# Bounds on (time / time of the faster peer), per model.
TARGETS = {
    "mlp": {
        "helper": 1.00,
        "fused helper": 0.98,
        "AccumulationOptimizer": 1.02,
        "dataset loop": 0.97,
    },
    "tiny": {"fused helper": 0.95, "dataset loop": 0.65},
}

BETA2 = _models.BETA2
parameter_count = _models.parameter_count


class Way:
    """One way of running a window, in its own graph and session."""

    def __init__(self, tf, name, runs, build):
        self.name = name
        self.runs = runs
        self.windows = 0
        self.graph = tf.Graph()
        with self.graph.as_default():
            window = build()
            self.sess = tf.compat.v1.Session(config=_bench.session_config())
            self.sess.run(tf.compat.v1.global_variables_initializer())
            (self._beta2_power,) = [
                v
                for v in tf.compat.v1.global_variables()
                if v.op.name.split("/")[-1] == "beta2_power"
            ]
        self._window = window

    def __call__(self):
        self._window(self.sess)
        self.windows += 1

    def applies(self):
        """Adam updates made so far, read from its ``beta2_power``."""
        power = float(self.sess.run(self._beta2_power))
        return round(math.log(power) / math.log(BETA2)) - 1

    def close(self):
        self.sess.close()


def build_ways(tf, spec, n, b, names=WAYS):
    builders = {**_models.ways(tf, spec, n, b), **_models.peer_ways(tf, spec, n, b)}
    for label, (way, pieces) in WITHOUT.items():
        runs, build = builders[way]
        builders[label] = (runs, _without(build, pieces))
    return [Way(tf, name, *builders[name]) for name in names]


# Rows built with parts of a way's work left out: {row: (way, parts)}. None
# of them is a way to use: without the lock, threads may lose micro-batches;
# without the divide, the sum is applied; without the check, a NaN window is
# applied.
# --lock-cost: the lock alone.
LOCK_COST = {
    way + ", no lock": (way, ("lock",)) for way in ("fused helper", "AccumulationOptimizer")
}
# --pieces: the fused helper's exact work left out one more part at a time,
# then the helper and AccumulationOptimizer without all of it (minimize
# scales the loss by 1 / N: it has no divide to leave out). The window has no
# reset pass to leave out: its first add assigns.
ALL_PIECES = ("lock", "divide", "check")
PIECES = {
    "fused helper, no lock": ("fused helper", ALL_PIECES[:1]),
    "fused, no lock/divide": ("fused helper", ALL_PIECES[:2]),
    "fused, no lock/divide/check": ("fused helper", ALL_PIECES),
    "helper, no lock/divide/check": ("helper", ALL_PIECES),
    "AccumulationOptimizer, no lock/check": ("AccumulationOptimizer", ("lock", "check")),
}
WITHOUT = {**LOCK_COST, **PIECES}


def _way_of(row):
    """The way a row measures: itself, or the way it was built from with parts left out."""
    return WITHOUT.get(row, (row,))[0]


def _without(build, pieces):
    """``build`` with ``pieces`` of the window's work left out (see `PIECES`).

    The window's classes are patched while ``build`` runs, then restored:
    "lock" builds no mutex lock; "divide" hands the optimizer the sum, not
    the mean; "check" takes no norm and applies every window, outside any
    conditional.
    """

    def built():
        import tensorflow as tf

        from tf1_accum import _window

        def exclusive(self, make, name=None):
            done, other = make()
            return (tf.group(done, name=name) if isinstance(done, tf.Operation) else done), other

        finish = _window._VariableAccumulator.finish

        def summed(self, total, denominator, *rest):
            return finish(self, total, None, *rest)

        init = _window.Window.__init__

        def applying_every_window(self, pairs, options, *args, **kwargs):
            options = dataclasses.replace(options, skip_nonfinite=False)
            init(self, pairs, options, *args, **kwargs)

        def no_norms(values):
            return [tf.constant(0.0, tf.float64) for _ in values]

        patches = {
            "lock": [(_window.Window, "exclusive", exclusive)],
            "divide": [(_window._VariableAccumulator, "finish", summed)],
            "check": [
                (_window, "square_norms", no_norms),
                (_window.Window, "__init__", applying_every_window),
            ],
        }
        saved = []
        try:
            for piece in pieces:
                for owner, attribute, replacement in patches[piece]:
                    saved.append((owner, attribute, owner.__dict__[attribute]))
                    setattr(owner, attribute, replacement)
            return build()
        finally:
            for owner, attribute, original in reversed(saved):
                setattr(owner, attribute, original)

    return built


def interleaved_samples(ways, repetitions, warmup, inner):
    """{name: [seconds per window, one per repetition]}, rotated order."""
    for way in ways:
        for _ in range(warmup):
            way()
    samples = {way.name: [] for way in ways}
    for rep in range(repetitions):
        shift = rep % len(ways)
        for way in ways[shift:] + ways[:shift]:
            start = time.perf_counter()
            for _ in range(inner):
                way()
            samples[way.name].append((time.perf_counter() - start) / inner)
    return samples


def quartiles(values):
    """The first and third quartiles, interpolated between the closest values."""
    q1, q3 = np.percentile(values, [25, 75])
    return float(q1), float(q3)


def measure(tf, model, n, b, repetitions, warmup, inner, names=WAYS):
    """One run on one model: a dict of results per way."""
    ways = build_ways(tf, MODELS[model], n, b, names)
    try:
        samples = interleaved_samples(ways, repetitions, warmup, inner)
        applies = {way.name: way.applies() / way.windows for way in ways}
    finally:
        for way in ways:
            way.close()
    medians = {name: statistics.median(values) for name, values in samples.items()}
    peer = min(PEERS, key=medians.get)
    results = {}
    for way in ways:
        per_rep = [t / p for t, p in zip(samples[way.name], samples[peer])]
        results[way.name] = dict(
            runs=way.runs,
            ms=medians[way.name] * 1e3,
            peer=medians[way.name] / medians[peer],
            iqr=quartiles(per_rep),
            floor=medians[way.name] / medians["floor"],
            applies=applies[way.name],
        )
    return peer, results


def verdict(model, name, ratio):
    bound = TARGETS[model].get(name)
    if bound is None:
        return "-", "-"
    return f"<= {bound:.2f}", "yes" if ratio <= bound else "NO"


RUN_HEADERS = [
    "model",
    "way",
    "runs",
    "ms/window",
    "/peer",
    "IQR /peer",
    "/floor",
    "applies/window",
    "target",
    "met",
]
SUMMARY_HEADERS = [
    "model",
    "way",
    "/peer (median)",
    "/peer range",
    "/floor (median)",
    "/floor range",
    "target",
    "met",
]


def run_rows(model, peer, results):
    rows = []
    for name, r in results.items():
        label = f"{name} (faster peer)" if name == peer else name
        target, met = verdict(model, name, r["peer"])
        rows.append(
            [
                model,
                label,
                r["runs"],
                r["ms"],
                r["peer"],
                f"{r['iqr'][0]:.3f}-{r['iqr'][1]:.3f}",
                r["floor"],
                f"{r['applies']:.2f}",
                target,
                met,
            ]
        )
    return rows


def summarize(all_runs):
    """Median and range over runs of each way's ratios: {model: {way: ...}}."""
    summary = {}
    for model in all_runs[0]:
        summary[model] = {}
        for name in all_runs[0][model][1]:
            to_peer = [run[model][1][name]["peer"] for run in all_runs]
            to_floor = [run[model][1][name]["floor"] for run in all_runs]
            summary[model][name] = dict(
                peer=statistics.median(to_peer),
                peer_range=(min(to_peer), max(to_peer)),
                floor=statistics.median(to_floor),
                floor_range=(min(to_floor), max(to_floor)),
            )
    return summary


def summary_rows(summary):
    rows = []
    for model, ways in summary.items():
        for name, s in ways.items():
            target, met = verdict(model, name, s["peer"])
            rows.append(
                [
                    model,
                    name,
                    s["peer"],
                    "{:.3f}-{:.3f}".format(*s["peer_range"]),
                    s["floor"],
                    "{:.3f}-{:.3f}".format(*s["floor_range"]),
                    target,
                    met,
                ]
            )
    return rows


def plot(summary, path, title):
    """Draws each model's ratios to the faster peer, one panel a model, stacked.

    7.4 inches wide at 200 dpi: the docs show the image at their column's
    width (about 740 px), where its 10-point text reads at its printed size.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    models = list(summary)
    rows = [len(summary[model]) for model in models]
    fig, axes = plt.subplots(
        len(models),
        1,
        figsize=(7.4, 1.6 + 0.27 * sum(rows) + 0.9 * len(models)),
        gridspec_kw={"height_ratios": rows},
        squeeze=False,
        layout="constrained",
    )
    for ax, model in zip(axes[:, 0], models):
        names = list(summary[model])
        values = [summary[model][name]["peer"] for name in names]
        low = [v - summary[model][name]["peer_range"][0] for name, v in zip(names, values)]
        high = [summary[model][name]["peer_range"][1] - v for name, v in zip(names, values)]
        y = np.arange(len(names))
        # Points, not bars: the ratios differ by percents, which bars from 0 hide.
        for i, name in enumerate(names):
            way = _way_of(name)
            if name in PEERS or name == "floor":
                color, face = "tab:gray", "tab:gray"
            elif way != name:  # built with parts left out: hollow
                color, face = "tab:blue", "white"
            else:
                color, face = "tab:blue", "tab:blue"
            ax.errorbar(
                values[i],
                i,
                xerr=[[low[i]], [high[i]]],
                fmt="o",
                markersize=6,
                capsize=4,
                color=color,
                markerfacecolor=face,
            )
            bound = TARGETS[model].get(way)
            if bound is not None:
                # A row built with parts left out shows its way's target, dashed.
                style = "-" if way == name else (0, (2, 1.5))
                ax.plot(
                    [bound, bound],
                    [i - 0.4, i + 0.4],
                    color="tab:red",
                    linewidth=2,
                    linestyle=style,
                )
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.grid(axis="x", alpha=0.3)
        ax.set_yticks(y)
        ax.set_yticklabels(names)
        ax.set_ylim(len(names) - 0.5, -0.5)
        ax.tick_params(labelsize=9)
        ax.set_xlabel("window time / the faster peer's", fontsize=10)
        ax.set_title(f"{model}: {parameter_count(MODELS[model]):,} parameters", fontsize=11)
    key = [
        Line2D([], [], color="tab:blue", marker="o", linestyle="", label="way in"),
        Line2D(
            [],
            [],
            color="tab:blue",
            marker="o",
            markerfacecolor="white",
            linestyle="",
            label="built with parts left out",
        ),
        Line2D([], [], color="tab:gray", marker="o", linestyle="", label="peer, floor"),
        Line2D([], [], color="tab:red", linewidth=2, label="target"),
        Line2D(
            [], [], color="tab:red", linewidth=2, linestyle=(0, (2, 1.5)), label="its way's target"
        ),
    ]
    fig.suptitle(title, fontsize=10)
    try:  # matplotlib 3.7 on: the layout makes room under the panels
        fig.legend(handles=key, loc="outside lower center", ncol=5, fontsize=8.5, frameon=False)
        fig.savefig(path, dpi=200)
    except ValueError:  # before (3.5 is the last for Python 3.7): the image grows to hold it
        fig.legend(
            handles=key,
            loc="upper center",
            bbox_to_anchor=(0.5, 0.0),
            ncol=3,
            fontsize=8.5,
            frameon=False,
        )
        fig.savefig(path, dpi=200, bbox_inches="tight")
    plt.close(fig)


def main(argv=None):
    parser = _bench.parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--mode",
        "--graph-mode",
        dest="mode",
        choices=("v1", "resource"),
        default="v1",
        help="v1: disable_v2_behavior() (reference variables, the default); "
        "resource: disable_eager_execution() only (resource variables)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: seconds, noisy")
    parser.add_argument(
        "--lock-cost",
        action="store_true",
        help="also time the fused helper and AccumulationOptimizer built without the "
        "window's mutex (unsafe with threads): what the lock costs",
    )
    parser.add_argument(
        "--pieces",
        action="store_true",
        help="also time the fused helper built without its lock, then also without the "
        "divide and the non-finite check, one more at a time, and the helper "
        "and AccumulationOptimizer without all of them (not ways to use): what each piece "
        "of their exact work costs",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=None,
        help="how many times to make the whole measurement (3; 1 with --quick)",
    )
    _models.add_model_arguments(parser)
    parser.add_argument(
        "--plot",
        metavar="PATH",
        default=None,
        help="write a chart (PNG) of the ratios to the faster peer",
    )
    args = parser.parse_args(argv)
    _models.use_model_arguments(args)
    if args.runs is None:
        args.runs = 1 if args.quick else 3
    missing = _models.missing_peers()
    if not PEERS:
        parser.error("no peer is installed: " + "; ".join(missing))
    tf = _bench.enter_graph_mode(args.mode)

    if missing:
        print("# left out, not installed: " + "; ".join(missing), flush=True)
    print(
        "# Peers apply the sum of the window's gradients and check nothing; the ways in "
        "apply the mean and skip non-finite windows. Correctness is not measured here: "
        "every way runs the same micro-batches per window, and only time is compared.",
        flush=True,
    )
    all_runs = []
    for run in range(args.runs):
        results = {}
        rows = []
        for model in args.models:
            reps = args.repetitions or (3 if args.quick else (31 if model == "mlp" else 21))
            inner = (1 if args.quick else 3) if model == "mlp" else (3 if args.quick else 30)
            warmup = 1 if args.quick else 3
            names = WAYS + (tuple(LOCK_COST) if args.lock_cost else ())
            if args.pieces:
                names += tuple(label for label in PIECES if label not in names)
            peer, res = measure(tf, model, args.steps, args.micro_batch, reps, warmup, inner, names)
            results[model] = (peer, res)
            print(
                f"# run {run + 1}/{args.runs}, {model}: "
                f"{parameter_count(MODELS[model]):,} parameters, N={args.steps}, "
                f"B={args.micro_batch}, Adam, float32, {reps} repetitions x {inner} windows, "
                f"graph mode {args.mode}; faster peer: {peer}",
                flush=True,
            )
            rows += run_rows(model, peer, res)
        print(_bench.format_table(RUN_HEADERS, rows), flush=True)
        all_runs.append(results)
    summary = summarize(all_runs)
    if args.runs > 1:
        print(f"# summary of {args.runs} runs: median and range of each run's ratio")
        print(_bench.format_table(SUMMARY_HEADERS, summary_rows(summary)))
    if args.plot:
        plot(
            summary,
            args.plot,
            f"N={args.steps}, B={args.micro_batch}, Adam, graph mode {args.mode}; "
            f"median of {args.runs} run(s), whiskers: their range",
        )
    return all_runs, summary


if __name__ == "__main__":
    main()
