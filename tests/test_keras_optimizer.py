"""KerasAccumulationOptimizer: a Keras 2 fit script that saves with model.save() and resumes.

The programs tested have the shape of Keras 2's ``examples/cifar10_cnn.py``
run under tf_keras (on TensorFlow 1.15, ``tf.keras``) in a TF1 graph: a small
convolutional ``Sequential`` compiled with a legacy optimizer,
``categorical_crossentropy`` and an accuracy metric, ``fit`` on NumPy arrays
with validation data, ``model.save('....h5')``, then ``load_model`` and
``fit`` again.
"""

import os
import pathlib
import subprocess
import warnings
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import Model
from _keras import KERAS_NAME
from _keras import LEGACY_NAME
from _keras import TF1
from _keras import keras
from _keras import legacy
from _keras import not_legacy

v1 = tf.compat.v1

# Micro-batches per update, examples per micro-batch: powers of two, as
# TensorFlow 1.15's Keras divides the loss by the batch size in float32,
# exact for those only (others move float64 weights by about 1e-8).
N, B = 4, 4
PER_EPOCH = 6  # micro-batches an epoch: a window stays open across each epoch's end
CLASSES = 3

OPTIMIZERS = {
    # cifar10_cnn.py's optimizer: RMSprop with a decay driven by iterations.
    "rmsprop_decay": lambda: legacy.RMSprop(0.01, decay=0.1),
    "adam": lambda: legacy.Adam(0.02),
    "sgd_nesterov": lambda: legacy.SGD(0.05, momentum=0.9, nesterov=True),
}


@pytest.fixture
def float64():
    keras.backend.set_floatx("float64")
    yield
    keras.backend.set_floatx("float32")


def _data(examples, seed):
    rng = np.random.RandomState(seed)
    x = rng.randn(examples, 6, 6, 3)
    labels = rng.randint(CLASSES, size=examples)
    return x, keras.utils.to_categorical(labels, CLASSES)


