"""The chain of wrapped optimizers, and what the window reads from it."""

import pytest
import tensorflow as tf

from tf1_accum._wrapping import counts_its_own_steps
from tf1_accum._wrapping import scales_loss
from tf1_accum._wrapping import wrapping_chain

v1 = tf.compat.v1


def _loss_scaled(optimizer, loss_scale):
    return v1.train.experimental.MixedPrecisionLossScaleOptimizer(optimizer, loss_scale=loss_scale)


def _sync(optimizer):
    return v1.train.SyncReplicasOptimizer(optimizer, replicas_to_aggregate=2)


def test_the_chain_follows_both_attributes_outermost_first():
    sgd = v1.train.GradientDescentOptimizer(0.1)
    scaled = _loss_scaled(sgd, "dynamic")  # wraps in _optimizer
    outer = _sync(scaled)  # wraps in _opt
    assert [id(o) for o in wrapping_chain(outer)] == [id(outer), id(scaled), id(sgd)]
    assert [id(o) for o in wrapping_chain(sgd)] == [id(sgd)]


def test_a_wrapper_that_refers_to_itself_ends_the_chain():
    class Looping(v1.train.GradientDescentOptimizer):
        pass

    looping = Looping(0.1)
    looping._optimizer = looping
    assert [id(o) for o in wrapping_chain(looping)] == [id(looping)]
    assert not scales_loss(looping) and not counts_its_own_steps(looping)


@pytest.mark.parametrize(
    "make, scales, counts",
    [
        (lambda sgd: sgd, False, False),
        (lambda sgd: _loss_scaled(sgd, "dynamic"), True, True),
        (lambda sgd: _loss_scaled(sgd, 128.0), False, True),
        (lambda sgd: _sync(sgd), False, True),
        # Found inside another wrapper too.
        (lambda sgd: _sync(_loss_scaled(sgd, "dynamic")), True, True),
        (lambda sgd: _sync(_loss_scaled(sgd, 128.0)), False, True),
    ],
    ids=["plain", "dynamic", "fixed", "sync", "sync-over-dynamic", "sync-over-fixed"],
)
def test_what_the_chain_says(make, scales, counts):
    optimizer = make(v1.train.GradientDescentOptimizer(0.1))
    assert scales_loss(optimizer) is scales
    assert counts_its_own_steps(optimizer) is counts
