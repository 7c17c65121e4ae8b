"""Tests of AccumulationOptimizer."""

import os
import re
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import RTOL
from _helpers import RTOL_TIGHT
from _helpers import Model
from _helpers import assert_same_values
from _helpers import concat
from _helpers import make_batches
from _helpers import values_by_name
from _ways import WAYS

v1 = tf.compat.v1


def test_state_is_created_outside_the_conditional_with_plain_names():
    def names(accumulate):
        with tf.Graph().as_default() as graph:
            model = Model(tf.float32, True)
            opt = v1.train.AdamOptimizer(0.1)
            step = v1.train.get_or_create_global_step()
            if accumulate:
                tf1_accum.AccumulationOptimizer(opt, 3).minimize(model.loss, global_step=step)
                variables = v1.global_variables()
                for v in variables:
                    assert v.op.graph is graph
                    assert v.op._get_control_flow_context() is None, v.op.name
                    assert v.initializer._get_control_flow_context() is None, v.op.name
                return {v.op.name for v in tf1_accum.plain_variables()}
            opt.minimize(model.loss, global_step=step)
            return {v.op.name for v in v1.global_variables()}

    assert names(True) == names(False)


def test_micro_step_counts_within_the_window_and_global_step_counts_updates():
    batches = make_batches(tf.float64, False, 7, 3)
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        step = v1.train.get_or_create_global_step()
        opt = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), steps=3)
        with pytest.raises(ValueError, match="call minimize"):
            _ = opt.window
        train_op = opt.minimize(model.loss, global_step=step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            seen = []
            for batch in batches:
                sess.run(train_op, model.feed(batch))
                seen.append(tuple(int(x) for x in sess.run([step, opt.window.counter])))
    assert seen == [(0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1)]


def test_sum_with_average_false():
    batches = make_batches(tf.float64, False, 4, 3)
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        opt = tf1_accum.AccumulationOptimizer(
            v1.train.GradientDescentOptimizer(0.1), steps=4, average=False
        )
        train_op = opt.minimize(model.loss)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for batch in batches:
                sess.run(train_op, model.feed(batch))
            got = values_by_name(sess, v1.trainable_variables())
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        # The sum of 4 micro-batch means is 4 x the mean over the 4: SGD at 0.4.
        train_op = v1.train.GradientDescentOptimizer(0.4).minimize(model.loss)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train_op, model.feed(concat(batches)))
            expected = values_by_name(sess, v1.trainable_variables())
    assert_same_values(got, expected, 1e-12, "average=False")


