"""Keras 2 in graph mode: model.fit with AccumulationOptimizer, and Keras legacy optimizers.

Keras 2 is tf_keras on TensorFlow 2, ``tf.keras`` on 1.15 (``tests/_keras.py``).
"""

import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import RTOL
from _helpers import Model
from _helpers import assert_same_values
from _helpers import concat
from _helpers import make_batches
from _helpers import values_by_name
from _keras import KERAS_NAME
from _keras import LEGACY_NAME
from _keras import TF1
from _keras import keras
from _keras import legacy
from _keras import not_legacy
from _ways import BY_NAME

v1 = tf.compat.v1

# Keras 2 legacy optimizers (OptimizerV2 subclasses), each with state that
# would show a window applied twice or a micro-batch applied alone.
KERAS_OPTIMIZERS = {
    "adam": lambda: legacy.Adam(0.05),
    "sgd_momentum": lambda: legacy.SGD(0.1, momentum=0.9, nesterov=True),
    "rmsprop": lambda: legacy.RMSprop(0.05, momentum=0.5),
    "adagrad": lambda: legacy.Adagrad(0.1),
    "nadam": lambda: legacy.Nadam(0.05),
    "adamax": lambda: legacy.Adamax(0.05),
    "ftrl": lambda: legacy.Ftrl(0.1, l1_regularization_strength=0.001),
    # Keras clips the window's mean, as it clips the large batch's gradient.
    "adam_clipnorm": lambda: legacy.Adam(0.05, clipnorm=0.3),
}
if not TF1:  # Keras 2.2.4-tf in TensorFlow 1.15 has no global_clipnorm
    KERAS_OPTIMIZERS["adam_global_clipnorm"] = lambda: legacy.Adam(0.05, global_clipnorm=0.3)


def _resource_model(dtype, sparse):
    with v1.variable_scope(v1.get_variable_scope(), use_resource=True):
        return Model(dtype, sparse)


def _keras_plain(name, dtype, sparse, windows):
    """Plain training with the Keras optimizer on each window's concatenated batch."""
    with tf.Graph().as_default():
        model = _resource_model(dtype, sparse)
        step = v1.train.get_or_create_global_step()
        opt = KERAS_OPTIMIZERS[name]()
        variables = v1.trainable_variables()
        # As Keras' fit: tf_keras clips in apply_gradients, 1.15's Keras here.
        update = opt.apply_gradients(zip(opt.get_gradients(model.loss, variables), variables))
        with tf.control_dependencies([update]):
            train_op = step.assign_add(1)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            results = []
            for window in windows:
                sess.run(train_op, model.feed(concat(window)))
                results.append(values_by_name(sess, v1.global_variables()))
    return results


def _keras_accumulated(name, dtype, sparse, windows, way):
    """Accumulates in ``way`` (a `_ways.WayIn`), steps the first window's size.

    Asserts that no trained variable moves before the apply (where the way
    runs micro-batches one by one). Returns the values after each window and
    the optimizer's ``iterations`` at the end.
    """

    def model_fn(inputs):
        # Keras optimizers update resource variables only.
        with v1.variable_scope(v1.get_variable_scope(), use_resource=True):
            return Model(dtype, sparse, inputs=inputs[0], labels=inputs[1]).loss

    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        opt = KERAS_OPTIMIZERS[name]()
        built = way.build(
            model_fn,
            opt,
            [batch for window in windows for batch in window],
            len(windows[0]),
            global_step=step,
        )
        trained = v1.trainable_variables()
        with way.session() as sess:
            results = []
            for w, window in enumerate(windows):
                before = values_by_name(sess, trained)

                def unmoved(w=w, before=before):
                    moved = values_by_name(sess, trained)
                    assert_same_values(moved, before, 0.0, f"window {w}")

                way.run_window(sess, built, window, between=unmoved)
                results.append(values_by_name(sess, tf1_accum.plain_variables()))
            iterations = sess.run(opt.iterations)
    return results, iterations


