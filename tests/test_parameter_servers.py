"""Tests of accumulation with parameter servers (between-graph replication).

One cluster, 1 parameter server and 2 workers on 127.0.0.1 (tests/_ps_worker.py,
in this process's graph mode), trains every scenario in turn: the asynchronous
ways in, the forum recipe, synchronous replicas through the wrapper.
"""

import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import RTOL
from _helpers import Model
from _helpers import ancestors
from _helpers import assert_same_values
from _helpers import concat
from _helpers import make_batches
from _helpers import relative_error
from _helpers import values_by_name
from test_distributed import finish
from test_distributed import free_ports
from test_distributed import _quiet

v1 = tf.compat.v1

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _ps_worker as worker  # noqa: E402


def run_cluster(tasks, out_dir):
    """Runs _ps_worker.py with each task's arguments, on free ports, killed after 240 s; outputs."""
    ports = ",".join(str(p) for p in free_ports(1 + worker.WORKERS))
    path = os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    processes = [
        subprocess.Popen(
            [sys.executable, str(HERE / "_ps_worker.py"), *task, ports, str(out_dir)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for task in tasks
    ]
    return finish(processes, limit=240)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("ps")
    outputs = run_cluster([[task] for task in ("ps", "0", "1")], out_dir)
    results = []
    for task in range(worker.WORKERS):
        path = out_dir / f"worker{task}.npz"
        assert path.exists(), (
            f"worker {task} wrote no results:\n{_quiet(outputs[task + 1])[-6000:]}"
        )
        with np.load(path) as data:
            results.append(dict(data))
    return results


def test_synchronous_replicas_through_the_wrapper_equal_one_process_on_every_micro_batch(
    cluster,
):
    # AccumulationOptimizer(SyncReplicasOptimizer(momentum, 2, 2)) in a
    # MonitoredTrainingSession with the synchronous optimizer's default hook:
    # each update is one momentum step on the 2 x 3 micro-batches of a window.
    windows = worker.sync_batches()
    with tf.Graph().as_default():
        model = Model(tf.float64, False, seed=100)
        step = v1.train.get_or_create_global_step()
        train_op = v1.train.MomentumOptimizer(0.05, 0.9).minimize(model.loss, global_step=step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for window in windows:
                sess.run(train_op, model.feed(concat([b for mine in window for b in mine])))
            expected = values_by_name(sess, v1.trainable_variables())
    for task, results in enumerate(cluster):
        got = {name: results[f"sync|{name}"] for name in expected}
        assert_same_values(got, expected, RTOL[tf.float64], f"worker {task}")
        assert results["sync|global_step"] == worker.WINDOWS


@pytest.fixture(scope="module")
def estimator_cluster(tmp_path_factory):
    """The Estimator's cluster from TF_CONFIG: ps, chief, worker; results and model dir."""
    pytest.importorskip(
        "tensorflow_estimator",
        reason="tf.estimator exists only up to TensorFlow 2.15 (package tensorflow-estimator)",
    )
    out_dir = tmp_path_factory.mktemp("estimator")
    outputs = run_cluster([["estimator", task] for task in ("ps", "0", "1")], out_dir)
    results = []
    for task in range(worker.WORKERS):
        path = out_dir / f"estimator{task}.npz"
        assert path.exists(), f"task {task} wrote no results:\n{_quiet(outputs[task + 1])[-6000:]}"
        with np.load(path) as data:
            results.append(dict(data))
    return results, out_dir


def test_an_asynchronous_estimator_applies_each_workers_own_windows(estimator_cluster):
    # Training stops at global_step 6 of the 8 windows: the weights are the
    # start minus lr x the means of the first windows of each worker, a0 + a1 = 6.
    results, _ = estimator_cluster
    initial = worker.linear_initial()
    means = [worker.window_means(task) for task in range(worker.WORKERS)]
    for task, result in enumerate(results):
        assert result["estimator-async|global_step"] == worker.ESTIMATOR_MAX_STEPS
        errors = {}
        for a0 in range(worker.WINDOWS + 1):
            a1 = worker.ESTIMATOR_MAX_STEPS - a0
            if 0 <= a1 <= worker.WINDOWS:
                applied = means[0][:a0] + means[1][:a1]
                errors[a0, a1] = max(
                    relative_error(
                        result[f"estimator-async|{v}"],
                        initial[v] - worker.LEARNING_RATE * sum(m[v] for m in applied),
                    )
                    for v in ("w", "b")
                )
        assert min(errors.values()) <= 1e-10, (task, errors)


def _large_batch(windows, variables_of):
    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        with v1.variable_scope("sync"):  # as the model_fn: its slots are sync/sync/...
            model = Model(tf.float64, False, seed=100)
            optimizer = v1.train.MomentumOptimizer(0.05, 0.9)
            train_op = optimizer.minimize(model.loss, global_step=step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for window in windows:
                sess.run(train_op, model.feed(concat(window)))
            return variables_of(sess)


def test_a_synchronous_estimator_equals_one_process_and_resumes_on_one_machine(
    estimator_cluster,
):
    results, out_dir = estimator_cluster
    cluster_windows = [[b for mine in w for b in mine] for w in worker.sync_batches()]
    expected = _large_batch(
        cluster_windows, lambda sess: values_by_name(sess, v1.trainable_variables())
    )
    for task, result in enumerate(results):
        got = {name: result[f"estimator-sync|{name.split('/')[-1]}"] for name in expected}
        assert_same_values(got, expected, RTOL[tf.float64], f"Estimator task {task}")
        assert result["estimator-sync|global_step"] == worker.WINDOWS
    # One machine, the same model_fn with the wrapper around Momentum alone,
    # resumes the cluster's last checkpoint for 2 more windows of 6 micro-batches.
    n = worker.WORKERS * worker.SYNC_STEPS
    more = make_batches(tf.float64, False, 2 * n, worker.BATCH, seed=4)

    def model_fn(features, labels, mode):
        with v1.variable_scope("sync"):
            loss = Model(tf.float64, False, seed=100, inputs=features, labels=labels).loss
            opt = tf1_accum.AccumulationOptimizer(v1.train.MomentumOptimizer(0.05, 0.9), n)
            train_op = opt.minimize(loss, global_step=v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(
            mode, loss=loss, train_op=train_op, scaffold=opt.make_scaffold()
        )

    def input_fn():
        xs, ys = np.stack([x for x, _ in more]), np.stack([y for _, y in more])
        return tf.data.Dataset.from_tensor_slices((xs, ys))

    model = tf.estimator.Estimator(model_fn, model_dir=str(out_dir / "estimator-sync"))
    model.train(input_fn)
    reader = tf.train.load_checkpoint(str(out_dir / "estimator-sync"))
    windows = cluster_windows + [more[:n], more[n:]]
    expected = _large_batch(windows, lambda sess: values_by_name(sess, v1.global_variables()))
    assert reader.get_tensor("global_step") == worker.WINDOWS + 2
    got = {name: reader.get_tensor(name) for name in expected if name != "global_step"}
    expected.pop("global_step")
    assert_same_values(got, expected, RTOL[tf.float64], "resumed on one machine")


@pytest.mark.parametrize("name", worker.ASYNC)
def test_asynchronous_workers_each_apply_the_mean_of_their_own_windows(cluster, name):
    # SGD on a loss linear in the weights: whatever the order of the updates,
    # the weights end at the start minus lr x the sum of every window's mean,
    # a mean over 2 micro-batches on worker 0 and over 3 on worker 1.
    initial = worker.linear_initial()
    means = [m for task in range(worker.WORKERS) for m in worker.window_means(task)]
    for task, results in enumerate(cluster):
        for var in ("w", "b"):
            expected = initial[var] - worker.LEARNING_RATE * sum(m[var] for m in means)
            error = relative_error(results[f"{name}|{var}"], expected)
            assert error <= 1e-10, (name, task, var, error)
        # global_step counts the updates of both workers.
        assert results[f"{name}|global_step"] == worker.WORKERS * worker.WINDOWS, (name, task)


def test_the_other_workers_updates_landed_inside_the_wrappers_windows(cluster):
    # What stopped the wrapper given global_step before: the step moving
    # inside a window, by the other worker's update.
    # Worker 1 waits, after its first micro-batch, for worker 0's first update.
    for name in ("wrapper", "hooked"):
        assert int(cluster[1][f"{name}|foreign"]) >= 1, name


def _bert_style(hand_written):
    """A worker's graph under replica_device_setter, with BERT's increment if asked."""
    setter = v1.train.replica_device_setter(ps_tasks=1, worker_device="/job:worker/task:0")
    graph = tf.Graph()
    with graph.as_default(), v1.device(setter):
        x = v1.placeholder(tf.float64, [None, worker.FEATURES])
        y = v1.placeholder(tf.float64, [None, 1])
        loss = worker.linear_loss(x, y)
        step = v1.train.get_or_create_global_step()
        opt = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), 2)
        train_op = opt.minimize(loss, global_step=step)
        if hand_written == "on_applied":
            counted = tf.cond(
                opt.window.applied,
                lambda: tf.identity(v1.assign_add(step, 1, name="update_count")),
                lambda: tf.identity(step),
                name="count_updates",
            )
            train_op = tf.group(train_op, counted)
        elif hand_written:
            train_op = tf.group(train_op, [step.assign(step + 1, name="bert_increment")])
        hook = opt.make_session_run_hook()
    return graph, hook


def test_a_hand_written_increment_of_a_shared_step_is_refused_when_the_session_starts():
    graph, hook = _bert_style(hand_written=True)
    with graph.as_default():
        with pytest.raises(ValueError) as raised:
            hook.begin()
    message = str(raised.value)
    assert re.search(
        r"'bert_increment' adds to global_step \(global_step, shared by the workers on "
        r"/job:ps/task:0\) besides AccumulationOptimizer",
        message,
    )
    assert "global_step.assign(global_step + 1)" in message
    assert "tf.cond(opt.window.applied, ...)" in message


def test_an_increment_on_applied_beside_the_wrappers_own_is_refused_when_the_session_starts():
    graph, hook = _bert_style(hand_written="on_applied")
    with graph.as_default():
        with pytest.raises(ValueError) as raised:
            hook.begin()
    message = str(raised.value)
    assert re.search(
        r"count_updates\S* increments global_step \(global_step\) in a tf.cond on "
        r"window.applied, and AccumulationOptimizer, given that global_step",
        message,
    )
    assert "global_step.assign_add(1)" in message


def test_a_shared_step_alone_is_not_refused_nor_read_with_every_micro_batch():
    graph, hook = _bert_style(hand_written=False)
    with graph.as_default():
        hook.begin()
    names = {op.name.rsplit("/", 1)[-1] for op in graph.get_operations()}
    assert "global_step_shared" in names
    assert "global_step_unmoved" not in names


def test_the_window_lock_stays_on_the_worker_when_a_loop_reads_the_parameter_server():
    # A version 1 while loop pulls an outside control input into the loop as
    # data, on the device of the op that waits for it: the read of a resource
    # variable on the ps. The lock (a variant) cannot be sent there.
    setter = v1.train.replica_device_setter(ps_tasks=1, worker_device="/job:worker/task:0")
    xs, ys = np.ones([4, 2, worker.FEATURES]), np.ones([4, 2, 1])

    def loss_fn(batch):
        w = v1.get_variable("w", initializer=np.ones([worker.FEATURES, 1]), use_resource=True)
        return tf.reduce_mean(tf.matmul(batch[0], w) * batch[1])

    was_v2 = v1.control_flow_v2_enabled()
    v1.disable_control_flow_v2()
    try:
        with tf.Graph().as_default() as graph, v1.device(setter):
            tf1_accum.build_dataset_accumulation(
                loss_fn,
                v1.train.GradientDescentOptimizer(0.1),
                tf.data.Dataset.from_tensor_slices((xs, ys)),
                2,
                global_step=v1.train.get_or_create_global_step(),
            )
    finally:
        if was_v2:
            v1.enable_control_flow_v2()
    (lock,) = [op for op in graph.get_operations() if op.type == "MutexLock"]
    readers = lock.outputs[0].consumers()
    assert {op.device for op in readers} == {lock.device}, [(op.name, op.device) for op in readers]
    # The loss's read of w, in the loop, still waits for the lock.
    assert lock in ancestors(graph.get_operation_by_name("MatMul/ReadVariableOp"))


def _sync(aggregate, total=2):
    return v1.train.SyncReplicasOptimizer(
        v1.train.GradientDescentOptimizer(0.1), aggregate, total_num_replicas=total
    )


def test_a_sync_replicas_optimizer_waiting_for_more_windows_than_workers_is_refused():
    with pytest.raises(
        ValueError,
        match=r"aggregates 3 pushes per update from 2 workers: the update would wait "
        r"forever\. Give it replicas_to_aggregate=2",
    ):
        tf1_accum.AccumulationOptimizer(_sync(3), 2)


def test_backup_workers_are_said_to_drop_windows():
    with pytest.warns(UserWarning, match=r"first 1 of 2 workers' windows and drops the others'"):
        tf1_accum.AccumulationOptimizer(_sync(1), 2)


def _wrapped_sync(global_step=True):
    setter = v1.train.replica_device_setter(ps_tasks=1, worker_device="/job:worker/task:0")
    with v1.device(setter):
        x = v1.placeholder(tf.float64, [None, worker.FEATURES])
        y = v1.placeholder(tf.float64, [None, 1])
        loss = worker.linear_loss(x, y)
        step = v1.train.get_or_create_global_step() if global_step else None
        sync = _sync(2)
        opt = tf1_accum.AccumulationOptimizer(sync, 2)
        opt.minimize(loss, global_step=step)
    return sync, opt


def test_initial_tokens_that_would_drop_windows_are_refused_and_none_is_the_default():
    with tf.Graph().as_default():
        sync, opt = _wrapped_sync()
        # The chief's update adds to global_step outside the conditional: the
        # wrapper's own, not a hand-written increment.
        opt.make_session_run_hook().begin()
        sync.make_session_run_hook(True).begin()
        assert sync.get_init_tokens_op().type == "NoOp"
        with pytest.raises(
            ValueError, match=r"num_tokens=2 initial tokens let a worker start its next window"
        ):
            sync.make_session_run_hook(True, num_tokens=2).begin()


def test_a_wrapped_sync_replicas_optimizer_needs_global_step():
    with tf.Graph().as_default():
        with pytest.raises(
            ValueError,
            match=r"AccumulationOptimizer\(SyncReplicasOptimizer\(\.\.\.\)\) needs global_step",
        ):
            _wrapped_sync(global_step=False)


@pytest.mark.parametrize("way", ["wrapper", "helper", "dataset"])
def test_weights_with_a_sync_replicas_optimizer_are_refused_naming_the_all_reduce_engines(way):
    """The synchronous optimizer averages the workers' windows equally: micro-batches
    of 2 rows on one worker and 6 on the other came out 0.155 off the large batch.
    Refused before anything is built, naming the engines that weight exactly."""
    message = (
        r"weight= cannot go with a SyncReplicasOptimizer: it averages the workers' windows "
        r"equally.*cross_replica=tf1_accum\.CollectiveAllReduce\(\.\.\.\) \(or "
        r"tf1_accum\.HorovodAllReduce\(\)\), whose update divides by the total weight"
    )
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float64, [None, worker.FEATURES])
        y = v1.placeholder(tf.float64, [None, 1])
        loss = worker.linear_loss(x, y)
        rows = tf.cast(tf.shape(x)[0], tf.float64)
        step = v1.train.get_or_create_global_step()
        data = tf.data.Dataset.from_tensor_slices(np.ones([4, 1]))
        before = len(graph.get_operations())
        with pytest.raises(ValueError, match=message):
            if way == "wrapper":
                tf1_accum.AccumulationOptimizer(_sync(2), 2, weight=rows)
            elif way == "helper":
                tf1_accum.build_accumulation(loss, _sync(2), global_step=step, weight=rows)
            else:
                tf1_accum.build_dataset_accumulation(
                    lambda b: tf.reduce_mean(b), _sync(2), data, 2, weight=lambda b: 1.0
                )
        assert len(graph.get_operations()) == before
