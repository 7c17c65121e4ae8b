"""One process of the parameter-server cluster that tests/test_parameter_servers.py starts.

Usage: python _ps_worker.py TASK PORTS OUT_DIR

TASK is "ps" or a worker index (worker 0 is the chief); PORTS lists the ps's
port, then the workers', on 127.0.0.1. Each worker trains every scenario of
SCENARIOS in turn, in a graph and a resource container of its own, under
``replica_device_setter``, and writes what the test checks to
OUT_DIR/worker<TASK>.npz. The graph mode comes from TF1_ACCUM_GRAPH_MODE.

The asynchronous scenarios train a loss linear in the weights: its gradients
do not depend on when the other worker's updates land, so plain SGD ends at
the initial weights minus the learning rate times the sum of every window's
mean, whatever the order of the updates.
"""

import os
import pathlib
import sys
import time

import _graph_mode
import numpy as np
import tensorflow as tf

_graph_mode.enter()

import tf1_accum  # noqa: E402
from _helpers import Model  # noqa: E402
from _helpers import make_batches  # noqa: E402
from _helpers import values_by_name  # noqa: E402

v1 = tf.compat.v1

WORKERS = 2
WINDOWS = 4  # per worker
FEATURES = 3
BATCH = 4
LEARNING_RATE = 0.125  # exact in float32, as GradientDescentOptimizer holds it
# Every wait for another process gives up after this long.
WAIT = 60.0

# The asynchronous ways in, then the forum recipe (accumulators on the ps),
# then synchronous replicas through the wrapper.
ASYNC = ("session", "wrapper", "hooked", "dataset")
SCENARIOS = ASYNC + ("recipe", "sync")


def steps_of(task):
    """Micro-batches per window: the workers differ, so a window mixed across them shows."""
    return 2 + task


def linear_batches(task):
    """Worker ``task``'s micro-batches, (x, y) in float64."""
    rng = np.random.RandomState(10 + task)
    count = WINDOWS * steps_of(task)
    return [(rng.randn(BATCH, FEATURES), rng.randn(BATCH, 1)) for _ in range(count)]


def linear_initial():
    rng = np.random.RandomState(5)
    return {"w": rng.randn(FEATURES, 1), "b": rng.randn(1)}


def linear_loss(x, y):
    """mean((x w + b) y): its gradient, (x^T y / B, mean(y)), does not depend on w or b."""
    initial = linear_initial()
    w = v1.get_variable("w", initializer=initial["w"])
    b = v1.get_variable("b", initializer=initial["b"])
    return tf.reduce_mean((tf.matmul(x, w) + b) * y)


def window_means(task):
    """The mean gradient of each of worker ``task``'s windows, in NumPy."""
    batches, n = linear_batches(task), steps_of(task)
    means = []
    for k in range(WINDOWS):
        window = batches[k * n : (k + 1) * n]
        means.append(
            {
                "w": np.mean([x.T @ y / BATCH for x, y in window], axis=0),
                "b": np.mean([[y.mean()] for _, y in window], axis=0),
            }
        )
    return means


def wait_for(path, seconds=WAIT):
    """Waits for ``path``; gives up at once when a worker has failed."""
    deadline = time.time() + seconds
    while not path.exists():
        failed = sorted(path.parent.glob("failed*"))
        if failed or time.time() > deadline:
            raise TimeoutError(f"gave up waiting for {path.name}: {failed or f'{seconds} s'}")
        time.sleep(0.02)


class Cluster:
    def __init__(self, task, ports, out_dir):
        ps, *workers = [f"127.0.0.1:{p}" for p in ports.split(",")]
        self.spec = v1.train.ClusterSpec({"ps": [ps], "worker": workers})
        self.config = v1.ConfigProto(operation_timeout_in_ms=int(WAIT * 1000))
        self.task = task
        self.out_dir = out_dir
        self.server = v1.train.Server(
            self.spec,
            job_name="ps" if task == "ps" else "worker",
            task_index=0 if task == "ps" else task,
            config=self.config,
        )

    def setter(self):
        return v1.train.replica_device_setter(
            worker_device=f"/job:worker/task:{self.task}", cluster=self.spec
        )

    def barrier(self, name):
        (self.out_dir / f"{name}{self.task}").touch()
        for other in range(WORKERS):
            wait_for(self.out_dir / f"{name}{other}")

    def session(self, name, hooks=()):
        """A MonitoredTrainingSession; the chief initializes, then both start together."""
        chief = self.task == 0
        if not chief:
            wait_for(self.out_dir / f"{name}-initialized")
        sess = v1.train.MonitoredTrainingSession(
            master=self.server.target,
            is_chief=chief,
            hooks=list(hooks),
            config=self.config,
            stop_grace_period_secs=1,
            save_checkpoint_secs=None,
            save_summaries_steps=None,
            log_step_count_steps=None,
        )
        if chief:
            (self.out_dir / f"{name}-initialized").touch()
        self.barrier(f"{name}-started")
        return sess