def test_monitored_training_session_with_its_hooks(tmp_path):
    n, updates = 3, 4
    batches = make_batches(tf.float32, False, n * updates + 5, 4)
    with tf.Graph().as_default():
        model = Model(tf.float32, False)
        step = v1.train.get_or_create_global_step()
        opt = tf1_accum.AccumulationOptimizer(v1.train.AdamOptimizer(0.05), steps=n)
        train_op = opt.minimize(model.loss, global_step=step)
        hooks = [
            v1.train.StopAtStepHook(last_step=updates),
            v1.train.StepCounterHook(every_n_steps=1, output_dir=str(tmp_path / "steps")),
        ]
        saver_hook = v1.train.CheckpointSaverHook(str(tmp_path / "ckpt"), save_steps=2)
        used = 0
        with v1.train.MonitoredTrainingSession(
            hooks=hooks, chief_only_hooks=[saver_hook], save_summaries_steps=None
        ) as sess:
            while not sess.should_stop():
                sess.run(train_op, model.feed(batches[used]))
                used += 1
    assert used == n * updates
    path = tf.train.latest_checkpoint(str(tmp_path / "ckpt"))
    assert path is not None and path.endswith(f"-{updates}")
    with tf.Graph().as_default():
        model = Model(tf.float32, False)
        step = v1.train.get_or_create_global_step()
        train_op = v1.train.AdamOptimizer(0.05).minimize(model.loss, global_step=step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for u in range(updates):
                sess.run(train_op, model.feed(concat(batches[u * n : (u + 1) * n])))
            expected = values_by_name(sess, v1.global_variables())
        with v1.Session() as sess:
            v1.train.Saver().restore(sess, path)  # the plain graph reads the checkpoint
            restored = values_by_name(sess, v1.global_variables())
    assert_same_values(restored, expected, RTOL_TIGHT[tf.float32], "after MonitoredTrainingSession")
    assert restored["global_step"] == updates


def test_outermost_over_a_mixed_precision_loss_scale_optimizer():
    batches = make_batches(tf.float32, True, 6, 5)

    def loss_scaled(opt):
        return v1.train.experimental.MixedPrecisionLossScaleOptimizer(opt, loss_scale=128.0)

    with tf.Graph().as_default():
        model = Model(tf.float32, True)
        opt = tf1_accum.AccumulationOptimizer(loss_scaled(v1.train.AdamOptimizer(0.05)), 3)
        train_op = opt.minimize(model.loss)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for batch in batches:
                sess.run(train_op, model.feed(batch))
            got = values_by_name(sess, tf1_accum.plain_variables())
    with tf.Graph().as_default():
        model = Model(tf.float32, True)
        train_op = loss_scaled(v1.train.AdamOptimizer(0.05)).minimize(model.loss)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for window in (batches[:3], batches[3:]):
                sess.run(train_op, model.feed(concat(window)))
            expected = values_by_name(sess, v1.global_variables())
    assert_same_values(got, expected, RTOL_TIGHT[tf.float32], "loss-scaled Adam, 2 windows")


@pytest.mark.parametrize(
    "args, error, message",
    [
        (
            (v1.train.GradientDescentOptimizer(0.1), 0),
            ValueError,
            r"steps must be at least 1 \(micro-batches per update\), got 0",
        ),
        (
            (v1.train.GradientDescentOptimizer(0.1), "4"),
            TypeError,
            r"steps must be an int .*got '4'",
        ),
        ((v1.train.GradientDescentOptimizer(0.1), 2.0), TypeError, "steps must be an int"),
        (("adam", 4), TypeError, "optimizer must be a tf.compat.v1.train.Optimizer"),
    ],
    ids=["zero-steps", "str-steps", "float-steps", "not-an-optimizer"],
)
def test_bad_arguments(args, error, message):
    with pytest.raises(error, match=message):
        tf1_accum.AccumulationOptimizer(*args)


def test_no_gradients_and_bad_global_step():
    with tf.Graph().as_default():
        w = v1.get_variable("w", initializer=1.0)
        opt = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), 2)
        with pytest.raises(ValueError, match=r"No gradients provided for any variable: \['w'\]"):
            opt.apply_gradients([(None, w)])
        with pytest.raises(TypeError, match="global_step must be an integer tf.Variable"):
            opt.apply_gradients([(tf.constant(1.0), w)], global_step=1)
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []


@pytest.mark.parametrize("sparse", [False, True])
def test_a_sync_replicas_optimizer_wrapping_the_wrapper_is_refused_at_build(sparse):
    """The other nesting built, then hung on the second micro-batch."""
    with tf.Graph().as_default():
        model = Model(tf.float32, sparse)
        step = v1.train.get_or_create_global_step()
        wrapper = tf1_accum.AccumulationOptimizer(v1.train.MomentumOptimizer(0.1, 0.9), steps=2)
        sync = v1.train.SyncReplicasOptimizer(wrapper, replicas_to_aggregate=1)
        with pytest.raises(
            ValueError,
            match=r"SyncReplicasOptimizer cannot wrap an AccumulationOptimizer: the gradient "
            r"of \S+ comes from its (Sparse|Resource)?AccumulatorTakeGradient, .*would wait "
            r"forever\. Nest them the other way round, "
            r"AccumulationOptimizer\(SyncReplicasOptimizer\(opt, \.\.\.\), steps\)",
        ):
            sync.minimize(model.loss, global_step=step)
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []
        with pytest.raises(ValueError, match="call minimize"):
            _ = wrapper.window


def test_flush_with_nothing_accumulated_changes_nothing():
    batches = make_batches(tf.float64, True, 4, 3)
    with tf.Graph().as_default():
        model = Model(tf.float64, True)
        step = v1.train.get_or_create_global_step()
        wrapper = tf1_accum.AccumulationOptimizer(v1.train.AdamOptimizer(0.05), 2)
        train_op = wrapper.minimize(model.loss, global_step=step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            start = values_by_name(sess, v1.global_variables())
            sess.run(wrapper.flush_op)  # before any micro-batch
            after_empty_start = values_by_name(sess, v1.global_variables())
            for batch in batches:  # two full windows: each applied by the train op
                sess.run(train_op, model.feed(batch))
            trained = values_by_name(sess, v1.global_variables())
            sess.run(wrapper.flush_op)  # right after a full window
            after_empty_end = values_by_name(sess, v1.global_variables())
    assert_same_values(after_empty_start, start, 0.0, "flush before any micro-batch")
    assert_same_values(after_empty_end, trained, 0.0, "flush after a full window")
    assert trained["global_step"] == 2


@pytest.mark.parametrize("name", ["flush_op", "window"])
def test_state_properties_exist_once_the_train_op_is_built(name):
    wrapper = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), 2)
    with pytest.raises(ValueError, match=f"{name} exists once the train op is built"):
        getattr(wrapper, name)