@pytest.mark.parametrize("way", [BY_NAME["ops"], BY_NAME["optimizer"], BY_NAME["dataset"]], ids=str)
@pytest.mark.parametrize("name", sorted(KERAS_OPTIMIZERS))
def test_keras_legacy_optimizer_equals_large_batch_training(name, way):
    n, count = 3, 3
    batches = make_batches(tf.float64, False, n * count, 4)
    windows = [batches[i * n : (i + 1) * n] for i in range(count)]
    expected = _keras_plain(name, tf.float64, False, windows)
    actual, iterations = _keras_accumulated(name, tf.float64, False, windows, way)
    for w, (got, want) in enumerate(zip(actual, expected)):
        assert_same_values(got, want, RTOL[tf.float64], f"Keras {name}, {way}: window {w}")
        assert got["global_step"] == w + 1
    assert iterations == count


@pytest.mark.parametrize("name", sorted(KERAS_OPTIMIZERS))
def test_the_wrapper_gives_back_the_keras_optimizer_it_was_given(name):
    with tf.Graph().as_default():
        opt = KERAS_OPTIMIZERS[name]()
        assert tf1_accum.AccumulationOptimizer(opt, steps=3).optimizer is opt


@pytest.mark.parametrize("name", ["adam", "sgd_momentum"])
def test_keras_legacy_optimizer_with_sparse_gradients(name):
    n = 4
    batches = make_batches(tf.float32, True, 2 * n, 5)
    windows = [batches[:n], batches[n:]]
    expected = _keras_plain(name, tf.float32, True, windows)
    actual, _ = _keras_accumulated(name, tf.float32, True, windows, BY_NAME["ops"])
    for w, (got, want) in enumerate(zip(actual, expected)):
        assert_same_values(got, want, RTOL[tf.float32], f"Keras {name}, sparse: window {w}")


def test_keras_optimizer_refuses_reference_variables_before_building():
    with tf.Graph().as_default():
        with v1.variable_scope(v1.get_variable_scope(), use_resource=False):
            model = Model(tf.float32, False)
        with pytest.raises(TypeError, match="updates resource variables only, but w1 is a refer"):
            tf1_accum.build_accumulation(model.loss, legacy.Adam(0.1))
        with pytest.raises(TypeError, match="use_resource=True"):
            tf1_accum.AccumulationOptimizer(legacy.Adam(0.1), 2).apply_gradients(
                [(tf.ones_like(v), v) for v in v1.trainable_variables()]
            )
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []


def test_keras_3_optimizer_is_refused_with_what_to_use():
    if TF1:
        pytest.skip("TensorFlow 1.15 (Python 3.7) has no Keras 3")
    keras_3 = pytest.importorskip("keras")
    if not keras_3.__version__.startswith("3."):
        pytest.skip(f"keras {keras_3.__version__} is not Keras 3")
    with tf.Graph().as_default():
        model = _resource_model(tf.float32, False)
        message = (
            r"got .*keras.src.optimizers.adam.Adam\)\. Keras 3 optimizers do not build TF1 "
            r"graph-mode ops for a Session\. Use tf_keras.optimizers.legacy.Adam \(tf_keras "
            r"package; tf.keras.optimizers.legacy.Adam with TF_USE_LEGACY_KERAS=1\) or "
            r"tf.compat.v1.train.AdamOptimizer instead\."
        )
        with pytest.raises(TypeError, match=message):
            tf1_accum.AccumulationOptimizer(keras_3.optimizers.Adam(0.1), 2)
        with pytest.raises(TypeError, match=message):
            tf1_accum.build_accumulation(model.loss, keras_3.optimizers.Adam(0.1))
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []


def test_new_tf_keras_optimizer_is_refused_with_its_legacy_counterpart():
    others = "those of tf.keras.optimizers" if TF1 else "the legacy ones"
    with pytest.raises(
        TypeError,
        match=rf"Keras optimizers other than {others} do not build TF1 graph-mode ops"
        rf".*Use {LEGACY_NAME}.RMSprop .*or tf.compat.v1.train.RMSPropOptimizer",
    ):
        tf1_accum.AccumulationOptimizer(not_legacy.RMSprop(0.1), 2)


