"""The mistakes a migrated program makes around the optimizer, caught where tf1_accum sees them.

Each test builds the program in the shape it has in the wild: BERT's
``create_optimizer`` (its schedule driven by ``global_step``, its
``tf.clip_by_global_norm`` and its hand-written ``global_step`` increment,
examples/real_programs/bert_style_optimizer.py), with the one-line migration
a new user makes first.
"""

import importlib.util
import os
import pathlib
import subprocess
import sys
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import Model
from _helpers import make_batches

v1 = tf.compat.v1
ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "real_programs"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"real_programs_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bert = _load("bert_style_optimizer")
STEPS = 4
MICRO_BATCH = 8


def _bert_graph(train_op_of):
    """BERT's model and feeds; ``train_op_of(loss, global_step, optimizer)`` makes the train op."""
    x = v1.placeholder(tf.float64, [None, bert.FEATURES])
    y = v1.placeholder(tf.float64, [None, 1])
    loss = bert.build_model(x, y)
    global_step = v1.train.get_or_create_global_step()
    optimizer = bert.create_optimizer(global_step, 0.01, 6, 2)
    train_op, wrapper = train_op_of(loss, global_step, optimizer)
    x_data, y_data = bert.make_data(STEPS * MICRO_BATCH * 3, 1)
    feeds = [
        {x: x_data[i : i + MICRO_BATCH], y: y_data[i : i + MICRO_BATCH]}
        for i in range(0, len(x_data), MICRO_BATCH)
    ]
    return train_op, wrapper, global_step, feeds


def _wrapped_with_own_increment(loss, global_step, optimizer):
    """The first migration of BERT's loop: the wrapper line added, nothing else changed."""
    wrapper = tf1_accum.AccumulationOptimizer(optimizer, STEPS, clip_norm=1.0)
    tvars = v1.trainable_variables()
    grads = tf.gradients(loss, tvars)
    train_op = wrapper.apply_gradients(zip(grads, tvars), global_step=global_step)
    # BERT's own increment, grouped with the train op, unordered.
    new_global_step = global_step + 1
    return tf.group(train_op, [global_step.assign(new_global_step)]), wrapper


def test_a_hand_written_increment_beside_the_wrappers_is_stopped_in_the_first_window():
    with tf.Graph().as_default():
        train_op, wrapper, global_step, feeds = _bert_graph(_wrapped_with_own_increment)
        trained = v1.trainable_variables()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            before = sess.run(trained)
            ran = 0
            with pytest.raises(tf.errors.InvalidArgumentError) as raised:
                for feed in feeds:
                    sess.run(train_op, feed)
                    ran += 1
            message = str(raised.value)
            # The increment of run 1 runs before or after the record, unordered:
            # by run 3 of the window the step has moved for sure.
            assert 1 <= ran <= 2
            assert sess.run(wrapper.window.counter) == ran
            for got, expected in zip(sess.run(trained), before):
                np.testing.assert_array_equal(got, expected)
    assert "global_step moved in the middle of an accumulation window" in message
    assert "global_step.assign(global_step + 1)" in message
    assert "opt.window.applied" in message
    assert "This micro-batch was not accumulated" in message


@pytest.mark.parametrize("own_increment", [True, False])
def test_the_migrated_bert_loop_runs_unstopped_with_global_step_counting_updates(own_increment):
    # Either fix of the guide: the increment hung on applied (the wrapper given
    # no global_step, so nothing is checked), or the wrapper's increment alone.
    def train_op_of(loss, global_step, optimizer):
        del optimizer
        return bert.accumulating_train_op(loss, 6, STEPS, own_increment)

    with tf.Graph().as_default():
        train_op, wrapper, global_step, feeds = _bert_graph(train_op_of)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            steps_seen = []
            for feed in feeds:
                sess.run(train_op, feed)
                steps_seen.append(int(sess.run(global_step)))
    assert steps_seen == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3]


