"""Two ops that change one window, fetched in one step, are refused on every run path.

Each refusal is checked for its text, for every variable left as it was, and
for the window then run apart giving large-batch training's update.
"""

import re

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import RTOL
from _helpers import Model
from _helpers import assert_same_values
from _helpers import concat
from _helpers import make_batches
from _helpers import plain_training
from _helpers import values_by_name
from tf1_accum import _guard

from _keras import keras
from _keras import legacy

v1 = tf.compat.v1
N, B = 4, 5  # micro-batches of a window, examples each


def _refused(first, second):
    """The refusal's text, as a pattern: the two ops fetched, then TFA010's words."""
    either = rf"({first} \(\S+\) and {second}|{second} \(\S+\) and {first})"  # fetches' order
    return (
        rf"^tf1_accum: {either} \(\S+\) of one accumulation are fetched in "
        r"one session.run \(TFA010, two ops of one window fetched in one run\): ops that "
        r"change one window, .* run in no fixed order.* Nothing was run\. Instead, run "
        rf"(each|({first} and {second}|{second} and {first}) each) in a session.run of its own"
    )


def _refuse_then_run_apart(sess, window, feed, fetch_together, fields, accumulate, apply):
    """Runs ``window`` with its last micro-batch first refused with two ops; the variables after.

    The refusal names ``fields`` and leaves every variable as it was; then the
    last micro-batch is accumulated and the window applied, each in a run of its own.
    """
    for batch in window[:-1]:
        accumulate(feed(batch))
    before = values_by_name(sess, v1.global_variables())
    with pytest.raises(ValueError, match=_refused(*fields)) as refused:
        fetch_together(feed(window[-1]))
    assert "accumulate op" not in str(refused.value)
    assert "this micro-batch" not in str(refused.value)
    # The message names the ops fetched, and no other (but fused=True's accum_apply_op,
    # the other way to run an accum_op and apply_op together).
    named = set(
        re.findall(r"\b(?:zero|accum|apply|accum_apply|train|flush)_op\b", str(refused.value))
    )
    if set(fields) != {"accum_op", "apply_op"}:
        assert named == set(fields), str(refused.value)
    else:
        assert named == {"accum_op", "apply_op", "accum_apply_op"}, str(refused.value)
    for name, value in values_by_name(sess, v1.global_variables()).items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    accumulate(feed(window[-1]))
    apply()
    return values_by_name(sess, v1.global_variables())


def _builder(sparse=False):
    model = Model(tf.float64, sparse)
    step = v1.train.get_or_create_global_step()
    opt = v1.train.AdamOptimizer(0.05)
    return model, tf1_accum.build_accumulation(model.loss, opt, global_step=step, fused=True)


# -- every way in: each pair of ops that change one window --------------------


@pytest.mark.parametrize(
    "fields",
    [
        ("accum_op", "apply_op"),
        ("accum_op", "accum_apply_op"),
        ("accum_apply_op", "apply_op"),
        ("zero_op", "apply_op"),
        ("zero_op", "accum_op"),
    ],
    ids=lambda fields: "+".join(fields),
)
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_two_of_the_builders_ops_in_one_run_are_refused(fields, sparse):
    window = make_batches(tf.float64, sparse, N, B)
    (large_batch,) = plain_training("adam", tf.float64, sparse, [window])
    with tf.Graph().as_default():
        model, acc = _builder(sparse)
        together = [getattr(acc, field) for field in fields]
        [finding] = tf1_accum.check_graph(tf.group(*together))
        assert (finding.kind, finding.op_name) == ("ops_in_one_run", max(o.name for o in together))
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            trained = _refuse_then_run_apart(
                sess,
                window,
                model.feed,
                lambda feed: sess.run(together, feed),
                fields,
                lambda feed: sess.run(acc.accum_op, feed),
                lambda: sess.run(acc.apply_op),
            )
    assert_same_values(trained, large_batch, RTOL[tf.float64], "after the refused run")


# -- every run path ----------------------------------------------------------


PATHS = ["run", "grouped", "make_callable", "partial_run", "keras_function", "monitored"]


def _runner(path, model, ops):
    """A function of (session, feed) that runs ``ops`` in one step by ``path``.

    Built before the session runs: a graph that has run takes no new control inputs.
    """
    feed_list = [model.inputs, model.labels]
    if path == "grouped":
        group = tf.group(*ops)
        return lambda sess, feed: sess.run(group, feed)
    if path == "make_callable":
        return lambda sess, feed: sess.make_callable(ops, feed_list)(*map(feed.get, feed_list))
    if path == "partial_run":
        setup = lambda sess: sess.partial_run_setup(ops, feed_list)  # noqa: E731
        return lambda sess, feed: sess.partial_run(setup(sess), ops, feed)
    if path == "keras_function":
        # Keras groups the updates in one tf.group: the target of a callable made from options.
        function = keras.backend.function(feed_list, [model.loss], updates=ops)
        return lambda sess, feed: function(list(map(feed.get, feed_list)))
    return lambda sess, feed: sess.run(ops, feed)  # run, monitored