def pause(task):
    # Interleave the workers' runs: the other worker's updates land inside
    # this worker's windows.
    time.sleep(0.004 * (1 + task))


def train_async(cluster, name):
    """Trains worker ``task``'s windows through way in ``name``; returns what the test checks."""
    task = cluster.task
    n = steps_of(task)
    batches = linear_batches(task)
    with tf.Graph().as_default(), v1.device(cluster.setter()), v1.container(name):
        step = v1.train.get_or_create_global_step()
        optimizer = v1.train.GradientDescentOptimizer(LEARNING_RATE, use_locking=True)
        hooks = []
        if name == "dataset":
            xs = np.stack([x for x, _ in batches])
            ys = np.stack([y for _, y in batches])
            acc = tf1_accum.build_dataset_accumulation(
                lambda batch: linear_loss(*batch),
                optimizer,
                tf.data.Dataset.from_tensor_slices((xs, ys)),
                n,
                global_step=step,
            )
        else:
            x = v1.placeholder(tf.float64, [None, FEATURES])
            y = v1.placeholder(tf.float64, [None, 1])
            loss = linear_loss(x, y)
            if name == "session":
                acc = tf1_accum.build_accumulation(loss, optimizer, global_step=step)
            else:
                opt = tf1_accum.AccumulationOptimizer(optimizer, n)
                train_op = opt.minimize(loss, global_step=step)
                if name == "hooked":
                    hooks.append(opt.make_session_run_hook())
        variables = [v for v in v1.global_variables() if v.op.name.split("/")[-1] in ("w", "b")]
        foreign = 0  # runs inside a window in which the other worker's update landed
        with cluster.session(name, hooks) as sess:
            if name == "session":
                for k in range(WINDOWS):
                    feeds = [{x: bx, y: by} for bx, by in batches[k * n : (k + 1) * n]]
                    tf1_accum.run_accumulation(sess, acc, feeds)
                    pause(task)
            elif name == "dataset":
                for _ in range(WINDOWS):
                    sess.run(acc.train_op)
                    pause(task)
            else:
                seen = sess.run(step)
                for i, (bx, by) in enumerate(batches):
                    sess.run(train_op, {x: bx, y: by})
                    if task == 0 and i == n - 1:
                        (cluster.out_dir / f"{name}-applied").touch()
                    if task == 1 and i == 0:
                        # Worker 0's first update lands inside this first window, for sure.
                        wait_for(cluster.out_dir / f"{name}-applied")
                    now = sess.run(step)
                    foreign += (i + 1) % n != 0 and now > seen
                    seen = now
                    pause(task)
            cluster.barrier(f"{name}-trained")
            final = values_by_name(sess, variables)
            global_step = sess.run(step)
            cluster.barrier(f"{name}-read")
    results = {f"{name}|{v.op.name.split('/')[-1]}": final[v.op.name] for v in variables}
    results[f"{name}|global_step"] = np.array(global_step)
    results[f"{name}|foreign"] = np.array(foreign)
    return results


def train_recipe(cluster):
    """The forum recipe: accumulators created with the model, so on the ps, shared.

    Returns, for each of this worker's updates, the largest relative
    difference between what it applied and the mean of its own window.
    """
    task, n = cluster.task, steps_of(cluster.task)
    batches, means = linear_batches(task), window_means(task)
    with tf.Graph().as_default(), v1.device(cluster.setter()), v1.container("recipe"):
        step = v1.train.get_or_create_global_step()
        x = v1.placeholder(tf.float64, [None, FEATURES])
        y = v1.placeholder(tf.float64, [None, 1])
        loss = linear_loss(x, y)
        tvars = v1.trainable_variables()
        accums = [v1.Variable(tf.zeros(v.shape, tf.float64), trainable=False) for v in tvars]
        zero = [a.assign(tf.zeros_like(a)) for a in accums]
        add = [a.assign_add(g) for a, g in zip(accums, tf.gradients(loss, tvars))]
        applied = [a / n for a in accums]
        optimizer = v1.train.GradientDescentOptimizer(LEARNING_RATE, use_locking=True)
        apply = optimizer.apply_gradients(zip(applied, tvars), global_step=step)
        names = [v.op.name.split("/")[-1] for v in tvars]
        errors = []
        with cluster.session("recipe") as sess:
            for k in range(WINDOWS):
                sess.run(zero)
                for bx, by in batches[k * n : (k + 1) * n]:
                    sess.run(add, {x: bx, y: by})
                    pause(task)
                got, _ = sess.run([applied, apply])
                errors.append(
                    max(
                        float(np.max(np.abs(g - means[k][v]) / np.max(np.abs(means[k][v]))))
                        for g, v in zip(got, names)
                    )
                )
            cluster.barrier("recipe-trained")
    return {"recipe|errors": np.array(errors)}


