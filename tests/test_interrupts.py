"""One rule for interrupts, and fetches run_accumulation cannot evaluate.

A ``KeyboardInterrupt`` during `run_accumulation` (raised by a feed-dict
generator, or a real Ctrl-C arriving while ``session.run`` runs a micro-batch)
discards the window exactly as any other exception does: no update, the
accumulators and the counter reset, the interrupt raised again naming the
micro-batch. The next window starts clean. Window ops and the apply's
statistics among ``fetches`` are refused before anything runs.
"""

import os
import signal

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import RTOL
from _helpers import Model
from _helpers import assert_same_values
from _helpers import make_batches
from _helpers import plain_training
from _helpers import values_by_name

v1 = tf.compat.v1

DTYPE = tf.float64
N = 3


class _CtrlCSession:
    """A session that gets a real SIGINT right after its run number ``at`` (from 0)."""

    def __init__(self, sess, at):
        self.sess = sess
        self.at = at
        self.calls = 0

    def run(self, fetches, feed_dict=None, **kwargs):
        result = self.sess.run(fetches, feed_dict=feed_dict, **kwargs)
        self.calls += 1
        if self.calls - 1 == self.at:
            os.kill(os.getpid(), signal.SIGINT)  # Python raises KeyboardInterrupt here
        return result


def _interrupted_then_clean(fused, interrupt):
    """Interrupts a window at micro-batch 2, then runs a full window; returns what it saw."""
    batches = make_batches(DTYPE, False, 2 * N, 4)
    with tf.Graph().as_default():
        model = Model(DTYPE, False)
        step = v1.train.get_or_create_global_step()
        acc = tf1_accum.build_accumulation(
            model.loss, v1.train.MomentumOptimizer(0.1, 0.9), global_step=step, fused=fused
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            initial = values_by_name(sess, tf1_accum.plain_variables())

            def feeds():
                for index, batch in enumerate(batches[:N]):
                    if interrupt == "generator" and index == 2:
                        raise KeyboardInterrupt
                    yield model.feed(batch)

            runner = _CtrlCSession(sess, at=1) if interrupt == "ctrl-c" else sess
            with pytest.raises(KeyboardInterrupt) as raised:
                tf1_accum.run_accumulation(runner, acc, feeds())
            after_interrupt = values_by_name(sess, tf1_accum.plain_variables())
            counter = sess.run(acc.counter)
            tf1_accum.run_accumulation(sess, acc, [model.feed(b) for b in batches[N:]])
            trained = values_by_name(sess, tf1_accum.plain_variables())
    return str(raised.value), initial, after_interrupt, counter, trained, batches[N:]


@pytest.mark.parametrize("interrupt", ["generator", "ctrl-c"])
@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
def test_an_interrupt_discards_the_window_like_any_error_and_the_next_starts_clean(
    fused, interrupt
):
    message, initial, after, counter, trained, window = _interrupted_then_clean(fused, interrupt)
    failing = 2 if interrupt == "generator" else 1
    assert message.startswith(
        f"micro-batch {failing} of the window failed so the window was discarded "
        "(accumulators and counter reset, no update applied)"
    )
    assert counter == 0
    for name, value in initial.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)
    # The next window holds its own N micro-batches only: one plain step on them.
    expected = plain_training("momentum", DTYPE, False, [window])[0]
    assert_same_values(trained, expected, RTOL[DTYPE], "the window after the interrupt")


def test_an_interrupt_after_the_apply_says_the_window_was_applied():
    batches = make_batches(DTYPE, False, N, 4)
    with tf.Graph().as_default():
        model = Model(DTYPE, False)
        step = v1.train.get_or_create_global_step()
        acc = tf1_accum.build_accumulation(
            model.loss, v1.train.GradientDescentOptimizer(0.1), global_step=step
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            runner = _CtrlCSession(sess, at=N)  # the apply's run
            with pytest.raises(
                KeyboardInterrupt,
                match="the apply of the window failed after the update: the window was applied",
            ):
                tf1_accum.run_accumulation(runner, acc, [model.feed(b) for b in batches])
            assert sess.run([step, acc.counter]) == [1, 0]


FIELDS = ["zero_op", "accum_op", "apply_op", "accum_apply_op", "statistics", "global_norm"]


@pytest.mark.parametrize("field", FIELDS + ["accum_apply_statistics"])
@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
def test_window_ops_and_the_applys_statistics_in_fetches_are_refused_before_anything_runs(
    field, fused
):
    """zero_op in fetches reset the window mid-way; the apply's statistics raced the fused run."""
    batches = make_batches(DTYPE, False, N, 4)
    with tf.Graph().as_default():
        model = Model(DTYPE, False)
        acc = tf1_accum.build_accumulation(
            model.loss,
            v1.train.GradientDescentOptimizer(0.1),
            fused=True,
            statistics=True,
            micro_batch_size=4,
        )
        fetched = getattr(acc, field)
        structure = {"loss": model.loss, "more": [fetched]}
        what = "the accumulation's" if field.endswith("_op") else "the apply's"
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for fetches in (structure, getattr(fetched, "name", None) or fetched[0].name):
                with pytest.raises(
                    ValueError,
                    match=rf"fetches holds {what} {field} \(.*\): fetch losses and metrics only; .*"
                    r"fetch statistics with apply_op, or accum_apply_statistics with "
                    r"accum_apply_op\. Nothing was run\.",
                ):
                    tf1_accum.run_accumulation(
                        sess, acc, [model.feed(b) for b in batches], fetches, fused=fused
                    )
            assert sess.run(acc.counter) == 0
            losses = tf1_accum.run_accumulation(
                sess, acc, [model.feed(b) for b in batches], model.loss, fused=fused
            )
            assert len(losses) == N and all(loss > 0 for loss in losses)