def _cnn():
    glorot = keras.initializers.glorot_uniform
    layers = keras.layers
    return keras.Sequential(
        [
            layers.Conv2D(
                4, (3, 3), padding="same", input_shape=(6, 6, 3), kernel_initializer=glorot(1)
            ),
            layers.Activation("relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Flatten(),
            layers.Dense(8, kernel_initializer=glorot(2)),
            layers.Activation("tanh"),
            layers.Dense(CLASSES, kernel_initializer=glorot(3)),
            layers.Activation("softmax"),
        ]
    )


def _compile(model, optimizer):
    model.compile(loss="categorical_crossentropy", optimizer=optimizer, metrics=["accuracy"])


def _fit(model, x, y, epochs, batch_size=B, callbacks=()):
    model.fit(
        x,
        y,
        batch_size=batch_size,
        epochs=epochs,
        validation_data=_data(2 * B, seed=9),
        shuffle=False,
        verbose=0,
        callbacks=list(callbacks),
    )


def _state(model):
    """(iterations, micro_step) of the model's KerasAccumulationOptimizer."""
    get = keras.backend.get_value
    return int(get(model.optimizer.iterations)), int(get(model.optimizer.window.counter))


def _uninterrupted(name, x, y, epochs):
    with tf.Graph().as_default(), v1.Session():
        model = _cnn()
        _compile(model, tf1_accum.KerasAccumulationOptimizer(OPTIMIZERS[name](), N))
        _fit(model, x, y, epochs)
        return model.get_weights(), _state(model)


def _large_batch(name, x, y, epochs):
    """Plain fit, one epoch over the epochs' examples in a row, on batches N times larger."""
    with tf.Graph().as_default(), v1.Session():
        model = _cnn()
        _compile(model, OPTIMIZERS[name]())
        _fit(model, np.concatenate([x] * epochs), np.concatenate([y] * epochs), 1, N * B)
        return model.get_weights(), int(keras.backend.get_value(model.optimizer.iterations))


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fit_save_load_fit_ends_as_the_uninterrupted_fit(name, tmp_path, float64):
    x, y = _data(PER_EPOCH * B, seed=0)
    epochs = 2  # 12 micro-batches: 3 windows, the second open across the save
    whole, state = _uninterrupted(name, x, y, epochs)
    assert state == (3, 0)
    reference, updates = _large_batch(name, x, y, epochs)
    assert updates == 3
    for i, (got, want) in enumerate(zip(whole, reference)):
        scale = np.max(np.abs(want))
        assert np.max(np.abs(got - want)) <= 1e-10 * scale, f"{name}: weight {i}"

    path = str(tmp_path / "keras_cifar10_trained_model.h5")
    with tf.Graph().as_default(), v1.Session():
        model = _cnn()
        _compile(model, tf1_accum.KerasAccumulationOptimizer(OPTIMIZERS[name](), N))
        _fit(model, x, y, 1)
        assert _state(model) == (1, 2)  # a window open at the save
        saved = model.optimizer.get_weights()
        names = [v.op.name for v in model.optimizer.weights]
        model.save(path)
    accumulators = [i for i, n in enumerate(names) if n.endswith("/accumulator")]
    assert len(accumulators) == 6 and all(np.any(saved[i] != 0) for i in accumulators)

    with tf.Graph().as_default(), v1.Session():
        model = keras.models.load_model(path)
        assert isinstance(model.optimizer, tf1_accum.KerasAccumulationOptimizer)
        assert (model.optimizer.steps, type(model.optimizer.optimizer)) == (
            N,
            type(OPTIMIZERS[name]()),
        )
        restored = []

        def read_state(logs):  # fit has built the train function, nothing ran yet
            restored.extend(model.optimizer.get_weights())

        begin = keras.callbacks.LambdaCallback(on_train_begin=read_state)
        _fit(model, x, y, epochs - 1, callbacks=[begin])
        for i, (got, want) in enumerate(zip(restored, saved)):
            np.testing.assert_array_equal(got, want, err_msg=f"{name}: {names[i]}")
        assert len(restored) == len(saved)
        resumed = model.get_weights()
        assert _state(model) == (3, 0)
    for i, (got, want) in enumerate(zip(resumed, whole)):
        np.testing.assert_array_equal(got, want, err_msg=f"{name}: weight {i}")


def _trained_model(optimizer=None):
    model = _cnn()
    if optimizer is None:
        optimizer = tf1_accum.KerasAccumulationOptimizer(legacy.Adam(0.02), N)
    _compile(model, optimizer)
    _fit(model, *_data(PER_EPOCH * B, seed=0), 1)
    return model


def test_savedmodel_format_raises_naming_hdf5(tmp_path):
    with tf.Graph().as_default(), v1.Session():
        model = _trained_model()
        with pytest.raises(
            ValueError,
            match=r"model.save\(\) in the SavedModel format would drop the state of "
            r"KerasAccumulationOptimizer .* Save the model in the HDF5 format, "
            r"model.save\('model.h5'\)",
        ):
            model.save(str(tmp_path / "saved"), save_format="tf")


def test_savedmodel_without_the_optimizer_saves_the_model_for_inference(tmp_path):
    x, _ = _data(2 * B, seed=5)
    path = str(tmp_path / "saved")
    with tf.Graph().as_default(), v1.Session():
        model = _trained_model()
        want = model.predict(x, verbose=0)
        model.save(path, save_format="tf", include_optimizer=False)
    with tf.Graph().as_default(), v1.Session():
        loaded = keras.models.load_model(path, compile=False)
        # Called, not predict(): a model 1.15 revives has no compile arguments for it.
        got = v1.keras.backend.get_session().run(loaded(tf.constant(x, tf.float32)))
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_keras_v3_format_fails_in_a_tf1_graph(tmp_path):
    path = str(tmp_path / "model.keras")
    with tf.Graph().as_default(), v1.Session():
        model = _trained_model()
        if not TF1:
            # tf_keras's .keras format needs eager execution: it fails before writing.
            with pytest.raises(NotImplementedError, match="only available when eager execution"):
                model.save(path)
            return
        # TensorFlow 1.15's Keras has no such format: .keras is an HDF5 name there.
        want = model.optimizer.get_weights()
        model.save(path)
    with tf.Graph().as_default(), v1.Session():
        loaded = keras.models.load_model(path)
        assert _state(loaded) == (1, 2)
        for got, saved in zip(loaded.optimizer.get_weights(), want):
            np.testing.assert_array_equal(got, saved)


def test_saving_a_loaded_model_before_fit_raises_instead_of_dropping_the_window(tmp_path):
    path = str(tmp_path / "model.h5")
    with tf.Graph().as_default(), v1.Session():
        _trained_model().save(path)
    with tf.Graph().as_default(), v1.Session():
        # As a new process loads it: the class named in custom_objects.
        model = keras.models.load_model(
            path,
            custom_objects={"KerasAccumulationOptimizer": tf1_accum.KerasAccumulationOptimizer},
        )
        assert int(keras.backend.get_value(model.optimizer.iterations)) == 1
        if TF1:  # 1.15's load_model builds the train function, the window with it
            assert _state(model) == (1, 2)
        else:
            with pytest.raises(
                ValueError, match=r"holds the window load_model read.*Train \(model.fit\) before"
            ):
                model.save(str(tmp_path / "again.h5"))
        model.save(str(tmp_path / "weights_only.h5"), include_optimizer=False)
        _fit(model, *_data(PER_EPOCH * B, seed=0), 1)
        assert _state(model) == (3, 0)
        model.save(str(tmp_path / "again.h5"))  # the window is in the graph again


def test_config_round_trips_the_wrapped_optimizer_and_the_options():
    wrapper = tf1_accum.KerasAccumulationOptimizer(
        legacy.RMSprop(0.01, decay=0.1, clipnorm=2.0),
        4,
        average=False,
        clip_norm=1.5,
        skip_nonfinite=False,
        name="Acc",
    )
    config = wrapper.get_config()
    again = tf1_accum.KerasAccumulationOptimizer.from_config(config)
    assert again.get_config() == config
    assert (again.steps, again._name, config["clip_norm"], config["average"]) == (
        4,
        "Acc",
        1.5,
        False,
    )
    inner = again.optimizer.get_config()
    assert isinstance(again.optimizer, legacy.RMSprop)
    assert (inner["decay"], inner["clipnorm"]) == (0.1, 2.0)


def test_flush_op_applies_the_last_short_window_of_each_epoch(float64):
    # 6 micro-batches an epoch: windows of 4 and (flushed) 2, as plain fit
    # with batches of 4 x B has a last batch of 2 x B.
    x, y = _data(PER_EPOCH * B, seed=2)
    with tf.Graph().as_default(), v1.Session():
        model = _cnn()
        optimizer = tf1_accum.KerasAccumulationOptimizer(legacy.Adam(0.02), N)
        _compile(model, optimizer)
        flush = keras.callbacks.LambdaCallback(
            on_epoch_end=lambda epoch, logs: v1.keras.backend.get_session().run(optimizer.flush_op)
        )
        _fit(model, x, y, 2, callbacks=[flush])
        got, state = model.get_weights(), _state(model)
    with tf.Graph().as_default(), v1.Session():
        model = _cnn()
        _compile(model, legacy.Adam(0.02))
        _fit(model, x, y, 2, N * B)
        want = model.get_weights()
    assert state == (4, 0)
    for i, (a, e) in enumerate(zip(got, want)):
        assert np.max(np.abs(a - e)) <= 1e-10 * np.max(np.abs(e)), f"weight {i}"


def test_fit_without_a_flush_warns_at_its_end(float64):
    # 5 micro-batches an epoch, windows of 4: the epochs end with 1, then 2.
    x, y = _data(5 * B, seed=2)
    with tf.Graph().as_default(), v1.Session():
        model = _cnn()
        _compile(model, tf1_accum.KerasAccumulationOptimizer(legacy.Adam(0.02), N))
        with pytest.warns(UserWarning) as record:
            _fit(model, x, y, 2)
        assert _state(model) == (2, 2)
    [message] = [str(w.message) for w in record if "tf1_accum: fit ended" in str(w.message)]
    assert message.startswith(
        "tf1_accum: fit ended 2 of its 2 epochs in the middle of an accumulation window"
    )
    assert "the last 2 miss their update" in message


def _warned_when(model, run):
    """``run()``'s tf1_accum warnings, each with `_state` of ``model`` as it was given."""
    seen = []

    def show(message, *args, **kwargs):
        if str(message).startswith("tf1_accum"):
            seen.append((str(message), _state(model)))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        run()
    return seen


def test_fit_without_a_flush_warns_before_its_first_micro_batch(float64):
    # 5 micro-batches an epoch, windows of 4: the epochs would end with 1, then 2.
    x, y = _data(5 * B, seed=2)
    with tf.Graph().as_default(), v1.Session():
        model = _cnn()
        _compile(model, tf1_accum.KerasAccumulationOptimizer(legacy.Adam(0.02), N))
        (begin, before), (end, after) = _warned_when(model, lambda: _fit(model, x, y, 2))
    assert before == (0, 0) and after == (2, 2)
    assert begin == (
        "tf1_accum: fit runs 5 micro-batches an epoch in windows of 4, so 2 of its 2 epochs "
        "end in the middle of an accumulation window, and no callback runs the "
        "optimizer's flush_op: an epoch's last micro-batches go into the next "
        "epoch's first window (fit with batches steps times larger applies a short last "
        "batch), and the last 2 miss their update. Run flush_op at each epoch's "
        f"end: callbacks=[{KERAS_NAME}.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: "
        "tf.compat.v1.keras.backend.get_session().run(opt.flush_op))]."
    )
    assert end.startswith("tf1_accum: fit ended 2 of its 2 epochs")


def test_a_resumed_fit_is_warned_of_the_epochs_it_runs(float64):
    # Epochs 2 and 3 of 3, 5 micro-batches each, windows of 4: they would end with 1, then 2.
    x, y = _data(5 * B, seed=2)
    with tf.Graph().as_default(), v1.Session():
        model = _cnn()
        _compile(model, tf1_accum.KerasAccumulationOptimizer(legacy.Adam(0.02), N))

        def fit():
            model.fit(x, y, batch_size=B, epochs=3, initial_epoch=1, shuffle=False, verbose=0)

        (begin, before), (end, after) = _warned_when(model, fit)
    assert before == (0, 0) and after == (2, 2)
    assert begin.startswith(
        "tf1_accum: fit runs 5 micro-batches an epoch in windows of 4, so 2 of its 2 epochs "
        "end in the middle of an accumulation window"
    )
    assert "and the last 2 miss their update." in begin
    assert end.startswith("tf1_accum: fit ended 2 of its 2 epochs")


def test_fit_with_its_own_callback_is_warned_when_an_epoch_ends_mid_window(float64):
    # The callback might run flush_op: known only once the first epoch ends,
    # before the next epoch's first update.
    x, y = _data(5 * B, seed=2)
    with tf.Graph().as_default(), v1.Session():
        model = _cnn()
        _compile(model, tf1_accum.KerasAccumulationOptimizer(legacy.Adam(0.02), N))
        logged = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: None)
        warned = _warned_when(model, lambda: _fit(model, x, y, 2, callbacks=[logged]))
    (epoch_end, at_epoch_end), (end, after) = warned
    assert at_epoch_end == (1, 1) and after == (2, 2)
    assert epoch_end == (
        "tf1_accum: fit's epoch 1 ended with 1 micro-batches in an accumulation window, and no "
        "callback runs the optimizer's flush_op: an epoch's last micro-batches go into the "
        "next epoch's first window (fit with batches steps times larger applies a short last "
        "batch). Run flush_op "
        f"at each epoch's end: callbacks=[{KERAS_NAME}.callbacks.LambdaCallback(on_epoch_end="
        "lambda epoch, logs: tf.compat.v1.keras.backend.get_session().run(opt.flush_op))]."
    )
    assert end.startswith("tf1_accum: fit ended 2 of its 2 epochs")


