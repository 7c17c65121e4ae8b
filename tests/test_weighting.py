"""Weighted averaging: micro-batches of different sizes, in every way in."""

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import OPTIMIZERS
from _helpers import RTOL
from _helpers import RTOL_TIGHT
from _helpers import Model
from _helpers import assert_same_values
from _helpers import make_batches
from _helpers import plain_training
from _helpers import relative_error
from _helpers import values_by_name
from _ways import WAYS

v1 = tf.compat.v1

SIZES = [5, 11, 3, 13]  # one window: 32 examples


def _size(inputs):
    return tf.cast(tf.shape(inputs)[0], tf.float32)


def _weighted_training(optimizer_name, dtype, sparse, windows, way):
    """Accumulates each window's micro-batches with weight = their size."""
    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        built = way.build(
            lambda b: Model(dtype, sparse, inputs=b[0], labels=b[1]).loss,
            OPTIMIZERS[optimizer_name](dtype),
            [b for window in windows for b in window],
            len(SIZES),
            global_step=step,
            weight=lambda b: _size(b[0]),
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            results = []
            for window in windows:
                way.run_window(sess, built, window)
                results.append(values_by_name(sess, v1.global_variables()))
    return results


@pytest.mark.parametrize("way", WAYS, ids=str)
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("dtype", [tf.float64, tf.float32], ids=lambda d: d.name)
@pytest.mark.parametrize("optimizer_name", ["sgd", "adam", "adagrad"])
def test_weighted_micro_batches_equal_one_batch_of_32(optimizer_name, dtype, sparse, way):
    batches = make_batches(dtype, sparse, 8, SIZES * 2)
    windows = [batches[:4], batches[4:]]
    expected = plain_training(optimizer_name, dtype, sparse, windows)
    actual = _weighted_training(optimizer_name, dtype, sparse, windows, way)
    for w, (got, want) in enumerate(zip(actual, expected)):
        assert_same_values(
            got,
            want,
            RTOL_TIGHT[dtype],
            f"{optimizer_name}, {dtype.name}, {way}, weighted: window {w}",
        )


def test_unweighted_averaging_of_unequal_sizes_is_biased():
    """The default counter mean weights a 3-example micro-batch like a 13-example one."""
    batches = make_batches(tf.float64, False, 4, SIZES)
    expected = plain_training("sgd", tf.float64, False, [batches])[0]
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        acc = tf1_accum.build_accumulation(model.loss, OPTIMIZERS["sgd"](tf.float64))
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in batches])
            got = values_by_name(sess, acc.var_list)
    errors = [relative_error(got[name], expected[name]) for name in got]
    assert max(errors) > 1e-3


