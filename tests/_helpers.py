"""Models, optimizers and comparisons shared by the tests.

Each model is built in its own ``tf.Graph`` from seeded NumPy values, so an
accumulating graph and a plain large-batch graph start from the same point.
"""

import functools

import numpy as np
import tensorflow as tf

from _ways import BY_NAME

v1 = tf.compat.v1


class SubclassedMomentum(v1.train.MomentumOptimizer):
    """A user subclass: accumulation must work through ``Optimizer`` subclasses."""


# Each takes the model's dtype: ProximalAdagradOptimizer does not cast its
# hyperparameters, so float64 training needs them as float64 tensors.
OPTIMIZERS = {
    "sgd": lambda dtype: v1.train.GradientDescentOptimizer(0.1),
    "momentum": lambda dtype: v1.train.MomentumOptimizer(0.1, 0.9),
    "nesterov": lambda dtype: v1.train.MomentumOptimizer(0.1, 0.9, use_nesterov=True),
    "adam": lambda dtype: v1.train.AdamOptimizer(0.05),
    "rmsprop": lambda dtype: v1.train.RMSPropOptimizer(0.05, momentum=0.5),
    "adagrad": lambda dtype: v1.train.AdagradOptimizer(0.1),
    "adadelta": lambda dtype: v1.train.AdadeltaOptimizer(1.0),
    "ftrl": lambda dtype: v1.train.FtrlOptimizer(
        0.1, l1_regularization_strength=0.001, l2_regularization_strength=0.01
    ),
    "proximal_adagrad": lambda dtype: v1.train.ProximalAdagradOptimizer(
        tf.constant(0.1, dtype),
        l1_regularization_strength=tf.constant(0.001, dtype),
        l2_regularization_strength=tf.constant(0.01, dtype),
    ),
    "subclass": lambda dtype: SubclassedMomentum(0.05, 0.5),
}

# Relative error allowed per parameter (per variable: the largest elementwise
# difference over the largest magnitude, see relative_error) between
# accumulated and large-batch training.
RTOL = {tf.float64: 1e-10, tf.float32: 1e-5}
# The same, 1e-6 in float32, where the accumulated window and the large batch
# add the same float32 numbers in another order and nothing else differs (the
# equivalence grid, weighted windows, loss scaling): the largest error
# measured there is 5.5e-7, in every graph mode. Float32 tests not measured
# against 1e-6 (Keras, Horovod, threads, the distributed ways) keep RTOL.
RTOL_TIGHT = {tf.float64: 1e-10, tf.float32: 1e-6}

VOCAB = 30  # embedding rows; ids are drawn from the first 20 only
FEATURES = 4
HIDDEN = 6


class Model:
    """A small MLP, optionally fed through an embedding table (sparse gradient).

    Attributes:
        inputs: the input placeholder (float features, or int ids).
        labels: the label placeholder.
        loss: mean squared error over the batch.
    """

    def __init__(self, dtype, sparse, seed=0, inputs=None, labels=None):
        rng = np.random.RandomState(seed)
        np_dtype = dtype.as_numpy_dtype
        if sparse:
            self.inputs = v1.placeholder(tf.int32, [None], name="ids") if inputs is None else inputs
            table = v1.get_variable(
                "embedding", initializer=rng.randn(VOCAB, FEATURES).astype(np_dtype), dtype=dtype
            )
            features = tf.nn.embedding_lookup(table, self.inputs)
        else:
            self.inputs = (
                v1.placeholder(dtype, [None, FEATURES], name="x") if inputs is None else inputs
            )
            features = self.inputs
        self.labels = v1.placeholder(dtype, [None, 1], name="y") if labels is None else labels
        w1 = v1.get_variable(
            "w1", initializer=rng.randn(FEATURES, HIDDEN).astype(np_dtype), dtype=dtype
        )
        b1 = v1.get_variable(
            "b1", initializer=(0.1 * rng.randn(HIDDEN)).astype(np_dtype), dtype=dtype
        )
        w2 = v1.get_variable("w2", initializer=rng.randn(HIDDEN, 1).astype(np_dtype), dtype=dtype)
        hidden = tf.tanh(tf.matmul(features, w1) + b1)
        self.loss = tf.reduce_mean((tf.matmul(hidden, w2) - self.labels) ** 2)

    def feed(self, batch):
        inputs, labels = batch
        return {self.inputs: inputs, self.labels: labels}


