"""One Horovod worker of the runs that tests/test_horovod.py starts with horovodrun.

Usage: horovodrun -np 2 -H localhost:2 --gloo python _horovod_worker.py SCENARIO OUT_DIR

SCENARIO is:

* "equivalence": trains each configuration of CONFIGS with
  ``cross_replica=tf1_accum.HorovodAllReduce()``, and writes the values after
  every window (and what the test checks besides) to OUT_DIR/rank<RANK>.npz;
* "horovod": trains SGD with Horovod's own ``hvd.DistributedOptimizer(opt,
  backward_passes_per_step=N)`` and with the library, from the same start on
  the same micro-batches, and writes both to OUT_DIR/horovod<RANK>.npz;
* "killed": trains one window; then rank 1 writes its pid to OUT_DIR/pid1 and
  waits for the test to kill it, and rank 0 trains on, and must fail.

The graph mode comes from TF1_ACCUM_GRAPH_MODE, as in the test process.
Horovod is imported where it is used: the test module imports this one for
its configurations, also where Horovod is not installed.
"""

import contextlib
import os
import pathlib
import signal
import sys
import time

import _graph_mode
import numpy as np
import tensorflow as tf

_graph_mode.enter()

import tf1_accum  # noqa: E402
from _distributed_worker import batch_sizes  # noqa: E402
from _distributed_worker import micro_batches  # noqa: E402
from _distributed_worker import weighted  # noqa: E402
from _distributed_worker import window_batches  # noqa: E402
from _helpers import OPTIMIZERS  # noqa: E402
from _helpers import Model  # noqa: E402
from _helpers import ancestors  # noqa: E402
from _helpers import make_batches  # noqa: E402
from _helpers import values_by_name  # noqa: E402
from _statistics import dense  # noqa: E402
from _ways import BY_NAME  # noqa: E402
from _ways import Built  # noqa: E402
from _ways import WayIn  # noqa: E402

v1 = tf.compat.v1

WINDOWS = 3  # K
MICRO_BATCHES = 3  # N per worker (the kinds of _distributed_worker use the same N)

# (optimizer, dtype, sparse, kind, way): each trained in a graph of its own.
# kind as in _distributed_worker ("mean", "weighted", "uneven", "empty"), or
# "nan": worker 1's last micro-batch of window 1 holds a NaN. way names a way
# in of _ways.BY_NAME, built with cross_replica=HorovodAllReduce(): "ops"
# (accum_op N times, then apply_op), "fused" (run_accumulation of a fused
# accumulation: the last micro-batch's add and the apply in one
# accum_apply_op run), "hook" (run_accumulation in a MonitoredTrainingSession
# that broadcasts through HorovodAllReduce.broadcast_hook), "optimizer" (the
# train op of an AccumulationOptimizer(steps=N, cross_replica=...), run N
# times a window) or "dataset" (the train op of build_dataset_accumulation
# over this worker's micro-batches, run once a window).
CONFIGS = (
    ("sgd", tf.float32, False, "mean", "ops"),
    ("adam", tf.float32, False, "mean", "fused"),
    ("momentum", tf.float32, False, "mean", "hook"),
    ("adam", tf.float64, True, "mean", "ops"),
    ("momentum", tf.float64, False, "weighted", "ops"),
    ("momentum", tf.float32, False, "uneven", "fused"),
    ("momentum", tf.float32, True, "empty", "fused"),
    ("adam", tf.float32, False, "mean", "optimizer"),
    ("momentum", tf.float64, True, "weighted", "optimizer"),
    ("momentum", tf.float32, False, "mean", "dataset"),
    ("adam", tf.float64, True, "mean", "dataset"),
    ("adam", tf.float64, False, "nan", "ops"),
)

NAN_WINDOW = 1


def config_key(optimizer_name, dtype, sparse, kind, way):
    return f"{optimizer_name}-{dtype.name}-{'sparse' if sparse else 'dense'}-{kind}-{way}"


