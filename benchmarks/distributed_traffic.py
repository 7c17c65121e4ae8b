"""What crosses the network per window: all-reduce once per window, or per micro-batch.

Starts a local cluster of 2 workers (this script, run again as each worker),
trains the same model both ways for one window of N micro-batches, and counts
from the ``RunMetadata`` step stats of every ``session.run`` of the window:

* all-reduces: collective reduce ops executed;
* elements: float32 elements those all-reduces carried;
* RecvBuf: buffer transfers between the workers, as traced (``RecvBuf``
  nodes in the step stats: the collective runtime's messages);
* MB sent: estimated bytes each worker sends, 2 (W - 1) / W x elements x 4
  for a ring all-reduce.

"per micro-batch" all-reduces each micro-batch's gradient (what synchronous
data-parallel training without accumulation does); "per window" is
``build_accumulation(..., cross_replica=CollectiveAllReduce(...))``.

Where Horovod imports, the same is measured on Horovod (its launcher starts
this script again as each worker, ``--horovod-worker``): "per micro-batch" is
``hvd.DistributedOptimizer(opt)`` run N times (one ``HorovodAllreduce`` per
gradient per step, which Horovod's tensor fusion may pack into fewer
messages), "per window" is ``cross_replica=HorovodAllReduce()``. Horovod's
ops are counted from the step stats too; MB is the same ring estimate.

Run:  python benchmarks/distributed_traffic.py
"""

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

WORKERS = 2
MICRO_BATCHES = (1, 4, 16)
LAYERS = (64, 256, 256, 10)  # an MLP of about 86k parameters


def _traced_nodes(v1, sess, op, feed):
    """Runs ``op`` traced (FULL_TRACE); returns the name of every node the run executed."""
    metadata = v1.RunMetadata()
    options = v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE)
    sess.run(op, feed, options=options, run_metadata=metadata)
    return [node.node_name for d in metadata.step_stats.dev_stats for node in d.node_stats]


def _worker(task, ports):
    import numpy as np
    import tensorflow as tf

    import tf1_accum

    v1 = tf.compat.v1
    v1.disable_v2_behavior()
    addresses = [f"127.0.0.1:{p}" for p in ports]
    base = tf1_accum.CollectiveAllReduce(WORKERS, task, timeout=60.0)
    server = v1.train.Server(
        v1.train.ClusterSpec({"worker": addresses}),
        job_name="worker",
        task_index=task,
        config=base.session_config(),
    )
    rng = np.random.RandomState(task)
    results = []
    for case, n in enumerate(MICRO_BATCHES):
        for way in ("per micro-batch", "per window"):
            key = 10000 * (case + 1) + (0 if way == "per window" else 5000)
            cross = tf1_accum.CollectiveAllReduce(WORKERS, task, timeout=60.0, instance_key=key)
            graph = tf.Graph()
            device = tf.device(f"/job:worker/replica:0/task:{task}")
            with graph.as_default(), device, v1.container(f"case{case}{way[4]}"):
                x = v1.placeholder(tf.float32, [None, LAYERS[0]])
                y = v1.placeholder(tf.int32, [None])
                h = x
                for i, (a, b) in enumerate(zip(LAYERS[:-1], LAYERS[1:])):
                    w = v1.get_variable(f"w{i}", [a, b])
                    h = tf.matmul(h, w)
                    h = tf.nn.relu(h) if i < len(LAYERS) - 2 else h
                loss = tf.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=h)
                )
                sgd = v1.train.GradientDescentOptimizer(0.1)
                if way == "per window":
                    acc = tf1_accum.build_accumulation(loss, sgd, cross_replica=cross)
                    runs = [acc.accum_op] * n + [acc.apply_op]
                    feeds = [True] * n + [False]
                else:
                    grads = [g for g, _ in sgd.compute_gradients(loss)]
                    flat = tf.concat([tf.reshape(g, [-1]) for g in grads], 0)
                    reduced = tf.raw_ops.CollectiveReduceV2(
                        input=flat,
                        group_size=WORKERS,
                        group_key=cross.group_key,
                        instance_key=key,
                        ordering_token=[],
                        merge_op="Add",
                        final_op="Div",
                        timeout_seconds=60.0,
                    )
                    total = v1.get_variable("total", flat.shape, initializer=v1.zeros_initializer())
                    step = total.assign_add(reduced)
                    runs = [step] * n
                    feeds = [True] * n
                collectives = {
                    op.name: int(np.prod(op.inputs[0].shape.as_list()))
                    for op in graph.get_operations()
                    if op.type == "CollectiveReduceV2"
                }
                counts = {"all-reduces": 0, "elements": 0, "RecvBuf": 0}
                with v1.Session(server.target, config=cross.session_config()) as sess:
                    sess.run(v1.global_variables_initializer())
                    for op, fed in zip(runs, feeds):
                        feed = (
                            {x: rng.randn(32, LAYERS[0]), y: rng.randint(0, LAYERS[-1], 32)}
                            if fed
                            else None
                        )
                        for name in _traced_nodes(v1, sess, op, feed):
                            if name in collectives:
                                counts["all-reduces"] += 1
                                counts["elements"] += collectives[name]
                            elif name == "RecvBuf":
                                counts["RecvBuf"] += 1
                results.append(dict(n=n, way=way, **counts))
    print("RESULTS " + json.dumps(results), flush=True)
    # Keep this server up while the other worker may still read from it.
    import time

    time.sleep(2.0)


