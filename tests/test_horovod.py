"""Tests of accumulation across Horovod workers: one Horovod all-reduce per window.

The cluster tests run ``horovodrun -np 2 -H localhost:2 --gloo`` with
tests/_horovod_worker.py, in this process's graph mode (v1 and resource each
run the module), and compare every worker with single-process large-batch
training on the union of the workers' micro-batches. The in-process tests
run Horovod with one worker (``hvd.init()`` outside ``horovodrun``).

Where Horovod cannot be imported (it is built from source against the
installed TensorFlow: see docs/distributed.rst), the tests that need it are
skipped with the reason, and the checks of arguments, which need no Horovod,
still run; with ``TF1_ACCUM_REQUIRE_HOROVOD=1`` (set by .ci/run in its
TensorFlow 2.15 environment, which builds Horovod) the module fails instead.
"""

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent


def _horovod_or_reason():
    """Returns None if Horovod and horovodrun are usable here, else why not."""
    try:
        import horovod.tensorflow  # noqa: F401
    except Exception as error:  # ImportError, or a library built for another TensorFlow
        return (
            f"Horovod cannot be imported ({type(error).__name__}: {error}); it is built from "
            "source against the installed TensorFlow (HOROVOD_WITH_TENSORFLOW=1 "
            "HOROVOD_WITH_GLOO=1 pip install --no-build-isolation horovod; see "
            "docs/distributed.rst). .ci/run builds it in its TensorFlow 2.15 environment."
        )
    if _horovodrun() is None:
        return "Horovod imports, but its launcher horovodrun is not on PATH or beside python."
    return None


def _horovodrun():
    beside = pathlib.Path(sys.executable).parent / "horovodrun"
    return str(beside) if beside.exists() else shutil.which("horovodrun")


_REASON = _horovod_or_reason()
if _REASON is not None and os.environ.get("TF1_ACCUM_REQUIRE_HOROVOD") == "1":
    raise RuntimeError(f"TF1_ACCUM_REQUIRE_HOROVOD=1, but: {_REASON}")
needs_horovod = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")

import tf1_accum  # noqa: E402
from _helpers import OPTIMIZERS  # noqa: E402
from _helpers import RTOL  # noqa: E402
from _helpers import Model  # noqa: E402
from _helpers import ancestors  # noqa: E402
from _helpers import assert_same_values  # noqa: E402
from _helpers import concat  # noqa: E402
from _helpers import make_batches  # noqa: E402
from _helpers import relative_error  # noqa: E402
from _helpers import values_by_name  # noqa: E402
from _statistics import assert_statistics  # noqa: E402
from _statistics import numpy_ema  # noqa: E402
from _statistics import numpy_statistics  # noqa: E402
from _ways import BY_NAME  # noqa: E402

sys.path.insert(0, str(HERE))
import _horovod_worker as worker  # noqa: E402

v1 = tf.compat.v1

WORKERS = 2
# Every horovodrun the tests start is waited for at most this long, then killed.
PROCESS_LIMIT = 300


@pytest.fixture(scope="module")
def hvd():
    """Horovod, initialized with one worker (outside horovodrun), for the in-process tests."""
    import horovod.tensorflow as hvd

    hvd.init()
    return hvd


def horovodrun(args, **kwargs):
    """Starts ``horovodrun -np 2 -H localhost:2 --gloo`` with ``args``, output piped."""
    path = os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    command = [_horovodrun(), "-np", str(WORKERS), "-H", f"localhost:{WORKERS}", "--gloo"]
    return subprocess.Popen(
        command + [sys.executable] + args,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=str(ROOT),
        **kwargs,
    )


def finish(process, limit=PROCESS_LIMIT):
    try:
        out, _ = process.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
        out += f"\n[killed by the test after {limit} s]"
    return out


def _quiet(output):
    """Drops TensorFlow's start-up log and deprecation lines from the workers' output."""
    noise = ("I0000", "W0000", "E0000", "WARNING", "Instructions for updating", "non-resource")
    return "\n".join(line for line in output.splitlines() if not any(n in line for n in noise))


