"""One worker of the local clusters that tests/test_distributed.py starts.

Usage: python _distributed_worker.py SCENARIO TASK PORTS OUT_DIR

SCENARIO is "equivalence" (trains each configuration of CONFIGS, writes the
values after every window to OUT_DIR/task<TASK>.npz) or "killed" (trains one
window, then worker 1 waits for the test to kill or stop it, and worker 0
trains on, and must fail). PORTS is the comma-separated list of the workers'
ports on 127.0.0.1. The graph mode comes from TF1_ACCUM_GRAPH_MODE, as in the test process.
"""

import pathlib
import sys
import time

import _graph_mode
import numpy as np
import tensorflow as tf

_graph_mode.enter()

import tf1_accum  # noqa: E402
from _helpers import OPTIMIZERS  # noqa: E402
from _helpers import Model  # noqa: E402
from _helpers import make_batches  # noqa: E402
from _helpers import values_by_name  # noqa: E402
from _statistics import dense  # noqa: E402

v1 = tf.compat.v1

WINDOWS = 3  # K
MICRO_BATCHES = 3  # N per worker
TIMEOUT = 5.0  # seconds, for the collective ops (the "killed" scenario)
# TensorFlow 1.15's collective ops cannot be cancelled: CollectiveAllReduce
# refuses a timeout there, and a lost worker blocks the others.
COLLECTIVE_TIMEOUT = not tf.__version__.startswith("1.")

# (optimizer, dtype, sparse, kind): each trained in a graph of its own. kind
# is "mean" (N equal micro-batches per worker), "weighted" (sizes differ,
# weight= their size), "uneven" (workers accumulate different numbers) or
# "empty" (worker 0 accumulates nothing, worker 1 N weighted micro-batches).
CONFIGS = (
    ("sgd", tf.float32, False, "mean"),
    ("momentum", tf.float32, False, "mean"),
    ("adam", tf.float32, False, "mean"),
    ("adam", tf.float64, True, "mean"),
    ("momentum", tf.float64, False, "weighted"),
    ("momentum", tf.float32, False, "uneven"),
    ("momentum", tf.float32, True, "empty"),
)


def config_key(optimizer_name, dtype, sparse, kind):
    return f"{optimizer_name}-{dtype.name}-{'sparse' if sparse else 'dense'}-{kind}"


def with_statistics(optimizer_name, dtype, sparse, kind):
    """Whether the configuration also builds statistics=True (the float64 ones).

    Each worker then saves the statistics of every window and the gradients
    of its micro-batches, from which the test recomputes them in NumPy.
    """
    del optimizer_name, sparse, kind
    return dtype == tf.float64


def weighted(kind):
    """Whether ``kind`` trains with weight= (each micro-batch's size)."""
    return kind in ("weighted", "empty")


def batch_sizes(kind, count):
    """Equal sizes, or (weighted kinds) sizes that differ between micro-batches."""
    return [3 + (i * 5) % 7 for i in range(count)] if weighted(kind) else 4


def micro_batches(task, kind):
    """N of worker ``task``: 2 and 4 for "uneven", 0 and N for "empty", else N."""
    if kind == "uneven":
        return 2 + 2 * task
    if kind == "empty":
        return MICRO_BATCHES if task else 0
    return MICRO_BATCHES


def window_batches(batches, workers, window, task, kind="mean"):
    """The micro-batches of ``task`` in ``window``: its slice of the window's."""
    per_task = [micro_batches(t, kind) for t in range(workers)]
    start = window * sum(per_task) + sum(per_task[:task])
    return batches[start : start + per_task[task]]


def wait_for(path, seconds):
    deadline = time.time() + seconds
    while not path.exists():
        if time.time() > deadline:
            raise TimeoutError(f"{path} did not appear within {seconds} s")
        time.sleep(0.05)