def test_a_step_moved_by_hand_between_windows_is_not_a_mistake():
    # An assign to the step while the window is empty (a restore, a reset)
    # is recorded as the next window's start.
    batches = make_batches(tf.float64, False, 6, 3)
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        step = v1.train.get_or_create_global_step()
        opt = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), 3)
        train_op = opt.minimize(model.loss, global_step=step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for batch in batches[:3]:
                sess.run(train_op, model.feed(batch))
            step.load(40, sess)
            for batch in batches[3:]:
                sess.run(train_op, model.feed(batch))
            assert sess.run(step) == 41
            step.load(7, sess)
            sess.run(train_op, model.feed(batches[0]))
            with pytest.raises(tf.errors.InvalidArgumentError, match="global_step moved"):
                step.load(8, sess)
                sess.run(train_op, model.feed(batches[1]))
            assert sess.run(opt.window.counter) == 1


def _clipped_per_micro_batch(clip_norm):
    def train_op_of(loss, global_step, optimizer):
        wrapper = tf1_accum.AccumulationOptimizer(optimizer, STEPS, clip_norm=clip_norm)
        tvars = v1.trainable_variables()
        grads = tf.gradients(loss, tvars)
        grads, _ = tf.clip_by_global_norm(grads, clip_norm=1.0)  # BERT's line, kept
        return wrapper.apply_gradients(zip(grads, tvars), global_step=global_step), wrapper

    return train_op_of


def test_clipping_in_front_of_the_wrapper_warns_with_the_option_to_use():
    with tf.Graph().as_default():
        with pytest.warns(UserWarning) as caught:
            _bert_graph(_clipped_per_micro_batch(None))
    messages = [str(w.message) for w in caught if "clip" in str(w.message)]
    assert len(messages) == 1
    assert "come from tf.clip_by_global_norm, so each micro-batch is clipped" in messages[0]
    assert "AccumulationOptimizer(..., clip_norm=c)" in messages[0]
    assert "dense/kernel" in messages[0]
    assert caught[0].filename == __file__


def test_clipping_in_front_of_a_wrapper_that_clips_says_to_remove_it():
    with tf.Graph().as_default():
        with pytest.warns(UserWarning, match="clip_norm=1.0 already clips the window's mean"):
            _bert_graph(_clipped_per_micro_batch(1.0))


def test_the_migrated_clipping_gives_no_warning():
    def train_op_of(loss, global_step, optimizer):
        del optimizer
        return bert.accumulating_train_op(loss, 6, STEPS, own_increment=False)

    # tf1_accum warns with UserWarning; TensorFlow 1.15's own DeprecationWarning
    # (collections ABCs), given once per process, is not this test's business.
    with tf.Graph().as_default(), warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        _bert_graph(train_op_of)


def test_clipping_by_norm_and_by_value_warn_too():
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        opt = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), 2)
        pairs = opt.compute_gradients(model.loss)
        clipped = [(tf.clip_by_norm(g, 1.0), v) for g, v in pairs[:1]]
        clipped += [(tf.clip_by_value(g, -1.0, 1.0), v) for g, v in pairs[1:]]
        with pytest.warns(UserWarning, match=r"come from tf\.clip_by_norm.*inside the wrapped"):
            opt.apply_gradients(clipped)


def _adam_in_a_wrapper():
    return tf1_accum.AccumulationOptimizer(v1.train.AdamOptimizer(0.1), steps=4)


@pytest.mark.parametrize(
    "way_in",
    ["build_accumulation", "build_dataset_accumulation", "AccumulationOptimizer"],
)
def test_an_accumulation_optimizer_given_to_a_way_that_accumulates_is_refused(way_in):
    with tf.Graph().as_default() as graph:
        model = Model(tf.float64, False)
        wrapper = _adam_in_a_wrapper()
        dataset = tf.data.Dataset.from_tensor_slices(np.zeros([4, 2]))
        ops_before = len(graph.get_operations())
        variables_before = list(v1.global_variables())
        with pytest.raises(TypeError) as raised:
            if way_in == "build_accumulation":
                tf1_accum.build_accumulation(model.loss, wrapper)
            elif way_in == "build_dataset_accumulation":
                tf1_accum.build_dataset_accumulation(
                    lambda batch: tf.reduce_mean(batch), wrapper, dataset, steps=2
                )
            else:
                tf1_accum.AccumulationOptimizer(wrapper, steps=2)
        assert len(graph.get_operations()) == ops_before
        assert v1.global_variables() == variables_before
    message = str(raised.value)
    assert f"{way_in} accumulates by itself, but its optimizer is an AccumulationOptimizer" in (
        message
    )
    assert "(steps=4) wrapping AdamOptimizer" in message
    assert "the weights would not change while global_step advances" in message
    assert "opt.optimizer, the AdamOptimizer" in message


@pytest.mark.graph_mode_independent
def test_importing_the_library_prints_nothing():
    # TensorFlow's own start-up messages come before the marker; nothing of
    # tf1_accum's may follow it (a deprecation warning there reads like the
    # user's bug).
    code = (
        "import sys\n"
        "import tensorflow as tf\n"
        "print('<imported>', file=sys.stderr, flush=True)\n"
        "import tf1_accum\n"
        "for name in tf1_accum.__all__:\n"
        "    getattr(tf1_accum, name)\n"
        "import tf1_accum.check\n"
        "from tf1_accum import _graph_check, _hooks, _keras, _migration, _validate\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True
    )
    assert done.stdout == ""
    assert done.stderr.split("<imported>\n", 1)[1] == ""


def test_run_accumulation_says_to_initialize_after_building():
    batches = make_batches(tf.float64, False, 2, 3)
    with tf.Graph().as_default():
        model = Model(tf.float64, False)
        init = v1.global_variables_initializer()  # made before the accumulation: too early
        acc = tf1_accum.build_accumulation(model.loss, v1.train.GradientDescentOptimizer(0.1))
        with v1.Session() as sess:
            sess.run(init)
            with pytest.raises(
                (tf.errors.NotFoundError, tf.errors.FailedPreconditionError)
            ) as raised:
                tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in batches])
            sess.run(v1.global_variables_initializer())
            before = sess.run(v1.trainable_variables())
            tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in batches])
            after = sess.run(v1.trainable_variables())
    message = raised.value.message
    assert message.startswith("tf1_accum: the accumulation's variables are not initialized (")
    assert "global_variables_initializer() (and run it) after the accumulation is built" in message
    assert "micro-batch 0 of the window failed" in message
    assert any(np.any(a != b) for a, b in zip(after, before))