def test_fit_whose_epochs_end_on_an_update_or_that_flushes_is_not_warned_at_its_start(float64):
    x, y = _data(8 * B, seed=2)
    with tf.Graph().as_default(), v1.Session():
        model = _cnn()
        optimizer = tf1_accum.KerasAccumulationOptimizer(legacy.Adam(0.02), N)
        _compile(model, optimizer)
        assert _warned_when(model, lambda: _fit(model, x, y, 2)) == []
        flush = keras.callbacks.LambdaCallback(
            on_epoch_end=lambda epoch, logs: v1.keras.backend.get_session().run(optimizer.flush_op)
        )
        # 6 micro-batches an epoch, flushed at each end: nothing to warn of.
        assert (
            _warned_when(model, lambda: _fit(model, x[: 6 * B], y[: 6 * B], 2, callbacks=[flush]))
            == []
        )
        assert _state(model) == (8, 0)


def test_learning_rate_is_the_wrapped_optimizers():
    with tf.Graph().as_default(), v1.Session():
        model = _cnn()
        optimizer = tf1_accum.KerasAccumulationOptimizer(legacy.SGD(0.05), N)
        _compile(model, optimizer)
        # What LearningRateScheduler and ReduceLROnPlateau do, through the wrapper.
        keras.backend.set_value(model.optimizer.lr, 0.125)
        assert keras.backend.get_value(optimizer.optimizer.learning_rate) == 0.125
        assert optimizer.iterations is optimizer.optimizer.iterations


