"""Peak memory of accumulation, read from TensorFlow, in parameter bytes.

Each configuration runs in a subprocess of its own (its peak mixes with no
other): it builds its graph, initializes the variables, runs one window
untraced, then traces ``--windows`` more with
``RunOptions(trace_level=FULL_TRACE)``. Two peaks come from the traces, in
units of P, the bytes of the trainable parameters, above plain training of
one micro-batch of B (so that a figure carries from this model to a larger
one):

* exact: the bytes of every variable of the graph and of the constants that
  the kernels of every run keep (from the runs' partition graphs), plus the
  most bytes a traced run holds at once of the tensors it allocates and
  releases (the allocation records, in time order). It counts what the
  program holds and nothing else; the targets are judged on it.
* allocator: the largest ``allocator_bytes_in_use`` that any node of those
  runs reports. It also holds the allocator's own slack (a freed block
  reused for a smaller tensor counts whole), which the order of
  allocations sets, and Grappler's temporary tensors and the executor's
  scheduling change that order at random: it moves by up to a parameter
  copy from process to process, in plain training too. TensorFlow 1.15's
  CPU allocator keeps no statistics: there this figure comes from a second
  process with its BFC allocator (``TF_CPU_ALLOCATOR_USE_BFC=true``), whose
  records, of the blocks it hands out, would overstate the exact figure.

The process's resident set moves by more than either.

The ways table (the default) measures, at one N and B on the 1.57 M-parameter
MLP of ``_models.py`` with Adam:

* plain training of one micro-batch of B per run (the reference), of one
  batch of N x B, and of B drawn from the ``tf.data`` pipeline that the
  dataset loop reads (the dataset loop is measured above this one, so that
  its input pipeline's share does not count as accumulation's);
* every way in with default options, with ``clip_norm=``, with
  ``statistics=True`` and with ``skip_nonfinite=False``, and the floor (N
  adds and one apply, nothing else);
* the two accumulating peers (the ``bench`` extra), those installed
  (gpt-2-simple does not install beside TensorFlow 1.15);
* the helper and plain training on an embedding model, whose gradients are
  sparse, with Adagrad (which updates only the rows it is given):
  accumulation adds its accumulators, not a dense copy of the table.

Each configuration runs ``--repetitions`` times, and the table shows the
largest of each peak, the least of the allocator's (above the least of its
reference) and the allocator's spread, for each graph mode of
``--graph-modes``. Targets: every way in at most plain + 1.15 P, with an
option at most + 1.30 P.

``--sweep`` draws the picture users look for instead: peak memory against the
effective batch N x B on a model whose activations dominate (``wide`` in
``_models.py``, B = 512), for one batch of N x B, for each way in and for
the peers, to ``--plot`` (docs/_static/memory_sweep.png by default).

Run:  python benchmarks/memory.py                     (both graph modes, ~15 minutes)
      python benchmarks/memory.py --quick             (v1, once each)
      python benchmarks/memory.py --sweep             (the plot, ~10 minutes)
"""

import concurrent.futures
import json
import os
import subprocess
import sys
import textwrap

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _bench  # noqa: E402
import _models  # noqa: E402

TARGET = 1.15  # P above plain training of B, default options
TARGET_OPTIONS = 1.30  # with an option
OPTIONS = {
    "": {},
    ", clip": {"clip_norm": 1.0},
    ", statistics": {"statistics": True, "micro_batch_size": 32},
    ", skip_nonfinite=False": {"skip_nonfinite": False},
}
WAYS = _models.WAYS[:-1]
PLAIN_B, PLAIN_NB, PLAIN_DATASET = "plain, B", "plain, N x B", "plain, B from tf.data"
PEERS = tuple(_models.PEERS)
SPARSE_PLAIN, SPARSE_HELPER = "embedding: plain, B", "embedding: helper"
# A measurement device, not a way to use: the optimizer's own copy of the rows
# it is given (its deduplication) left out, to show what accumulation adds.
SPARSE_NO_DEDUP = "embedding: helper, optimizer's deduplication left out"
CONFIGS = (
    (PLAIN_B, PLAIN_NB, PLAIN_DATASET)
    + tuple(way + suffix for suffix in OPTIONS for way in WAYS)
    + ("floor",)
    + PEERS
    + (SPARSE_PLAIN, SPARSE_HELPER, SPARSE_NO_DEDUP)
)
EMBEDDING = dict(vocabulary=40000, width=40, ids=16, classes=10)