def test_token_masked_sequence_loss_equals_the_token_mean_of_the_window():
    rng = np.random.RandomState(3)
    lengths = [[3, 5, 1], [6, 2], [4, 4, 4, 2]]  # tokens per sequence, per micro-batch
    steps = 6
    batches = []
    for seqs in lengths:
        x = rng.randn(len(seqs), steps, 2)
        y = rng.randn(len(seqs), steps)
        mask = (np.arange(steps)[None, :] < np.array(seqs)[:, None]).astype(np.float64)
        batches.append((x, y, mask))

    def build():
        x = v1.placeholder(tf.float64, [None, steps, 2])
        y = v1.placeholder(tf.float64, [None, steps])
        mask = v1.placeholder(tf.float64, [None, steps])
        w = v1.get_variable("w", initializer=np.array([0.5, -1.0]))
        per_token = (tf.tensordot(x, w, 1) - y) ** 2
        tokens = tf.reduce_sum(mask)
        loss = tf.reduce_sum(per_token * mask) / tokens  # token mean of a micro-batch
        return (x, y, mask), w, loss, tokens

    with tf.Graph().as_default():
        ph, w, loss, tokens = build()
        acc = tf1_accum.build_accumulation(
            loss, v1.train.GradientDescentOptimizer(0.1), weight=tokens
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            tf1_accum.run_accumulation(sess, acc, [dict(zip(ph, b)) for b in batches])
            got = sess.run(w)
    with tf.Graph().as_default():
        ph, w, loss, _ = build()
        train = v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        padded = [np.concatenate(part) for part in zip(*batches)]
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train, dict(zip(ph, padded)))
            want = sess.run(w)
    assert np.abs(got - np.array([0.5, -1.0])).max() > 1e-3
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_zero_weight_window_is_skipped_and_a_negative_weight_raises():
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        scale = v1.placeholder(tf.float64, [])
        step = v1.train.get_or_create_global_step()
        acc = tf1_accum.build_accumulation(
            model.loss, OPTIMIZERS["sgd"](tf.float64), global_step=step, weight=scale
        )
        batches = make_batches(tf.float64, False, 2, 4)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            before = values_by_name(sess, acc.var_list)
            # 0 / 0 has no mean: the window is skipped and counted.
            tf1_accum.run_accumulation(sess, acc, [{**model.feed(b), scale: 0.0} for b in batches])
            assert sess.run([step, acc.skipped_windows, acc.counter]) == [0, 1, 0]
            feeds = [{**model.feed(b), scale: w} for b, w in zip(batches, [1.0, -1.0])]
            with pytest.raises(
                tf.errors.InvalidArgumentError, match="(?s)micro-batch 1 .*weight is negative"
            ):
                tf1_accum.run_accumulation(sess, acc, feeds)
            assert sess.run(acc.counter) == 0
            after = values_by_name(sess, acc.var_list)
            # Training goes on.
            tf1_accum.run_accumulation(sess, acc, [{**model.feed(b), scale: 1.0} for b in batches])
            assert sess.run(step) == 1
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value)


@pytest.mark.parametrize(
    "weight, error, message",
    [
        (3.0, TypeError, r"weight must be a scalar real number tf.Tensor .*got 3.0"),
        ("tokens", TypeError, "weight must be a scalar real number tf.Tensor"),
    ],
)
def test_bad_weight_is_rejected(weight, error, message):
    with tf.Graph().as_default():
        model = Model(tf.float32, False)
        with pytest.raises(error, match=message):
            tf1_accum.build_accumulation(model.loss, OPTIMIZERS["sgd"](tf.float32), weight=weight)
        with pytest.raises(error, match=message):
            tf1_accum.AccumulationOptimizer(OPTIMIZERS["sgd"](tf.float32), 2, weight=weight)
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []


def test_non_scalar_or_non_real_weight_is_rejected():
    with tf.Graph().as_default():
        model = Model(tf.float32, False)
        opt = OPTIMIZERS["sgd"](tf.float32)
        with pytest.raises(ValueError, match=r"weight must be a scalar .*shape \[None\]"):
            tf1_accum.build_accumulation(model.loss, opt, weight=model.labels[:, 0])
        with pytest.raises(TypeError, match="real number tensor .*got .* string"):
            tf1_accum.build_accumulation(model.loss, opt, weight=tf.constant("a"))
        with pytest.raises(TypeError, match="weight must be a callable taking one dataset element"):
            tf1_accum.build_dataset_accumulation(
                lambda b: model.loss, opt, tf.data.Dataset.range(3), 2, weight=tf.constant(1.0)
            )


# Token-weighted language-model training: loss is the token mean of a
# micro-batch, weight its token count. An all-padding micro-batch has loss
# 0 / 0 = NaN and weight 0: it must contribute nothing.
LM_VOCAB = 12
LM_STEPS = 5


def _lm_batch(rng, sequences, ids=(0, 10), padding=False):
    tokens = rng.randint(ids[0], ids[1], size=(sequences, LM_STEPS)).astype(np.int32)
    targets = rng.randn(sequences, LM_STEPS)
    if padding:
        mask = np.zeros((sequences, LM_STEPS))
    else:
        lengths = rng.randint(1, LM_STEPS + 1, size=sequences)
        mask = (np.arange(LM_STEPS)[None, :] < lengths[:, None]).astype(np.float64)
    return tokens, targets, mask