@pytest.mark.parametrize(
    "kind, skipped_window_applies",
    [("skip", False), ("no-skip", True), ("dynamic-loss-scale", False)],
)
def test_applied_is_true_exactly_in_the_runs_that_apply_an_update(kind, skipped_window_applies):
    # Three windows of 3; the second holds an Inf gradient.
    batches = make_batches(tf.float32, False, 9, 3)
    inputs, labels = batches[4]
    batches[4] = (inputs, np.full_like(labels, np.inf))
    with tf.Graph().as_default():
        model = Model(tf.float32, False)
        step = v1.train.get_or_create_global_step()
        opt = v1.train.GradientDescentOptimizer(0.1)
        if kind == "dynamic-loss-scale":
            opt = v1.train.experimental.MixedPrecisionLossScaleOptimizer(opt, loss_scale="dynamic")
        wrapper = tf1_accum.AccumulationOptimizer(opt, 3, skip_nonfinite=kind != "no-skip")
        train_op = wrapper.minimize(model.loss, global_step=step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            applied, steps = [], []
            for batch in batches:
                fetched = sess.run([train_op, wrapper.window.applied], model.feed(batch))
                applied.append(bool(fetched[1]))
                steps.append(int(sess.run(step)))
    assert applied == [False, False, True, False, False, skipped_window_applies] + [
        False,
        False,
        True,
    ]
    # global_step moves in exactly the runs that report an update.
    assert steps == list(np.cumsum(applied))


def test_applied_drives_per_update_work_after_the_train_op():
    """An update counter of the program's own, hung on applied, counts updates."""
    batches = make_batches(tf.float64, False, 7, 3)
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        updates = v1.get_variable("updates", initializer=np.int64(0), trainable=False)
        wrapper = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), 3)
        train_op = wrapper.minimize(model.loss)
        with tf.control_dependencies([train_op]):
            # No conditional of the program's own: it builds in every graph
            # mode, reference variables under control flow v2 included.
            count = updates.assign_add(tf.cast(wrapper.window.applied, tf.int64))
        train_op = tf.group(train_op, count)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            seen = []
            for batch in batches:
                sess.run(train_op, model.feed(batch))
                seen.append(int(sess.run(updates)))
            sess.run(wrapper.flush_op)  # applies, but is not the train op
            assert int(sess.run(updates)) == 2
    assert seen == [0, 0, 1, 1, 1, 2, 2]


def test_variables_are_the_wrapped_optimizers_then_tf1_accums_state():
    batches = make_batches(tf.float64, True, 2, 3)
    with tf.Graph().as_default():
        model = Model(tf.float64, True)
        adam = v1.train.AdamOptimizer(0.05)
        wrapper = tf1_accum.AccumulationOptimizer(adam, 2)
        assert wrapper.variables() == []
        train_op = wrapper.minimize(model.loss)
        ids = [id(v) for v in wrapper.variables()]
        wrapped = [id(v) for v in adam.variables()]
        assert wrapped and ids[: len(wrapped)] == wrapped
        state = v1.get_collection(tf1_accum.STATE_COLLECTION)
        assert sorted(ids[len(wrapped) :]) == sorted(id(v) for v in state)
        names = {v.op.name for v in wrapper.variables()}
        assert {"w1/accumulator", "embedding/accumulator_touched", "Accumulation/counter"} <= names
        assert not {id(v) for v in state} & {id(v) for v in tf1_accum.plain_variables()}
        with v1.Session() as sess:
            # The model's variables and the optimizer's: everything training needs.
            sess.run(v1.variables_initializer(v1.trainable_variables() + wrapper.variables()))
            assert sess.run(v1.report_uninitialized_variables()).size == 0
            for batch in batches:
                sess.run(train_op, model.feed(batch))
            assert sess.run(wrapper.window.counter) == 0
    with tf.Graph().as_default():
        assert wrapper.variables() == []  # only the default graph's