def with_statistics(optimizer_name, dtype, sparse, kind, way):
    """Whether it also builds statistics=True: float64, no NaN, a way that can show them.

    The worker reads each micro-batch's gradients in the run that adds it
    and the statistics in the apply's run: the way must run the apply on its
    own, fed nothing, and fetch with it.
    """
    del optimizer_name, sparse
    lacks = {"fetch_at_apply", "unfed_apply"} & BY_NAME[way].cannot.keys()
    return dtype == tf.float64 and kind != "nan" and not lacks


def training_batches(dtype, sparse, kind, workers):
    """Every micro-batch of the run, windows in order, each window's by worker.

    For "nan", worker 1's last micro-batch of window NAN_WINDOW holds a NaN.
    """
    count = WINDOWS * sum(micro_batches(t, kind) for t in range(workers))
    batches = make_batches(dtype, sparse, count, batch_sizes(kind, count))
    if kind == "nan":
        last = (NAN_WINDOW + 1) * workers * MICRO_BATCHES - 1
        inputs, labels = batches[last]
        labels = labels.copy()
        labels[0, 0] = np.nan
        batches[last] = (inputs, labels)
    return batches


def horovod_nodes(ops, library):
    """The HorovodAllreduce nodes among ``ops`` and in the functions they call.

    Under version 2 control flow (resource variables) a conditional's
    branches are functions of the graph's library, not ops of the graph.
    Returns (name, ignore_name_scope) pairs, one per node.
    """
    found = []

    def visit(node_op, attrs, name):
        if node_op == "HorovodAllreduce":
            found.append((name, attrs["ignore_name_scope"].b))
        for attr in attrs.values():
            if attr.HasField("func"):
                for node in library[attr.func.name].node_def:
                    visit(node.op, node.attr, node.name)

    for op in ops:
        visit(op.type, op.node_def.attr, op.name)
    return found


def graph_counts(graph, first, second, third):
    """Horovod all-reduces in the graph, and in the ancestry of each op given (or None).

    Also returns the names they negotiate with (Horovod drops the name scope).
    """
    library = {f.signature.name: f for f in graph.as_graph_def().library.function}
    every = horovod_nodes(graph.get_operations(), library)
    counts = [len(every)] + [
        0 if op is None else len(horovod_nodes(ancestors(op), library))
        for op in (first, second, third)
    ]
    names = sorted({name.split("/")[-1] for name, ignore_scope in every if ignore_scope})
    return np.array(counts), np.array(names)


class TracedSession:
    """A session whose every run is traced: counts the Horovod all-reduces each run executes.

    What a way runs goes through it (`_ways.WayIn.run_window`, and
    ``run_accumulation`` inside it, take anything with a session's ``run``).

    Attributes:
        executed: per run, the all-reduces it executed.
        grads: per fed run (a micro-batch's), the gradients fetched in it, if
            ``grads`` was given.
    """

    def __init__(self, sess, reduce_ops, grads=None):
        self._sess = sess
        self._reduce_ops = reduce_ops
        self._grads = grads
        self.executed = []
        self.grads = []

    def run(self, fetches, feed_dict=None):
        metadata = v1.RunMetadata()
        options = v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE)
        with_grads = self._grads is not None and feed_dict is not None
        got = self._sess.run(
            (fetches, self._grads) if with_grads else fetches,
            feed_dict,
            options=options,
            run_metadata=metadata,
        )
        if with_grads:
            got, grads = got
            self.grads.append([dense(g) for g in grads])
        # Inside a function a node runs under the conditional's name: match
        # the last part, which is the name Horovod negotiates with.
        self.executed.append(
            sum(
                node.node_name.split("/")[-1] in self._reduce_ops
                for device in metadata.step_stats.dev_stats
                for node in device.node_stats
            )
        )
        return got