def _lm_windows():
    """Two windows of three micro-batches, each with one all-padding micro-batch.

    The second window's padding names rows (6 to 9) that only the first
    window's real micro-batches touched: marking them touched would move
    them under Momentum, whose sparse update acts on the rows it is given.
    """
    rng = np.random.RandomState(7)
    first = [_lm_batch(rng, 3), _lm_batch(rng, 2, padding=True), _lm_batch(rng, 4)]
    second = [
        _lm_batch(rng, 2, ids=(0, 6)),
        _lm_batch(rng, 3, ids=(0, 6)),
        _lm_batch(rng, 2, ids=(6, 10), padding=True),
    ]
    return [first, second]


def _lm_model(inputs=None):
    """Returns (placeholders, token-mean loss, token count, summed token loss)."""
    rng = np.random.RandomState(0)
    if inputs is None:
        inputs = (
            v1.placeholder(tf.int32, [None, LM_STEPS]),
            v1.placeholder(tf.float64, [None, LM_STEPS]),
            v1.placeholder(tf.float64, [None, LM_STEPS]),
        )
    ids, targets, mask = inputs
    table = v1.get_variable("embedding", initializer=rng.randn(LM_VOCAB, 3), dtype=tf.float64)
    w = v1.get_variable("w", initializer=rng.randn(3), dtype=tf.float64)
    b = v1.get_variable("b", initializer=np.float64(0.3), dtype=tf.float64)
    predictions = tf.tanh(tf.tensordot(tf.nn.embedding_lookup(table, ids), w, 1) + b)
    per_token = (predictions - targets) ** 2
    tokens = tf.reduce_sum(mask)
    summed = tf.reduce_sum(per_token * mask)
    return inputs, summed / tokens, tokens, summed