def _loss_scale_optimizer(optimizer):
    if TF1:
        return keras.mixed_precision.experimental.LossScaleOptimizer(optimizer, "dynamic")
    return keras.mixed_precision.LossScaleOptimizer(optimizer)


def test_tf_keras_loss_scale_optimizer_is_refused_with_the_tf1_one_named():
    """It crashed with AttributeError ('_name') in both ways in."""
    message = (
        rf"tf1_accum does not support a Keras LossScaleOptimizer \({KERAS_NAME}.mixed_precision\): "
        r"use tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer\(tf.compat.v1.train."
        r"<Optimizer>\(\.\.\.\), 'dynamic'\) for Adam\."
    )
    with tf.Graph().as_default():
        model = _resource_model(tf.float32, False)
        scaled = _loss_scale_optimizer(legacy.Adam(0.1))
        with pytest.raises(TypeError, match=message):
            tf1_accum.build_accumulation(model.loss, scaled)
        with pytest.raises(TypeError, match=message):
            tf1_accum.AccumulationOptimizer(scaled, 2)
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []


# --- model.fit -------------------------------------------------------------

# Batches of powers of two: TensorFlow 1.15's Keras divides the loss by the
# batch size in float32, exact for those only (others move float64 weights by ~1e-8).
N, B = 4, 4


def _fit(make_optimizer, batch_size, x, y, epochs=2, wrap=False, callbacks=()):
    """Trains a small Keras model with fit; returns (weights, iterations, optimizer)."""
    with tf.Graph().as_default(), v1.Session():
        glorot = keras.initializers.glorot_uniform
        model = keras.Sequential(
            [
                keras.layers.Dense(
                    5, activation="tanh", input_shape=(4,), kernel_initializer=glorot(seed=1)
                ),
                keras.layers.Dense(1, kernel_initializer=glorot(seed=2)),
            ]
        )
        optimizer = make_optimizer()
        if wrap:
            optimizer = tf1_accum.AccumulationOptimizer(optimizer, N)
        model.compile(optimizer=optimizer, loss="mse")
        model.fit(
            x,
            y,
            batch_size=batch_size,
            epochs=epochs,
            shuffle=False,
            verbose=0,
            callbacks=[c(optimizer) for c in callbacks],
        )
        weights = model.get_weights()
        iterations = keras.backend.get_value(model.optimizer.iterations)
        variables = []
        if wrap:
            variables = [v.op.name for v in optimizer.variables()]
            state = {v.op.name for v in v1.get_collection(tf1_accum.STATE_COLLECTION)}
            plain = {v.op.name for v in tf1_accum.plain_variables()}
            assert state <= set(variables) and not state & plain
    return weights, iterations, variables


@pytest.fixture
def floatx():
    def set_floatx(value):
        keras.backend.set_floatx(value)

    yield set_floatx
    keras.backend.set_floatx("float32")


FIT_OPTIMIZERS = {
    "v1_adam": lambda: v1.train.AdamOptimizer(0.05),
    "v1_momentum": lambda: v1.train.MomentumOptimizer(0.1, 0.9),
    "keras_adam": lambda: legacy.Adam(0.05),
    "keras_sgd_momentum": lambda: legacy.SGD(0.1, momentum=0.9),
    "keras_rmsprop": lambda: legacy.RMSprop(0.02),
}


@pytest.mark.parametrize("name", sorted(FIT_OPTIMIZERS))
def test_fit_equals_fit_on_batches_n_times_larger(name, floatx):
    floatx("float64")
    rng = np.random.RandomState(0)
    x, y = rng.randn(4 * N * B, 4), rng.randn(4 * N * B, 1)
    make = FIT_OPTIMIZERS[name]
    got, iterations, variables = _fit(make, B, x, y, wrap=True)
    want, plain_iterations, _ = _fit(make, N * B, x, y)
    small, _, _ = _fit(make, B, x, y)
    for i, (a, e, s) in enumerate(zip(got, want, small)):
        scale = np.max(np.abs(e))
        assert np.max(np.abs(a - e)) <= 1e-10 * scale, f"{name}: weight {i}"
        assert np.max(np.abs(s - e)) > 1e-3 * scale  # the batch size matters here
    # Two epochs of 4 windows: iterations counts updates, as in the plain fit.
    assert iterations == plain_iterations == 8
    assert "dense/kernel/accumulator" in variables