def _horovod_worker():
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    import tf1_accum

    v1 = tf.compat.v1
    v1.disable_v2_behavior()
    hvd.init()
    rng = np.random.RandomState(hvd.rank())
    results = []
    for n in MICRO_BATCHES:
        for way in ("per micro-batch", "per window"):
            with tf.Graph().as_default() as graph:
                x = v1.placeholder(tf.float32, [None, LAYERS[0]])
                y = v1.placeholder(tf.int32, [None])
                h = x
                for i, (a, b) in enumerate(zip(LAYERS[:-1], LAYERS[1:])):
                    h = tf.matmul(h, v1.get_variable(f"w{i}", [a, b]))
                    h = tf.nn.relu(h) if i < len(LAYERS) - 2 else h
                loss = tf.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=h)
                )
                sgd = v1.train.GradientDescentOptimizer(0.1)
                if way == "per window":
                    cross = tf1_accum.HorovodAllReduce()
                    acc = tf1_accum.build_accumulation(loss, sgd, cross_replica=cross)
                    runs, feeds = [acc.accum_op] * n + [acc.apply_op], [True] * n + [False]
                else:
                    step = hvd.DistributedOptimizer(sgd).minimize(loss)
                    runs, feeds = [step] * n, [True] * n
                reduces = {
                    op.name: int(np.prod(op.inputs[0].shape.as_list()))
                    for op in graph.get_operations()
                    if op.type == "HorovodAllreduce"
                }
                counts = {"all-reduces": 0, "elements": 0}
                with v1.Session() as sess:
                    sess.run(v1.global_variables_initializer())
                    for op, fed in zip(runs, feeds):
                        feed = (
                            {x: rng.randn(32, LAYERS[0]), y: rng.randint(0, LAYERS[-1], 32)}
                            if fed
                            else None
                        )
                        for name in _traced_nodes(v1, sess, op, feed):
                            if name in reduces:
                                counts["all-reduces"] += 1
                                counts["elements"] += reduces[name]
                results.append(dict(n=n, way=way, **counts))
    if hvd.rank() == 0:
        print("RESULTS " + json.dumps(results), flush=True)


def _horovod_results():
    """Runs the Horovod workers; returns their results, or why they did not run."""
    try:
        import horovod.tensorflow  # noqa: F401
    except Exception as error:  # not installed, or built for another TensorFlow
        return None, f"Horovod cannot be imported here ({type(error).__name__})"
    beside = pathlib.Path(sys.executable).parent / "horovodrun"
    launcher = str(beside) if beside.exists() else shutil.which("horovodrun")
    if launcher is None:
        return None, "horovodrun is not on PATH"
    command = [launcher, "-np", str(WORKERS), "-H", f"localhost:{WORKERS}", "--gloo"]
    command += [sys.executable, __file__, "--horovod-worker"]
    try:
        out = subprocess.run(
            command, capture_output=True, text=True, timeout=300, check=False
        ).stdout
    except subprocess.TimeoutExpired:
        return None, "the Horovod workers did not finish within 300 s"
    lines = [line for line in out.splitlines() if "RESULTS " in line]
    if not lines:
        return None, "rank 0 reported nothing:\n" + out[-3000:]
    return json.loads(lines[0].split("RESULTS ", 1)[1]), None


def _table(title, results, note):
    by = {(r["n"], r["way"]): r for r in results}
    ring = 2 * (WORKERS - 1) / WORKERS
    traced = "RecvBuf" in results[0]
    print(title)
    header = f"{'N':>3} | {'all-reduces':>19} | {'elements all-reduced':>25} | "
    header += f"{'RecvBuf messages':>17} | " if traced else ""
    header += f"{'MB sent (est.)':>15} | ratio"
    print(header)
    print("-" * len(header))
    for n in MICRO_BATCHES:
        micro, window = by[(n, "per micro-batch")], by[(n, "per window")]
        mb = [ring * r["elements"] * 4 / 1e6 for r in (micro, window)]
        row = (
            f"{n:>3} | {micro['all-reduces']:>8} vs {window['all-reduces']:>8} | "
            f"{micro['elements']:>11} vs {window['elements']:>11} | "
        )
        if traced:
            row += f"{micro['RecvBuf']:>6} vs {window['RecvBuf']:>6} | "
        row += f"{mb[0]:>6.2f} vs {mb[1]:>5.2f} | {micro['elements'] / window['elements']:.2f}x"
        print(row)
    print(note)


def main():
    sockets = [socket.socket() for _ in range(WORKERS)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [str(s.getsockname()[1]) for s in sockets]
    for s in sockets:
        s.close()
    processes = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", str(task), ",".join(ports)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for task in range(WORKERS)
    ]
    outputs = []
    for process in processes:
        try:
            outputs.append(process.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            process.kill()
            raise SystemExit("a worker did not finish within 300 s") from None
    lines = [line for line in outputs[0].splitlines() if line.startswith("RESULTS ")]
    if not lines:
        raise SystemExit("worker 0 reported nothing:\n" + outputs[0][-3000:])
    results = json.loads(lines[0][len("RESULTS ") :])
    _table(
        f"Traffic per window and per worker, {WORKERS} workers, float32 MLP {LAYERS}, "
        "TensorFlow's collective ops",
        results,
        "(per micro-batch vs per window; ratio = elements per micro-batch way / per window "
        "way; the window's vector carries one extra element, its count)",
    )
    print()
    horovod, why = _horovod_results()
    if horovod is None:
        print(f"Horovod: not measured: {why}.")
        return
    _table(
        "The same on Horovod (Gloo): hvd.DistributedOptimizer per micro-batch vs "
        "HorovodAllReduce per window",
        horovod,
        "(all-reduces: HorovodAllreduce ops executed, one per gradient per step for "
        "DistributedOptimizer, one per window for HorovodAllReduce)",
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(int(sys.argv[2]), sys.argv[3].split(","))
    elif len(sys.argv) > 1 and sys.argv[1] == "--horovod-worker":
        _horovod_worker()
    else:
        main()