def test_set_weights_refuses_a_list_of_another_length():
    with tf.Graph().as_default(), v1.Session():
        model = _trained_model()
        values = model.optimizer.get_weights()
        before = [np.copy(v) for v in values]
        with pytest.raises(
            ValueError,
            match=rf"has {len(values)} weights \(13 of Adam, 8 of the window\), but "
            rf"{len(values) - 1} values were given",
        ):
            model.optimizer.set_weights(values[:-1])
        for got, want in zip(model.optimizer.get_weights(), before):
            np.testing.assert_array_equal(got, want)
        # As load_model sets them: the wrapped optimizer's weights made, the window not yet.
        fresh = tf1_accum.KerasAccumulationOptimizer(legacy.Adam(0.1), N)
        if not TF1:  # 1.15's load_model builds the train function, the window with it
            fresh._create_all_weights(model.trainable_variables)
            with pytest.raises(ValueError, match=r"1 values were given, fewer than the 13 weights"):
                fresh.set_weights(values[:1])
        # One value too many: found when fit builds the window, before any batch.
        fresh.set_weights(values + [np.zeros(3)])
        model.compile(loss="categorical_crossentropy", optimizer=fresh)
        with pytest.raises(ValueError, match=r"has 21 weights .* but 22 values were given"):
            _fit(model, *_data(PER_EPOCH * B, seed=0), 1)


