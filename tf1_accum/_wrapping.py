"""Optimizers that wrap another: the chain of them, and what the window asks of it.

TensorFlow's wrappers keep the optimizer they wrap privately: `_compat.wrapped_optimizer`
reads it.
"""

from __future__ import annotations

import typing

from tf1_accum._compat import loss_scale, tf, wrapped_optimizer


def wrapping_chain(optimizer: object) -> typing.Iterator[object]:
    """Yields ``optimizer``, then the optimizer it wraps, and so on inwards (each once)."""
    seen: set[int] = set()
    while optimizer is not None and id(optimizer) not in seen:
        seen.add(id(optimizer))
        yield optimizer
        optimizer = wrapped_optimizer(optimizer)


def _loss_scale_optimizer(optimizer: object) -> object | None:
    """The outermost loss-scale optimizer in ``optimizer``'s chain, or None."""
    return next((o for o in wrapping_chain(optimizer) if "LossScale" in type(o).__name__), None)


def scales_loss(optimizer: object) -> bool:
    """Whether ``optimizer`` is (or wraps) a dynamic loss-scale optimizer (one that checks)."""
    scaling = _loss_scale_optimizer(optimizer)
    return scaling is not None and "Dynamic" in type(loss_scale(scaling)).__name__


def counts_its_own_steps(optimizer: object) -> bool:
    """Whether ``optimizer`` (or one it wraps: loss-scale, sync) advances ``global_step`` itself."""
    return _loss_scale_optimizer(optimizer) is not None or any(
        isinstance(o, tf.compat.v1.train.SyncReplicasOptimizer) for o in wrapping_chain(optimizer)
    )