SYNC_STEPS = 3


def sync_batches():
    """Every worker's micro-batches, window by window: [window][worker][micro-batch]."""
    batches = make_batches(tf.float64, False, WINDOWS * WORKERS * SYNC_STEPS, BATCH, seed=3)
    it = iter(batches)
    return [[[next(it) for _ in range(SYNC_STEPS)] for _ in range(WORKERS)] for _ in range(WINDOWS)]


def train_sync(cluster):
    """AccumulationOptimizer(SyncReplicasOptimizer(...)) in a MonitoredTrainingSession.

    Both workers pass the synchronous optimizer's hook with its defaults,
    the chief also the wrapper's; each trains its own micro-batches of every
    window. Returns the weights after training and global_step.
    """
    task = cluster.task
    windows = sync_batches()
    with tf.Graph().as_default(), v1.device(cluster.setter()), v1.container("sync"):
        model = Model(tf.float64, False, seed=100)
        step = v1.train.get_or_create_global_step()
        sync = v1.train.SyncReplicasOptimizer(
            v1.train.MomentumOptimizer(0.05, 0.9), WORKERS, total_num_replicas=WORKERS
        )
        opt = tf1_accum.AccumulationOptimizer(sync, SYNC_STEPS)
        train_op = opt.minimize(model.loss, global_step=step)
        hooks = [sync.make_session_run_hook(task == 0)]
        if task == 0:
            hooks.append(opt.make_session_run_hook())
        variables = v1.trainable_variables()
        with cluster.session("sync", hooks) as sess:
            for window in windows:
                for batch in window[task]:
                    sess.run(train_op, model.feed(batch))
            # The chief's queue runner applies the updates: it stays until both are done.
            cluster.barrier("sync-trained")
            final = values_by_name(sess, variables)
            global_step = sess.run(step)
            cluster.barrier("sync-read")
    results = {f"sync|{name}": value for name, value in final.items()}
    results["sync|global_step"] = np.array(global_step)
    return results


# The Estimator (TensorFlow 1.15 and 2.15): chief, worker, ps from TF_CONFIG; the
# chief is task 0 of this script, the worker task 1.
ESTIMATOR_MAX_STEPS = 6  # of the 8 windows the two workers have, asynchronously


def estimator_model_fn(features, labels, mode, config, kind, hook):
    task = 0 if config.is_chief else 1
    with v1.variable_scope(kind):
        if kind == "async":
            loss = linear_loss(features, labels)
            inner = v1.train.GradientDescentOptimizer(LEARNING_RATE, use_locking=True)
            steps = steps_of(task)
        else:
            loss = Model(tf.float64, False, seed=100, inputs=features, labels=labels).loss
            inner = v1.train.SyncReplicasOptimizer(
                v1.train.MomentumOptimizer(0.05, 0.9), WORKERS, total_num_replicas=WORKERS
            )
            steps = SYNC_STEPS
        opt = tf1_accum.AccumulationOptimizer(inner, steps)
        train_op = opt.minimize(loss, global_step=v1.train.get_global_step())
    hooks = [hook]
    if config.is_chief:
        hooks.append(opt.make_session_run_hook())
    if kind == "sync":
        hooks.append(inner.make_session_run_hook(config.is_chief))
    return tf.estimator.EstimatorSpec(
        mode, loss=loss, train_op=train_op, training_hooks=hooks, scaffold=opt.make_scaffold()
    )


def estimator_input_fn(kind, task):
    if kind == "async":
        batches = linear_batches(task)
    else:
        batches = [b for window in sync_batches() for b in window[task]]
    xs = np.stack([x for x, _ in batches])
    ys = np.stack([y for _, y in batches])
    return lambda: tf.data.Dataset.from_tensor_slices((xs, ys))