def test_one_train_op_per_graph():
    with tf.Graph().as_default(), v1.Session():
        optimizer = tf1_accum.KerasAccumulationOptimizer(legacy.Adam(0.02), N)
        _trained_model(optimizer)
        with pytest.raises(ValueError, match="builds one train op per graph"):
            _trained_model(optimizer)


def test_window_properties_exist_once_fit_built_the_train_op():
    optimizer = tf1_accum.KerasAccumulationOptimizer(legacy.Adam(0.02), N)
    with tf.Graph().as_default():
        with pytest.raises(
            ValueError, match=r"flush_op exists once .* \(model.fit\(\) builds it\)"
        ):
            _ = optimizer.flush_op
        with pytest.raises(ValueError, match=r"window exists once the train op is built"):
            _ = optimizer.window


def test_eager_execution_is_refused():
    from tensorflow.python.eager import context

    optimizer = tf1_accum.KerasAccumulationOptimizer(legacy.Adam(0.02), N)
    with context.eager_mode():
        var = tf.Variable(1.0)
        with pytest.raises(RuntimeError, match="builds TF1 graph-mode ops"):
            optimizer.apply_gradients([(tf.constant(1.0), var)])
        assert float(var.numpy()) == 1.0


# What the messages call Keras 2's optimizers: those tf1_accum takes, and the others.
OPTIMIZER = "optimizer" if TF1 else "legacy optimizer"
OTHERS = "those of tf.keras.optimizers" if TF1 else "the legacy ones"


