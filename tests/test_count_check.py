"""Losses averaged over a count of the fed data (a token mean), warned of when built.

Each way in warns, naming the count and the weight= to pass, when a loss is
divided by a count the fed data decides and no weight= was given; check_graph
reports a hand-written accumulation of such a loss. A mean over a fixed count
(all positions of the batch, the batch's rows), a softmax's sums and a loss
given its weight= are left alone.
"""

import re
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum

v1 = tf.compat.v1
VOCABULARY, LENGTH = 7, 5


def _token_model(kind, features=None):
    """A token-level loss of ``kind`` over padded ids; (ids, lengths, loss)."""
    if features is None:
        ids = v1.placeholder(tf.int32, [None, LENGTH], name="ids")
        lengths = v1.placeholder(tf.int32, [None], name="lengths")
    else:
        ids, lengths = features
    rng = np.random.RandomState(0)
    embedding = v1.get_variable("embedding", initializer=rng.randn(VOCABULARY, 3))
    softmax = v1.get_variable("softmax", initializer=rng.randn(3, VOCABULARY))
    logits = tf.tensordot(tf.nn.embedding_lookup(embedding, ids), softmax, 1)
    xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ids, logits=logits)
    mask = tf.sequence_mask(lengths, LENGTH, dtype=tf.float64)
    if kind == "sum of the mask":
        loss = tf.reduce_sum(xent * mask) / tf.maximum(
            tf.reduce_sum(mask, name="tokens"), 1.0, name="count"
        )
    elif kind == "reciprocal of the lengths' sum":
        tokens = tf.cast(tf.reduce_sum(lengths, name="tokens"), tf.float64, name="count")
        loss = tf.reduce_sum(xent * mask) * tf.math.reciprocal(tokens)
    elif kind == "mean of a boolean_mask":
        loss = tf.reduce_mean(tf.boolean_mask(xent, mask > 0, name="valid"))
    elif kind == "mean over all positions":
        loss = tf.reduce_mean(xent)
    elif kind == "sum over the batch's rows":
        loss = tf.reduce_sum(xent * mask) / tf.cast(tf.shape(ids)[0], tf.float64)
    elif kind == "softmax's sums":
        exp = tf.exp(logits)
        loss = -tf.reduce_mean(tf.math.log(exp / tf.reduce_sum(exp, -1, keepdims=True)))
    return ids, lengths, loss


WARNED = {
    "sum of the mask": "divides by count:0 (Maximum), the Sum of fed data",
    "reciprocal of the lengths' sum": "divides by count:0 (Cast), the Sum of fed data",
    "mean of a boolean_mask": "averages over valid/GatherV2:0, whose number of elements",
}
SILENT = ["mean over all positions", "sum over the batch's rows", "softmax's sums"]


def _warnings(build):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build()
    return [str(w.message) for w in caught if "(TFA014" in str(w.message)]


@pytest.mark.parametrize("kind", sorted(WARNED))
def test_build_accumulation_warns_of_a_loss_divided_by_a_count_of_the_data(kind):
    with tf.Graph().as_default():
        _, _, loss = _token_model(kind)
        opt = v1.train.GradientDescentOptimizer(0.1)
        [text] = _warnings(
            lambda: tf1_accum.build_accumulation(loss, opt)  # tf1_accum.check: ignore TFA014
        )
    assert text.startswith(f"tf1_accum: the loss {WARNED[kind]}")
    weight = "tf.size(<the tensor valid/GatherV2:0>)" if "boolean" in kind else "<the tensor "
    assert f"pass build_accumulation(loss, optimizer, weight={weight}" in text
    assert "(see real_programs.html#real-programs-token-mean)." in text


@pytest.mark.parametrize("kind", SILENT)
def test_a_mean_over_a_fixed_count_is_not_warned_of(kind):
    with tf.Graph().as_default():
        _, _, loss = _token_model(kind)
        opt = v1.train.GradientDescentOptimizer(0.1)
        built = _warnings(
            lambda: tf1_accum.build_accumulation(loss, opt)  # tf1_accum.check: ignore TFA014
        )
        assert built == []
        # Its gradients are read too (the wrapper's apply_gradients): silent there as well.
        wrapper = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), 2)
        pairs = wrapper.compute_gradients(loss)
        assert _warnings(lambda: wrapper.apply_gradients(pairs)) == []


def test_a_batch_mean_over_an_embedding_of_sparse_ids_is_not_warned_of():
    # A feature column's embedding drops invalid ids (Where) and averages each row's ids,
    # yet has one row per example: a mean over its batch is a fixed count.
    with tf.Graph().as_default():
        ids = v1.sparse_placeholder(tf.int64, name="ids")
        labels = v1.placeholder(tf.float64, [None, 1], name="labels")
        rng = np.random.RandomState(0)
        table = v1.get_variable("table", initializer=rng.randn(VOCABULARY, 3))
        dense = v1.get_variable("dense", initializer=rng.randn(3, 1))
        predictions = tf.matmul(v1.nn.safe_embedding_lookup_sparse(table, ids), dense)
        loss = tf.reduce_mean(tf.square(predictions - labels))
        opt = v1.train.GradientDescentOptimizer(0.1)
        built = _warnings(
            lambda: tf1_accum.build_accumulation(loss, opt)  # tf1_accum.check: ignore TFA014
        )
        assert built == []
        # Its rows reshaped or kept by a mask are counted by the data: warned of.
        masked = tf.boolean_mask(predictions, tf.reshape(labels > 0, [-1]), name="valid")
        flat = tf.reshape(masked, [-1], name="flat")
        warned = _warnings(
            lambda: tf1_accum.build_accumulation(  # tf1_accum.check: ignore TFA014
                tf.reduce_mean(flat), opt
            )
        )
        assert [text.split(", and")[0] for text in warned] == [
            "tf1_accum: the loss averages over flat:0, whose number of elements depends on the "
            "fed data"
        ]


