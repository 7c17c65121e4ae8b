"""Property tests: accumulation equals large-batch training, whatever the setup.

Hypothesis draws the model's shapes (and whether its input goes through an
embedding table, for sparse gradients), the dtype, the optimizer, N, the
micro-batch sizes, the weighting and the way the window runs. The examples are
derandomized (the same on every run, in CI too) and few, because each one
builds two graphs: the accumulating one and its large-batch reference.

Weighting, for micro-batch i of B_i examples and mean loss L_i:

* ``equal``: no ``weight=``, equal sizes; the reference is the plain mean
  over the window's examples;
* ``size``: ``weight = B_i``, sizes differ; the reference is again the plain
  mean over all examples;
* ``random``: any positive ``weight = w_i``; the reference weighs each example
  of micro-batch i by w_i / (B_i * sum w), which makes its loss
  sum(w_i L_i) / sum(w_i), the mean that the apply uses.
"""

import numpy as np
import tensorflow as tf
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import tf1_accum
from _helpers import OPTIMIZERS
from _helpers import RTOL
from _helpers import assert_same_values
from _helpers import values_by_name

v1 = tf.compat.v1

WINDOWS = 2


@st.composite
def setups(draw):
    n = draw(st.integers(1, 4), label="N")
    weighting = draw(st.sampled_from(["equal", "size", "random"]), label="weighting")
    if weighting == "equal":
        size = draw(st.integers(1, 6))
        sizes = [[size] * n for _ in range(WINDOWS)]
    else:
        sizes = draw(
            st.lists(
                st.lists(st.integers(1, 6), min_size=n, max_size=n),
                min_size=WINDOWS,
                max_size=WINDOWS,
            ),
            label="sizes",
        )
    weights = [[float(b) for b in window] for window in sizes]
    if weighting == "random":
        weights = draw(
            st.lists(
                st.lists(st.floats(0.1, 3.0), min_size=n, max_size=n),
                min_size=WINDOWS,
                max_size=WINDOWS,
            ),
            label="weights",
        )
    return dict(
        dtype=draw(st.sampled_from([tf.float32, tf.float64]), label="dtype"),
        optimizer=draw(st.sampled_from(sorted(OPTIMIZERS)), label="optimizer"),
        features=draw(st.integers(1, 5), label="features"),
        hidden=draw(st.integers(1, 6), label="hidden"),
        outputs=draw(st.integers(1, 3), label="outputs"),
        vocab=draw(st.one_of(st.none(), st.integers(2, 12)), label="vocab (None: dense input)"),
        fused=draw(st.booleans(), label="fused"),
        weighting=weighting,
        sizes=sizes,
        weights=weights,
        seed=draw(st.integers(0, 2**16), label="seed"),
    )


def _data(setup):
    """Per window, per micro-batch: (inputs, targets), from the setup's seed."""
    rng = np.random.RandomState(setup["seed"])
    np_dtype = setup["dtype"].as_numpy_dtype
    windows = []
    for window in setup["sizes"]:
        batches = []
        for size in window:
            if setup["vocab"]:
                inputs = rng.randint(0, setup["vocab"], size=size).astype(np.int32)
            else:
                inputs = rng.randn(size, setup["features"]).astype(np_dtype)
            batches.append((inputs, rng.randn(size, setup["outputs"]).astype(np_dtype)))
        windows.append(batches)
    return windows


def _model(setup):
    """Placeholders, seeded variables, and the loss of each example, shape [batch]."""
    dtype, features = setup["dtype"], setup["features"]
    rng = np.random.RandomState(setup["seed"] + 1)
    np_dtype = dtype.as_numpy_dtype

    def variable(name, *shape):
        return v1.get_variable(name, initializer=rng.randn(*shape).astype(np_dtype), dtype=dtype)

    if setup["vocab"]:
        inputs = v1.placeholder(tf.int32, [None], name="ids")
        table = variable("embedding", setup["vocab"], features)
        x = tf.nn.embedding_lookup(table, inputs)
    else:
        inputs = v1.placeholder(dtype, [None, features], name="x")
        x = inputs
    targets = v1.placeholder(dtype, [None, setup["outputs"]], name="y")
    w1 = variable("w1", features, setup["hidden"])
    hidden = tf.tanh(tf.matmul(x, w1) + variable("b1", setup["hidden"]))
    prediction = tf.matmul(hidden, variable("w2", setup["hidden"], setup["outputs"]))
    per_example = tf.reduce_sum((prediction - targets) ** 2, axis=1)
    return inputs, targets, per_example


def _large_batch(setup, data):
    """Plain minimize, one step per window on its examples; values after each."""
    with tf.Graph().as_default():
        inputs, targets, per_example = _model(setup)
        coefficients = v1.placeholder(setup["dtype"], [None], name="coefficients")
        loss = tf.reduce_sum(coefficients * per_example)
        optimizer = OPTIMIZERS[setup["optimizer"]](setup["dtype"])
        train_op = optimizer.minimize(loss, global_step=v1.train.get_or_create_global_step())
        results = []
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for batches, weights in zip(data, setup["weights"]):
                if setup["weighting"] == "random":
                    parts = [np.full(len(b[0]), w / len(b[0])) for b, w in zip(batches, weights)]
                    c = np.concatenate(parts) / sum(weights)
                else:
                    total = sum(len(b[0]) for b in batches)
                    c = np.full(total, 1.0 / total)
                feed = {
                    inputs: np.concatenate([b[0] for b in batches]),
                    targets: np.concatenate([b[1] for b in batches]),
                    coefficients: c,
                }
                sess.run(train_op, feed)
                results.append(values_by_name(sess, v1.global_variables()))
    return results


def _accumulated(setup, data):
    """build_accumulation and run_accumulation; values after each window."""
    with tf.Graph().as_default():
        inputs, targets, per_example = _model(setup)
        weight = None
        if setup["weighting"] != "equal":
            weight = v1.placeholder(setup["dtype"], [], name="weight")
        acc = tf1_accum.build_accumulation(
            tf.reduce_mean(per_example),
            OPTIMIZERS[setup["optimizer"]](setup["dtype"]),
            global_step=v1.train.get_or_create_global_step(),
            weight=weight,
            fused=setup["fused"],
        )
        results = []
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for batches, weights in zip(data, setup["weights"]):
                feeds = []
                for (x, y), w in zip(batches, weights):
                    feeds.append({inputs: x, targets: y})
                    if weight is not None:
                        feeds[-1][weight] = w
                tf1_accum.run_accumulation(sess, acc, feeds)
                results.append(values_by_name(sess, tf1_accum.plain_variables()))
    return results


@settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(setups())
def test_accumulation_equals_large_batch_training(setup):
    data = _data(setup)
    expected = _large_batch(setup, data)
    actual = _accumulated(setup, data)
    for w, (got, want) in enumerate(zip(actual, expected)):
        assert_same_values(got, want, RTOL[setup["dtype"]], f"window {w} of {setup}")
        assert got["global_step"] == w + 1