def _loss_scale_optimizer(optimizer):
    if TF1:
        return keras.mixed_precision.experimental.LossScaleOptimizer(optimizer, "dynamic")
    return keras.mixed_precision.LossScaleOptimizer(optimizer)


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: v1.train.AdamOptimizer(0.1),
            r"got .*AdamOptimizer.*\. A tf.compat.v1.train optimizer goes in "
            r"tf1_accum.AccumulationOptimizer instead",
        ),
        (
            lambda: not_legacy.Adam(0.1),
            rf"Keras optimizers other than {OTHERS} do not build TF1 graph-mode ops.*"
            rf"Use {LEGACY_NAME}.Adam",
        ),
        (
            lambda: _loss_scale_optimizer(legacy.Adam(0.1)),
            rf"tf1_accum does not support a Keras LossScaleOptimizer \({KERAS_NAME}.mixed_"
            r"precision\)",
        ),
        (
            lambda: tf1_accum.KerasAccumulationOptimizer(legacy.Adam(0.1), 2),
            r"cannot wrap a KerasAccumulationOptimizer \(steps=2\)",
        ),
        (lambda: "adam", rf"must be a {KERAS_NAME} {OPTIMIZER}, got 'adam' \(a builtins.str\)"),
        (
            lambda: legacy.Adam,
            r"optimizer must be an optimizer instance, got the class .*\.Adam itself: pass "
            r"Adam\(learning_rate=\.\.\.\)\.",
        ),
    ],
    ids=["v1", "new_tf_keras", "loss_scale", "nested", "string", "class"],
)
def test_what_is_not_a_tf_keras_legacy_optimizer_is_refused(make, message):
    with pytest.raises(TypeError, match=message):
        tf1_accum.KerasAccumulationOptimizer(make(), N)


def test_keras_3_optimizer_is_refused_with_what_to_use():
    if TF1:
        pytest.skip("TensorFlow 1.15 (Python 3.7) has no Keras 3")
    keras_3 = pytest.importorskip("keras")
    if not keras_3.__version__.startswith("3."):
        pytest.skip(f"keras {keras_3.__version__} is not Keras 3")
    with pytest.raises(
        TypeError, match=r"Keras 3 optimizers do not build TF1 graph-mode ops.*legacy.Adam"
    ):
        tf1_accum.KerasAccumulationOptimizer(keras_3.optimizers.Adam(0.1), N)


def test_keras_2_optimizer_of_the_keras_package_is_refused():
    # TensorFlow 2.15's tf.keras: Keras 2 in the keras package, not tf_keras.
    if TF1:
        pytest.skip("TensorFlow 1.15's Keras 2 is tf.keras: no other package has its optimizers")
    keras_2 = pytest.importorskip("keras")
    if not keras_2.__version__.startswith("2."):
        pytest.skip(f"keras {keras_2.__version__} is not Keras 2")
    with pytest.raises(
        TypeError,
        match=r"a Keras 2 optimizer of another package\. Use tf_keras.optimizers.legacy.Adam",
    ):
        tf1_accum.KerasAccumulationOptimizer(keras_2.optimizers.legacy.Adam(0.1), N)


# Spawns its own process, which does not depend on the graph mode.
@pytest.mark.graph_mode_independent
def test_the_library_works_without_tf_keras_until_this_class_is_used():
    # sys.modules["tf_keras"] = None makes "import tf_keras" fail, as if it
    # were not installed.
    root = pathlib.Path(__file__).resolve().parent.parent
    script = (
        "import sys\n"
        "sys.modules['tf_keras'] = None\n"
        "import tensorflow as tf\n"
        "import tf1_accum\n"
        "tf.compat.v1.disable_v2_behavior()\n"
        "opt = tf1_accum.AccumulationOptimizer(\n"
        "    tf.compat.v1.train.GradientDescentOptimizer(0.1), 2)\n"
        "print('steps', opt.steps)\n"
        "try:\n"
        "    print(tf1_accum.KerasAccumulationOptimizer.__name__)\n"
        "except ImportError as error:\n"
        "    print('ImportError:', error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=root,
        env=dict(os.environ, PYTHONPATH=str(root), TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    # TensorFlow 1.15 needs no tf_keras: its tf.keras is Keras 2.
    last = (
        "KerasAccumulationOptimizer"
        if TF1
        else (
            "ImportError: tf1_accum.KerasAccumulationOptimizer needs the tf_keras package: "
            "pip install tf_keras."
        )
    )
    assert result.stdout.splitlines() == ["steps 2", last]


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"steps": 0}, ValueError, "steps must be at least 1"),
        ({"steps": 2.0}, TypeError, "steps must be an int"),
        ({"steps": 2, "average": "yes"}, TypeError, "average must be True or False"),
        ({"steps": 2, "clip_norm": -1.0}, ValueError, "clip_norm"),
        ({"steps": 2, "clipnorm": 1.0}, TypeError, r"takes no Keras option, got \['clipnorm'\]"),
    ],
)
def test_bad_options_are_refused(kwargs, error, message):
    with pytest.raises(error, match=message):
        tf1_accum.KerasAccumulationOptimizer(legacy.Adam(0.1), **kwargs)