def train(config, rank, workers, after_first_window=None):
    """Trains one configuration; returns what the test checks, as a dict of arrays."""
    optimizer_name, dtype, sparse, kind, way = config
    way = BY_NAME[way]
    batches = training_batches(dtype, sparse, kind, workers)
    windows = [window_batches(batches, workers, w, rank, kind) for w in range(WINDOWS)]
    statistics = with_statistics(*config)
    options = {}
    if statistics:
        options = dict(statistics=True, micro_batch_size=None if weighted(kind) else 4)
    losses = []

    def model_fn(inputs):
        # A different initialization on every worker: the broadcast must fix it.
        model = Model(dtype, sparse, seed=100 + rank, inputs=inputs[0], labels=inputs[1])
        losses.append(model.loss)
        return model.loss

    out = {}
    with tf.Graph().as_default() as graph:
        global_step = v1.train.get_or_create_global_step()
        cross = tf1_accum.HorovodAllReduce()
        built = way.build(
            model_fn,
            OPTIMIZERS[optimizer_name](dtype),
            # A worker with no micro-batch of its own ("empty") shapes its
            # inputs like the run's first.
            [b for window in windows for b in window] or batches[:1],
            MICRO_BATCHES,
            weight=(lambda inputs: tf.shape(inputs[1])[0]) if weighted(kind) else None,
            global_step=global_step,
            cross_replica=cross,
            **options,
        )
        grads = tf.gradients(losses[0], built.window.var_list) if statistics else None
        trained = tf1_accum.plain_variables()
        # [in the graph, then in the ancestry of each of the way's run_ops:
        # apply_op, accum_op, accum_apply_op; or (optimizer) the train op,
        # flush_op; or (dataset) the train op]
        run_ops = (*way.run_ops(built), None, None)[:3]
        out["graph_counts"], out["names"] = graph_counts(graph, *run_ops)
        # VarHandleOp (resource variables) or VariableV2 (reference variables).
        out["variable_ops"] = np.array(sorted({v.op.type for v in trained}))
        reduce_ops = set(out["names"])
        with way.session(cross_replica=cross) as sess:
            values = [values_by_name(sess, trained)]
            executed, observed, skipped = [], [], []
            for w, mine in enumerate(windows):
                traced = TracedSession(sess, reduce_ops, grads)
                got = way.run_window(
                    traced, built, mine, fetch=built.statistics if statistics else None
                )
                executed.append(traced.executed)
                if statistics:
                    observed.append(
                        {
                            "statistics": got._asdict(),
                            "weights": [len(b[1]) for b in mine],
                            "grads": traced.grads,
                        }
                    )
                values.append(values_by_name(sess, trained))
                skipped.append(sess.run(built.skipped_windows))
                print(f"rank {rank}: {config_key(*config)} window {w} done", flush=True)
                if w == 0 and after_first_window is not None:
                    after_first_window()
    for w, window_values in enumerate(values):
        for name, value in window_values.items():
            out[f"{w}|{name}"] = value
    # Ragged for "uneven": one row per window, padded with -1.
    width = max(len(row) for row in executed)
    out["executed"] = np.array([row + [-1] * (width - len(row)) for row in executed])
    out["skipped"] = np.array(skipped)
    for w, window in enumerate(observed):
        for field, value in window["statistics"].items():
            if field != "summary_op":
                out[f"{w}|statistics|{field}"] = np.array(value)
        out[f"{w}|weights"] = np.array(window["weights"], np.float64)
        for k, micro in enumerate(window["grads"]):
            for i, g in enumerate(micro):
                out[f"{w}|grad|{k}|{i}"] = g
    return out


def equivalence(rank, workers, out_dir):
    results = {}
    for config in CONFIGS:
        key = config_key(*config)
        for name, value in train(config, rank, workers).items():
            results[f"{key}|{name}"] = value
    np.savez(out_dir / f"rank{rank}.npz", **results)


HOROVOD_LR = 0.1


class HorovodOwn(WayIn):
    """The program being migrated: ``hvd.DistributedOptimizer(opt, backward_passes_per_step=N)``.

    Horovod aggregates N passes locally, then all-reduces; its train op runs
    once per micro-batch. Its all-reduce is Horovod's own: the engine that
    ``cross_replica`` gives the library's ways is not used.
    """

    name = "horovod"

    def build(
        self,
        model_fn,
        optimizer,
        data,
        steps,
        *,
        weight=None,
        global_step=None,
        cross_replica=None,
        **options,
    ):
        import horovod.tensorflow as hvd

        del cross_replica  # Horovod all-reduces by itself
        assert weight is None and not options, "Horovod's own optimizer takes no window options"
        inputs = self.make_input(data)
        loss = model_fn(inputs)
        opt = hvd.DistributedOptimizer(optimizer, backward_passes_per_step=steps)
        train_op = opt.minimize(loss, global_step=global_step)
        return Built(inputs, opt, train_op, steps, None, None, None, None, None)

    def run_window(self, sess, built, window, *, fetch=None, between=None):
        assert fetch is None and between is None
        for batch in window:
            sess.run(built.train_op, built.feed(batch))

    @contextlib.contextmanager
    def session(self, cross_replica=None, config=None):
        import horovod.tensorflow as hvd

        sync = hvd.broadcast_global_variables(0)
        with v1.Session(config=config) as sess:
            # Horovod's aggregation counters are local variables.
            sess.run((v1.global_variables_initializer(), v1.local_variables_initializer()))
            sess.run(sync)
            yield sess