class TracedSession:
    """A session whose runs are traced.

    ``peak`` is the largest ``allocator_bytes_in_use`` seen. ``transient`` is
    the most bytes a traced run held at once of the tensors it allocated and
    released again, from the allocation records (requested sizes, in time
    order). A buffer a run allocates and keeps (a gradient a variable adopts
    on assign, replacing a buffer of the same size that the records of that
    run cannot show being released) is left out. ``constants`` is the bytes
    of the constants that the kernels of every run so far keep for the
    session's life, from each run's partition graphs.
    """

    def __init__(self, sess, tf):
        self.sess = sess
        self.tf = tf
        self.tracing = False
        self.peak = 0
        self.transient = 0
        self._graphs = {}

    @property
    def constants(self):
        return sum(self._graphs.values())

    def run(self, fetches, feed_dict=None, **kwargs):
        v1 = self.tf.compat.v1
        metadata = v1.RunMetadata()
        options = v1.RunOptions(output_partition_graphs=True)
        if self.tracing:
            options.trace_level = v1.RunOptions.FULL_TRACE
        result = self.sess.run(fetches, feed_dict, options=options, run_metadata=metadata)
        for graph in metadata.partition_graphs:
            key = graph.SerializeToString(deterministic=True)
            if key not in self._graphs:
                self._graphs[key] = _constant_bytes(self.tf, graph)
        if self.tracing:
            self._read(metadata)
        return result

    def _read(self, metadata):
        records = []
        for device in metadata.step_stats.dev_stats:
            for node in device.node_stats:
                for memory in node.memory:
                    self.peak = max(self.peak, memory.allocator_bytes_in_use)
                    allocated = sum(r.alloc_bytes for r in memory.allocation_records)
                    # A node's allocations that are all released again
                    # within the run sum to zero.
                    if allocated == 0:
                        records += [
                            (r.alloc_micros, r.alloc_bytes) for r in memory.allocation_records
                        ]
        live = 0
        for _, change in sorted(records):
            live += change
            self.transient = max(self.transient, live)

    def __getattr__(self, name):
        return getattr(self.sess, name)


def _constant_bytes(tf, graph):
    """Bytes of the constants in one partition graph (their kernels keep them)."""
    total = 0
    for node in graph.node:
        if node.op in ("Const", "HostConst"):
            tensor = node.attr["value"].tensor
            count = int(np.prod([d.size for d in tensor.tensor_shape.dim] or [1]))
            total += count * tf.dtypes.as_dtype(tensor.dtype).size
    return total


def embedding_data(n, b):
    """The embedding model's initial values and its window of N micro-batches (ids, labels)."""
    e = EMBEDDING
    rng = np.random.RandomState(1)
    table = rng.randn(e["vocabulary"], e["width"]).astype(np.float32)
    w = rng.randn(e["width"], e["classes"]).astype(np.float32)
    batches = [
        (
            rng.randint(0, e["vocabulary"], size=(b, e["ids"])).astype(np.int32),
            rng.randint(0, e["classes"], size=b).astype(np.int32),
        )
        for _ in range(n)
    ]
    return table, w, batches


def embedding_model(tf, n, b):
    """An embedding table (most of the parameters) and a dense layer: sparse gradients."""
    v1 = tf.compat.v1
    e = EMBEDDING
    table_value, w_value, batches = embedding_data(n, b)
    ids = v1.placeholder(tf.int32, [None, e["ids"]])
    labels = v1.placeholder(tf.int32, [None])
    table = v1.get_variable("table", initializer=table_value)
    w = v1.get_variable("w", initializer=w_value)
    h = tf.reduce_mean(tf.nn.embedding_lookup(table, ids), axis=1)
    loss = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=tf.matmul(h, w))
    )
    return loss, [{ids: i, labels: y} for i, y in batches]


