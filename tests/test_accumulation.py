"""Tests of build_accumulation: graph structure, state, errors.

Its equivalence with large-batch training: tests/test_equivalence.py.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import Model
from _helpers import ancestors
from _helpers import make_batches
from _helpers import values_by_name

v1 = tf.compat.v1


def _sgd_model(dtype=tf.float64, sparse=False, lr=0.1):
    model = Model(dtype, sparse)
    return model, v1.train.GradientDescentOptimizer(lr)


def test_sum_is_opt_in_and_n_times_the_mean():
    n = 4
    batches = make_batches(tf.float64, False, n, 5)
    deltas = {}
    for average in (True, False):
        with tf.Graph().as_default():
            model, opt = _sgd_model()
            kwargs = {} if average else {"average": False}
            acc = tf1_accum.build_accumulation(model.loss, opt, **kwargs)
            with v1.Session() as sess:
                sess.run(v1.global_variables_initializer())
                before = values_by_name(sess, acc.var_list)
                for batch in batches:
                    sess.run(acc.accum_op, model.feed(batch))
                sess.run(acc.apply_op)
                after = values_by_name(sess, acc.var_list)
        deltas[average] = {k: after[k] - before[k] for k in after}
    for name, mean_delta in deltas[True].items():
        assert np.abs(mean_delta).max() > 1e-3, f"{name} did not move"
        np.testing.assert_allclose(deltas[False][name], n * mean_delta, rtol=1e-10)


def test_apply_has_no_path_to_placeholders_or_accumulate():
    with tf.Graph().as_default():
        for sparse, scope in ((False, "dense"), (True, "sparse")):
            with v1.variable_scope(scope):
                model = Model(tf.float32, sparse)
                acc = tf1_accum.build_accumulation(
                    model.loss,
                    v1.train.AdamOptimizer(0.1),
                    var_list=v1.trainable_variables(scope),
                    global_step=v1.train.get_or_create_global_step(),
                )
            reached = ancestors(acc.apply_op)
            placeholders = [op.name for op in reached if op.type.startswith("Placeholder")]
            assert placeholders == []
            assert acc.accum_op not in reached
            assert model.loss.op not in reached
            # The walk does reach what the apply must read.
            assert acc.counter.op in reached
            assert all(a.op in reached for a in acc.accumulators)


def test_accumulators_are_built_without_initialized_value(monkeypatch):
    def forbidden(self):
        raise AssertionError("initialized_value() was called")

    for cls in {type(v) for v in (v1.Variable(1.0), v1.Variable(1.0, use_resource=True))}:
        monkeypatch.setattr(cls, "initialized_value", forbidden, raising=False)
    with tf.Graph().as_default():
        model, opt = _sgd_model(sparse=True)
        acc = tf1_accum.build_accumulation(model.loss, opt)
        assert len(acc.accumulators) == 4
        with v1.Session() as sess:
            # Initializers in any order: no accumulator reads its variable.
            sess.run([v.initializer for v in reversed(v1.global_variables())])
            for a, v in zip(acc.accumulators, acc.var_list):
                assert sess.run(a).shape == tuple(v.shape.as_list())
                assert not sess.run(a).any()


def test_state_is_non_trainable_named_after_its_variable_and_saved_by_default(tmp_path):
    with tf.Graph().as_default():
        model, opt = _sgd_model(sparse=True)
        trainable_before = list(v1.trainable_variables())
        acc = tf1_accum.build_accumulation(model.loss, opt, name="window")
        assert v1.trainable_variables() == trainable_before
        assert [a.op.name for a in acc.accumulators] == [
            v.op.name + "/accumulator" for v in acc.var_list
        ]
        assert acc.counter.op.name == "window/counter"
        assert acc.counter.dtype.base_dtype == tf.int64
        state = v1.get_collection(tf1_accum.STATE_COLLECTION)
        assert {v.op.name for v in state} == (
            {a.op.name for a in acc.accumulators}
            | {"window/counter", "window/skipped_windows", "embedding/accumulator_touched"}
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            path = v1.train.Saver().save(sess, str(tmp_path / "ckpt"))
        saved = {name for name, _ in tf.train.list_variables(path)}
        assert {v.op.name for v in state} <= saved


def test_optimizer_state_advances_once_per_window():
    n, windows = 4, 3
    batches = make_batches(tf.float32, False, n * windows, 5)
    with tf.Graph().as_default():
        model = Model(tf.float32, False)
        opt = v1.train.AdamOptimizer(0.01, beta1=0.9, beta2=0.99)
        step = v1.train.get_or_create_global_step()
        acc = tf1_accum.build_accumulation(model.loss, opt, global_step=step)
        beta1_power, beta2_power = opt._get_beta_accumulators()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for w in range(windows):
                for batch in batches[w * n : (w + 1) * n]:
                    sess.run(acc.accum_op, model.feed(batch))
                    assert sess.run(step) == w
                sess.run(acc.apply_op)
                assert sess.run(step) == w + 1
                np.testing.assert_allclose(sess.run(beta1_power), 0.9 ** (w + 2), rtol=1e-6)
                np.testing.assert_allclose(sess.run(beta2_power), 0.99 ** (w + 2), rtol=1e-6)


def test_slot_names_match_plain_minimize():
    def names(accumulate):
        with tf.Graph().as_default():
            model = Model(tf.float32, True)
            opt = v1.train.AdamOptimizer(0.1)
            step = v1.train.get_or_create_global_step()
            if accumulate:
                tf1_accum.build_accumulation(model.loss, opt, global_step=step)
                return {v.op.name for v in tf1_accum.plain_variables()}
            opt.minimize(model.loss, global_step=step)
            return {v.op.name for v in v1.global_variables()}

    plain = names(False)
    assert "beta1_power" in plain and "w1/Adam" in plain
    assert names(True) == plain


def test_none_gradient_is_skipped_with_one_warning_and_left_untouched():
    with tf.Graph().as_default():
        model, opt = _sgd_model()
        unused = v1.get_variable("unused", initializer=np.ones(3))
        with pytest.warns(UserWarning, match=r"no gradient .* unused") as record:
            acc = tf1_accum.build_accumulation(model.loss, opt)
        assert len([w for w in record if "no gradient" in str(w.message)]) == 1
        assert all(v is not unused for v in acc.var_list)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            tf1_accum.run_accumulation(
                sess, acc, [model.feed(b) for b in make_batches(tf.float64, False, 2, 3)]
            )
            np.testing.assert_array_equal(sess.run(unused), np.ones(3))


def test_float16_variables_accumulate_in_float32():
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float16, [None])
        w = v1.get_variable("w", initializer=np.float16(1.5))
        loss = tf.reduce_mean(w * x * x)
        acc = tf1_accum.build_accumulation(loss, v1.train.GradientDescentOptimizer(0.5))
        assert acc.accumulators[0].dtype.base_dtype == tf.float32
        assert acc.grads_and_vars[0][0].dtype == tf.float16
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            tf1_accum.run_accumulation(sess, acc, [{x: [1.0, 3.0]}, {x: [2.0]}])
            # mean gradient: (5 + 4) / 2 = 4.5; 1.5 - 0.5 * 4.5 = -0.75
            assert float(sess.run(w)) == -0.75


def test_apply_with_nothing_accumulated_raises_in_graph_and_changes_nothing():
    with tf.Graph().as_default():
        model, opt = _sgd_model(sparse=True)
        step = v1.train.get_or_create_global_step()
        acc = tf1_accum.build_accumulation(model.loss, opt, global_step=step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            before = values_by_name(sess, v1.global_variables())
            with pytest.raises(tf.errors.InvalidArgumentError, match="nothing accumulated"):
                sess.run(acc.apply_op)
            after = values_by_name(sess, v1.global_variables())
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)


def test_zero_op_discards_a_partial_window():
    batches = make_batches(tf.float64, True, 3, 4)
    with tf.Graph().as_default():
        model, opt = _sgd_model(sparse=True)
        acc = tf1_accum.build_accumulation(model.loss, opt)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(acc.accum_op, model.feed(batches[0]))
            assert sess.run(acc.counter) == 1
            held = sess.run(acc.accumulators)
            assert all(a.any() for a in held)
            sess.run(acc.zero_op)
            assert sess.run(acc.counter) == 0
            # A window is empty when its counter is 0. A sparse accumulator is
            # zeroed where the window touched it; a dense one keeps what it
            # held (the window's first add assigns, so it is never read).
            sparse = [isinstance(g, tf.IndexedSlices) for g, _ in acc.grads_and_vars]
            assert sparse.count(True) == 1
            for is_sparse, before, after in zip(sparse, held, sess.run(acc.accumulators)):
                if is_sparse:
                    assert not after.any()
                else:
                    np.testing.assert_array_equal(after, before)
            # The next window holds only its own micro-batches.
            sess.run(acc.accum_op, model.feed(batches[1]))
            first = sess.run([g for g, _ in acc.grads_and_vars[1:]])
            sess.run(acc.zero_op)
            sess.run(acc.accum_op, model.feed(batches[1]))
            again = sess.run([g for g, _ in acc.grads_and_vars[1:]])
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)


def _scalar_model():
    x = v1.placeholder(tf.float32, [None])
    w = v1.get_variable("w", initializer=1.0)
    return x, w, tf.reduce_mean((w * x - 1.0) ** 2)


@pytest.mark.parametrize(
    "make_loss, error, message",
    [
        (
            lambda x, w, loss: w * x,
            ValueError,
            r"loss must be a scalar \(.*\), got .* shape \[None\]",
        ),
        (
            lambda x, w, loss: tf.cast(loss, tf.int32),
            TypeError,
            "floating-point tensor .*got .* int32",
        ),
        (
            lambda x, w, loss: 3.0,
            TypeError,
            r"scalar floating-point tf.Tensor .*got 3.0 \(a builtins.float\)",
        ),
    ],
    ids=["not-scalar", "not-float", "not-a-tensor"],
)
def test_bad_loss_is_rejected_and_builds_nothing(make_loss, error, message):
    with tf.Graph().as_default() as graph:
        x, w, loss = _scalar_model()
        bad = make_loss(x, w, loss)
        count = len(graph.get_operations())
        with pytest.raises(error, match=message):
            tf1_accum.build_accumulation(bad, v1.train.GradientDescentOptimizer(0.1))
        assert len(graph.get_operations()) == count
        assert v1.global_variables() == [w]


def test_keras_optimizer_is_rejected_with_the_class_to_use():
    from _keras import LEGACY_NAME
    from _keras import not_legacy  # tf_keras's new optimizers, 1.15's Keras 1 style ones

    with tf.Graph().as_default():
        _, _, loss = _scalar_model()
        keras_adam = not_legacy.Adam(0.1)
        with pytest.raises(
            TypeError,
            match=rf"must be a tf.compat.v1.train.Optimizer.*Use {LEGACY_NAME}.Adam "
            r".*or tf.compat.v1.train.AdamOptimizer instead",
        ):
            tf1_accum.build_accumulation(loss, keras_adam)
        with pytest.raises(TypeError, match=r"got 'sgd' \(a builtins.str\)"):
            tf1_accum.build_accumulation(loss, "sgd")


def test_no_variables_is_rejected():
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [None])
        loss = tf.reduce_mean(x)
        opt = v1.train.GradientDescentOptimizer(0.1)
        with pytest.raises(ValueError, match="no trainable variables"):
            tf1_accum.build_accumulation(loss, opt)
        with pytest.raises(ValueError, match="var_list is empty"):
            tf1_accum.build_accumulation(loss, opt, var_list=[])
        with pytest.raises(TypeError, match=r"var_list\[0\] must be a tf.Variable, got"):
            tf1_accum.build_accumulation(loss, opt, var_list=[x])


def test_no_gradients_is_rejected_naming_the_variables():
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [None])
        v1.get_variable("lonely", initializer=1.0)
        loss = tf.reduce_mean(x)
        with pytest.raises(ValueError, match=r"No gradients.*\['lonely'\]"):
            tf1_accum.build_accumulation(loss, v1.train.GradientDescentOptimizer(0.1))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"global_step": 3}, "global_step must be an integer tf.Variable"),
        ({"average": "yes"}, r"average must be True or False, got 'yes'"),
        ({"fused": "yes"}, r"fused must be True or False, got 'yes'"),
    ],
)
def test_bad_keyword_arguments_are_rejected(kwargs, message):
    with tf.Graph().as_default():
        _, _, loss = _scalar_model()
        with pytest.raises(TypeError, match=message):
            tf1_accum.build_accumulation(loss, v1.train.GradientDescentOptimizer(0.1), **kwargs)


def test_float_global_step_is_rejected():
    with tf.Graph().as_default():
        _, _, loss = _scalar_model()
        step = v1.get_variable("step", initializer=0.0, trainable=False)
        with pytest.raises(TypeError, match="integer variable, got step of float32"):
            tf1_accum.build_accumulation(
                loss, v1.train.GradientDescentOptimizer(0.1), global_step=step
            )


def test_eager_execution_is_rejected_with_the_call_to_make():
    from tensorflow.python.eager import context

    with context.eager_mode():
        with pytest.raises(RuntimeError, match=r"tf.compat.v1.disable_eager_execution\(\)"):
            tf1_accum.build_accumulation(tf.constant(1.0), v1.train.GradientDescentOptimizer(0.1))


def test_built_under_the_callers_control_dependencies():
    """The batch-norm idiom: build the train ops under the UPDATE_OPS dependencies."""
    with tf.Graph().as_default():
        model, opt = _sgd_model()
        moving = v1.get_variable("moving_mean", initializer=np.zeros(1), trainable=False)
        update = moving.assign_add(tf.reduce_mean(model.labels, axis=0))
        with tf.control_dependencies([update]):
            acc = tf1_accum.build_accumulation(model.loss, opt)
        batches = make_batches(tf.float64, False, 2, 3)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())  # needs no feed
            tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in batches])
            # The dependency ran with each micro-batch, and not with the apply.
            expected = sum(b[1].mean() for b in batches)
            np.testing.assert_allclose(sess.run(moving), [expected], rtol=1e-12)
            sess.run(acc.zero_op)  # needs no feed either


def test_unknown_static_shape_loss_is_checked_when_run():
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float64, None)
        w = v1.get_variable("w", initializer=np.float64(2.0))
        acc = tf1_accum.build_accumulation(
            tf.reduce_sum(w * x, axis=None, keepdims=None) * tf.ones_like(x),
            v1.train.GradientDescentOptimizer(0.5),
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            tf1_accum.run_accumulation(sess, acc, [{x: 3.0}, {x: 1.0}])
            assert sess.run(w) == 2.0 - 0.5 * 2.0
            with pytest.raises(tf.errors.InvalidArgumentError, match="micro-batch 0"):
                tf1_accum.run_accumulation(sess, acc, [{x: [1.0, 2.0]}])
            assert sess.run(w) == 1.0


def test_shape_not_fully_defined_is_rejected_before_any_state_is_made():
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [None])
        fixed = v1.get_variable("fixed", initializer=1.0)
        loose = v1.Variable(tf.ones([2]), shape=tf.TensorShape(None), name="loose")
        loss = tf.reduce_mean(fixed * x) + tf.reduce_sum(loose)
        before = list(v1.global_variables())
        with pytest.raises(ValueError, match="loose has shape .* not fully defined"):
            tf1_accum.build_accumulation(loss, v1.train.GradientDescentOptimizer(0.1))
        assert v1.global_variables() == before
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []


def test_sparse_gradients_are_scatter_added_never_densified():
    with tf.Graph().as_default():
        model = Model(tf.float32, sparse=True)
        acc = tf1_accum.build_accumulation(model.loss, v1.train.AdagradOptimizer(0.1))
        types = {o.type for o in ancestors(acc.accum_op)}
        # IndexedSlices become dense tensors through UnsortedSegmentSum.
        assert "UnsortedSegmentSum" not in types
        assert types & {"ScatterAdd", "ResourceScatterAdd"}
        # The optimizer is handed the touched rows, not a dense gradient.
        embedding = [g for g, v in acc.grads_and_vars if v.op.name == "embedding"][0]
        assert isinstance(embedding, tf.IndexedSlices)


def test_weight_from_another_graph_is_rejected():
    with tf.Graph().as_default():
        elsewhere = tf.constant(1.0)
    with tf.Graph().as_default():
        _, _, loss = _scalar_model()
        with pytest.raises(ValueError, match="is not in the graph of the loss"):
            tf1_accum.build_accumulation(
                loss, v1.train.GradientDescentOptimizer(0.1), weight=elsewhere
            )


def test_optimizer_wrapper_in_eager_mode_says_what_to_call():
    from tensorflow.python.eager import context

    opt = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), 2)
    with context.eager_mode():
        with pytest.raises(RuntimeError, match=r"disable_eager_execution\(\)"):
            opt.apply_gradients([(tf.constant(1.0), None)])