def make_batches(dtype, sparse, count, size, seed=1):
    """Returns ``count`` micro-batches of ``size`` examples, as (inputs, labels).

    ``size`` is an int, or a list of ``count`` sizes.
    """
    rng = np.random.RandomState(seed)
    np_dtype = dtype.as_numpy_dtype
    sizes = size if isinstance(size, (list, tuple)) else [size] * count
    batches = []
    for size in sizes:
        if sparse:
            inputs = rng.randint(0, 20, size=size).astype(np.int32)
        else:
            inputs = rng.randn(size, FEATURES).astype(np_dtype)
        labels = rng.randn(size, 1).astype(np_dtype)
        batches.append((inputs, labels))
    return batches


def concat(batches):
    """Joins micro-batches into one large batch."""
    return tuple(np.concatenate(part) for part in zip(*batches))


def pending(sess, accumulators, counter):
    """What a window holds: its accumulators' values, or zeros while its ``counter`` is 0.

    A window's first add assigns, so between windows a dense accumulator
    keeps what the last window left there: only a counter above 0 makes it
    the window's sums.
    """
    values, count = sess.run([list(accumulators), counter])
    return values if count > 0 else [np.zeros_like(v) for v in values]


def values_by_name(sess, variables):
    """Returns {variable name: value} for ``variables``."""
    variables = list(variables)
    return dict(zip([v.op.name for v in variables], sess.run(variables)))


def relative_error(actual, expected):
    """max|actual - expected| / max|expected| over one variable (0 if equal).

    Normalizing by the variable's largest magnitude, not elementwise, keeps an
    element that is itself a near-cancelling sum (a momentum slot crossing
    zero) from reporting float32 rounding as a large relative error.
    """
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    diff = float(np.max(np.abs(actual - expected), initial=0.0))
    if diff == 0.0:
        return 0.0
    scale = float(np.max(np.abs(expected), initial=0.0))
    return diff / scale if scale else float("inf")


def assert_same_values(actual, expected, rtol, where):
    """Fails naming ``where`` and the variable if any value differs by > rtol."""
    missing = sorted(set(expected) - set(actual))
    assert not missing, f"{where}: variables missing from the accumulating graph: {missing}"
    for name in sorted(expected):
        err = relative_error(actual[name], expected[name])
        assert err <= rtol, (
            f"{where}: {name} diverged from large-batch training: relative error "
            f"{err:.3g} > {rtol:g}\n  accumulated: {actual[name]}\n"
            f"  large batch: {expected[name]}"
        )


class CountingSession:
    """Wraps a session and counts its ``run`` calls."""

    def __init__(self, sess):
        self.sess = sess
        self.calls = []

    def run(self, fetches, feed_dict=None, **kwargs):
        self.calls.append(feed_dict)
        return self.sess.run(fetches, feed_dict=feed_dict, **kwargs)


