"""Checkpoints: mid-window save and restore, and interchange with plain training."""

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import Model
from _helpers import concat
from _helpers import make_batches
from _helpers import values_by_name

v1 = tf.compat.v1


def _accumulating_graph():
    model = Model(tf.float32, sparse=True)
    acc = tf1_accum.build_accumulation(
        model.loss,
        v1.train.AdamOptimizer(0.05),
        global_step=v1.train.get_or_create_global_step(),
    )
    return model, acc


def test_mid_window_save_and_restore_is_bit_identical(tmp_path):
    batches = make_batches(tf.float32, True, 8, 5)
    first, second = batches[:4], batches[4:]

    with tf.Graph().as_default():
        model, acc = _accumulating_graph()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in first])
            tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in second])
            uninterrupted = values_by_name(sess, v1.global_variables())

    with tf.Graph().as_default():
        model, acc = _accumulating_graph()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in first])
            for batch in second[:2]:
                sess.run(acc.accum_op, model.feed(batch))
            path = v1.train.Saver().save(sess, str(tmp_path / "mid"))

    with tf.Graph().as_default():
        model, acc = _accumulating_graph()
        with v1.Session() as sess:
            v1.train.Saver().restore(sess, path)
            assert sess.run(acc.counter) == 2
            tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in second[2:]])
            resumed = values_by_name(sess, v1.global_variables())

    assert set(resumed) == set(uninterrupted)
    for name, value in uninterrupted.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)
    assert resumed["global_step"] == 2


def _plain_graph():
    model = Model(tf.float32, sparse=True)
    train_op = v1.train.AdamOptimizer(0.05).minimize(
        model.loss, global_step=v1.train.get_or_create_global_step()
    )
    return model, train_op


def test_plain_checkpoint_restores_into_an_accumulating_graph(tmp_path):
    batches = make_batches(tf.float32, True, 5, 5)
    with tf.Graph().as_default():
        model, train_op = _plain_graph()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train_op, model.feed(batches[0]))
            path = v1.train.Saver().save(sess, str(tmp_path / "plain"))
            sess.run(train_op, model.feed(concat(batches[1:])))
            expected = values_by_name(sess, v1.global_variables())

    with tf.Graph().as_default():
        model, acc = _accumulating_graph()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            v1.train.Saver(tf1_accum.plain_variables()).restore(sess, path)
            tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in batches[1:]])
            got = values_by_name(sess, tf1_accum.plain_variables())

    assert set(got) == set(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, err_msg=name)
    assert got["global_step"] == 2


def test_accumulating_checkpoint_restores_into_a_plain_graph(tmp_path):
    batches = make_batches(tf.float32, True, 4, 5)
    with tf.Graph().as_default():
        model, acc = _accumulating_graph()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in batches])
            sess.run(acc.accum_op, model.feed(batches[0]))  # a partial window
            path = v1.train.Saver().save(sess, str(tmp_path / "accumulating"))
            saved = values_by_name(sess, tf1_accum.plain_variables())

    with tf.Graph().as_default():
        _plain_graph()
        with v1.Session() as sess:
            v1.train.Saver().restore(sess, path)
            restored = values_by_name(sess, v1.global_variables())

    assert set(restored) == set(saved)
    for name, value in saved.items():
        np.testing.assert_array_equal(restored[name], value, err_msg=name)


def _window_of(weighted):
    model = Model(tf.float64, sparse=False)
    weight = v1.placeholder_with_default(tf.constant(2.0, tf.float64), []) if weighted else None
    acc = tf1_accum.build_accumulation(model.loss, v1.train.AdamOptimizer(0.05), weight=weight)
    return model, acc


@pytest.mark.parametrize(
    "saved, restored, missing",
    [(True, False, "accumulation/counter"), (False, True, r"accumulation/weight_\w+")],
    ids=["weighted_into_unweighted", "unweighted_into_weighted"],
)
def test_a_mid_window_checkpoint_does_not_restore_into_the_other_kind_of_window(
    tmp_path, saved, restored, missing
):
    """A weighted window's accumulators hold the weighted sum, which the counter's mean
    would misread (and the other way round): the restore fails, naming what is missing."""
    batch = make_batches(tf.float64, False, 1, 5)[0]
    with tf.Graph().as_default():
        model, acc = _window_of(saved)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(acc.accum_op, model.feed(batch))
            path = v1.train.Saver().save(sess, str(tmp_path / "mid"))
    with tf.Graph().as_default():
        _window_of(restored)
        with v1.Session() as sess:
            with pytest.raises(tf.errors.NotFoundError, match=f"Key {missing} not found"):
                v1.train.Saver().restore(sess, path)


def test_a_weighted_checkpoint_of_the_previous_window_layout_is_refused_saying_what_to_do(
    tmp_path,
):
    """The previous layout named a weighted window's counter ``counter`` and kept a
    ``weight_scale`` (its accumulators held scaled sums): the library's Saver restores
    nothing of it and says how to go on, instead of TensorFlow's bare NotFoundError."""
    batch = make_batches(tf.float64, False, 1, 5)[0]
    with tf.Graph().as_default():
        model, acc = _window_of(True)
        v1.Variable(np.float64(2.0**-1), name="old_weight_scale")
        old_names = {
            v.op.name.replace("weighted_counter", "counter"): v for v in v1.global_variables()
        }
        old_names["accumulation/weight_scale"] = old_names.pop("old_weight_scale")
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(acc.accum_op, model.feed(batch))
            path = v1.train.Saver(old_names).save(sess, str(tmp_path / "previous"))
    with tf.Graph().as_default():
        model, acc = _window_of(True)
        saver = tf1_accum.Saver()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(acc.accum_op, model.feed(batch))
            before = values_by_name(sess, v1.global_variables())
            with pytest.raises(
                tf.errors.NotFoundError,
                match=r"^tf1_accum: the checkpoint .*previous holds no "
                r"accumulation/weighted_counter: its window has another layout "
                r".*Nothing was restored \(by a sharded Saver, perhaps another device's: "
                r"restore or initialize them again\)\. Restore it with the tf1_accum and options "
                r"that saved it, finish the window \(apply_op or flush_op\) and save again; or "
                r"drop the partial window: .*tf1_accum.plain_variables\(\)",
            ):
                saver.restore(sess, path)
            after = values_by_name(sess, v1.global_variables())
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)