def _session(path):
    if path == "monitored":
        return v1.train.MonitoredTrainingSession()
    session = v1.Session()
    session.run(v1.global_variables_initializer())
    return session


@pytest.mark.parametrize("path", PATHS)
def test_every_run_path_refuses_two_ops_of_one_window(path):
    window = make_batches(tf.float64, False, N, B)
    (large_batch,) = plain_training("adam", tf.float64, False, [window])
    with tf.Graph().as_default():
        model, acc = _builder()
        run_together = _runner(path, model, [acc.accum_op, acc.apply_op])
        with _session(path) as sess:
            trained = _refuse_then_run_apart(
                sess,
                window,
                model.feed,
                lambda feed: run_together(sess, feed),
                ("accum_op", "apply_op"),
                lambda feed: sess.run(acc.accum_op, feed),
                lambda: sess.run(acc.apply_op),
            )
    assert_same_values(trained, large_batch, RTOL[tf.float64], f"after the refused {path}")


@pytest.mark.parametrize("scope", ["", "imported/"])
def test_an_exported_and_imported_graph_still_refuses_two_window_ops_in_one_run(tmp_path, scope):
    # The marks are in the graph (a collection), not on the Python objects; an
    # import_scope prefixes the ops but not the collection's strings.
    window = make_batches(tf.float64, False, N, B)
    (large_batch,) = plain_training("adam", tf.float64, False, [window])
    with tf.Graph().as_default():
        model, acc = _builder()
        names = [op.name for op in (acc.accum_op, acc.apply_op, acc.zero_op)]
        feeds = [model.inputs.name, model.labels.name]
        v1.train.export_meta_graph(str(tmp_path / "model.meta"))
    with tf.Graph().as_default() as graph:
        v1.train.import_meta_graph(str(tmp_path / "model.meta"), import_scope=scope[:-1] or None)
        accum_op, apply_op, zero_op = (graph.get_operation_by_name(scope + n) for n in names)
        x, y = (graph.get_tensor_by_name(scope + name) for name in feeds)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            trained = _refuse_then_run_apart(
                sess,
                window,
                lambda batch: {x: batch[0], y: batch[1]},
                lambda feed: sess.run([zero_op, apply_op], feed),
                ("zero_op", "apply_op"),
                lambda feed: sess.run(accum_op, feed),
                lambda: sess.run(apply_op),
            )
    trained = {name[len(scope) :]: value for name, value in trained.items()}
    assert_same_values(trained, large_batch, RTOL[tf.float64], "after the imported graph's window")


# -- the wrapper: its train op and flush_op ------------------------------------


def _wrapper():
    model = Model(tf.float64, False)
    step = v1.train.get_or_create_global_step()
    opt = tf1_accum.AccumulationOptimizer(v1.train.AdamOptimizer(0.05), steps=2 * N)
    return model, opt, opt.minimize(model.loss, global_step=step)


@pytest.mark.parametrize("path", ["run", "grouped", "keras_function", "monitored"])
@pytest.mark.parametrize("train", ["train_op", "applied"])
def test_the_train_op_fetched_with_flush_op_is_refused(path, train):
    # The flush may run first: it applies the partial window without this
    # micro-batch, which then starts the next window.
    window = make_batches(tf.float64, False, N, B)
    (large_batch,) = plain_training("adam", tf.float64, False, [window])
    with tf.Graph().as_default():
        model, opt, train_op = _wrapper()
        fetched = train_op if train == "train_op" else opt.window.applied
        together = [fetched, opt.flush_op]
        if path != "keras_function":  # updates are ops
            [finding] = tf1_accum.check_graph(together)
            assert (finding.kind, finding.op_name) == ("ops_in_one_run", opt.flush_op.name)
        run_together = _runner(path, model, together)
        with _session(path) as sess:
            trained = _refuse_then_run_apart(
                sess,
                window,
                model.feed,
                lambda feed: run_together(sess, feed),
                ("train_op", "flush_op"),
                lambda feed: sess.run(train_op, feed),
                lambda: sess.run(opt.flush_op),
            )
    assert_same_values(trained, large_batch, RTOL[tf.float64], f"after the refused {path}")