def test_fit_in_float32(floatx):
    floatx("float32")
    rng = np.random.RandomState(3)
    # 3 windows an epoch: with 2, the output bias ends near 0 (1e-3), too small
    # for float32 rounding to stay within 1e-5 of it.
    x = rng.randn(3 * N * B, 4).astype(np.float32)
    y = rng.randn(3 * N * B, 1).astype(np.float32)
    make = FIT_OPTIMIZERS["v1_adam"]
    got, _, _ = _fit(make, B, x, y, wrap=True)
    want, _, _ = _fit(make, N * B, x, y)
    for i, (a, e) in enumerate(zip(got, want)):
        assert np.max(np.abs(a - e)) <= RTOL[tf.float32] * np.max(np.abs(e)), f"weight {i}"


def _flush_at_epoch_end(optimizer):
    return keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: v1.keras.backend.get_session().run(optimizer.flush_op)
    )


def test_a_partial_last_window_is_flushed_by_a_callback(floatx):
    # 6 micro-batches an epoch: windows of 4 and (flushed at the epoch's
    # end) 2, as plain fit with batches of 4 x B has a last batch of 2 x B.
    floatx("float64")
    rng = np.random.RandomState(1)
    x, y = rng.randn(6 * B, 4), rng.randn(6 * B, 1)
    make = FIT_OPTIMIZERS["keras_adam"]
    got, iterations, _ = _fit(make, B, x, y, wrap=True, callbacks=[_flush_at_epoch_end])
    want, plain_iterations, _ = _fit(make, N * B, x, y)
    for i, (a, e) in enumerate(zip(got, want)):
        assert np.max(np.abs(a - e)) <= 1e-10 * np.max(np.abs(e)), f"weight {i}"
    assert iterations == plain_iterations == 4


def _fit_warnings(callbacks):
    """Fits 2 epochs of 7 micro-batches (windows of 4); returns (fit's warnings, iterations)."""
    rng = np.random.RandomState(1)
    x, y = rng.randn(7 * B, 4), rng.randn(7 * B, 1)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _, iterations, _ = _fit(
            FIT_OPTIMIZERS["keras_adam"], B, x, y, wrap=True, callbacks=callbacks
        )
    return [str(w.message) for w in record if "tf1_accum: fit ended" in str(w.message)], iterations


def test_fit_without_a_flush_warns_at_its_end_of_epochs_that_ended_mid_window(floatx):
    floatx("float64")
    messages, iterations = _fit_warnings(callbacks=[])
    assert iterations == 3  # plain fit with batches of 4 x B: 4
    assert messages == [
        "tf1_accum: fit ended 2 of its 2 epochs in the middle of an accumulation window, and "
        "no callback runs the optimizer's flush_op: an epoch's last micro-batches go into "
        "the next epoch's first window (fit with batches steps times larger applies a short "
        "last batch), and the last 2 miss their update. Run flush_op at "
        f"each epoch's end: callbacks=[{KERAS_NAME}.callbacks.LambdaCallback(on_epoch_end=lambda "
        "epoch, logs: tf.compat.v1.keras.backend.get_session().run(opt.flush_op))]."
    ]