def sparse_bounds(n, b, param_bytes):
    """The sparse rows' targets in P: what accumulation may add, and with the optimizer's copy.

    Accumulation adds its own state (an accumulator per variable, P, and a
    float per table row marking the rows a window touched) and the window's
    touched rows, gathered for the optimizer. The optimizer then copies the
    rows it is given once more (``_apply_sparse_duplicate_indices`` sums
    duplicate indices into a new tensor, even when there are none), as it
    does in plain training for the rows of its batch.
    """
    e = EMBEDDING
    _, _, batches = embedding_data(n, b)
    touched = len(np.unique(np.concatenate([ids.ravel() for ids, _ in batches])))
    rows = touched * e["width"] * 4
    own = (param_bytes + e["vocabulary"] * 4 + rows) / param_bytes
    return own, own + rows / param_bytes


def build(tf, config, spec, n, b):
    """``window(sess)`` for one configuration, built in the default graph."""
    import tf1_accum

    if config in (PLAIN_B, PLAIN_NB):
        steps, size = (n, b) if config == PLAIN_B else (1, n * b)
        loss, feeds = _models.fed_model(tf, spec, steps, size)
        return _models.per_micro_batch(_models.adam(tf).minimize(loss), feeds)
    if config == PLAIN_DATASET:
        dataset = _models.micro_batches(tf, spec, n, b)
        batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        train_op = _models.adam(tf).minimize(_models.make_loss_fn(tf, spec)(batch))
        return _models.per_micro_batch(train_op, [None] * n)
    if config in (SPARSE_PLAIN, SPARSE_HELPER, SPARSE_NO_DEDUP):
        loss, feeds = embedding_model(tf, n, b)
        # Adagrad updates only the rows it is given; Adam's sparse update
        # rewrites both of its slots whole (m * beta1 over the table), and
        # its copies would hide what accumulation adds.
        optimizer = _adagrad(tf, deduplicate=config != SPARSE_NO_DEDUP)
        if config == SPARSE_PLAIN:
            return _models.per_micro_batch(optimizer.minimize(loss), feeds)
        acc = tf1_accum.build_accumulation(loss, optimizer)
        return lambda sess: tf1_accum.run_accumulation(sess, acc, feeds)
    if config in PEERS:
        return _models.peer_ways(tf, spec, n, b)[config][1]()
    for suffix, options in OPTIONS.items():
        for way in WAYS + ("floor",):
            if config == way + suffix:
                return _models.ways(tf, spec, n, b, **options)[way][1]()
    raise ValueError(f"unknown configuration {config!r}")


def _adagrad(tf, deduplicate=True):
    """Adagrad; without ``deduplicate``, it applies the rows it is given as they are.

    A window's rows are unique, so leaving out the optimizer's summing of
    duplicate indices (its own copy of the rows) changes no value there: the
    row shows what accumulation adds without the optimizer's share.
    """
    optimizer = tf.compat.v1.train.AdagradOptimizer
    if deduplicate:
        return optimizer(0.1)

    class AsGiven(optimizer):
        def _apply_sparse_duplicate_indices(self, grad, var):
            return self._apply_sparse(grad, var)

        def _resource_apply_sparse_duplicate_indices(self, grad, handle, indices):
            return self._resource_apply_sparse(grad, handle, indices)

    return AsGiven(0.1)