def test_two_minimize_calls_flush_op_flushes_both_windows():
    """One wrapper, two models' losses: flush_op applies each partial window, as plain training."""
    dtype = tf.float64
    batches = make_batches(dtype, False, 3, 4)
    first, second = batches[:2], batches[2:]

    def of(scope):
        return v1.trainable_variables(scope)

    def models():
        with v1.variable_scope("a"):
            a = Model(dtype, False, seed=0)
        with v1.variable_scope("b"):
            b = Model(dtype, False, seed=1)
        return a, b

    with tf.Graph().as_default():
        a, b = models()
        opt = v1.train.MomentumOptimizer(0.1, 0.9)
        train_a, train_b = (
            opt.minimize(a.loss, var_list=of("a")),
            opt.minimize(b.loss, var_list=of("b")),
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train_a, a.feed(concat(first)))
            sess.run(train_b, b.feed(concat(second)))
            expected = values_by_name(sess, v1.global_variables())

    with tf.Graph().as_default():
        a, b = models()
        opt = tf1_accum.AccumulationOptimizer(v1.train.MomentumOptimizer(0.1, 0.9), steps=4)
        train_a = opt.minimize(a.loss, var_list=of("a"))
        train_b = opt.minimize(b.loss, var_list=of("b"))
        with pytest.raises(ValueError, match="window is ambiguous: this Accumulation"):
            _ = opt.window
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for batch in first:
                sess.run(train_a, a.feed(batch))
            for batch in second:
                sess.run(train_b, b.feed(batch))
            before = values_by_name(sess, tf1_accum.plain_variables())
            sess.run(opt.flush_op)
            got = values_by_name(sess, tf1_accum.plain_variables())
            counters = sess.run([v for v in opt.variables() if v.op.name.endswith("counter")])
    assert sorted(int(c) for c in counters) == [0, 0]
    assert set(got) == set(expected)
    for name in ("a/w1", "b/w1"):
        assert not np.allclose(before[name], expected[name]), name
    assert_same_values(got, expected, RTOL_TIGHT[dtype], "flush_op after two minimize calls")


def test_micro_step_of_one_train_op_per_graph_is_that_train_ops():
    """Train ops built in other graphs do not make the properties ambiguous."""
    opt = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), steps=2)
    for _ in range(2):
        with tf.Graph().as_default() as graph:
            opt.minimize(Model(tf.float32, False).loss)
            assert opt.window.counter.graph is graph
            assert opt.window.applied.graph is graph


def test_the_properties_read_the_build_of_the_graph_they_are_read_in():
    """Each graph's train op, whichever was built last; outside both, a clear error."""
    opt = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), steps=2)
    graphs = [tf.Graph(), tf.Graph()]
    for graph in graphs:
        with graph.as_default():
            opt.minimize(Model(tf.float32, False).loss)
    with graphs[0].as_default():  # the first graph, though the second was built last
        for name in ("counter", "applied", "global_norm", "skipped_windows"):
            assert getattr(opt.window, name).graph is graphs[0], name
        assert opt.flush_op.graph is graphs[0]
        assert {v.graph for v in opt.variables()} == {graphs[0]}
    with pytest.raises(
        ValueError,
        match=r"window exists once the train op is built: .* in "
        r"this graph \(it was built in other graphs: enter the one you mean",
    ):
        _ = opt.window


_ANOTHER_GRAPHS_STEP = (
    r"global_step global_step is not in the graph of the loss: build it in that graph"
)


def _assert_adam_state_made_once():
    names = {v.op.name for v in tf1_accum.plain_variables()}
    assert {"w1/Adam", "w1/Adam_1", "beta1_power", "beta2_power"} <= names
    assert not any(name.endswith(("Adam_2", "power_1")) for name in names)


@pytest.mark.parametrize("way", WAYS, ids=str)
def test_a_global_step_of_another_graph_is_refused_before_anything_is_built(way):
    """It was refused after about 120 ops, without naming global_step, and slots stayed taken.

    The refusal adds no op to those of the model and its input.
    """
    with tf.Graph().as_default():
        other_step = v1.train.get_or_create_global_step()
    data = make_batches(tf.float32, False, 2, 3)
    with tf.Graph().as_default() as graph:
        made = {}

        def model_fn(inputs):
            if "model" not in made:  # the refused build made it: the next one reuses it
                made["model"] = Model(tf.float32, False, inputs=inputs[0], labels=inputs[1])
                made["ops"] = len(graph.get_operations())
            return made["model"].loss

        step = v1.train.get_or_create_global_step()
        ops = len(graph.get_operations())
        with tf.Graph().as_default() as scratch:
            way.make_input(data)  # the way's input: placeholders, or the dataset loop's data
        ops += len(scratch.get_operations())
        with pytest.raises(ValueError, match=_ANOTHER_GRAPHS_STEP):
            way.build(model_fn, v1.train.AdamOptimizer(0.1), data, 2, global_step=other_step)
        # Nothing besides the input and the model (if the way made it first).
        assert len(graph.get_operations()) == made.get("ops", ops)
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []
        way.build(model_fn, v1.train.AdamOptimizer(0.1), data, 2, global_step=step)
        _assert_adam_state_made_once()