def _lm_plain(optimizer_name, windows, average=True):
    """Large-batch training on each window's real (non-padding) micro-batches."""
    with tf.Graph().as_default():
        inputs, loss, _, summed = _lm_model()
        step = v1.train.get_or_create_global_step()
        train = OPTIMIZERS[optimizer_name](tf.float64).minimize(
            loss if average else summed, global_step=step
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            results = []
            for window in windows:
                real = [b for b in window if b[2].any()] or window
                sess.run(train, dict(zip(inputs, [np.concatenate(p) for p in zip(*real)])))
                results.append(values_by_name(sess, v1.global_variables()))
    return results


def _lm_accumulated(optimizer_name, windows, way, average=True):
    """Token-weighted training through ``way``.

    Returns the values after each window, and the window losses the way
    reads in its apply runs (None where it has no window loss).
    """
    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        built = way.build(
            lambda b: _lm_model(b)[1],
            OPTIMIZERS[optimizer_name](tf.float64),
            [b for window in windows for b in window],
            len(windows[0]),
            global_step=step,
            average=average,
            weight=lambda b: tf.reduce_sum(b[2]),
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            results, losses = [], []
            for window in windows:
                losses.append(way.run_window(sess, built, window, fetch=built.window_loss))
                results.append(values_by_name(sess, v1.global_variables()))
            assert sess.run([step, built.skipped_windows]) == [len(windows), 0]
    return results, losses


@pytest.mark.parametrize("way", WAYS, ids=str)
@pytest.mark.parametrize("optimizer_name", ["sgd", "momentum", "adam"])
def test_an_all_padding_micro_batch_contributes_nothing(optimizer_name, way):
    windows = _lm_windows()
    expected = _lm_plain(optimizer_name, windows)
    actual, _ = _lm_accumulated(optimizer_name, windows, way)
    for w, (got, want) in enumerate(zip(actual, expected)):
        got = {k: v for k, v in got.items() if k in want}
        assert_same_values(got, want, 1e-10, f"{optimizer_name}, {way}: window {w}")


@pytest.mark.parametrize("way", WAYS, ids=str)
@pytest.mark.parametrize("optimizer_name", ["sgd", "momentum", "adam"])
def test_the_window_loss_over_an_all_padding_micro_batch_is_finite(optimizer_name, way):
    """The padding's NaN loss (0 / 0) is weighed 0 in the window's loss too."""
    way.require("report_window_loss")
    _, losses = _lm_accumulated(optimizer_name, _lm_windows(), way)
    assert len(losses) == 2 and np.isfinite(losses).all(), losses


def test_the_all_padding_micro_batch_has_a_nan_gradient_and_weight_zero():
    """The case above is the one that matters: 0 / 0 poisons the gradient."""
    padding = _lm_windows()[0][1]
    with tf.Graph().as_default():
        inputs, loss, tokens, _ = _lm_model()
        grads = tf.gradients(loss, v1.trainable_variables())
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            feed = dict(zip(inputs, padding))
            assert sess.run(tokens, feed) == 0.0
            assert all(np.isnan(sess.run(tf.convert_to_tensor(g), feed)).any() for g in grads)


def test_an_infinite_gradient_of_weight_zero_contributes_nothing():
    windows = _lm_windows()
    expected = _lm_plain("sgd", windows[:1])[0]
    expected = {name: value for name, value in expected.items() if name != "global_step"}
    with tf.Graph().as_default():
        inputs, _, tokens, summed = _lm_model()
        b = [v for v in v1.trainable_variables() if v.op.name == "b"][0]
        # The token mean, plus a term whose gradient is Inf, not NaN, where
        # the micro-batch is all padding (and 0 elsewhere).
        infinite = tf.where(tokens > 0, tf.constant(0.0, tf.float64), np.inf)
        loss = summed / tf.maximum(tokens, 1.0) + b * infinite
        acc = tf1_accum.build_accumulation(loss, OPTIMIZERS["sgd"](tf.float64), weight=tokens)
        (grad_b,) = tf.gradients(loss, [b])
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            feeds = [dict(zip(inputs, batch)) for batch in windows[0]]
            assert sess.run(grad_b, feeds[1]) == np.inf
            tf1_accum.run_accumulation(sess, acc, feeds)
            assert sess.run(acc.skipped_windows) == 0
            got = values_by_name(sess, acc.var_list)
    assert_same_values(got, expected, 1e-10, "sgd, an Inf gradient of weight 0")


def test_a_nan_in_a_micro_batch_of_positive_weight_still_skips_the_window():
    windows = _lm_windows()
    poisoned = list(windows[0])
    ids, targets, mask = poisoned[0]
    poisoned[0] = (ids, np.where(mask > 0, np.nan, targets), mask)
    expected = _lm_plain("adam", windows[1:])[0]
    with tf.Graph().as_default():
        inputs, loss, tokens, _ = _lm_model()
        step = v1.train.get_or_create_global_step()
        acc = tf1_accum.build_accumulation(
            loss, OPTIMIZERS["adam"](tf.float64), global_step=step, weight=tokens
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for window in (poisoned, windows[1]):
                tf1_accum.run_accumulation(sess, acc, [dict(zip(inputs, b)) for b in window])
            assert sess.run([step, acc.skipped_windows]) == [1, 1]
            got = values_by_name(sess, v1.global_variables())
    assert_same_values(got, expected, 1e-10, "adam, the window after a skipped one")


@pytest.mark.parametrize("way", WAYS, ids=str)
def test_a_window_of_weight_zero_with_average_false_applies_a_zero_sum(way):
    """The sum over no token is 0: applied, as plain training on a token sum would."""
    windows = _lm_windows()
    rng = np.random.RandomState(11)
    empty = [_lm_batch(rng, 2, padding=True) for _ in range(3)]
    expected = _lm_plain("adam", [windows[0], empty], average=False)
    actual, _ = _lm_accumulated("adam", [windows[0], empty], way, average=False)
    # Adam's moments keep moving the variables after the first window.
    assert relative_error(expected[1]["w"], expected[0]["w"]) > 1e-3
    for w, (got, want) in enumerate(zip(actual, expected)):
        got = {k: v for k, v in got.items() if k in want}
        assert_same_values(got, want, 1e-10, f"adam, average=False, {way}: window {w}")


def test_statistics_ignore_a_micro_batch_of_weight_zero():
    """The statistics of a window equal those of the window without its padding."""
    window = _lm_windows()[0]
    real = [window[0], window[2]]

    def statistics(batches):
        with tf.Graph().as_default():
            inputs, loss, tokens, _ = _lm_model()
            acc = tf1_accum.build_accumulation(
                loss, OPTIMIZERS["sgd"](tf.float64), weight=tokens, statistics=True
            )
            stats = acc.statistics._replace(summary_op=tf.constant(0.0))
            with v1.Session() as sess:
                sess.run(v1.global_variables_initializer())
                for _ in range(2):  # the second window's moving average counts the first
                    for batch in batches:
                        sess.run(acc.accum_op, dict(zip(inputs, batch)))
                    _, values = sess.run([acc.apply_op, stats])
        return values

    got, want = statistics(window), statistics(real)
    assert want.micro_batches == 2 and np.isfinite(want.noise_scale_ema)
    for field in got._fields:
        np.testing.assert_allclose(
            np.asarray(getattr(got, field)),
            np.asarray(getattr(want, field)),
            rtol=1e-10,
            err_msg=field,
        )


@pytest.mark.parametrize("way", WAYS, ids=str)
def test_a_window_of_padding_only_is_skipped_and_counted_then_training_goes_on(way):
    """Weights summing to 0 with average=True: no mean, so the window is skipped."""
    windows = _lm_windows()
    rng = np.random.RandomState(12)
    empty = [_lm_batch(rng, 2, padding=True) for _ in range(3)]
    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        built = way.build(
            lambda b: _lm_model(b)[1],
            OPTIMIZERS["adam"](tf.float64),
            empty + windows[1],
            len(empty),
            global_step=step,
            weight=lambda b: tf.reduce_sum(b[2]),
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            start = values_by_name(sess, tf1_accum.plain_variables())
            counts = []
            for window in (empty, windows[1]):
                way.run_window(sess, built, window)
                counts.append(sess.run([step, built.skipped_windows]))
                if window is empty:
                    after_empty = values_by_name(sess, tf1_accum.plain_variables())
            got = values_by_name(sess, v1.global_variables())
    assert counts == [[0, 1], [1, 1]]
    assert_same_values(after_empty, start, 0.0, f"{way}: after the skipped window")
    want = _lm_plain("adam", windows[1:])[0]
    got = {k: v for k, v in got.items() if k in want}
    assert_same_values(got, want, 1e-10, f"{way}: the window after the skipped one")


_FINITE_AND_NON_NEGATIVE = "a weight must be finite and non-negative"
_NORMAL = r"a positive weight must be a normal number, in \[{}, {}\]"
_RATIO = (
    r"the least positive weight of a window \({}\) over its largest \({}\) must be a "
    r"normal {} number, at least {}"
)


@pytest.mark.parametrize(
    "bad, dtype, what, rule, average",
    [
        (np.inf, tf.float64, r"infinite \(inf\)", _FINITE_AND_NON_NEGATIVE, True),
        (np.nan, tf.float64, r"NaN \(nan\)", _FINITE_AND_NON_NEGATIVE, True),
        (-2.0, tf.float64, r"negative \(-2\)", _FINITE_AND_NON_NEGATIVE, True),
        (
            1e-300,
            tf.float32,
            r"too far from the other weights of its window \(1e-300\)",
            _RATIO.format("1e-300", "2", "float32", "1.17549e-38"),
            True,
        ),
        (
            1e-50,
            tf.float32,
            r"outside the range of float32 \(1e-50\)",
            _NORMAL.format("1.17549e-38", r"3.40282e\+38"),
            False,
        ),
    ],
    ids=["inf", "nan", "negative", "1e-300_beside_2_on_float32", "1e-50_summed_on_float32"],
)
@pytest.mark.parametrize("way", WAYS, ids=str)
def test_a_weight_that_cannot_weight_a_gradient_fails_naming_it_and_changes_nothing(
    bad, dtype, what, rule, average, way
):
    """An infinite weight used to skip the window silently, a NaN one was called
    negative, and a positive one whose ratio to the others the accumulators' dtype
    rounds to 0 would change the mean, as would one the dtype cannot hold where the
    sum (average=False) holds the weights themselves: each fails the run that
    brings it, before anything is added.

    The weight of each micro-batch arrives with it; the third one is bad.
    """
    batches = [
        (*b, np.float64(w)) for b, w in zip(make_batches(dtype, False, 3, 4), [1.0, 2.0, bad])
    ]
    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        built = way.build(
            lambda b: Model(dtype, False, inputs=b[0], labels=b[1]).loss,
            OPTIMIZERS["momentum"](dtype),
            batches,
            3,
            global_step=step,
            weight=lambda b: b[2],
            average=average,
        )
        state = v1.get_collection(tf1_accum.STATE_COLLECTION)
        message = f"weight is {what}: {rule}"
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            before = []  # the state before each micro-batch but the first
            with pytest.raises(tf.errors.InvalidArgumentError, match=way.error_pattern(2, message)):
                way.run_window(sess, built, batches, between=lambda: before.append(sess.run(state)))
            assert sess.run(built.counter) == way.left_open_after_error(2)
            assert sess.run(step) == 0
            if before:  # the way ran the micro-batches one by one: the failed one changed nothing
                for got, want in zip(sess.run(state), before[-1]):
                    np.testing.assert_array_equal(got, want)


def _weighted_examples(batch):
    """A micro-batch of the linear model, each example carrying its micro-batch's weight."""
    x, y, weight = batch
    return x, y, np.full((len(x), 1), weight, np.float32)


@pytest.mark.parametrize("way", WAYS, ids=str)
def test_weights_from_1e_20_to_1e10_train_a_float32_model_as_the_large_batch(way):
    """Weights far apart in one window (the heavy ones first or last) neither
    overflow nor skip the window, and the update equals the large batch's weighted
    mean: a heavier weight moves the window's reference weight."""
    weights = [[1e-20, 1e10, 3e-20, 2e10], [4e9, 1e-20, 1e10, 2e-20]]
    batches = make_batches(tf.float32, False, 8, 5)
    windows = [
        [(*b, np.float32(w)) for b, w in zip(batches[4 * k : 4 * k + 4], weights[k])]
        for k in range(2)
    ]
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [None, 4])
        y = v1.placeholder(tf.float32, [None, 1])
        e = v1.placeholder(tf.float32, [None, 1])
        Model(tf.float32, False, inputs=x, labels=y)  # its variables, as the window's start
        hidden = tf.tanh(tf.matmul(x, _var("w1")) + _var("b1"))
        squares = (tf.matmul(hidden, _var("w2")) - y) ** 2
        loss = tf.reduce_sum(e * squares) / tf.reduce_sum(e)
        train_op = v1.train.AdamOptimizer(0.05).minimize(loss)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            expected = []
            for window in windows:
                xs, ys, es = (np.concatenate(p) for p in zip(*map(_weighted_examples, window)))
                sess.run(train_op, {x: xs, y: ys, e: es})
                expected.append(values_by_name(sess, v1.global_variables()))
    with tf.Graph().as_default():
        built = way.build(
            lambda b: Model(tf.float32, False, inputs=b[0], labels=b[1]).loss,
            v1.train.AdamOptimizer(0.05),
            [b for window in windows for b in window],
            4,
            weight=lambda b: b[2],
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for w, window in enumerate(windows):
                way.run_window(sess, built, window)
                assert sess.run(built.skipped_windows) == 0, f"{way}: window {w} skipped"
                got = values_by_name(sess, v1.global_variables())
                got = {k: v for k, v in got.items() if k in expected[w]}
                assert_same_values(got, expected[w], RTOL_TIGHT[tf.float32], f"{way}: window {w}")


def _var(name):
    return [v for v in v1.global_variables() if v.op.name == name][0]


def _window_of_weights(way, dtype, weights, loss_scale, learning_rate=None, **options):
    """One window of the MLP under SGD, micro-batch i weighted ``weights[i]``, its
    loss times ``loss_scale``: (the update applied, the large batch's, skipped windows).

    The large batch's update is the weighted mean (the sum, with average=False) of the
    micro-batches' gradients, each taken at the start in the model's dtype and
    combined in float64 by the weights' ratios to the largest, which no dtype
    over- or underflows.
    """
    learning_rate = learning_rate or 0.5 / loss_scale
    batches = make_batches(dtype, False, len(weights), [3, 5, 2, 4][: len(weights)])
    window = [(*b, np.float64(w)) for b, w in zip(batches, weights)]

    def loss_fn(b):
        return Model(dtype, False, inputs=b[0], labels=b[1]).loss * loss_scale

    with tf.Graph().as_default():
        model = Model(dtype, False)
        loss = model.loss * loss_scale
        variables = v1.trainable_variables()
        names = [v.op.name for v in variables]
        grads = tf.gradients(loss, variables)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            start = values_by_name(sess, variables)
            gradients = [sess.run(grads, model.feed(b)) for b in batches]
    ratios = np.array(weights, np.float64) / max(weights)
    want = {}
    for k, name in enumerate(names):
        total = sum(r * np.asarray(g[k], np.float64) for r, g in zip(ratios, gradients))
        mean = total * max(weights) if options.get("average") is False else total / ratios.sum()
        want[name] = -learning_rate * mean
    with tf.Graph().as_default():
        built = way.build(
            loss_fn,
            v1.train.GradientDescentOptimizer(tf.constant(learning_rate, dtype)),
            window,
            len(window),
            weight=lambda b: b[2],
            **options,
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            way.run_window(sess, built, window)
            end = values_by_name(sess, v1.trainable_variables())
            got = {k: np.asarray(end[k], np.float64) - start[k] for k in names}
            return got, want, sess.run(built.skipped_windows)


@pytest.mark.parametrize(
    "dtype, weights, loss_scale",
    [
        (tf.float32, [3e38, 3e38], 1.0),
        (tf.float32, [1e38] * 4, 1.0),
        (tf.float64, [1e-160] * 2, 1.0),
        (tf.float64, [1e200] * 2, 1.0),
        (tf.float64, [1.0, 1e300], 1.0),
        (tf.float64, [1e300, 1.0, 3e-8, 2e299], 1.0),
        (tf.float32, [1e-30] * 4, 1e-10),
        (tf.float32, [1.2e-38] * 4, 1.0),
        (tf.float32, [1e-30, 2e7, 3e-30, 1e7], 1e-10),
    ],
    ids=lambda v: v.name if isinstance(v, tf.DType) else str(v),
)
@pytest.mark.parametrize("way", WAYS, ids=str)
def test_weights_of_any_size_give_the_large_batch_update(way, dtype, weights, loss_scale):
    """Only the weights' ratios matter: weights whose products with the gradients, or
    whose sums, used to overflow (the window skipped) or underflow (nothing or a
    mis-scaled update applied) give the large batch's update."""
    got, want, skipped = _window_of_weights(way, dtype, weights, loss_scale)
    assert skipped == 0, f"{way}: the window was skipped"
    for name in want:
        error = relative_error(got[name], want[name])
        assert error <= RTOL[dtype], f"{way}: {name}'s update is {error:.3g} off"


@pytest.mark.parametrize("way", WAYS, ids=str)
def test_weights_of_1e155_summed_give_the_large_batch_sum(way):
    """With average=False the sum of weights times gradients is applied: its squared
    norm, in float64, used to overflow where the sum itself does not (the window
    skipped, or NaN with skip_nonfinite=False)."""
    got, want, skipped = _window_of_weights(
        way, tf.float64, [1e155, 3e155], 1.0, 2.0**-520, average=False, skip_nonfinite=False
    )
    assert skipped == 0
    for name in want:
        error = relative_error(got[name], want[name])
        assert error <= RTOL[tf.float64], f"{way}: {name}'s update is {error:.3g} off"