def test_fit_without_a_flush_is_warned_before_its_first_micro_batch(floatx):
    floatx("float64")
    made, seen = [], []

    def make():
        made.append(legacy.Adam(0.05))
        return made[-1]

    def show(message, *args, **kwargs):
        if str(message).startswith("tf1_accum: fit runs"):
            state = v1.get_collection(tf1_accum.STATE_COLLECTION)
            [counter] = [v for v in state if v.op.name.endswith("counter")]
            get = keras.backend.get_value
            seen.append((str(message), get(made[0].iterations), get(counter)))

    rng = np.random.RandomState(1)
    x, y = rng.randn(7 * B, 4), rng.randn(7 * B, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        _, iterations, _ = _fit(make, B, x, y, wrap=True)
    [(message, updates, micro_batches)] = seen
    assert (updates, micro_batches, iterations) == (0, 0, 3)
    assert message.startswith(
        "tf1_accum: fit runs 7 micro-batches an epoch in windows of 4, so 2 of its 2 epochs "
        "end in the middle of an accumulation window, and no callback runs the "
        "optimizer's flush_op"
    )
    assert message.endswith("opt.flush_op))].")


def test_fit_with_a_flush_at_each_epochs_end_does_not_warn(floatx):
    floatx("float64")
    assert _fit_warnings(callbacks=[_flush_at_epoch_end]) == ([], 4)


def _load_example(name):
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "real_programs"
    spec = importlib.util.spec_from_file_location(f"real_programs_{name}", path / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_keras_fit_example(capsys):
    # 6 micro-batches of 8 an epoch: windows of 4 and 2, two epochs.
    result = _load_example("keras_fit").main(["--examples", "48", "--epochs", "2"])
    assert result["max_rel_diff"] <= 1e-10
    assert result["updates"] == result["large_batch_updates"] == 4
    assert "accumulated vs large batch" in capsys.readouterr().out
    assert keras.backend.floatx() == "float32"  # as the example found it


def _fit_saved(x, y, epochs, save_to=None, restore_from=None):
    """fit with the wrapper; saves Keras' session after, or restores it before, training."""
    with tf.Graph().as_default(), v1.Session():
        glorot = keras.initializers.glorot_uniform
        model = keras.Sequential(
            [
                keras.layers.Dense(
                    5, activation="tanh", input_shape=(4,), kernel_initializer=glorot(seed=1)
                ),
                keras.layers.Dense(1, kernel_initializer=glorot(seed=2)),
            ]
        )
        optimizer = tf1_accum.AccumulationOptimizer(legacy.Adam(0.05), N)
        model.compile(optimizer=optimizer, loss="mse")
        callbacks = []
        if restore_from is not None:
            # The optimizer's variables exist once fit has built its train
            # function, before the first batch: restore them all then.
            def restore(logs):
                v1.train.Saver().restore(v1.keras.backend.get_session(), restore_from)

            callbacks.append(keras.callbacks.LambdaCallback(on_train_begin=restore))
        model.fit(x, y, batch_size=B, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
        if save_to is not None:
            v1.train.Saver().save(v1.keras.backend.get_session(), save_to)
        sess = v1.keras.backend.get_session()
        return (
            model.get_weights(),
            int(sess.run(model.optimizer.iterations)),
            int(sess.run(optimizer.window.counter)),
        )


def test_a_saver_in_keras_session_keeps_the_optimizer_and_the_window(tmp_path, floatx):
    # model.save() keeps no state of a tf.compat.v1 optimizer; a Saver of
    # Keras' session keeps all of it: slots, iterations, the partial window.
    floatx("float64")
    rng = np.random.RandomState(4)
    x, y = rng.randn(5 * B, 4), rng.randn(5 * B, 1)  # 5 micro-batches an epoch
    whole, iterations, pending = _fit_saved(x, y, epochs=2)
    assert (iterations, pending) == (2, 2)
    path = str(tmp_path / "keras")
    first, iterations, pending = _fit_saved(x, y, epochs=1, save_to=path)
    assert (iterations, pending) == (1, 1)  # a window open across the epochs
    resumed, iterations, pending = _fit_saved(x, y, epochs=1, restore_from=path)
    assert (iterations, pending) == (2, 2)
    for i, (a, e) in enumerate(zip(resumed, whole)):
        np.testing.assert_array_equal(a, e, err_msg=f"weight {i}")