def test_apply_gradients_refuses_a_global_step_of_another_graph_before_making_state():
    with tf.Graph().as_default():
        other_step = v1.train.get_or_create_global_step()
    with tf.Graph().as_default():
        Model(tf.float32, False)
        pairs = [(tf.ones_like(v), v) for v in v1.trainable_variables()]

        def build(step):
            opt = tf1_accum.AccumulationOptimizer(v1.train.AdamOptimizer(0.1), 2)
            return opt.apply_gradients(pairs, global_step=step)

        with pytest.raises(ValueError, match=_ANOTHER_GRAPHS_STEP):
            build(other_step)
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []
        build(v1.train.get_or_create_global_step())
        _assert_adam_state_made_once()


def test_a_weight_callable_that_needs_arguments_is_refused_when_the_wrapper_is_made():
    with tf.Graph().as_default():
        with pytest.raises(
            TypeError,
            match=r"weight must be a scalar tensor or a callable of no argument returning one, "
            r"got .*, which needs arguments\.",
        ):
            tf1_accum.AccumulationOptimizer(
                v1.train.GradientDescentOptimizer(0.1), steps=2, weight=lambda batch: batch
            )
        assert v1.global_variables() == []


#: A version 2 conditional cannot write a reference variable (TensorFlow refuses
#: the assign in plain training too): the ref_v2 mode cannot build these programs.
_NO_REFERENCE_IN_COND_V2 = pytest.mark.skipif(
    os.environ.get("TF1_ACCUM_GRAPH_MODE") == "ref_v2",
    reason="its conditional cannot take reference variables: plain training fails too",
)


@_NO_REFERENCE_IN_COND_V2
def test_a_dynamic_loss_scale_around_the_wrapper_trains_as_large_batches():
    """The loss-scale optimizer builds the wrapper's apply in its conditional.

    MixedPrecisionLossScaleOptimizer(AccumulationOptimizer(...)); its loss
    scale is float32, so is the model.
    """
    batches = make_batches(tf.float32, False, 7, 3)

    def train(accumulate):
        with tf.Graph().as_default():
            model = Model(tf.float32, False)
            step = v1.train.get_or_create_global_step()
            opt = v1.train.GradientDescentOptimizer(0.1)
            if accumulate:  # with a weight and an update op of the graph outside the apply
                seen = v1.get_variable("seen", initializer=np.int64(0), trainable=False)
                opt = wrapper = tf1_accum.AccumulationOptimizer(
                    opt,
                    3,
                    weight=tf.cast(tf.shape(model.labels)[0], tf.float32),
                    update_ops=[seen.assign_add(1).op],
                )
            opt = v1.train.experimental.MixedPrecisionLossScaleOptimizer(opt, "dynamic")
            train_op = opt.minimize(model.loss, global_step=step)
            with v1.Session() as sess:
                sess.run(v1.global_variables_initializer())
                if accumulate:
                    for batch in batches:
                        sess.run(train_op, model.feed(batch))
                    sess.run(wrapper.flush_op)  # the seventh micro-batch, alone
                    assert int(sess.run(seen)) == 7
                else:
                    for window in (batches[:3], batches[3:6], batches[6:]):
                        sess.run(train_op, model.feed(concat(window)))
                return values_by_name(sess, v1.trainable_variables()), int(sess.run(step))

    (got, got_step), (expected, expected_step) = train(True), train(False)
    assert got_step == expected_step == 3
    assert_same_values(got, expected, RTOL[tf.float32], "loss scale around the wrapper")


def _gan_with_batch_norm():
    """A GAN whose discriminator normalizes its input: (real, noise, d_loss, g_loss)."""
    rng = np.random.RandomState(0)
    real = v1.placeholder(tf.float64, [None, 3], name="real_images")
    noise = v1.placeholder(tf.float64, [None, 2], name="noise")
    with v1.variable_scope("generator"):
        fake = tf.matmul(noise, v1.get_variable("w", initializer=rng.randn(2, 3), dtype=tf.float64))

    def discriminate(x):
        with v1.variable_scope("discriminator", reuse=v1.AUTO_REUSE):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # the layer's deprecation notice
                normalized = v1.layers.batch_normalization(x, training=True, name="bn")
            return tf.matmul(
                normalized, v1.get_variable("w", initializer=rng.randn(3, 1), dtype=tf.float64)
            )

    d_fake = discriminate(fake)
    d_loss = tf.reduce_mean(tf.nn.softplus(-discriminate(real)) + tf.nn.softplus(d_fake))
    return real, noise, d_loss, tf.reduce_mean(tf.nn.softplus(-d_fake))


def _other_models_warnings(record):
    return [str(w.message) for w in record if "it is another model's" in str(w.message)]


