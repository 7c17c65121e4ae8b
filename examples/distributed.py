"""Accumulation across workers: one collective all-reduce per window.

The same script runs on every machine of a cluster. Each worker trains on its
own share of the data, accumulates N micro-batches, and the apply all-reduces
the window across the workers, once; every worker then applies the same
update. The cluster and this worker's task come from TF_CONFIG:

    TF_CONFIG='{"cluster": {"worker": ["host0:2222", "host1:2222"]},
                "task": {"type": "worker", "index": 0}}' python examples/distributed.py

or from flags:

    python examples/distributed.py --workers host0:2222,host1:2222 --task 0

With --local W it is a launcher instead: it starts W worker processes on
127.0.0.1 (free ports), waits for them (bounded), and prints the largest
parameter difference between them at the end.

Run:  python examples/distributed.py --local 2
"""

import argparse
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

FEATURES = 10
HIDDEN = 32


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local", type=int, default=0, help="launch a local cluster of W workers")
    parser.add_argument("--workers", default="", help="comma-separated host:port of every worker")
    parser.add_argument("--task", type=int, default=None, help="this worker's index")
    parser.add_argument("--micro-batch", type=int, default=16, help="B, examples per micro-batch")
    parser.add_argument("--steps", type=int, default=4, help="N, micro-batches per window")
    parser.add_argument("--updates", type=int, default=20, help="windows to train")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds after which a collective op fails (TensorFlow 2 only); default: none",
    )
    parser.add_argument("--out", default="", help="write this worker's results here (JSON)")
    return parser.parse_args(argv)


def cluster_from(args):
    """Returns (worker addresses, task index), from the flags or TF_CONFIG."""
    if args.workers:
        return args.workers.split(","), args.task
    config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    if not config:
        raise SystemExit("Give the cluster: TF_CONFIG, or --workers and --task (or --local W).")
    return config["cluster"]["worker"], int(config["task"]["index"])


def make_data(examples, seed):
    rng = np.random.RandomState(seed)
    x = rng.randn(examples, FEATURES).astype(np.float32)
    true_w = np.linspace(-1.0, 1.0, FEATURES).astype(np.float32)
    y = (np.tanh(x @ true_w) + 0.1 * rng.randn(examples)).astype(np.float32)[:, None]
    return x, y


def train_worker(args):
    import _tensorflow_log  # noqa: F401  (before TensorFlow: its C++ log stays quiet)
    import tensorflow as tf

    import tf1_accum

    v1 = tf.compat.v1
    v1.disable_v2_behavior()
    addresses, task = cluster_from(args)
    cross = tf1_accum.CollectiveAllReduce(len(addresses), task, timeout=args.timeout)
    server = v1.train.Server(
        v1.train.ClusterSpec({"worker": addresses}),
        job_name="worker",
        task_index=task,
        config=cross.session_config(),
    )
    # Each worker its own shard of the data, and its own initialization: the
    # broadcast from worker 0 makes the replicas equal.
    x_data, y_data = make_data(args.updates * args.steps * args.micro_batch, seed=task)
    x_eval, y_eval = make_data(512, seed=1000)
    with tf.Graph().as_default(), tf.device(f"/job:worker/replica:0/task:{task}"):
        x = v1.placeholder(tf.float32, [None, FEATURES])
        y = v1.placeholder(tf.float32, [None, 1])
        w1 = v1.get_variable("w1", [FEATURES, HIDDEN])  # Glorot-uniform draws
        b1 = v1.get_variable("b1", [HIDDEN], initializer=v1.zeros_initializer())
        w2 = v1.get_variable("w2", [HIDDEN, 1])
        loss = tf.reduce_mean((tf.matmul(tf.tanh(tf.matmul(x, w1) + b1), w2) - y) ** 2)
        acc = tf1_accum.build_accumulation(
            loss,
            v1.train.AdamOptimizer(0.01),
            global_step=v1.train.get_or_create_global_step(),
            cross_replica=cross,
        )
        sync = tf1_accum.broadcast_variables(cross)
        with v1.Session(server.target, config=cross.session_config()) as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(sync)
            before = sess.run(loss, {x: x_eval, y: y_eval})
            b = args.micro_batch
            for update in range(args.updates):
                start = update * args.steps * b
                feeds = [
                    {x: x_data[i : i + b], y: y_data[i : i + b]}
                    for i in range(start, start + args.steps * b, b)
                ]
                tf1_accum.run_accumulation(sess, acc, feeds)
            after = sess.run(loss, {x: x_eval, y: y_eval})
            params = {v.op.name: sess.run(v).tolist() for v in acc.var_list}
    print(f"worker {task}: held-out loss {before:.4f} -> {after:.4f}", flush=True)
    if args.out:
        result = {"before": float(before), "after": float(after), "params": params}
        pathlib.Path(args.out).write_text(json.dumps(result))
        # Stay up until every worker has written its result: a peer may still
        # be reading this worker's part of the last all-reduce.
        deadline = time.time() + 60
        folder = pathlib.Path(args.out).parent
        while len(list(folder.glob("worker*.json"))) < len(addresses):
            if time.time() > deadline:
                break
            time.sleep(0.1)
        time.sleep(0.5)
    return {"before": float(before), "after": float(after)}


def launch(args, argv):
    """Starts ``args.local`` workers on 127.0.0.1 and checks what they report."""
    sockets = [socket.socket() for _ in range(args.local)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    addresses = ",".join(f"127.0.0.1:{s.getsockname()[1]}" for s in sockets)
    for s in sockets:
        s.close()
    passed = [a for a in argv if not a.startswith("--local")]
    if "--local" in argv:
        i = argv.index("--local")
        passed = argv[:i] + argv[i + 2 :]
    with tempfile.TemporaryDirectory() as folder:
        processes = [
            subprocess.Popen(
                [sys.executable, __file__, *passed, "--workers", addresses, "--task", str(t)]
                + ["--out", str(pathlib.Path(folder) / f"worker{t}.json")]
            )
            for t in range(args.local)
        ]
        deadline = time.time() + 600
        for process in processes:
            try:
                process.wait(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                for p in processes:
                    p.kill()
                raise SystemExit("a worker did not finish in time; all were stopped") from None
        if any(p.returncode != 0 for p in processes):
            raise SystemExit(f"worker exit codes: {[p.returncode for p in processes]}")
        results = [
            json.loads((pathlib.Path(folder) / f"worker{t}.json").read_text())
            for t in range(args.local)
        ]
    first = results[0]["params"]
    spread = max(
        float(np.max(np.abs(np.array(r["params"][k]) - np.array(first[k]))))
        for r in results
        for k in first
    )
    print(f"largest parameter difference between workers: {spread:.3g}")
    return {"spread": spread, "results": results}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.local:
        return launch(args, argv)
    return train_worker(args)


if __name__ == "__main__":
    main()