def train(
    server,
    cross,
    task,
    workers,
    optimizer_name,
    dtype,
    sparse,
    kind,
    windows,
    scope,
    after_first_window=None,
):
    """Trains one configuration; returns per-window values and collective counts.

    Variables live in the servers, beyond one session: each configuration
    keeps them in a resource container of its own.
    """
    count = windows * sum(micro_batches(t, kind) for t in range(workers))
    batches = make_batches(dtype, sparse, count, batch_sizes(kind, count))
    device = f"/job:worker/replica:0/task:{task}"
    with tf.Graph().as_default() as graph, tf.device(device), v1.container(scope):
        # A different initialization on every worker: the broadcast must fix it.
        model = Model(dtype, sparse, seed=100 + task)
        v1.Variable([task == 0, task != 0], trainable=False, name="flags")  # a bool, too
        global_step = v1.train.get_or_create_global_step()
        weight = tf.shape(model.labels)[0] if weighted(kind) else None
        statistics = with_statistics(optimizer_name, dtype, sparse, kind)
        acc = tf1_accum.build_accumulation(
            model.loss,
            OPTIMIZERS[optimizer_name](dtype),
            global_step=global_step,
            weight=weight,
            cross_replica=cross,
            statistics=statistics,
            micro_batch_size=4 if statistics and weight is None else None,
        )
        grads = tf.gradients(model.loss, acc.var_list)
        sync = tf1_accum.broadcast_variables(cross)
        reduce_ops = {op.name for op in graph.get_operations() if op.type.startswith("Collective")}
        values, executed, observed = [], [], []
        trained = tf1_accum.plain_variables()
        with v1.Session(server.target, config=cross.session_config()) as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(sync)
            values.append(values_by_name(sess, trained))
            for w in range(windows):
                mine = window_batches(batches, workers, w, task, kind)
                runs = [(acc.accum_op, model.feed(b)) for b in mine]
                runs.append((acc.apply_op, None))
                per_run = []
                window = {"grads": [], "weights": [len(b[1]) for b in mine]}
                for op, feed in runs:
                    metadata = v1.RunMetadata()
                    options = v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE)
                    fetches = [op]
                    if statistics and op is acc.apply_op:
                        fetches.append(acc.statistics)
                    elif statistics:
                        fetches.append(grads)
                    got = sess.run(fetches, feed, options=options, run_metadata=metadata)
                    if statistics and op is acc.apply_op:
                        window["statistics"] = got[1]._asdict()
                    elif statistics:
                        window["grads"].append([dense(g) for g in got[1]])
                    names = [
                        node.node_name
                        for device in metadata.step_stats.dev_stats
                        for node in device.node_stats
                        if node.node_name in reduce_ops
                    ]
                    per_run.append(len(names))
                executed.append(per_run)
                observed.append(window)
                values.append(values_by_name(sess, trained))
                print(f"task {task}: {optimizer_name} window {w} done", flush=True)
                if w == 0 and after_first_window is not None:
                    after_first_window()
    return values, executed, observed


def killed(server, task, workers, out_dir, timeout):
    """One window together; then worker 1 is lost (killed or stopped by the
    test), and worker 0's next apply must fail."""

    def after_first_window():
        (out_dir / f"ready{task}").touch()
        if task != 0:
            time.sleep(120)  # killed by the test long before
            sys.exit(1)
        wait_for(out_dir / "killed", 60)
        print("worker 1 is lost; training on", flush=True)
        started[0] = time.time()

    started = [time.time()]
    cross = tf1_accum.CollectiveAllReduce(workers, task, timeout=timeout)
    try:
        train(
            server,
            cross,
            task,
            workers,
            "sgd",
            tf.float32,
            False,
            "mean",
            windows=2,
            scope="lost",
            after_first_window=after_first_window,
        )
    except tf.errors.OpError as error:
        where = error.op.name if error.op is not None else "?"
        print(
            f"FAILED after {time.time() - started[0]:.1f} s at {where} "
            f"with {type(error).__name__}: {error.message.splitlines()[0]}",
            flush=True,
        )
        return 3
    print("trained on without worker 1", flush=True)
    return 0


PS_WINDOWS = 4  # per worker, in the parameter-server scenario


def parameter_servers(task, ports, out_dir):
    """Scenario "ps": 1 parameter server + workers; TASK is "ps" or a worker index.

    Trains with SyncReplicasOptimizer, then asynchronously with a plain
    optimizer, each in a resource container of its own, and writes what the
    test checks to OUT_DIR/ps<TASK>.npz.
    """
    ps, *workers = [f"127.0.0.1:{p}" for p in ports.split(",")]
    cluster = v1.train.ClusterSpec({"ps": [ps], "worker": workers})
    config = v1.ConfigProto(operation_timeout_in_ms=60000)
    if task == "ps":
        v1.train.Server(cluster, job_name="ps", task_index=0, config=config)
        for other in range(len(workers)):
            wait_for(out_dir / f"done{other}", 170)
        return 0
    server = v1.train.Server(cluster, job_name="worker", task_index=task, config=config)
    results = {}
    for mode in ("sync", "async"):
        results.update(_ps_training(server, cluster, task, len(workers), mode, out_dir, config))
    np.savez(out_dir / f"ps{task}.npz", **results)
    (out_dir / f"done{task}").touch()
    for other in range(len(workers)):
        wait_for(out_dir / f"done{other}", 120)
    return 0


