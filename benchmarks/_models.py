"""The models, data and ways in that the timing and memory benchmarks share.

Every way builds the same MLP (seeded initial values, ``get_variable``) and
runs the same N micro-batches per window with Adam. ``ways`` returns, per
name, how many ``session.run`` a window takes and a builder: called inside a
fresh graph, it returns ``window(sess)``.

The floor is the least work any accumulation does: N forward and backward
passes, N ``assign_add`` of the gradients into accumulators, and one Adam
apply of their sum, in the run of the last micro-batch (N runs; no reset, no
counter, no check). The benchmarks report every way against it.
"""

import math

import numpy as np

MODELS = {
    # 1,570,344 parameters: 1000 -> 1024 -> 512 -> 40.
    "mlp": dict(features=1000, hidden=(1024, 512), classes=40),
    # 1,585,162 parameters, 512 -> 1024 -> 1024 -> 10: at a micro-batch of
    # 512 its activations outweigh its parameters and optimizer state, so one
    # batch of N x B needs several times the memory of B.
    "wide": dict(features=512, hidden=(1024, 1024), classes=10),
    # 1,608 parameters: 16 -> 64 -> 8; the cost of each session.run dominates.
    "tiny": dict(features=16, hidden=(64,), classes=8),
}

BETA2 = 0.999

#: The ways in, then the floor, in the order the tables list them.
WAYS = ("helper", "fused helper", "AccumulationOptimizer", "dataset loop", "floor")


def parameter_count(spec):
    sizes = [spec["features"], *spec["hidden"], spec["classes"]]
    return sum(a * b + b for a, b in zip(sizes, sizes[1:]))


def make_loss_fn(tf, spec, seed=0):
    """``loss_fn((x, y))``: an MLP built from seeded values with get_variable."""
    v1 = tf.compat.v1
    sizes = [spec["features"], *spec["hidden"], spec["classes"]]
    rng = np.random.RandomState(seed)
    initial = [
        ((rng.randn(a, b) / math.sqrt(a)).astype(np.float32), np.zeros(b, np.float32))
        for a, b in zip(sizes, sizes[1:])
    ]

    def loss_fn(batch):
        h, labels = batch
        for i, (w0, b0) in enumerate(initial):
            w = v1.get_variable(f"w{i}", initializer=w0)
            b = v1.get_variable(f"b{i}", initializer=b0)
            h = tf.matmul(h, w) + b
            if i < len(initial) - 1:
                h = tf.nn.relu(h)
        return tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=h)
        )

    return loss_fn


def make_data(spec, n, b, seed=1):
    rng = np.random.RandomState(seed)
    x = rng.randn(n * b, spec["features"]).astype(np.float32)
    y = rng.randint(0, spec["classes"], size=n * b).astype(np.int32)
    return x, y


def micro_batches(tf, spec, n, b):
    """The window's N micro-batches as a ``tf.data.Dataset``, repeated.

    Each micro-batch is formed once (``batch``, then ``cache``), as the other
    ways' feed dicts hold arrays formed once: the dataset loop then pays for
    drawing a micro-batch, not for stacking its B examples again each time.
    """
    dataset = tf.data.Dataset.from_tensor_slices(make_data(spec, n, b))
    return dataset.batch(b).cache().repeat()


def adam(tf):
    return tf.compat.v1.train.AdamOptimizer(1e-4, beta2=BETA2)


def fed_model(tf, spec, n, b):
    """Builds the model on placeholders: returns its loss and the window's feed dicts."""
    v1 = tf.compat.v1
    x_all, y_all = make_data(spec, n, b)
    x = v1.placeholder(tf.float32, [None, spec["features"]], name="x")
    y = v1.placeholder(tf.int32, [None], name="y")
    loss = make_loss_fn(tf, spec)((x, y))
    feeds = [{x: x_all[i * b : (i + 1) * b], y: y_all[i * b : (i + 1) * b]} for i in range(n)]
    return loss, feeds