def child(args):
    """Runs one configuration in this process; prints a JSON line."""
    tf = _bench.enter_graph_mode(args.graph_mode)
    v1 = tf.compat.v1
    spec = dict(_models.MODELS[args.model])
    if args.hidden:
        spec["hidden"] = tuple(args.hidden)
    if args.features:
        spec["features"] = args.features
    window = build(tf, args.child, spec, args.steps, args.micro_batch)
    param_bytes = sum(v.shape.num_elements() * v.dtype.size for v in v1.trainable_variables())
    state_bytes = sum(
        v.shape.num_elements() * v.dtype.size
        for v in {v.name: v for v in v1.global_variables() + v1.local_variables()}.values()
    )
    sess = TracedSession(v1.Session(config=_bench.session_config()), tf)
    sess.run(v1.global_variables_initializer())
    window(sess)
    sess.tracing = True
    for _ in range(args.windows):
        window(sess)
    print(
        json.dumps(
            {
                "peak": sess.peak,
                "exact": state_bytes + sess.constants + sess.transient,
                "param_bytes": param_bytes,
                "tf1": tf.__version__.startswith("1."),
            }
        )
    )


def run_child(config, args, model=None, steps=None, graph_mode=None):
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        config,
        "--model",
        model or args.model,
        "-n",
        str(steps or args.steps),
        "-b",
        str(args.micro_batch),
        "--windows",
        str(args.windows),
        "--graph-mode",
        graph_mode or args.graph_mode,
    ]
    if args.hidden:
        command += ["--hidden", *map(str, args.hidden)]
    if args.features:
        command += ["--features", str(args.features)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    result = _run(command, env, config)
    if result["peak"] == 0 and result["tf1"] and "TF_CPU_ALLOCATOR_USE_BFC" not in env:
        # TensorFlow 1.15's CPU allocator keeps no statistics (its
        # allocator_bytes_in_use reads 0); its BFC allocator does, but records
        # the blocks it hands out, not the bytes asked for. The exact figure
        # comes from this process, the allocator's from a second one with BFC.
        bfc = dict(env, TF_CPU_ALLOCATOR_USE_BFC="true")
        result["peak"] = _run(command, bfc, config)["peak"]
    return result


def _run(command, env, config):
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1200)
    if result.returncode != 0:
        raise RuntimeError(f"{config} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def reference(config):
    """The configuration a row is measured above: its own plain training of B."""
    if config.startswith("embedding"):
        return SPARSE_PLAIN
    if config.startswith("dataset loop"):
        return PLAIN_DATASET
    return PLAIN_B


def target(config, args=None, param_bytes=None):
    """The most a configuration may add above its reference, in P (None: not a way in)."""
    if config.startswith("plain") or config in PEERS or config in ("floor", SPARSE_PLAIN):
        return None
    if config in (SPARSE_HELPER, SPARSE_NO_DEDUP):
        own, with_copy = sparse_bounds(args.steps, args.micro_batch, param_bytes)
        return own if config == SPARSE_NO_DEDUP else with_copy
    return TARGET_OPTIONS if config.endswith(tuple(s for s in OPTIONS if s)) else TARGET


def ways_table(args):
    """Each configuration's exact peak and allocator peak over the repetitions, per graph mode."""
    configs = [c for c in CONFIGS if c not in PEERS or c in _models.installed_peers()]
    if args.configs:
        wanted = set(args.configs) | {reference(c) for c in args.configs}
        configs = [c for c in configs if c in wanted]
    jobs = [
        (mode, config)
        for rep in range(args.repetitions)
        for mode in args.graph_modes
        for config in (configs if rep % 2 == 0 else configs[::-1])
    ]
    results = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [(job, pool.submit(run_child, job[1], args, graph_mode=job[0])) for job in jobs]
        for (mode, config), future in futures:
            result = future.result()
            print(
                f"# {mode}, {config}: exact {result['exact'] / 2**20:.3f} MB, "
                f"allocator {result['peak'] / 2**20:.3f} MB",
                flush=True,
            )
            results.setdefault((mode, config), []).append(result)
    rows = []
    for mode in args.graph_modes:
        for config in configs:
            own, base = results[(mode, config)], results[(mode, reference(config))]
            p = own[0]["param_bytes"]
            exact = max(r["exact"] for r in own)
            peaks, base_peaks = [r["peak"] for r in own], [r["peak"] for r in base]
            above = (exact - max(r["exact"] for r in base)) / p
            bound = target(config, args, p)
            rows.append(
                [
                    mode,
                    config,
                    exact / 2**20,
                    above,
                    max(peaks) / 2**20,
                    (max(peaks) - max(base_peaks)) / p,
                    (min(peaks) - min(base_peaks)) / p,
                    (max(peaks) - min(peaks)) / p,
                    "-" if bound is None else f"<= {bound:.2f}",
                    "-" if bound is None else ("yes" if above <= bound else "NO"),
                ]
            )
    first = args.graph_modes[0]
    mlp = results.get((first, PLAIN_B), [{}])[0].get("param_bytes")
    sparse = results.get((first, SPARSE_PLAIN), [{}])[0].get("param_bytes")
    print(
        f"# largest (and allocator least) of {args.repetitions} runs"
        + ("" if mlp is None else f"; MLP P = {mlp / 1e6:.2f} MB")
        + ("" if sparse is None else f", embedding model P = {sparse / 1e6:.2f} MB")
        + f", N={args.steps}, B={args.micro_batch}, Adam. 'exact': the bytes of the variables "
        "and of the constants kernels keep, plus the most a run holds at once of the tensors it "
        "allocates and releases (allocation records); 'allocator': allocator_bytes_in_use, "
        "which also holds the allocator's own slack. 'above' is above plain training of B (the "
        "dataset loop: on its tf.data pipeline); targets are judged on the exact figure"
    )
    headers = [
        "mode",
        "configuration",
        "exact MB",
        "above P",
        "allocator MB",
        "allocator above P",
        "least above P",
        "allocator spread P",
        "target P",
        "met",
    ]
    print(_bench.format_table(headers, rows))
    return rows


SWEEP = ("big batch",) + WAYS + PEERS


def sweep(args):
    """Peak against the effective batch N x B on the activation-dominated model."""
    steps = args.sweep_steps
    configs = [c for c in SWEEP if c not in PEERS or c in _models.installed_peers()]
    jobs = [(config, n) for n in steps for config in configs]
    peaks = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [
            (
                job,
                pool.submit(
                    run_child,
                    PLAIN_NB if job[0] == "big batch" else job[0],
                    args,
                    model="wide",
                    steps=job[1],
                ),
            )
            for job in jobs
        ]
        for job, future in futures:
            peaks[job] = future.result()
    p = peaks[(configs[0], steps[0])]["param_bytes"]
    base = peaks[("big batch", steps[0])]["peak"]
    rows = [
        [n * args.micro_batch]
        + [peaks[(c, n)]["peak"] / 2**20 for c in configs]
        + [(peaks[("helper", n)]["peak"] - base) / p]
        for n in steps
    ]
    print(
        f"# wide MLP, P = {p / 1e6:.2f} MB, B={args.micro_batch}, Adam, graph mode "
        f"{args.graph_mode}: allocator peak MB against the effective batch N x B"
    )
    print(_bench.format_table(["N x B"] + list(configs) + ["helper above B, P"], rows))
    if args.plot:
        megabytes = {c: [peaks[(c, n)]["peak"] / 2**20 for n in steps] for c in configs}
        plot(megabytes, [n * args.micro_batch for n in steps], args.micro_batch, p, args.plot)
    return rows


# The legend in words a reader of the performance page knows.
LABELS = {
    "big batch": "no accumulation: one batch of N x B",
    "helper": "tf1_accum: run_accumulation",
    "fused helper": "tf1_accum: run_accumulation, apply fused with the last add",
    "AccumulationOptimizer": "tf1_accum: AccumulationOptimizer",
    "dataset loop": "tf1_accum: build_dataset_accumulation (input cached)",
    "tensorpack": "tensorpack's accumulating optimizer",
    "gpt-2-simple": "gpt-2-simple's accumulating optimizer",
}


def plot(megabytes, batches, b, param_bytes, path):
    """Plots ``megabytes`` ({row of the table: peak MB per effective batch}) to ``path``.

    And beside it, as NAME_narrow.png, the same plot drawn for a phone's
    width: the docs show it there (docs/conf.py), with its text at the size
    of the page's.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stem, extension = os.path.splitext(path)
    for narrow, target in ((False, path), (True, f"{stem}_narrow{extension}")):
        # Narrow: 3.6 inches and 12-point text, shown 358 px wide at 390 px.
        with plt.rc_context({"font.size": 12 if narrow else 10}):
            _draw(plt, megabytes, batches, b, param_bytes, target, narrow)
    print(f"# plot: {os.path.abspath(path)}")


def _draw(plt, megabytes, batches, b, param_bytes, path, narrow):
    def wrap(text):  # on lines of 32 characters, N x B on one
        if not narrow:
            return text
        return textwrap.fill(text.replace(" x ", "\u00a0x\u00a0"), 32, break_on_hyphens=False)

    if narrow:
        fig, ax = plt.subplots(figsize=(3.6, 7.2))
    else:
        fig, ax = plt.subplots(figsize=(5.6, 3.8))
    markers = dict(zip(LABELS, "osD^vxP+"))
    for config, values in megabytes.items():
        style = ":" if config in PEERS else "-"
        ax.plot(batches, values, style, marker=markers[config], label=wrap(LABELS[config]))
    ax.axhline(
        megabytes["big batch"][0] + param_bytes / 2**20,
        color="grey",
        linestyle="--",
        linewidth=1,
        label=wrap("training one micro-batch of B, plus one copy of the parameters"),
    )
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches)
    ax.set_xticklabels([str(x) for x in batches])
    ax.set_xlabel(wrap(f"effective batch N x B (micro-batches of B = {b} rows)"))
    ax.set_ylabel("peak allocator memory (MB)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    title = f"Peak memory, wide MLP of {param_bytes / 1e6:.1f} MB parameters, Adam"
    if narrow:
        ax.set_title(title.replace(" of ", " of\n"), fontsize=12)
        # Under the plot (tight_layout: matplotlib 3.5 has no "outside" legends).
        legend = fig.legend(loc="lower center", frameon=False)
        fig.canvas.draw()
        fig.tight_layout(rect=(0, legend.get_window_extent().height / fig.bbox.height, 1, 1))
    else:
        ax.set_title(title)
        ax.legend(
            fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1, frameon=False
        )
    _bench.save_figure(fig, path, dpi=150, bbox_inches=None if narrow else "tight")
    plt.close(fig)


def main(argv=None):
    parser = _bench.parser(__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="graph mode v1, one run each")
    parser.add_argument("-n", "--steps", type=int, default=8)
    parser.add_argument("-b", "--micro-batch", type=int, default=None)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--windows", type=int, default=2, help="traced windows per run")
    parser.add_argument("--jobs", type=int, default=2, help="subprocesses at once")
    parser.add_argument("--graph-modes", nargs="+", choices=("v1", "resource"), default=None)
    parser.add_argument("--configs", nargs="+", default=None, help="only these rows")
    parser.add_argument("--sweep", action="store_true", help="peak against N x B, and a plot")
    parser.add_argument("--sweep-steps", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument(
        "--plot", default=os.path.join(HERE, "..", "docs", "_static", "memory_sweep.png")
    )
    parser.add_argument(
        "--hidden", type=int, nargs="+", default=None, help="the models' hidden sizes"
    )
    parser.add_argument("--features", type=int, default=None, help="the models' input size")
    parser.add_argument("--model", default="mlp", help=_hidden())
    parser.add_argument("--child", help=_hidden())
    _bench.graph_mode_argument(parser)
    args = parser.parse_args(argv)
    if args.micro_batch is None:
        args.micro_batch = 512 if args.sweep else 32
    if args.child:
        return child(args)
    if args.quick:
        args.repetitions = 1
        args.graph_modes = args.graph_modes or ["v1"]
    args.graph_modes = args.graph_modes or ["v1", "resource"]
    if _models.missing_peers():
        print("# left out, not installed: " + "; ".join(_models.missing_peers()), flush=True)
    if args.sweep:
        return sweep(args)
    return ways_table(args)


def _hidden():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