def _build_gan_half(way, loss, var_list):
    """The train step of one half of the GAN through ``way``: a function of (sess, feed)."""
    if way == "optimizer":
        train = tf1_accum.AccumulationOptimizer(v1.train.AdamOptimizer(0.01), 2).minimize(
            loss, var_list=var_list
        )
        return lambda sess, feed: sess.run(train, feed)
    acc = tf1_accum.build_accumulation(loss, v1.train.AdamOptimizer(0.01), var_list=var_list)
    if way == "ops":
        return lambda sess, feed: sess.run(acc.accum_op, feed)
    return lambda sess, feed: tf1_accum.run_accumulation(sess, acc, feed, micro_batch_size=2)


@pytest.mark.parametrize(
    "way, runner",
    [
        ("optimizer", "the train op of Accumulation_1"),
        ("ops", "accum_op of accumulation_1"),
        ("split", "accum_op of accumulation_1"),
    ],
)
def test_an_update_op_of_another_model_in_update_ops_is_named_at_build(way, runner):
    """The generator's train op would run the discriminator's batch-norm update on real data."""
    batch = np.random.RandomState(1).randn(4, 2)
    with tf.Graph().as_default():
        real, noise, d_loss, g_loss = _gan_with_batch_norm()
        d_vars = v1.trainable_variables("discriminator")
        g_vars = v1.trainable_variables("generator")
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            _build_gan_half(way, d_loss, d_vars)
            assert _other_models_warnings(record) == []  # its loss reads both placeholders
            g_train = _build_gan_half(way, g_loss, g_vars)
        [message] = _other_models_warnings(record)
        assert re.match(
            r"tf1_accum: the update op discriminator_1/bn/[\w/]+ of UPDATE_OPS, which "
            rf"{runner} runs with each micro-batch \(update_ops=None\), needs "
            r"placeholder real_images fed, which the loss does not read.*Pass "
            r"update_ops= this model's ops",
            message,
        ), message
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            with pytest.raises(tf.errors.InvalidArgumentError, match="real_images"):
                g_train(sess, {noise: batch})


def test_update_ops_of_the_model_itself_train_without_a_warning():
    batch = np.random.RandomState(1).randn(4, 2)
    with tf.Graph().as_default():
        real, noise, d_loss, g_loss = _gan_with_batch_norm()
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            wrapper = tf1_accum.AccumulationOptimizer(
                v1.train.AdamOptimizer(0.01),
                2,
                update_ops=v1.get_collection(v1.GraphKeys.UPDATE_OPS, scope="generator"),
            )
            g_train = wrapper.minimize(g_loss, var_list=v1.trainable_variables("generator"))
        assert _other_models_warnings(record) == []
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            before = sess.run(v1.trainable_variables("generator"))
            for _ in range(2):
                sess.run(g_train, {noise: batch})
            after = sess.run(v1.trainable_variables("generator"))
        assert not np.array_equal(before[0], after[0])


@pytest.mark.parametrize(
    "name, field",
    [
        ("micro_step", "counter"),
        ("applied", "applied"),
        ("global_norm", "global_norm"),
        ("skipped_windows", "skipped_windows"),
        ("statistics", "statistics"),
        ("flush_statistics", "flush_statistics"),
    ],
)
def test_a_removed_property_names_the_window_field_it_became(name, field):
    # The own-increment recipe of earlier docs: the step hung on the wrapper's `applied`.
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        wrapper = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), 3)
        train_op = wrapper.minimize(model.loss)
        with pytest.raises(
            AttributeError,
            match=rf"AccumulationOptimizer\.{name} was removed: read opt\.window\.{field} "
            r"instead.*kept for one release only",
        ):
            with tf.control_dependencies([train_op]):
                getattr(wrapper, name)
        assert field in wrapper.window._fields  # where the message points
        with pytest.raises(AttributeError, match="^'AccumulationOptimizer' object has no attri"):
            wrapper.no_such_name  # noqa: B018
        assert not hasattr(wrapper, name)