def plain_training(optimizer_name, dtype, sparse, windows):
    """Trains with plain ``minimize`` on each window's concatenated batch.

    Returns one {variable name: value} dict per window, after its update.
    """
    with tf.Graph().as_default():
        model = Model(dtype, sparse)
        global_step = v1.train.get_or_create_global_step()
        train_op = OPTIMIZERS[optimizer_name](dtype).minimize(model.loss, global_step=global_step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            results = []
            for window in windows:
                sess.run(train_op, model.feed(concat(window)))
                results.append(values_by_name(sess, v1.global_variables()))
    return results


def dataset_of(batches):
    """A ``tf.data.Dataset`` whose elements are the given micro-batches, in order."""
    inputs = np.stack([b[0] for b in batches])
    labels = np.stack([b[1] for b in batches])
    return tf.data.Dataset.from_tensor_slices((inputs, labels))


def loss_fn_of(dtype, sparse):
    """The dataset loop's ``loss_fn``: the `Model`'s loss on one dataset element."""

    def loss_fn(batch):
        inputs, labels = batch
        return Model(dtype, sparse, inputs=inputs, labels=labels).loss

    return loss_fn


def dataset_training(make_optimizer, dtype, sparse, batches, steps):
    """Runs the dataset loop's train op until the data ends.

    Asserts that each run leaves the window empty and that ``global_step``
    counts the runs. Returns (micro-batches drawn, {variable name: value})
    after each run.
    """
    import tf1_accum

    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        acc = tf1_accum.build_dataset_accumulation(
            loss_fn_of(dtype, sparse),
            make_optimizer(),
            dataset_of(batches),
            steps,
            global_step=step,
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            results = []
            while True:
                try:
                    _, drawn = sess.run([acc.train_op, acc.micro_batches])
                except tf.errors.OutOfRangeError:
                    break
                results.append((int(drawn), values_by_name(sess, v1.global_variables())))
                assert sess.run(acc.counter) == 0
            assert sess.run(step) == len(results)
    return results


def accumulated_training(optimizer_name, dtype, sparse, windows, path):
    """Trains the same model by accumulation, window by window.

    ``path`` names a way in of `_ways.WAYS` (or is one), built with
    ``steps`` the size of the first window: the wrapper flushes a shorter
    window, the end of the data cuts the dataset loop's last window short.
    Asserts that no variable moves before the apply (where the way runs
    micro-batches one by one) and that each window leaves the counter at 0.
    Returns one {variable name: value} dict per window, after its update.
    """
    import tf1_accum

    way = BY_NAME.get(path, path)
    with tf.Graph().as_default():
        global_step = v1.train.get_or_create_global_step()
        built = way.build(
            lambda inputs: Model(dtype, sparse, inputs=inputs[0], labels=inputs[1]).loss,
            OPTIMIZERS[optimizer_name](dtype),
            [batch for window in windows for batch in window],
            len(windows[0]),
            global_step=global_step,
        )
        trained = tf1_accum.plain_variables()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            results = []
            for w, window in enumerate(windows):
                before = values_by_name(sess, trained)

                def unmoved(w=w, before=before):
                    moved = values_by_name(sess, trained)
                    assert_same_values(moved, before, 0.0, f"window {w}, before apply")

                way.run_window(sess, built, window, between=unmoved)
                assert sess.run(built.counter) == 0, f"{way}: window {w} left open"
                results.append(values_by_name(sess, v1.global_variables()))
    return results


@functools.lru_cache(maxsize=None)
def _large_batch_reference(optimizer_name, dtype, sparse, sizes, b):
    """`plain_training` on the windows of `_windows`, computed once per process.

    Every way in is compared with the same reference; the grid reuses it
    rather than training it again for each way.
    """
    return tuple(plain_training(optimizer_name, dtype, sparse, _windows(dtype, sparse, sizes, b)))


def _windows(dtype, sparse, sizes, b):
    """Micro-batches of ``b`` examples grouped into windows of ``sizes``."""
    batches = make_batches(dtype, sparse, sum(sizes), b)
    starts = np.cumsum([0] + list(sizes))
    return [batches[start:stop] for start, stop in zip(starts[:-1], starts[1:])]


def check_equivalence(optimizer_name, dtype, sparse, path, windows=3, n=4, b=5):
    """Asserts accumulated == large-batch training after each of ``windows``."""
    sizes = (n,) * windows
    expected = _large_batch_reference(optimizer_name, dtype, sparse, sizes, b)
    actual = accumulated_training(
        optimizer_name, dtype, sparse, _windows(dtype, sparse, sizes, b), path
    )
    assert len(actual) == len(expected) == windows
    for w, (got, want) in enumerate(zip(actual, expected)):
        assert_same_values(
            got,
            want,
            RTOL_TIGHT[dtype],
            f"{optimizer_name}, {dtype.name}, {'sparse' if sparse else 'dense'}, "
            f"{path}: window {w}",
        )
        assert got["global_step"] == w + 1


def check_short_window(optimizer_name, path, sizes=(4, 4, 2), dtype=tf.float64, sparse=False, b=3):
    """Asserts windows of ``sizes`` micro-batches of ``b`` equal large-batch training.

    The last window is shorter: it must be averaged over its own count.
    """
    expected = _large_batch_reference(optimizer_name, dtype, sparse, tuple(sizes), b)
    actual = accumulated_training(
        optimizer_name, dtype, sparse, _windows(dtype, sparse, sizes, b), path
    )
    assert len(actual) == len(expected) == len(sizes)
    for w, (got, want) in enumerate(zip(actual, expected)):
        assert_same_values(got, want, RTOL_TIGHT[dtype], f"{path}: window {w} of sizes {sizes}")
        assert got["global_step"] == w + 1


def ancestors(op):
    """``op`` and every op it depends on, through inputs or control inputs."""
    reached, stack = set(), [op]
    while stack:
        current = stack.pop()
        if current not in reached:
            reached.add(current)
            stack.extend(t.op for t in current.inputs)
            stack.extend(current.control_inputs)
    return reached