def run_scenario(scenario, out_dir, prefix):
    out = finish(horovodrun([str(HERE / "_horovod_worker.py"), scenario, str(out_dir)]))
    results = []
    for rank in range(WORKERS):
        path = out_dir / f"{prefix}{rank}.npz"
        assert path.exists(), f"rank {rank} wrote no results:\n{_quiet(out)[-6000:]}"
        with np.load(path) as data:
            results.append(dict(data))
    return results


def large_batch_training(optimizer_name, dtype, sparse, kind, way, learning_rate=None):
    """Plain minimize on each window's micro-batches of every worker, from rank 0's start.

    A window holding a NaN ("nan") is left out, as the library skips it.
    """
    del way
    batches = worker.training_batches(dtype, sparse, kind, WORKERS)
    with tf.Graph().as_default():
        model = Model(dtype, sparse, seed=100)  # rank 0's initialization
        global_step = v1.train.get_or_create_global_step()
        if learning_rate is None:
            optimizer = OPTIMIZERS[optimizer_name](dtype)
        else:
            optimizer = v1.train.GradientDescentOptimizer(learning_rate)
        train_op = optimizer.minimize(model.loss, global_step=global_step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            results = [values_by_name(sess, v1.global_variables())]
            for w in range(worker.WINDOWS):
                window = [
                    b
                    for rank in range(WORKERS)
                    for b in worker.window_batches(batches, WORKERS, w, rank, kind)
                ]
                if not (kind == "nan" and w == worker.NAN_WINDOW):
                    sess.run(train_op, model.feed(concat(window)))
                results.append(values_by_name(sess, v1.global_variables()))
    return results


@pytest.fixture(scope="module")
def cluster_results(tmp_path_factory):
    return run_scenario("equivalence", tmp_path_factory.mktemp("horovod"), "rank")


def _results_of(cluster_results, config):
    prefix = worker.config_key(*config) + "|"
    return [
        {k[len(prefix) :]: v for k, v in results.items() if k.startswith(prefix)}
        for results in cluster_results
    ]


@needs_horovod
@pytest.mark.parametrize("config", worker.CONFIGS, ids=lambda c: worker.config_key(*c))
def test_every_worker_equals_large_batch_training(cluster_results, config):
    optimizer_name, dtype, sparse, kind, way = config
    expected = large_batch_training(*config)
    for rank, results in enumerate(_results_of(cluster_results, config)):
        for w, want in enumerate(expected):
            got = {name: results[f"{w}|{name}"] for name in want if f"{w}|{name}" in results}
            where = f"{worker.config_key(*config)}, rank {rank}, " + (
                "after the broadcast" if w == 0 else f"after window {w - 1}"
            )
            assert_same_values(got, want, RTOL[dtype], where)
    # Training moved the variables (no test on zero gradients).
    first, last = expected[0], expected[-1]
    for name in ["w1", "b1", "w2"] + (["embedding"] if sparse else []):
        assert np.abs(last[name] - first[name]).max() > 1e-3, f"{name} did not move"


@needs_horovod
@pytest.mark.parametrize("config", worker.CONFIGS, ids=lambda c: worker.config_key(*c))
def test_the_workers_run_in_this_process_graph_mode(cluster_results, config):
    resource = os.environ.get("TF1_ACCUM_GRAPH_MODE", "v1") == "resource"
    for results in _results_of(cluster_results, config):
        assert list(results["variable_ops"]) == ["VarHandleOp" if resource else "VariableV2"]


@needs_horovod
@pytest.mark.parametrize("config", worker.CONFIGS, ids=lambda c: worker.config_key(*c))
def test_global_step_counts_updates_not_micro_batches(cluster_results, config):
    for results in _results_of(cluster_results, config):
        steps = [int(results[f"{w}|global_step"]) for w in range(worker.WINDOWS + 1)]
        assert steps == ([0, 1, 1, 2] if config[3] == "nan" else [0, 1, 2, 3])


@needs_horovod
@pytest.mark.parametrize("config", worker.CONFIGS, ids=lambda c: worker.config_key(*c))
def test_exactly_one_all_reduce_per_window_in_the_graph_and_in_each_run(cluster_results, config):
    way = config[4]
    for rank, results in enumerate(_results_of(cluster_results, config)):
        # [in the graph, then in the ancestry of each op of the way's run_ops:
        # apply_op, accum_op, accum_apply_op; the train op, flush_op
        # (optimizer); the train op (dataset)]
        want = {
            "ops": [1, 1, 0, 0],
            "hook": [1, 1, 0, 0],
            "fused": [2, 1, 0, 1],
            "optimizer": [2, 1, 1, 0],
            "dataset": [1, 1, 0, 0],
        }[way]
        np.testing.assert_array_equal(results["graph_counts"], want, err_msg=f"rank {rank}")
        # The fused op (or the flush) and the apply negotiate under one name.
        assert len(results["names"]) == 1
        assert results["names"][0].endswith("_window_0")
        n = worker.micro_batches(rank, config[3])
        # Per window: the runs that add execute none, the one that applies one.
        runs = {
            "ops": n + 1,  # N adds, then the apply
            "hook": n + 1,  # run_accumulation: N adds, then the apply
            "fused": max(n, 1),  # the last add applies (no micro-batch: the apply alone)
            "optimizer": max(n, 1),  # every N-th run applies
            "dataset": 1,  # the window drawn and applied in one run
        }[way]
        want = [[0] * (runs - 1) + [1] + [-1] * (results["executed"].shape[1] - runs)]
        np.testing.assert_array_equal(
            results["executed"], want * worker.WINDOWS, err_msg=f"rank {rank}"
        )


@needs_horovod
def test_a_nan_on_one_worker_makes_every_worker_skip_the_window(cluster_results):
    config = worker.CONFIGS[-1]
    assert config[3] == "nan"
    nan_window = worker.NAN_WINDOW + 1  # values are stored after the broadcast, then per window
    for rank, results in enumerate(_results_of(cluster_results, config)):
        np.testing.assert_array_equal(results["skipped"], [0, 1, 1], err_msg=f"rank {rank}")
        for name in ("w1", "b1", "w2", "w1/Adam", "beta1_power"):
            before, after = results[f"{nan_window - 1}|{name}"], results[f"{nan_window}|{name}"]
            np.testing.assert_array_equal(after, before, err_msg=f"rank {rank}: {name}")
            assert np.isfinite(results[f"{worker.WINDOWS}|{name}"]).all()
            assert (results[f"{worker.WINDOWS}|{name}"] != after).any(), name


STATISTICS_CONFIGS = [c for c in worker.CONFIGS if worker.with_statistics(*c)]


@needs_horovod
@pytest.mark.parametrize("config", STATISTICS_CONFIGS, ids=lambda c: worker.config_key(*c))
def test_statistics_across_workers_equal_numpy_on_every_micro_batch(cluster_results, config):
    per_rank = _results_of(cluster_results, config)
    variables = len(per_rank[0]["0|statistics|variable_norms"])
    traces, squares = [], []
    for w in range(worker.WINDOWS):
        micro, weights = [], []
        for results in per_rank:  # rank 0's micro-batches, then rank 1's
            sizes = results[f"{w}|weights"]
            weights += list(sizes)
            for k in range(len(sizes)):
                micro.append([results[f"{w}|grad|{k}|{i}"] for i in range(variables)])
        weighted = worker.weighted(config[3])
        want = numpy_statistics(micro, weights if weighted else None, 4)
        traces.append(want["noise_trace"])
        squares.append(want["gradient_square"])
        for rank, results in enumerate(per_rank):
            prefix = f"{w}|statistics|"
            got = tf1_accum.GradientStatistics(
                **{
                    field: results.get(prefix + field)
                    for field in tf1_accum.GradientStatistics._fields
                }
            )
            where = f"{worker.config_key(*config)}, rank {rank}, window {w}"
            assert_statistics(got, want, 1e-10, where)
            np.testing.assert_allclose(
                got.noise_scale_ema, numpy_ema(traces) / numpy_ema(squares), rtol=1e-10
            )
            assert got.micro_batches == WORKERS * worker.MICRO_BATCHES


@pytest.fixture(scope="module")
def horovod_results(tmp_path_factory):
    return run_scenario("horovod", tmp_path_factory.mktemp("horovod_own"), "horovod")


@needs_horovod
def test_horovods_backward_passes_per_step_applies_the_sum_and_the_library_the_mean(
    horovod_results,
):
    """The migration this library offers: same program, same data, the large batch's update."""
    config = ("sgd", tf.float32, False, "mean", "ops")
    n = worker.MICRO_BATCHES
    large_batch = large_batch_training(*config, learning_rate=worker.HOROVOD_LR)
    # Horovod sums its N passes (average_aggregated_gradients is off by default),
    # then averages over the workers: SGD at N times the learning rate.
    summed = large_batch_training(*config, learning_rate=n * worker.HOROVOD_LR)
    for rank, results in enumerate(horovod_results):
        for w in range(worker.WINDOWS + 1):
            library = {name: results[f"library|{w}|{name}"] for name in ("w1", "b1", "w2")}
            horovod = {name: results[f"horovod|{w}|{name}"] for name in ("w1", "b1", "w2")}
            want = {name: large_batch[w][name] for name in library}
            where = f"rank {rank}, window {w}"
            assert_same_values(library, want, RTOL[tf.float32], "library, " + where)
            assert_same_values(
                horovod, {k: summed[w][k] for k in horovod}, RTOL[tf.float32], "Horovod, " + where
            )
            if w:
                # Not the large batch's update: off by far more than rounding.
                assert max(relative_error(horovod[k], want[k]) for k in want) > 1e-2, where
        # Horovod advances global_step on every pass; the library once per update.
        assert int(results["horovod|global_step"]) == n * worker.WINDOWS
        assert int(results["library|global_step"]) == worker.WINDOWS


@needs_horovod
def test_a_killed_worker_makes_the_other_fail_within_a_timeout(tmp_path):
    process = horovodrun([str(HERE / "_horovod_worker.py"), "killed", str(tmp_path)])
    try:
        deadline = time.time() + PROCESS_LIMIT
        while not (tmp_path / "pid1").exists():
            assert process.poll() is None, "horovodrun ended before rank 1 was killed"
            assert time.time() < deadline, "rank 1 never finished its first window"
            time.sleep(0.1)
        time.sleep(0.2)  # the pid file is written before rank 1 sleeps
        os.kill(int((tmp_path / "pid1").read_text()), signal.SIGKILL)
        (tmp_path / "killed").touch()
        started = time.time()
        limit = 60  # Horovod notices the closed connection at once; allow for a slow machine
        out = finish(process, limit=limit)
        elapsed = time.time() - started
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    out = _quiet(out)
    failure = [line for line in out.splitlines() if "FAILED after" in line]
    assert len(failure) == 1, out[-6000:]
    # Rank 0's next apply failed in the window's one all-reduce, saying why.
    assert "at accumulation/horovod/tf1_accum0_window_0 with " in failure[0], failure[0]
    assert "Horovod has been shut down" in failure[0], failure[0]
    # horovodrun then ends the job, naming the rank that died first.
    assert process.returncode != 0
    assert "Process name: 1" in out and "Exit code: 137" in out, out[-3000:]
    assert elapsed < limit


@needs_horovod
def test_the_migration_example_runs_and_its_replicas_agree():
    out = finish(horovodrun([str(ROOT / "examples" / "horovod_migration.py")]))
    assert "Traceback" not in out, _quiet(out)[-6000:]
    lines = [line.split(">:", 1)[-1] for line in out.splitlines() if "after:" in line]
    assert len(lines) == WORKERS, _quiet(out)[-6000:]
    # Every rank prints the same parameters after migrating, and the same global_step.
    assert len({line.strip() for line in lines}) == 1, lines
    assert "global_step 4," in lines[0]
    # Before the migration, Horovod's global_step counted every pass.
    assert sum("before: global_step 12," in line for line in out.splitlines()) == WORKERS


# In-process tests: one Horovod worker.


def _engine(kind):
    if kind == "collective":
        return tf1_accum.CollectiveAllReduce(1, 0)  # one worker: no peer to wait for
    import horovod.tensorflow as hvd

    hvd.init()
    return tf1_accum.HorovodAllReduce()


@pytest.mark.parametrize("kind", ["collective", pytest.param("horovod", marks=needs_horovod)])
@pytest.mark.parametrize("way", [BY_NAME["optimizer"], BY_NAME["dataset"]], ids=str)
def test_one_worker_of_the_optimizer_and_the_dataset_loop_equals_large_batch(kind, way):
    """Both engines in the two ways in that apply inside a conditional (one worker)."""
    steps = 3
    batches = make_batches(tf.float64, True, 2 * steps, 4)
    with tf.Graph().as_default() as graph:
        step = v1.train.get_or_create_global_step()
        cross = _engine(kind)
        built = way.build(
            lambda inputs: Model(tf.float64, True, inputs=inputs[0], labels=inputs[1]).loss,
            v1.train.AdamOptimizer(0.01),
            batches,
            steps,
            global_step=step,
            cross_replica=cross,
        )
        config = cross.session_config() if kind == "collective" else None
        with way.session(config=config) as sess:
            for window in (batches[:steps], batches[steps:]):
                way.run_window(sess, built, window)
            got = values_by_name(sess, tf1_accum.plain_variables(graph))
    with tf.Graph().as_default():
        model = Model(tf.float64, True)
        step = v1.train.get_or_create_global_step()
        train_op = v1.train.AdamOptimizer(0.01).minimize(model.loss, global_step=step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for window in (batches[:steps], batches[steps:]):
                sess.run(train_op, model.feed(concat(window)))
            want = values_by_name(sess, v1.global_variables())
    assert_same_values(got, want, RTOL[tf.float64], f"one {kind} worker, {way}")
    assert got["global_step"] == 2


@needs_horovod
@pytest.mark.parametrize("fused", [False, True])
def test_the_apply_holds_one_horovod_all_reduce_of_everything(hvd, fused):
    with tf.Graph().as_default() as graph:
        model = Model(tf.float64, True)
        acc = tf1_accum.build_accumulation(
            model.loss,
            v1.train.MomentumOptimizer(0.1, 0.9),
            cross_replica=tf1_accum.HorovodAllReduce(name="apply"),
            weight=tf.shape(model.labels)[0],
            statistics=True,
            fused=fused,
        )
        reduces = [op for op in graph.get_operations() if op.type == "HorovodAllreduce"]
        assert len(reduces) == (2 if fused else 1)
        assert len([op for op in reduces if op in ancestors(acc.apply_op)]) == 1
        assert not [op for op in reduces if op in ancestors(acc.accum_op)]
        # One flat float64 vector: every accumulator, the embedding's touched-row
        # mask, the count, the squared norms' sum, the count of weight > 0, the weight.
        elements = sum(int(np.prod(v.shape.as_list())) for v in acc.var_list)
        mask = int(acc.var_list[0].shape[0])
        for op in reduces:
            assert op.inputs[0].shape.as_list() == [elements + mask + 4]
            assert op.inputs[0].dtype == tf.float64
            assert op.get_attr("ignore_name_scope")
        assert {op.name.split("/")[-1] for op in reduces} == {"apply_window_0"}


@needs_horovod
@pytest.mark.parametrize("fused", [False, True])
def test_one_worker_equals_large_batch_training(hvd, fused):
    batches = make_batches(tf.float32, True, 6, 4)
    with tf.Graph().as_default():
        model = Model(tf.float32, True)
        cross = tf1_accum.HorovodAllReduce()
        acc = tf1_accum.build_accumulation(
            model.loss, v1.train.AdamOptimizer(0.01), cross_replica=cross, fused=fused
        )
        sync = tf1_accum.broadcast_variables(cross)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(sync)
            for window in (batches[:3], batches[3:]):
                tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in window])
            got = values_by_name(sess, tf1_accum.plain_variables())
    with tf.Graph().as_default():
        model = Model(tf.float32, True)
        train_op = v1.train.AdamOptimizer(0.01).minimize(model.loss)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for window in (batches[:3], batches[3:]):
                sess.run(train_op, model.feed(concat(window)))
            want = values_by_name(sess, v1.global_variables())
    assert_same_values(got, want, RTOL[tf.float32], "one Horovod worker")