@pytest.mark.parametrize(
    "dtype, shape, now, first",
    [
        (tf.float64, [], r"\[0.5\]", r"\[0.05\]"),
        # placeholder(tf.float32): no shape, so held as its size, sum, sum of squares and ends.
        (
            tf.float32,
            None,
            r"\[1 0.5 0.25 0.5 0.5\]",
            r"\[1 0\.05\d* 0\.0025\d* 0\.05\d* 0\.05\d*\]",
        ),
    ],
    ids=["scalar", "unshaped"],
)
def test_a_learning_rate_fed_differently_within_a_window_is_refused(dtype, shape, now, first):
    """Fed 0.05, 0.05 then 0.5, the window would be applied at 0.5: the third run is refused."""
    batches = make_batches(tf.float64, False, 3, 4)

    def build():
        model = Model(tf.float64, False)
        rate = v1.placeholder(dtype, shape, name="rate")
        return model, rate, v1.train.AdamOptimizer(rate)

    with tf.Graph().as_default():
        model, rate, adam = build()
        opt = tf1_accum.AccumulationOptimizer(adam, 3)
        train_op = opt.minimize(model.loss)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for batch in batches[:2]:
                sess.run(train_op, {**model.feed(batch), rate: 0.05})
            before = values_by_name(sess, v1.global_variables())
            with pytest.raises(
                tf.errors.InvalidArgumentError,
                match=r"this micro-batch feeds rate:0 another value than micro-batch 0 of the "
                r"window fed it: the update reads it once per window(.|\n)*Neither the window "
                r"nor the variables changed \(UPDATE_OPS may have run\)\."
                rf"(.|\n)*{now} {first} \[2\]",
            ):
                sess.run(train_op, {**model.feed(batches[2]), rate: 0.5})
            # Nothing was added: the window holds its two micro-batches, as they were.
            assert_same_values(values_by_name(sess, v1.global_variables()), before, 0, "refused")
            assert int(sess.run(opt.window.counter)) == 2
            # A flush applies the window: at its rate too.
            with pytest.raises(
                tf.errors.InvalidArgumentError,
                match=r"flush_op feeds rate:0 another value than micro-batch 0 of the window fed "
                rf"it(.|\n)*{now} {first} \[2\]",
            ):
                sess.run(opt.flush_op, {rate: 0.5})
            assert_same_values(values_by_name(sess, v1.global_variables()), before, 0, "flush")
            assert sess.run(opt.window.applied, {**model.feed(batches[2]), rate: 0.05})
            got = values_by_name(sess, tf1_accum.plain_variables())
            # The next window takes another rate.
            sess.run(train_op, {**model.feed(batches[0]), rate: 0.5})
    with tf.Graph().as_default():
        model, rate, adam = build()
        train_op = adam.minimize(model.loss)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train_op, {**model.feed(concat(batches)), rate: 0.05})
            expected = values_by_name(sess, v1.global_variables())
    assert_same_values(got, expected, RTOL[tf.float64], "one rate for the window")


@_NO_REFERENCE_IN_COND_V2
@pytest.mark.parametrize("field", ["applied", "global_norm", "statistics"])
def test_the_window_record_inside_a_loss_scale_optimizer_names_the_working_nesting(field):
    """What each run computes stays in the loss scale's conditional: refused, naming the fix."""
    batches = make_batches(tf.float32, False, 3, 3)
    with tf.Graph().as_default():
        model = Model(tf.float32, False)
        wrapper = tf1_accum.AccumulationOptimizer(
            v1.train.GradientDescentOptimizer(0.1), 3, statistics=True, micro_batch_size=3
        )
        opt = v1.train.experimental.MixedPrecisionLossScaleOptimizer(wrapper, "dynamic")
        train_op = opt.minimize(model.loss)
        with pytest.raises(
            ValueError,
            match=rf"window\.{field} of this AccumulationOptimizer is built inside another "
            r"optimizer's conditional, where it cannot be fetched\. Nest them the other way to "
            r"read it: AccumulationOptimizer\(MixedPrecisionLossScaleOptimizer\(opt, loss_scale\), "
            r"steps\)",
        ):
            getattr(wrapper.window, field)
        # What lives outside the conditional still reads: the counter.
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for batch in batches[:2]:
                sess.run(train_op, model.feed(batch))
            assert int(sess.run(wrapper.window.counter)) == 2


def _counted_on_applied(form, wrappers_step):
    """A model whose step is incremented on ``window.applied``; the wrapper given it or not."""
    model = Model(tf.float64, False)
    step = v1.train.get_or_create_global_step()
    opt = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), 2)
    train_op = opt.minimize(model.loss, global_step=step if wrappers_step else None)

    def increment():
        if form == "assign_add":
            return tf.identity(v1.assign_add(step, 1))
        return tf.identity(v1.assign(step, step + 1))

    counted = tf.cond(opt.window.applied, increment, lambda: tf.identity(step), name="count")
    return model, step, opt, counted, tf.group(train_op, counted)