def test_a_loss_given_its_weight_is_not_warned_of():
    with tf.Graph().as_default():
        _, lengths, loss = _token_model("sum of the mask")
        tokens = tf.reduce_sum(lengths)
        opt = v1.train.GradientDescentOptimizer(0.1)
        assert _warnings(lambda: tf1_accum.build_accumulation(loss, opt, weight=tokens)) == []
        wrapper = tf1_accum.AccumulationOptimizer(opt, 2, weight=lambda: tokens)
        assert _warnings(lambda: wrapper.minimize(loss)) == []


def test_the_wrapper_warns_from_the_loss_and_from_its_gradients():
    with tf.Graph().as_default():
        _, _, loss = _token_model("sum of the mask")
        first = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), 2)
        [from_loss] = _warnings(lambda: first.minimize(loss))  # tf1_accum.check: ignore TFA014
        second = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), 2)
        pairs = second.compute_gradients(loss)
        [from_gradients] = _warnings(lambda: second.apply_gradients(pairs))
    for text in (from_loss, from_gradients):
        assert "divides by count:0 (Maximum), the Sum of fed data" in text
        assert "AccumulationOptimizer(optimizer, steps, weight=<the tensor count:0>)" in text


def _dataset():
    rng = np.random.RandomState(1)
    ids = rng.randint(1, VOCABULARY, size=(8, LENGTH)).astype(np.int32)
    lengths = rng.randint(1, LENGTH + 1, size=8).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((ids, lengths)).batch(2)


def test_the_dataset_loop_warns_unless_given_a_weight_of_the_element():
    def loss_fn(element):
        return _token_model("sum of the mask", element)[2]

    def build(weight):
        opt = v1.train.GradientDescentOptimizer(0.1)
        return tf1_accum.build_dataset_accumulation(loss_fn, opt, _dataset(), 2, weight=weight)

    with tf.Graph().as_default():
        [text] = _warnings(lambda: build(None))
    assert "the Sum of fed data, and no weight= was given (TFA014" in text
    assert "build_dataset_accumulation(..., weight=lambda element: <the tensor " in text
    with tf.Graph().as_default():
        assert _warnings(lambda: build(lambda element: tf.reduce_sum(element[1]))) == []


def _hand_written(weighted):
    """Forum-style accumulation of a token-mean loss: (apply_op, accumulate ops)."""
    _, lengths, loss = _token_model("sum of the mask")
    tokens = tf.cast(tf.reduce_sum(lengths), tf.float64)
    opt = v1.train.GradientDescentOptimizer(0.1)
    pairs = opt.compute_gradients(loss)
    accums = [v1.Variable(tf.zeros(v.shape, v.dtype.base_dtype), trainable=False) for _, v in pairs]
    total = v1.Variable(tf.zeros([], tf.float64), trainable=False)
    scale = tokens if weighted else 1.0
    adds = [a.assign_add(tf.convert_to_tensor(g) * scale) for a, (g, _) in zip(accums, pairs)]
    adds.append(total.assign_add(tokens if weighted else 1.0))
    # Weighted, the total is the window's tokens: a weighted mean, not a count of micro-batches.
    mean = [(a / total, v) for a, (_, v) in zip(accums, pairs)]
    apply = opt.apply_gradients(mean)  # tf1_accum.check: ignore TFA002
    resets = [a.assign(tf.zeros_like(a)) for a in accums + [total]]
    return tf.group(apply, *resets), adds


def test_check_graph_reports_a_hand_written_accumulation_of_a_token_mean():
    with tf.Graph().as_default():
        findings = tf1_accum.check_graph(*_hand_written(weighted=False))
    [finding] = [f for f in findings if f.kind == "mean_over_data_count"]
    assert (finding.code, finding.op_name) == ("TFA014", "tokens")
    assert finding.message.startswith(
        "The gradients accumulated are of a loss that divides by count:0 (Maximum), the Sum "
        "of fed data, and nothing weighs them by it: weight=<the tensor count:0>: a mean over a "
        "count the data decides"
    )


def test_check_graph_leaves_a_weighted_or_tf1_accum_accumulation_alone():
    with tf.Graph().as_default():
        findings = tf1_accum.check_graph(*_hand_written(weighted=True))
    assert [f.kind for f in findings if f.kind == "mean_over_data_count"] == []
    with tf.Graph().as_default(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, _, loss = _token_model("sum of the mask")
        acc = tf1_accum.build_accumulation(  # tf1_accum.check: ignore TFA014
            loss, v1.train.GradientDescentOptimizer(0.1)
        )
        assert tf1_accum.check_graph(acc.apply_op, acc.accum_op) == []


def test_the_warning_names_the_code_the_catalogue_gives():
    with tf.Graph().as_default():
        _, _, loss = _token_model("mean of a boolean_mask")
        opt = v1.train.GradientDescentOptimizer(0.1)
        [text] = _warnings(
            lambda: tf1_accum.build_accumulation(loss, opt)  # tf1_accum.check: ignore TFA014
        )
    assert re.search(r"\(TFA014, mean over a data-dependent count\): a mean over a count", text)
