"""Tests of accumulation across workers: collective all-reduce once per window.

The cluster tests start W = 2 worker processes (tests/_distributed_worker.py)
on 127.0.0.1, in this process's graph mode (the nested run of the suite covers
the other one), and compare every worker with single-process large-batch
training on the same W x N micro-batches.
"""

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import OPTIMIZERS
from _helpers import RTOL
from _helpers import Model
from _helpers import assert_same_values
from _helpers import ancestors
from _helpers import concat
from _helpers import make_batches
from _helpers import values_by_name
from _statistics import assert_statistics
from _statistics import numpy_ema
from _statistics import numpy_statistics

v1 = tf.compat.v1

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
WORKERS = 2
# Every process the tests start is waited for at most this long, then killed.
PROCESS_LIMIT = 180

sys.path.insert(0, str(HERE))
import _distributed_worker as worker  # noqa: E402


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def start_workers(scenario, out_dir):
    ports = ",".join(str(p) for p in free_ports(WORKERS))
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    script = str(HERE / "_distributed_worker.py")
    return [
        subprocess.Popen(
            [sys.executable, script, scenario, str(task), ports, str(out_dir)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for task in range(WORKERS)
    ]


def finish(processes, limit=PROCESS_LIMIT):
    """Waits for every process (killing any still running at ``limit``); returns outputs."""
    deadline = time.time() + limit
    outputs = []
    for process in processes:
        try:
            out, _ = process.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
            out += f"\n[killed by the test after {limit} s]"
        outputs.append(out)
    return outputs


def _quiet(output):
    """Drops TensorFlow's start-up log lines from a worker's output."""
    return "\n".join(
        line for line in output.splitlines() if not line.startswith(("I0000", "W0000", "E0000"))
    )


def large_batch_training(optimizer_name, dtype, sparse, kind):
    """Plain minimize on each window's W x N micro-batches, from worker 0's start."""
    count = worker.WINDOWS * sum(worker.micro_batches(t, kind) for t in range(WORKERS))
    batches = make_batches(dtype, sparse, count, worker.batch_sizes(kind, count))
    with tf.Graph().as_default():
        model = Model(dtype, sparse, seed=100)  # worker 0's initialization
        global_step = v1.train.get_or_create_global_step()
        train_op = OPTIMIZERS[optimizer_name](dtype).minimize(model.loss, global_step=global_step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            results = [values_by_name(sess, v1.global_variables())]
            for w in range(worker.WINDOWS):
                window = [
                    b
                    for task in range(WORKERS)
                    for b in worker.window_batches(batches, WORKERS, w, task, kind)
                ]
                sess.run(train_op, model.feed(concat(window)))
                results.append(values_by_name(sess, v1.global_variables()))
    return results


@pytest.fixture(scope="module")
def cluster_results(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("cluster")
    outputs = finish(start_workers("equivalence", out_dir))
    results = []
    for task, output in enumerate(outputs):
        path = out_dir / f"task{task}.npz"
        assert path.exists(), f"worker {task} wrote no results:\n{_quiet(output)[-6000:]}"
        with np.load(path) as data:
            results.append(dict(data))
    return results


@pytest.mark.parametrize("config", worker.CONFIGS, ids=lambda c: worker.config_key(*c))
def test_every_worker_equals_large_batch_training(cluster_results, config):
    key = worker.config_key(*config)
    optimizer_name, dtype, sparse, kind = config
    expected = large_batch_training(optimizer_name, dtype, sparse, kind)
    for task, results in enumerate(cluster_results):
        for w, want in enumerate(expected):
            got = {
                name: results[f"{key}|{w}|{name}"]
                for name in want
                if f"{key}|{w}|{name}" in results
            }
            where = f"{key}, worker {task}, " + (
                "after the broadcast" if w == 0 else f"after window {w - 1}"
            )
            assert_same_values(got, want, RTOL[dtype], where)
            assert got["global_step"] == w
    # Training moved the variables (no test on zero gradients).
    first, last = expected[0], expected[-1]
    for name in ["w1", "b1", "w2"] + (["embedding"] if sparse else []):
        assert np.abs(last[name] - first[name]).max() > 1e-3, f"{name} did not move"
    assert len(cluster_results) == WORKERS


@pytest.mark.parametrize("config", worker.CONFIGS[:1], ids=lambda c: worker.config_key(*c))
def test_exactly_one_all_reduce_executes_per_window(cluster_results, config):
    key = worker.config_key(*config)
    for task, results in enumerate(cluster_results):
        executed = results[f"{key}|executed"]
        # Per window: N accumulate runs with no collective op, then one apply with one.
        want = np.array([[0] * worker.MICRO_BATCHES + [1]] * worker.WINDOWS)
        np.testing.assert_array_equal(executed, want, err_msg=f"worker {task}")
    for config in worker.CONFIGS:
        for results in cluster_results:
            assert results[f"{worker.config_key(*config)}|executed"].sum() == worker.WINDOWS


def test_the_broadcast_sends_worker_0s_bool_variables(cluster_results):
    for task, results in enumerate(cluster_results):
        for config in worker.CONFIGS:
            flags = results[f"{worker.config_key(*config)}|0|flags"]
            np.testing.assert_array_equal(flags, [True, False], err_msg=f"worker {task}")


STATISTICS_CONFIGS = [c for c in worker.CONFIGS if worker.with_statistics(*c)]


@pytest.mark.parametrize("config", STATISTICS_CONFIGS, ids=lambda c: worker.config_key(*c))
def test_statistics_across_workers_equal_numpy_on_every_micro_batch(cluster_results, config):
    """The statistics of a window are those of the W x N micro-batches of all workers."""
    key = worker.config_key(*config)
    variables = len(cluster_results[0][f"{key}|0|statistics|variable_norms"])
    traces, squares = [], []
    for w in range(worker.WINDOWS):
        micro, weights = [], []
        for results in cluster_results:  # worker 0's micro-batches, then worker 1's
            sizes = results[f"{key}|{w}|weights"]
            weights += list(sizes)
            for k in range(len(sizes)):
                micro.append([results[f"{key}|{w}|grad|{k}|{i}"] for i in range(variables)])
        weighted = worker.weighted(config[3])
        want = numpy_statistics(micro, weights if weighted else None, 4)
        traces.append(want["noise_trace"])
        squares.append(want["gradient_square"])
        for task, results in enumerate(cluster_results):
            prefix = f"{key}|{w}|statistics|"
            got = tf1_accum.GradientStatistics(
                **{
                    field: results.get(prefix + field)
                    for field in tf1_accum.GradientStatistics._fields
                }
            )
            assert_statistics(got, want, 1e-10, f"{key}, worker {task}, window {w}")
            np.testing.assert_allclose(
                got.noise_scale_ema,
                numpy_ema(traces) / numpy_ema(squares),
                rtol=1e-10,
                err_msg=f"{key}, worker {task}, window {w}",
            )
            assert got.micro_batches == WORKERS * worker.MICRO_BATCHES


NO_TIMEOUT = "TensorFlow 1.15's collective ops cannot be cancelled: no timeout to test"


@pytest.mark.skipif(not worker.COLLECTIVE_TIMEOUT, reason=NO_TIMEOUT)
@pytest.mark.parametrize(
    "how, error",
    [
        # A dead peer refuses connections: the all-reduce fails at once.
        (signal.SIGKILL, "UnavailableError"),
        # A hung peer answers nothing: the collective timeout ends the wait.
        (signal.SIGSTOP, "DeadlineExceededError"),
    ],
    ids=["killed", "hung"],
)
def test_a_lost_worker_makes_the_others_fail_within_the_timeout(tmp_path, how, error):
    # TensorFlow's runtime itself sometimes crashes (SIGABRT, "Mutex corrupt" in
    # absl's mutex, or SIGSEGV after absl's mutex traces) while it cancels a
    # collective whose peer is gone, before the error reaches Python; that crash
    # is not the library's to test, so such a run is repeated in a fresh
    # directory. Every completed run is held to the one outcome below.
    for attempt in range(3):
        run_dir = tmp_path / f"attempt{attempt}"
        run_dir.mkdir()
        returncode, out, elapsed, limit = _lose_worker_1(run_dir, how)
        aborted = returncode == -signal.SIGABRT and "Mutex corrupt" in out
        crashed = returncode == -signal.SIGSEGV and "mutex.cc" in out
        if not (aborted or crashed):
            break
    assert returncode == 3, out[-6000:]
    # It failed in the apply's all-reduce (local micro-batches still ran), clearly.
    failure = [line for line in out.splitlines() if line.startswith("FAILED after")]
    assert len(failure) == 1, out[-6000:]
    assert " at accumulation/all_reduce_window with " in failure[0], failure[0]
    assert f"with {error}:" in failure[0], failure[0]
    assert elapsed < limit


def _lose_worker_1(run_dir, how):
    """Two workers train a window; worker 1 then gets signal ``how``.

    Returns worker 0's exit code, its output, the seconds it took to end after
    worker 1 was lost, and the limit on those seconds.
    """
    processes = start_workers("killed", run_dir)
    try:
        deadline = time.time() + PROCESS_LIMIT
        while not (run_dir / "ready1").exists():
            assert processes[1].poll() is None, "worker 1 ended before it was lost"
            assert time.time() < deadline, "worker 1 never finished its first window"
            time.sleep(0.1)
        processes[1].send_signal(how)
        if how == signal.SIGKILL:
            # Gone, not going: its port refuses connections before worker 0 goes on.
            processes[1].wait(timeout=60)
        (run_dir / "killed").touch()
        started = time.time()
        # The collective timeout is worker.TIMEOUT seconds; allow for a slow machine.
        limit = 2 * worker.TIMEOUT + 30
        out, _ = processes[0].communicate(timeout=limit)
        elapsed = time.time() - started
    finally:
        processes[1].kill()  # also ends a stopped process
        finish(processes, limit=5)
    return processes[0].returncode, _quiet(out), elapsed, limit


def test_parameter_servers_accumulate_on_each_worker_and_push_one_window(tmp_path):
    ports = ",".join(str(p) for p in free_ports(1 + WORKERS))
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    script = str(HERE / "_distributed_worker.py")
    processes = [
        subprocess.Popen(
            [sys.executable, script, "ps", task, ports, str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for task in ["ps"] + [str(t) for t in range(WORKERS)]
    ]
    outputs = finish(processes)
    results = []
    for task in range(WORKERS):
        path = tmp_path / f"ps{task}.npz"
        output = _quiet(outputs[task + 1])[-6000:]
        assert path.exists(), f"worker {task} wrote no results:\n{output}"
        with np.load(path) as data:
            results.append(dict(data))
    for task, result in enumerate(results):
        for mode in ("sync", "async"):
            # Accumulators and counters on the worker's own device, as local
            # variables (each worker initializes its own); the model on the PS.
            devices = set(result[f"{mode}|state_devices"])
            assert devices == {f"/job:worker/task:{task}"}, (mode, task, devices)
            assert result[f"{mode}|state_local"].all() and len(result[f"{mode}|state_local"]) == 5
            assert set(result[f"{mode}|model_devices"]) == {"/job:ps/task:0"}
    chief = results[0]
    for mode in ("sync", "async"):
        before, after = chief[f"{mode}|loss"]
        assert after < 0.5 * before, (mode, before, after)
    # Synchronous: one update per W pushed windows; a stale push is dropped.
    assert 1 <= int(chief["sync|global_step"]) <= worker.PS_WINDOWS
    # Asynchronous: every window of every worker is one update.
    assert int(chief["async|global_step"]) == WORKERS * worker.PS_WINDOWS


# In-process tests: one worker, no server.


def test_under_replica_device_setter_all_window_state_is_local_on_the_worker():
    setter = v1.train.replica_device_setter(ps_tasks=1, worker_device="/job:worker/task:0")
    with tf.Graph().as_default(), v1.device(setter):
        model = Model(tf.float32, True)
        acc = tf1_accum.build_accumulation(
            model.loss,
            v1.train.GradientDescentOptimizer(0.1),
            weight=tf.shape(model.labels)[0],
            statistics=True,
        )
        state = v1.get_collection(tf1_accum.STATE_COLLECTION)
        names = {v.op.name.split("/")[-1] for v in state}
        # The moving averages of the statistics too, not only the accumulators.
        assert {"noise_trace_ema", "gradient_square_ema", "accumulator_touched"} <= names
        local = {id(v) for v in v1.local_variables()}
        glob = {id(v) for v in v1.global_variables()}
        for v in state:
            assert v.device == "/job:worker/task:0", (v.op.name, v.device)
            assert id(v) in local and id(v) not in glob, v.op.name
        assert {v.device for v in acc.var_list} == {"/job:ps/task:0"}


def _timeout(seconds):
    """``seconds``, where collective ops take a timeout (TensorFlow 2), else None."""
    return seconds if worker.COLLECTIVE_TIMEOUT else None


def _single_worker_accumulation(dtype=tf.float64, **kwargs):
    model = Model(dtype, False)
    cross = tf1_accum.CollectiveAllReduce(1, 0, timeout=_timeout(30.0))
    acc = tf1_accum.build_accumulation(
        model.loss, v1.train.MomentumOptimizer(0.1, 0.9), cross_replica=cross, **kwargs
    )
    return model, cross, acc


def _instance_key(op):
    """A collective op's instance key: an input of the second version, an attribute of the first."""
    if op.type == "CollectiveReduce":  # TensorFlow 1.15
        return op.get_attr("instance_key")
    return int(tf.get_static_value(op.inputs[3]))


@pytest.mark.parametrize("fused", [False, True])
def test_the_apply_holds_one_all_reduce_of_everything(fused):
    with tf.Graph().as_default() as graph:
        model, _, acc = _single_worker_accumulation(fused=fused)
        collective = [op for op in graph.get_operations() if op.type.startswith("Collective")]
        assert len(collective) == (2 if fused else 1)
        apply_path = ancestors(acc.apply_op)
        in_apply = [op for op in collective if op in apply_path]
        assert len(in_apply) == 1
        assert not [op for op in collective if op in ancestors(acc.accum_op)]
        # One flat vector: every accumulator's elements, plus the count.
        elements = sum(int(np.prod(v.shape.as_list())) for v in acc.var_list)
        assert in_apply[0].inputs[0].shape.as_list() == [elements + 1]
        # A float64 model sends float64, from either op (the fused one reads
        # the totals its add returns: references, under reference variables).
        assert {op.inputs[0].dtype for op in collective} == {tf.float64}
        if fused:
            # apply_op and accum_apply_op share the window's instance key, so
            # workers that apply either way still meet.
            keys = {_instance_key(op) for op in collective}
            assert len(keys) == 1


@pytest.mark.parametrize("fused", [False, True])
def test_one_worker_equals_large_batch_training(fused):
    batches = make_batches(tf.float64, False, 6, 4)
    with tf.Graph().as_default():
        model, cross, acc = _single_worker_accumulation(fused=fused)
        with v1.Session(config=cross.session_config()) as sess:
            sess.run(v1.global_variables_initializer())
            for window in (batches[:3], batches[3:]):
                tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in window])
            got = values_by_name(sess, acc.var_list)
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        train_op = v1.train.MomentumOptimizer(0.1, 0.9).minimize(model.loss)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for window in (batches[:3], batches[3:]):
                sess.run(train_op, model.feed(concat(window)))
            want = values_by_name(sess, v1.trainable_variables())
    assert_same_values(got, want, RTOL[tf.float64], "one worker")


def test_with_nothing_accumulated_on_any_worker_the_apply_fails_after_the_all_reduce():
    with tf.Graph().as_default():
        model, cross, acc = _single_worker_accumulation()
        with v1.Session(config=cross.session_config()) as sess:
            sess.run(v1.global_variables_initializer())
            before = values_by_name(sess, v1.global_variables())
            match = "nothing accumulated on any worker"
            with pytest.raises(tf.errors.InvalidArgumentError, match=match):
                sess.run(acc.apply_op)
            assert_same_values(values_by_name(sess, v1.global_variables()), before, 0.0, "")
            # The window still works afterwards.
            batch = make_batches(tf.float64, False, 1, 4)[0]
            tf1_accum.run_accumulation(sess, acc, [model.feed(batch)])
            after = values_by_name(sess, acc.var_list)
        assert any(np.abs(after[k] - before[k]).max() > 0 for k in after)


def test_a_float64_weight_total_crosses_a_float32_all_reduce_exactly():
    from tf1_accum import _distributed
    from tf1_accum import _window

    weights = [2.0**24 + 1, 2.0**30 + 3.5, 7.0, 2.0**40 + 2.0**24 + 5]
    with tf.Graph().as_default():
        packed = [
            _distributed._weight_pieces(tf.constant(w, tf.float64), tf.float32) for w in weights
        ]
        assert all(p.dtype == tf.float32 for pieces in packed for p in pieces)
        alone = _distributed._join_weight_pieces(packed[0])
        # Summed in float32, as the all-reduce of W = 4 workers sums them.
        summed = _distributed._join_weight_pieces([tf.add_n(list(p)) for p in zip(*packed)])
        # One worker through the collective itself, with a float32 model.
        cross = tf1_accum.CollectiveAllReduce(1, 0, timeout=_timeout(30.0))
        slot = _window._VariableAccumulator(v1.Variable([0.0, 0.0], name="model"))
        weighting = _window._Weighting([tf.float32], average=True, relative=False)
        added = _window.Added(
            None,
            [(tf.constant([1.0, 2.0]),)],
            tf.constant(3, tf.int64),
            [(tf.constant(weights[0], tf.float64),)],
        )
        reduced, _ = cross._reducer().reduce([slot], added, [weighting])
        count, weight = reduced.count, reduced.parts[0][0]
        with v1.Session(config=cross.session_config()) as sess:
            got = sess.run(dict(alone=alone, summed=summed, count=count, weight=weight))
    assert got["alone"] == weights[0] == got["weight"]
    assert got["summed"] == sum(weights)
    assert got["count"] == 3


def test_session_config_sets_the_leader_on_a_copy():
    base = v1.ConfigProto(inter_op_parallelism_threads=2)
    config = tf1_accum.CollectiveAllReduce(3, 2, job_name="trainer").session_config(base)
    assert config.experimental.collective_group_leader == "/job:trainer/replica:0/task:0"
    assert config.inter_op_parallelism_threads == 2
    assert base.experimental.collective_group_leader == ""
    assert config.operation_timeout_in_ms == 0


@pytest.mark.skipif(not worker.COLLECTIVE_TIMEOUT, reason=NO_TIMEOUT)
def test_session_config_sets_twice_the_timeout():
    config = tf1_accum.CollectiveAllReduce(3, 2, timeout=1.5).session_config()
    assert config.operation_timeout_in_ms == 3000


@pytest.mark.skipif(worker.COLLECTIVE_TIMEOUT, reason="TensorFlow 2's collective ops time out")
def test_on_tensorflow_1_15_a_timeout_is_refused_with_the_alternative():
    with pytest.raises(ValueError, match=r"timeout=5\.0 needs TensorFlow 2: .* cannot be cancel"):
        tf1_accum.CollectiveAllReduce(2, 0, timeout=5.0)
    with pytest.raises(ValueError, match="asynchronous parameter servers"):
        tf1_accum.CollectiveAllReduce(2, 0, timeout=5.0)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(num_workers=2.0, task_index=0), TypeError, "num_workers must be an int"),
        (dict(num_workers=2, task_index="0"), TypeError, "task_index must be an int"),
        (dict(num_workers=2, task_index=0, group_key=None), TypeError, "group_key must be an int"),
        (
            dict(num_workers=2, task_index=0, instance_key=1.5),
            TypeError,
            "instance_key must be an int",
        ),
        (dict(num_workers=2, task_index=0, job_name=3), TypeError, "job_name must be a string"),
        (dict(num_workers=2, task_index=0, timeout="5"), TypeError, "timeout must be a positive"),
        (dict(num_workers=0, task_index=0), ValueError, "num_workers must be at least 1"),
        (
            dict(num_workers=2, task_index=2),
            ValueError,
            r"task_index must be in \[0, num_workers\) = \[0, 2\), got 2",
        ),
        (dict(num_workers=2, task_index=0, timeout=0), ValueError, "timeout must be positive"),
    ],
)
def test_collective_all_reduce_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        tf1_accum.CollectiveAllReduce(**kwargs)


def test_build_accumulation_rejects_a_cross_replica_of_another_type():
    with tf.Graph().as_default() as graph:
        model = Model(tf.float32, False)
        before = len(graph.get_operations())
        match = "cross_replica must be a tf1_accum.CollectiveAllReduce"
        with pytest.raises(TypeError, match=match):
            tf1_accum.build_accumulation(
                model.loss, v1.train.GradientDescentOptimizer(0.1), cross_replica="ring"
            )
        assert len(graph.get_operations()) == before


@pytest.mark.parametrize("weighted", [False, True], ids=["counted", "weighted"])
def test_statistics_ride_in_the_one_all_reduce(weighted):
    """The sum of squared norms (and, weighted, the count of weight > 0) join the vector."""
    with tf.Graph().as_default() as graph:
        model = Model(tf.float64, False)
        acc = tf1_accum.build_accumulation(
            model.loss,
            v1.train.MomentumOptimizer(0.1, 0.9),
            cross_replica=tf1_accum.CollectiveAllReduce(2, 0),
            weight=tf.shape(model.labels)[0] if weighted else None,
            micro_batch_size=None if weighted else 4,
            statistics=True,
        )
        collective = [op for op in graph.get_operations() if op.type.startswith("Collective")]
        assert len(collective) == 1 and collective[0] in ancestors(acc.apply_op)
        elements = sum(int(np.prod(v.shape.as_list())) for v in acc.var_list)
        # The accumulators, the count, the squared norms' sum; weighted: the
        # count of micro-batches of positive weight, and the weight total.
        scalars = 4 if weighted else 2
        assert collective[0].inputs[0].shape.as_list() == [elements + scalars]


@pytest.mark.parametrize("fused", [False, True])
def test_one_worker_statistics_equal_numpy(fused):
    sizes = [3, 7, 5]
    batches = make_batches(tf.float64, False, 3, sizes)
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        cross = tf1_accum.CollectiveAllReduce(1, 0, timeout=_timeout(30.0))
        acc = tf1_accum.build_accumulation(
            model.loss,
            v1.train.MomentumOptimizer(0.1, 0.9),
            cross_replica=cross,
            weight=tf.cast(tf.shape(model.labels)[0], tf.float64),
            statistics=True,
            fused=fused,
        )
        grads = tf.gradients(model.loss, acc.var_list)
        with v1.Session(config=cross.session_config()) as sess:
            sess.run(v1.global_variables_initializer())
            micro = []
            for batch in batches[:-1]:
                micro.append(sess.run([acc.accum_op, grads], model.feed(batch))[1])
            if fused:  # the last micro-batch's add and the apply in one run
                micro.append(sess.run(grads, model.feed(batches[-1])))
                run = [acc.accum_apply_op, acc.accum_apply_statistics]
                got = sess.run(run, model.feed(batches[-1]))[1]
            else:
                micro.append(sess.run([acc.accum_op, grads], model.feed(batches[-1]))[1])
                got = sess.run([acc.apply_op, acc.statistics])[1]
            assert sess.run(acc.counter) == 0
    assert_statistics(got, numpy_statistics(micro, sizes), 1e-10, "one worker")
    assert got.micro_batches == 3


def test_broadcast_variables_rejects_bad_arguments():
    with tf.Graph().as_default():
        cross = tf1_accum.CollectiveAllReduce(1, 0)
        with pytest.raises(TypeError, match="collective must be a tf1_accum.CollectiveAllReduce"):
            tf1_accum.broadcast_variables(None)
        with pytest.raises(ValueError, match="the graph has no variables to broadcast"):
            tf1_accum.broadcast_variables(cross)
        with pytest.raises(ValueError, match="var_list is empty"):
            tf1_accum.broadcast_variables(cross, [])
        with pytest.raises(TypeError, match=r"var_list\[0\] must be a tf.Variable"):
            tf1_accum.broadcast_variables(cross, [1.0])
        table = v1.get_variable("table", initializer=tf.constant(["a"]), trainable=False)
        with pytest.raises(ValueError, match="dtype string, which the collective broadcast"):
            tf1_accum.broadcast_variables(cross, [table])