@_NO_REFERENCE_IN_COND_V2
@pytest.mark.parametrize("form", ["assign_add", "assign"])
def test_an_increment_hung_on_applied_beside_the_wrappers_own_is_refused_in_a_plain_loop(form):
    """No hook, no check_graph: the first run that would count is refused, nothing run."""
    batches = make_batches(tf.float64, False, 2, 3)
    with tf.Graph().as_default():
        model, step, opt, counted, train = _counted_on_applied(form, wrappers_step=True)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            before = values_by_name(sess, v1.global_variables())
            # The loop's train op, the wrapper's alone, and the increment alone.
            for fetch in (train, opt.window.applied, counted):
                with pytest.raises(
                    ValueError,
                    match=r"count\S* increments global_step \(global_step\) in a tf.cond on "
                    r"window.applied, and AccumulationOptimizer, given that global_step "
                    r"(.|\n)*Refused before this session.run ran anything",
                ):
                    sess.run(fetch, model.feed(batches[0]))
            feed = model.feed(batches[0])
            with pytest.raises(ValueError, match="increments global_step"):
                sess.make_callable(train, list(feed))(*feed.values())
            assert_same_values(values_by_name(sess, v1.global_variables()), before, 0, "refused")
            assert (int(sess.run(step)), int(sess.run(opt.window.counter))) == (0, 0)


def test_a_graph_imported_under_a_scope_runs_with_the_wrappers_step(tmp_path):
    """import_scope prefixes the step's name in the guard's records: still found, the loop runs."""
    batches = make_batches(tf.float64, False, 2, 3)
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        opt = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), 2)
        train = opt.minimize(model.loss, global_step=v1.train.get_or_create_global_step())
        names = [train.name, model.inputs.name, model.labels.name]
        v1.train.export_meta_graph(str(tmp_path / "model.meta"))
    with tf.Graph().as_default() as graph:
        v1.train.import_meta_graph(str(tmp_path / "model.meta"), import_scope="imported")
        train, x, y = (graph.as_graph_element("imported/" + name) for name in names)
        variables = {v.op.name: v for v in v1.global_variables()}
        step = variables["imported/global_step"]
        counter = variables["imported/Accumulation/counter"]
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for batch in batches:
                sess.run(train, {x: batch[0], y: batch[1]})
            assert (int(sess.run(step)), int(sess.run(counter))) == (1, 0)


@_NO_REFERENCE_IN_COND_V2
@pytest.mark.parametrize("form", ["assign_add", "assign"])
def test_an_increment_hung_on_applied_alone_counts_each_update_once(form):
    """The wrapper given no global_step: the increment is the one count, and the loop runs."""
    batches = make_batches(tf.float64, False, 6, 3)
    with tf.Graph().as_default():
        model, step, opt, _, train = _counted_on_applied(form, wrappers_step=False)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            seen = []
            for batch in batches:
                sess.run(train, model.feed(batch))
                seen.append(int(sess.run(step)))
            got = values_by_name(sess, v1.trainable_variables())
    assert seen == [0, 1, 1, 2, 2, 3]
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        train_op = v1.train.GradientDescentOptimizer(0.1).minimize(model.loss)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for i in range(0, 6, 2):
                sess.run(train_op, model.feed(concat(batches[i : i + 2])))
            expected = values_by_name(sess, v1.trainable_variables())
    assert_same_values(got, expected, RTOL[tf.float64], "three updates")


@_NO_REFERENCE_IN_COND_V2
@pytest.mark.parametrize("form", ["assign_add", "assign"])
def test_an_increment_hung_on_applied_beside_the_wrappers_own_is_refused(form):
    """Given global_step, the wrapper counts each update; an increment on applied again."""
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        step = v1.train.get_or_create_global_step()
        opt = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), 2)
        train_op = opt.minimize(model.loss, global_step=step)

        def increment():
            if form == "assign_add":
                return tf.identity(v1.assign_add(step, 1))
            return tf.identity(v1.assign(step, step + 1))

        counted = tf.cond(opt.window.applied, increment, lambda: tf.identity(step), name="count")
        tf.group(train_op, counted)
        with pytest.raises(
            ValueError,
            match=r"count\S* increments global_step \(global_step\) in a tf.cond on "
            r"window.applied, and AccumulationOptimizer, given that global_step (.|\n)*Keep one",
        ):
            v1.train.MonitoredSession(hooks=[opt.make_session_run_hook()])


def test_a_graph_the_wrapper_built_in_is_freed_once_dropped():
    import gc
    import weakref

    graphs = []
    for _ in range(3):
        graph = tf.Graph()
        with graph.as_default():
            w = v1.get_variable("w", initializer=1.0)
            step = v1.train.get_or_create_global_step()
            opt = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), 2)
            opt.minimize(w * w, global_step=step)
        graphs.append(weakref.ref(graph))
        del graph, w, step, opt
    gc.collect()
    assert [g() for g in graphs] == [None, None, None]