class _Together(v1.train.SessionRunHook):
    """The worker starts once the chief has initialized; at the end both read the values."""

    def __init__(self, cluster, kind):
        self.cluster, self.kind = cluster, kind
        self.results = {}

    def begin(self):
        if self.cluster.task != 0:
            wait_for(self.cluster.out_dir / f"estimator-{self.kind}-initialized")
        self.step = v1.train.get_global_step()
        self.variables = [v for v in v1.trainable_variables() if v.op.name.startswith(self.kind)]

    def after_create_session(self, session, coord):
        if self.cluster.task == 0:
            (self.cluster.out_dir / f"estimator-{self.kind}-initialized").touch()

    def end(self, session):
        self.cluster.barrier(f"estimator-{self.kind}-trained")
        final = values_by_name(session, self.variables)
        self.results = {f"estimator-{self.kind}|{k.split('/')[-1]}": v for k, v in final.items()}
        self.results[f"estimator-{self.kind}|global_step"] = np.array(session.run(self.step))
        self.cluster.barrier(f"estimator-{self.kind}-read")


def train_estimator(cluster, kind):
    hook = _Together(cluster, kind)
    config = tf.estimator.RunConfig(
        model_dir=str(cluster.out_dir / f"estimator-{kind}"),
        save_checkpoints_steps=2,
        save_summary_steps=None,
        log_step_count_steps=None,
        session_config=cluster.config,
    )

    def model_fn(features, labels, mode, config):
        return estimator_model_fn(features, labels, mode, config, kind, hook)

    model = tf.estimator.Estimator(model_fn, config=config)
    max_steps = ESTIMATOR_MAX_STEPS if kind == "async" else WINDOWS
    model.train(estimator_input_fn(kind, cluster.task), max_steps=max_steps)
    return hook.results


def estimator_main(task, ports, out_dir):
    """Task "ps", 0 (the chief) or 1 (the worker) of an Estimator cluster from TF_CONFIG."""
    import json

    ps, chief, other = [f"127.0.0.1:{p}" for p in ports.split(",")]
    kind, index = {"ps": ("ps", 0), 0: ("chief", 0), 1: ("worker", 0)}[task]
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"ps": [ps], "chief": [chief], "worker": [other]},
            "task": {"type": kind, "index": index},
        }
    )
    cluster = Cluster.__new__(Cluster)
    cluster.task, cluster.out_dir = task, out_dir
    # The Estimator's session waits up to 120 s for the chief's queue runner,
    # blocked in its next take when training ends: this ends that take sooner.
    cluster.config = v1.ConfigProto(operation_timeout_in_ms=30000)
    spec = tf.train.ClusterSpec({"ps": [ps], "chief": [chief], "worker": [other]})
    cluster.server = v1.train.Server(spec, job_name=kind, task_index=index, config=cluster.config)
    if task == "ps":
        for other_task in range(WORKERS):
            wait_for(out_dir / f"done{other_task}", 600)
        return 0
    results = {}
    try:
        for name in ("async", "sync"):
            results.update(train_estimator(cluster, name))
    except BaseException:
        (out_dir / f"failed{task}").touch()
        (out_dir / f"done{task}").touch()
        raise
    np.savez(out_dir / f"estimator{task}.npz", **results)
    (out_dir / f"done{task}").touch()
    for other_task in range(WORKERS):
        wait_for(out_dir / f"done{other_task}", 120)
    return 0


def main():
    if sys.argv[1] == "estimator":
        task = sys.argv[2] if sys.argv[2] == "ps" else int(sys.argv[2])
        return estimator_main(task, sys.argv[3], pathlib.Path(sys.argv[4]))
    task = sys.argv[1] if sys.argv[1] == "ps" else int(sys.argv[1])
    cluster = Cluster(task, sys.argv[2], pathlib.Path(sys.argv[3]))
    if task == "ps":
        for other in range(WORKERS):
            wait_for(cluster.out_dir / f"done{other}", 600)  # the test's limit is lower
        return 0
    results = {}
    try:
        for name in ASYNC:
            results.update(train_async(cluster, name))
        results.update(train_recipe(cluster))
        results.update(train_sync(cluster))
    except BaseException:
        (cluster.out_dir / f"failed{task}").touch()
        (cluster.out_dir / f"done{task}").touch()
        raise
    np.savez(cluster.out_dir / f"worker{task}.npz", **results)
    cluster.barrier("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