@needs_horovod
def test_the_broadcast_hook_runs_in_a_monitored_session(hvd):
    with tf.Graph().as_default():
        w = v1.get_variable("w", initializer=[1.0, 2.0])
        cross = tf1_accum.HorovodAllReduce()
        hook = cross.broadcast_hook()
        assert isinstance(hook, v1.train.SessionRunHook)
        with v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
            ops = [op for op in w.graph.get_operations() if op.type == "HorovodBroadcast"]
            assert len(ops) == 1
            np.testing.assert_array_equal(sess.run(w), [1.0, 2.0])


@needs_horovod
def test_num_workers_and_task_index_are_horovods(hvd):
    cross = tf1_accum.HorovodAllReduce()
    assert (cross.num_workers, cross.task_index) == (hvd.size(), hvd.rank()) == (1, 0)


@needs_horovod
def test_default_names_count_the_objects_made(hvd):
    first, second = tf1_accum.HorovodAllReduce(), tf1_accum.HorovodAllReduce()
    assert int(second.name[len("tf1_accum") :]) == int(first.name[len("tf1_accum") :]) + 1


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(name=3), TypeError, "name must be a string or None, got 3"),
        (dict(name=""), ValueError, "name must be a non-empty string of letters"),
        (dict(name="a/b"), ValueError, r"letters, digits and '_'.*got 'a/b'"),
    ],
)
def test_horovod_all_reduce_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        tf1_accum.HorovodAllReduce(**kwargs)