def horovod_own(rank, workers, out_dir):
    """Horovod's backward_passes_per_step, then the library, on the same micro-batches."""
    batches = make_batches(tf.float32, False, WINDOWS * workers * MICRO_BATCHES, 4)

    def model_fn(inputs):
        return Model(tf.float32, False, seed=100 + rank, inputs=inputs[0], labels=inputs[1]).loss

    results = {}
    for label, way in (("horovod", HorovodOwn()), ("library", BY_NAME["helper"])):
        with tf.Graph().as_default():
            step = v1.train.get_or_create_global_step()
            cross = tf1_accum.HorovodAllReduce()
            built = way.build(
                model_fn,
                v1.train.GradientDescentOptimizer(HOROVOD_LR),
                batches,
                MICRO_BATCHES,
                global_step=step,
                cross_replica=cross,
            )
            trained = [v for v in v1.global_variables() if v.op.name in ("w1", "b1", "w2")]
            with way.session(cross_replica=cross) as sess:
                values = [values_by_name(sess, trained)]
                for w in range(WINDOWS):
                    way.run_window(sess, built, window_batches(batches, workers, w, rank))
                    values.append(values_by_name(sess, trained))
                results[f"{label}|global_step"] = np.array(sess.run(step))
        for w, window_values in enumerate(values):
            for name, value in window_values.items():
                results[f"{label}|{w}|{name}"] = value
    np.savez(out_dir / f"horovod{rank}.npz", **results)


def killed(rank, workers, out_dir):
    """One window together; then rank 1 is killed by the test, and rank 0 trains on."""
    started = [time.time()]
    if rank == 0:
        # horovodrun terminates the other ranks (SIGTERM, then SIGKILL 5 s
        # later) once one has died; rank 0 waits for its own error instead,
        # which is what this scenario is about.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def after_first_window():
        if rank != 0:
            (out_dir / "pid1").write_text(str(os.getpid()))
            time.sleep(120)  # killed by the test long before
            sys.exit(1)
        wait_for(out_dir / "killed", 60)
        print("rank 1 is lost; training on", flush=True)
        started[0] = time.time()

    try:
        train(
            ("sgd", tf.float32, False, "mean", "ops"),
            rank,
            workers,
            after_first_window=after_first_window,
        )
    except tf.errors.OpError as error:
        where = error.op.name if error.op is not None else "?"
        # TensorFlow's message holds where the op was built; Horovod's own
        # reason is the line that names it.
        lines = error.message.splitlines()
        message = next((line for line in lines if "Horovod" in line), lines[0]).strip()
        print(
            f"FAILED after {time.time() - started[0]:.1f} s at {where} "
            f"with {type(error).__name__}: {message}",
            flush=True,
        )
        return 3
    print("trained on without rank 1", flush=True)
    return 0


def wait_for(path, seconds):
    deadline = time.time() + seconds
    while not path.exists():
        if time.time() > deadline:
            raise TimeoutError(f"{path} did not appear within {seconds} s")
        time.sleep(0.05)


def main():
    import horovod.tensorflow as hvd

    scenario, out_dir = sys.argv[1], pathlib.Path(sys.argv[2])
    hvd.init()
    rank, workers = hvd.rank(), hvd.size()
    if scenario == "equivalence":
        equivalence(rank, workers, out_dir)
    elif scenario == "horovod":
        horovod_own(rank, workers, out_dir)
    else:
        return killed(rank, workers, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