@pytest.mark.parametrize("way_in", ["build_accumulation", "AccumulationOptimizer"])
def test_other_ways_in_refuse_it(way_in):
    with tf.Graph().as_default():
        with v1.variable_scope(v1.get_variable_scope(), use_resource=True):
            model = Model(tf.float32, False)
        wrapper = tf1_accum.KerasAccumulationOptimizer(legacy.Adam(0.1), 2)
        with pytest.raises(
            TypeError,
            match=rf"{way_in} accumulates by itself, but its optimizer is a "
            r"KerasAccumulationOptimizer \(steps=2\) wrapping Adam.*use the "
            "KerasAccumulationOptimizer alone",
        ):
            if way_in == "build_accumulation":
                tf1_accum.build_accumulation(model.loss, wrapper)
            else:
                tf1_accum.AccumulationOptimizer(wrapper, 2)
        assert v1.get_collection(tf1_accum.STATE_COLLECTION) == []


def test_keras_save_example(capsys):
    import importlib.util

    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "real_programs"
    spec = importlib.util.spec_from_file_location("keras_save", path / "keras_save.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    # 6 micro-batches of 8 an epoch, windows of 4: the save leaves 2 of a window open.
    result = example.main([])
    assert result["micro_batches_open_at_save"] == 2
    assert result["resumed_vs_uninterrupted"] == 0.0
    assert result["resumed_vs_large_batch"] <= 1e-10
    assert result["updates"] == result["large_batch_updates"] == 3
    assert "resumed vs uninterrupted 0," in capsys.readouterr().out
    assert keras.backend.floatx() == "float32"  # as the example found it


VOCABULARY, LENGTH = 7, 5


def _sequences(examples, seed):
    """Token ids padded with 0, and one-hot targets whose padding rows are all 0."""
    rng = np.random.RandomState(seed)
    lengths = rng.randint(1, LENGTH + 1, size=examples)
    ids = np.where(
        np.arange(LENGTH) >= lengths[:, None],
        0,
        rng.randint(1, VOCABULARY, size=(examples, LENGTH)),
    )
    targets = np.eye(VOCABULARY)[(3 * ids + 1) % VOCABULARY] * (ids > 0)[..., None]
    return ids.astype(np.float64), targets


def _token_mean(y_true, y_pred):
    """Cross entropy averaged over the real tokens (a padding row of y_true is all 0)."""
    xent = keras.losses.categorical_crossentropy(y_true, y_pred, from_logits=True)
    return tf.reduce_sum(xent) / tf.reduce_sum(y_true, name="tokens")


def _fit_tokens(optimizer, ids, targets, batch_size):
    """A model of tokens fitted with ``optimizer`` (a callable of the model); its weights."""
    with tf.Graph().as_default(), v1.Session():
        model = keras.Sequential(
            [
                keras.layers.Embedding(
                    VOCABULARY,
                    3,
                    input_length=LENGTH,
                    embeddings_initializer=keras.initializers.RandomNormal(seed=1),
                ),
                keras.layers.Dense(
                    VOCABULARY, kernel_initializer=keras.initializers.glorot_uniform(2)
                ),
            ]
        )
        model.compile(loss=_token_mean, optimizer=optimizer(model))
        model.fit(ids, targets, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
        return model.get_weights()


def _relative(weights, expected):
    return max(np.abs(w - e).max() / np.abs(e).max() for w, e in zip(weights, expected))


def test_a_token_mean_loss_is_exact_with_weight_and_warned_of_without(float64):
    ids, targets = _sequences(3 * N * B, seed=4)
    expected = _fit_tokens(lambda model: legacy.SGD(0.5), ids, targets, N * B)

    def weighted(model):
        tokens = lambda: tf.math.count_nonzero(model.inputs[0], dtype=tf.float64)  # noqa: E731
        return tf1_accum.KerasAccumulationOptimizer(legacy.SGD(0.5), N, weight=tokens)

    assert _relative(_fit_tokens(weighted, ids, targets, B), expected) <= 1e-10
    unweighted = lambda model: tf1_accum.KerasAccumulationOptimizer(legacy.SGD(0.5), N)  # noqa: E731
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        off = _relative(_fit_tokens(unweighted, ids, targets, B), expected)
    assert off > 1e-3
    [text] = [str(w.message) for w in caught if "(TFA014" in str(w.message)]
    assert text.startswith("tf1_accum: the loss divides by ")
    assert "the Sum of fed data, and no weight= was given" in text
    assert "pass KerasAccumulationOptimizer(optimizer, steps, weight=lambda: <the tensor " in text


def test_a_weight_that_is_no_tensor_nor_callable_is_refused():
    with pytest.raises(TypeError, match="weight must be a scalar tensor or a callable"):
        tf1_accum.KerasAccumulationOptimizer(legacy.SGD(0.5), N, weight=lambda element: 1.0)
    with pytest.raises(TypeError, match="weight must be a"):
        tf1_accum.KerasAccumulationOptimizer(legacy.SGD(0.5), N, weight=3)


def test_a_removed_property_names_the_window_field_it_became():
    with tf.Graph().as_default(), v1.Session():
        optimizer = tf1_accum.KerasAccumulationOptimizer(legacy.Adam(0.02), N)
        model = _trained_model(optimizer)
        with pytest.raises(
            AttributeError,
            match=r"KerasAccumulationOptimizer\.micro_step was removed: read "
            r"opt\.window\.counter instead.*kept for one release only",
        ):
            optimizer.micro_step  # noqa: B018
        assert optimizer.window.counter is not None
        with pytest.raises(AttributeError, match="object has no attribute 'no_such_name'"):
            optimizer.no_such_name  # noqa: B018
        del model


def test_a_learning_rate_fed_differently_within_a_window_is_refused(float64):
    """A loop running apply_gradients' train op, the rate fed: one value per window."""
    rng = np.random.RandomState(3)
    x_data, y_data = rng.randn(3 * B, 5), rng.randn(3 * B, 2)

    def build(accumulate):
        x = v1.placeholder(tf.float64, [None, 5])
        y = v1.placeholder(tf.float64, [None, 2])
        rate = v1.placeholder(tf.float64, [], name="rate")
        model = keras.Sequential(
            [
                keras.layers.Dense(
                    2, input_shape=(5,), kernel_initializer=keras.initializers.glorot_uniform(4)
                )
            ]
        )
        loss = tf.reduce_mean(tf.square(model(x) - y))
        optimizer = legacy.SGD(rate)
        if accumulate:
            optimizer = tf1_accum.KerasAccumulationOptimizer(optimizer, 3)
        variables = model.trainable_weights
        train_op = optimizer.apply_gradients(zip(tf.gradients(loss, variables), variables))
        return x, y, rate, model, train_op

    with tf.Graph().as_default(), v1.Session() as sess:
        x, y, rate, model, train_op = build(accumulate=True)
        sess.run(v1.global_variables_initializer())
        rows = [slice(i * B, (i + 1) * B) for i in range(3)]
        for r in rows[:2]:
            sess.run(train_op, {x: x_data[r], y: y_data[r], rate: 0.05})
        before = model.get_weights()
        with pytest.raises(
            tf.errors.InvalidArgumentError,
            match=r"this micro-batch feeds rate:0 another value than micro-batch 0 of the window "
            r"fed it: the update reads it(.|\n)*\[0.5\] \[0.05\] \[2\]",
        ):
            sess.run(train_op, {x: x_data[rows[2]], y: y_data[rows[2]], rate: 0.5})
        for got, want in zip(model.get_weights(), before):
            np.testing.assert_array_equal(got, want)
        sess.run(train_op, {x: x_data[rows[2]], y: y_data[rows[2]], rate: 0.05})
        got = model.get_weights()
    with tf.Graph().as_default(), v1.Session() as sess:
        x, y, rate, model, train_op = build(accumulate=False)
        sess.run(v1.global_variables_initializer())
        sess.run(train_op, {x: x_data, y: y_data, rate: 0.05})
        expected = model.get_weights()
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-10)