def ways(tf, spec, n, b, **options):
    """{name: (session runs per window, build)} for every name of `WAYS`.

    ``options`` (``clip_norm``, ``statistics``) go to every way in.
    """
    import tf1_accum

    v1 = tf.compat.v1

    def model():
        return fed_model(tf, spec, n, b)

    def helper(fused):
        def build():
            loss, feeds = model()
            acc = tf1_accum.build_accumulation(loss, adam(tf), fused=fused, **options)
            return lambda sess: tf1_accum.run_accumulation(sess, acc, feeds)

        return build

    def optimizer():
        loss, feeds = model()
        opt = tf1_accum.AccumulationOptimizer(adam(tf), steps=n, **options)
        train_op = opt.minimize(loss)
        return per_micro_batch(train_op, feeds)

    def dataset_loop():
        acc = tf1_accum.build_dataset_accumulation(
            make_loss_fn(tf, spec), adam(tf), micro_batches(tf, spec, n, b), n, **options
        )
        return lambda sess: sess.run(acc.train_op)

    def floor():
        loss, feeds = model()
        opt = adam(tf)
        pairs = opt.compute_gradients(loss)
        accumulators = [
            v1.Variable(tf.zeros(v.shape, v.dtype.base_dtype), trainable=False) for _, v in pairs
        ]
        # Each add's output is its accumulator's new value: the apply reads
        # what the last adds wrote, ordered after them, with no other pass.
        sums = [a.assign_add(g) for a, (g, _) in zip(accumulators, pairs)]
        accumulate = tf.group(*sums)
        # The floor applies the sum, fused with the last add, on purpose.
        apply = opt.apply_gradients(
            [(s, v) for s, (_, v) in zip(sums, pairs)]  # tf1_accum.check: ignore TFA001, TFA003
        )

        def window(sess):
            for feed in feeds[:-1]:
                sess.run(accumulate, feed)
            sess.run(apply, feeds[-1])

        return window

    return {
        "helper": (n + 1, helper(False)),
        "fused helper": (n, helper(True)),
        "AccumulationOptimizer": (n, optimizer),
        "dataset loop": (1, dataset_loop),
        "floor": (n, floor),
    }


#: The accumulating peers: {name: (module, how to install it)}.
PEERS = {
    "tensorpack": ("tensorpack", "pip install tensorpack==0.11"),
    # 0.8.1 requires TensorFlow 2.5.1 or later: it does not install beside 1.15.
    "gpt-2-simple": ("gpt_2_simple", "pip install gpt-2-simple==0.8.1, on TensorFlow 2"),
}


def installed_peers():
    """The names of the peers installed here, in the order of `PEERS`.

    Looked up, not imported: gpt_2_simple's package switches off eager
    execution when imported.
    """
    import importlib.util

    return tuple(name for name, (module, _) in PEERS.items() if importlib.util.find_spec(module))


def missing_peers():
    """``"name (how to install it)"`` for each peer not installed here."""
    return [f"{name} ({how})" for name, (_, how) in PEERS.items() if name not in installed_peers()]


def peer_ways(tf, spec, n, b):
    """{name: (session runs per window, build)} for the accumulating peers installed.

    tensorpack's ``AccumGradOptimizer`` and gpt-2-simple's
    ``AccumulatingOptimizer`` (the ``bench`` extra), used as their
    documentation says, on the same model, data and Adam as `ways`.
    """
    v1 = tf.compat.v1

    def tensorpack():
        from tensorpack.tfutils.optimizer import AccumGradOptimizer

        loss, feeds = fed_model(tf, spec, n, b)
        train_op = AccumGradOptimizer(adam(tf), niter=n).minimize(loss)
        return per_micro_batch(train_op, feeds)

    def gpt_2_simple():
        # Imported once the graph mode is set: gpt_2_simple's package calls
        # disable_eager_execution() when imported.
        from gpt_2_simple.src.accumulate import AccumulatingOptimizer

        loss, feeds = fed_model(tf, spec, n, b)
        opt = AccumulatingOptimizer(opt=adam(tf), var_list=v1.trainable_variables())
        opt_reset = opt.reset()
        opt_compute = opt.compute_gradients(loss)
        opt_apply = opt.apply_gradients()

        def window(sess):
            sess.run(opt_reset)
            for feed in feeds:
                sess.run(opt_compute, feed)
            sess.run(opt_apply)

        return window

    ways = {"tensorpack": (n, tensorpack), "gpt-2-simple": (n + 2, gpt_2_simple)}
    return {name: ways[name] for name in installed_peers()}


def per_micro_batch(train_op, feeds):
    """A window that runs ``train_op`` once per micro-batch."""

    def window(sess):
        for feed in feeds:
            sess.run(train_op, feed)

    return window


def add_model_arguments(parser):
    """The options that choose the models, shared by the benchmarks that time them."""
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["mlp", "tiny"])
    parser.add_argument("-n", "--steps", type=int, default=8, help="micro-batches per window")
    parser.add_argument("-b", "--micro-batch", type=int, default=32)
    parser.add_argument("--repetitions", type=int, default=None)
    parser.add_argument(
        "--hidden", type=int, nargs="+", default=None, help="override the MLP's hidden sizes"
    )
    parser.add_argument("--features", type=int, default=None, help="override the MLP's input size")


def use_model_arguments(args):
    """Applies ``--hidden`` and ``--features`` to the MLP's entry of `MODELS`."""
    if args.hidden:
        MODELS["mlp"]["hidden"] = tuple(args.hidden)
    if args.features:
        MODELS["mlp"]["features"] = args.features