def _ps_training(server, cluster, task, workers, mode, out_dir, config):
    chief = task == 0
    count = PS_WINDOWS * workers * MICRO_BATCHES
    batches = make_batches(tf.float32, False, count, 4)
    held_out = make_batches(tf.float32, False, 1, 64, seed=7)[0]
    setter = v1.train.replica_device_setter(
        worker_device=f"/job:worker/task:{task}", cluster=cluster
    )
    with tf.Graph().as_default(), v1.device(setter), v1.container(mode):
        model = Model(tf.float32, False, seed=3)
        step = v1.train.get_or_create_global_step()
        optimizer = v1.train.GradientDescentOptimizer(0.1)
        hooks = []
        if mode == "sync":
            optimizer = v1.train.SyncReplicasOptimizer(
                optimizer, replicas_to_aggregate=workers, total_num_replicas=workers
            )
            # A token for every window of every worker: an apply never waits
            # for an update that needs a push the other worker will not make
            # (its pushes were stale, or it has finished).
            tokens = workers * PS_WINDOWS
            hooks.append(optimizer.make_session_run_hook(is_chief=chief, num_tokens=tokens))
        acc = tf1_accum.build_accumulation(model.loss, optimizer, global_step=step)
        state = v1.get_collection(tf1_accum.STATE_COLLECTION)
        local = {id(v) for v in v1.local_variables()}
        glob = {id(v) for v in v1.global_variables()}
        if not chief:  # start once the chief has initialized the parameter servers
            wait_for(out_dir / f"{mode}-initialized", 120)
        with v1.train.MonitoredTrainingSession(
            master=server.target,
            is_chief=chief,
            hooks=hooks,
            config=config,
            stop_grace_period_secs=1,
            save_checkpoint_secs=None,
            save_summaries_steps=None,
            log_step_count_steps=None,
        ) as sess:
            if chief:
                (out_dir / f"{mode}-initialized").touch()
            before = sess.run(model.loss, model.feed(held_out))
            for w in range(PS_WINDOWS):
                mine = window_batches(batches, workers, w, task)
                tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in mine])
            (out_dir / f"{mode}-trained{task}").touch()
            # The chief's queue runner applies the synchronous updates: keep
            # its session open until every worker has trained.
            for other in range(workers):
                wait_for(out_dir / f"{mode}-trained{other}", 120)
            after = sess.run(model.loss, model.feed(held_out))
            global_step = sess.run(step)
    return {
        f"{mode}|state_devices": np.array([v.device for v in state]),
        f"{mode}|state_local": np.array([id(v) in local and id(v) not in glob for v in state]),
        f"{mode}|model_devices": np.array([v.device for v in acc.var_list]),
        f"{mode}|loss": np.array([before, after]),
        f"{mode}|global_step": np.array(global_step),
    }


def main():
    if sys.argv[1] == "ps":
        task = sys.argv[2] if sys.argv[2] == "ps" else int(sys.argv[2])
        return parameter_servers(task, sys.argv[3], pathlib.Path(sys.argv[4]))
    scenario, task, ports, out_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    out_dir = pathlib.Path(out_dir)
    addresses = [f"127.0.0.1:{p}" for p in ports.split(",")]
    workers = len(addresses)
    cluster = v1.train.ClusterSpec({"worker": addresses})
    timeout = TIMEOUT if scenario == "killed" else 60.0 if COLLECTIVE_TIMEOUT else None
    config = tf1_accum.CollectiveAllReduce(workers, task, timeout=timeout).session_config()
    server = v1.train.Server(cluster, job_name="worker", task_index=task, config=config)
    if scenario == "equivalence":
        results = {}
        for i, (optimizer_name, dtype, sparse, kind) in enumerate(CONFIGS):
            cross = tf1_accum.CollectiveAllReduce(
                workers, task, timeout=timeout, instance_key=1000 * (i + 1)
            )
            values, executed, observed = train(
                server,
                cross,
                task,
                workers,
                optimizer_name,
                dtype,
                sparse,
                kind,
                WINDOWS,
                scope=f"config{i}",
            )
            key = config_key(optimizer_name, dtype, sparse, kind)
            for w, window_values in enumerate(values):
                for name, value in window_values.items():
                    results[f"{key}|{w}|{name}"] = value
            results[f"{key}|executed"] = np.array(executed)
            for w, window in enumerate(observed):
                if "statistics" not in window:
                    continue
                for field, value in window["statistics"].items():
                    if field != "summary_op":
                        results[f"{key}|{w}|statistics|{field}"] = np.array(value)
                results[f"{key}|{w}|weights"] = np.array(window["weights"], np.float64)
                for k, micro in enumerate(window["grads"]):
                    for i, g in enumerate(micro):
                        results[f"{key}|{w}|grad|{k}|{i}"] = g
        np.savez(out_dir / f"task{task}.npz", **results)
    else:
        return killed(server, task, workers, out_dir, timeout)
    # Keep this server up until every worker is done: a peer may still be
    # reading this worker's part of the last all-reduce.
    (out_dir / f"done{task}").touch()
    for other in range(workers):
        wait_for(out_dir / f"done{other}", 60)
    time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