def test_a_flush_op_that_flushes_two_windows_is_refused_with_either_train_op():
    dtype = tf.float64
    first, second = make_batches(dtype, False, 2, B), make_batches(dtype, False, 2, B, seed=2)

    def models():
        with v1.variable_scope("a"):
            a = Model(dtype, False, seed=0)
        with v1.variable_scope("b"):
            b = Model(dtype, False, seed=1)
        return a, b

    with tf.Graph().as_default():
        a, b = models()
        opt = v1.train.MomentumOptimizer(0.1, 0.9)
        train_a = opt.minimize(a.loss, var_list=v1.trainable_variables("a"))
        train_b = opt.minimize(b.loss, var_list=v1.trainable_variables("b"))
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train_a, a.feed(concat(first)))
            sess.run(train_b, b.feed(concat(second)))
            expected = values_by_name(sess, v1.global_variables())

    with tf.Graph().as_default():
        a, b = models()
        opt = tf1_accum.AccumulationOptimizer(v1.train.MomentumOptimizer(0.1, 0.9), steps=2 * N)
        train_a = opt.minimize(a.loss, var_list=v1.trainable_variables("a"))
        train_b = opt.minimize(b.loss, var_list=v1.trainable_variables("b"))
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train_b, b.feed(second[0]))
            sess.run(train_b, b.feed(second[1]))
            # The flush of the last train op flushes the first's window too.
            trained = _refuse_then_run_apart(
                sess,
                first,
                a.feed,
                lambda feed: sess.run([train_a, opt.flush_op], feed),
                ("train_op", "flush_op"),
                lambda feed: sess.run(train_a, feed),
                lambda: sess.run(opt.flush_op),
            )
    assert_same_values(trained, expected, RTOL[dtype], "after the refused run")


def test_the_keras_wrappers_train_op_with_its_flush_op_in_a_keras_function_is_refused():
    window = make_batches(tf.float64, False, N, B)
    (large_batch,) = plain_training("sgd", tf.float64, False, [window])
    del large_batch["global_step"]  # the wrapped optimizer counts updates in its iterations
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        if any(v.dtype != v.dtype.base_dtype for v in v1.global_variables()):
            pytest.skip("Keras 2 optimizers take resource variables only (v1 mode: references)")
        opt = tf1_accum.KerasAccumulationOptimizer(legacy.SGD(0.1), steps=2 * N)
        variables = v1.trainable_variables()
        train_op = opt.apply_gradients(zip(tf.gradients(model.loss, variables), variables))
        run_together = _runner("keras_function", model, [train_op, opt.flush_op])
        with _session("run") as sess:
            trained = _refuse_then_run_apart(
                sess,
                window,
                model.feed,
                lambda feed: run_together(sess, feed),
                ("train_op", "flush_op"),
                lambda feed: sess.run(train_op, feed),
                lambda: sess.run(opt.flush_op),
            )
    assert_same_values(trained, large_batch, RTOL[tf.float64], "after the refused function")


# -- the dataset loop: its one op, marked -------------------------------------


def test_the_dataset_loops_train_op_and_tensors_are_one_mark_and_run_together():
    window = make_batches(tf.float64, False, N, B)
    (large_batch,) = plain_training("adam", tf.float64, False, [window])
    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        dataset = tf.data.Dataset.from_tensor_slices(
            (np.stack([b[0] for b in window]), np.stack([b[1] for b in window]))
        )

        def loss_fn(batch):
            return Model(tf.float64, False, inputs=batch[0], labels=batch[1]).loss

        acc = tf1_accum.build_dataset_accumulation(
            loss_fn, v1.train.AdamOptimizer(0.05), dataset, N, global_step=step
        )
        fetches = [acc.train_op, acc.applied, acc.micro_batches, acc.global_norm]
        marks = {m for t in fetches for m in _guard.marks(getattr(t, "op", t))}
        assert {(m.window, m.field) for m in marks} == {("dataset_accumulation/", "train_op")}
        assert tf1_accum.check_graph(fetches) == []
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            _, applied, drawn, _ = sess.run(fetches)
            trained = values_by_name(sess, v1.global_variables())
    assert (applied, drawn) == (True, N)
    assert_same_values(trained, large_batch, RTOL[tf.float64], "after the loop's window")


def test_ops_of_two_windows_and_one_op_twice_run_together():
    window = make_batches(tf.float64, False, N, B)
    with tf.Graph().as_default():
        model, acc = _builder()
        other = tf1_accum.build_accumulation(model.loss, v1.train.AdamOptimizer(0.05))
        fetches = [acc.accum_op, other.accum_op, tf.group(acc.accum_op)]
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for batch in window:
                sess.run(fetches, model.feed(batch))
            assert sess.run([acc.counter, other.counter]) == [N, N]