def test_without_horovod_the_error_says_how_to_build_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "horovod.tensorflow", None)
    with pytest.raises(ImportError, match="HorovodAllReduce needs Horovod built with TensorFlow"):
        tf1_accum.HorovodAllReduce()


@needs_horovod
def test_before_hvd_init_the_error_says_to_call_it():
    code = (
        "import tensorflow as tf\n"
        "import tf1_accum\n"
        "try:\n"
        "    tf1_accum.HorovodAllReduce()\n"
        "except ValueError as error:\n"
        "    print('ValueError:', error)\n"
    )
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=path),
        capture_output=True,
        text=True,
        timeout=PROCESS_LIMIT,
    ).stdout
    assert "ValueError: Horovod is not initialized: call hvd.init()" in out, out


@needs_horovod
def test_broadcast_variables_names_the_engine_that_cannot_send_a_dtype(hvd):
    with tf.Graph().as_default() as graph:
        table = v1.get_variable("table", initializer=tf.constant(["a"]), trainable=False)
        before = len(graph.get_operations())
        with pytest.raises(ValueError, match="dtype string, which the Horovod broadcast"):
            tf1_accum.broadcast_variables(tf1_accum.HorovodAllReduce(), [table])
        assert len(graph.get_operations()) == before


def test_cross_replica_and_broadcast_name_both_engines_when_given_something_else():
    with tf.Graph().as_default():
        model = Model(tf.float32, False)
        with pytest.raises(TypeError, match="a tf1_accum.HorovodAllReduce or None, got 'hvd'"):
            tf1_accum.build_accumulation(
                model.loss, v1.train.GradientDescentOptimizer(0.1), cross_replica="hvd"
            )
        with pytest.raises(TypeError, match="or a tf1_accum.HorovodAllReduce, got 'hvd'"):
            tf1_accum.broadcast_variables("hvd")
        with pytest.raises(TypeError, match="a tf1_accum.HorovodAllReduce or None, got 'hvd'"):
            tf1_accum.AccumulationOptimizer(
                v1.train.GradientDescentOptimizer(0.1), steps=2, cross_replica="hvd"
            )
        with pytest.raises(TypeError, match="a tf1_accum.HorovodAllReduce or None, got 'hvd'"):
            tf1_accum.build_dataset_accumulation(
                lambda batch: tf.reduce_mean(batch),
                v1.train.GradientDescentOptimizer(0.1),
                tf.data.Dataset.from_tensor_slices(np.ones([4, 2], np.float32)),
                2,
                cross_replica="hvd",
            )
