"""Synchronous replicas through the wrapper: one window per worker per update.

`prepare` builds the synchronous optimizer's accumulators, queue and chief
update outside the wrapper's conditional apply; `SyncPush`, inside it, pushes
to them and waits (:ref:`parameter-servers`).
"""

from __future__ import annotations

import warnings

from tf1_accum._compat import sync_replicas_parts, tf

from tf1_accum import _validate
from tf1_accum._options import Pairs


class SyncPush(tf.compat.v1.train.Optimizer):
    """Pushes a window to the accumulators `prepare` built, then waits for the update.

    It wraps the synchronous optimizer (``_opt``): ``global_step`` moves on the chief.
    """

    def __init__(self, sync: tf.compat.v1.train.SyncReplicasOptimizer) -> None:
        super().__init__(use_locking=False, name=sync.get_name())
        self._opt = sync

    def apply_gradients(
        self, grads_and_vars: Pairs, global_step: tf.Variable | None = None, name: str | None = None
    ) -> tf.Operation:
        local_step, accumulators, sync_step, queue, _, _ = sync_replicas_parts(self._opt)
        pushes = []
        with tf.compat.v1.name_scope(name, self.get_name()):
            for (grad, _), (accumulator, device) in zip(grads_and_vars, accumulators):
                sparse = isinstance(grad, tf.IndexedSlices)
                push = accumulator.apply_indexed_slices_grad if sparse else accumulator.apply_grad
                with tf.device(device):
                    pushes.append(push(grad, local_step=local_step))
            with tf.device(sync_step.device), tf.control_dependencies(pushes):
                token = queue.dequeue()
            return tf.group(local_step.assign(token, read_value=False))


def prepare(
    sync: tf.compat.v1.train.SyncReplicasOptimizer, pairs: Pairs, global_step: tf.Variable | None
) -> tuple[SyncPush, list[tf.Operation]]:
    """Builds ``sync``'s accumulators, queue and chief update; returns a `SyncPush` and those ops.

    Raises:
        ValueError: If ``global_step`` is None (the tokens are its values).
    """
    if global_step is None:
        raise ValueError(
            "AccumulationOptimizer(SyncReplicasOptimizer(...)) needs global_step (its tokens), "
            "got None: minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())."
        )
    graph = global_step.graph
    before = len(graph.get_operations())
    sync.apply_gradients(pairs, global_step=global_step)
    return SyncPush(sync), graph.get_operations()[before:]


def refuse_weight(what: str) -> None:
    """Refuses ``weight=`` with a ``SyncReplicasOptimizer``, which averages windows equally.

    Raises:
        ValueError: Always.
    """
    raise ValueError(
        f"{what}: weight= cannot go with a SyncReplicasOptimizer: it averages the workers' windows "
        "equally. Leave weight= out, or use cross_replica=tf1_accum.CollectiveAllReduce(...) (or "
        "tf1_accum.HorovodAllReduce()), whose update divides by the total weight."
    )


def check(sync: tf.compat.v1.train.SyncReplicasOptimizer) -> None:
    """Refuses aggregation settings that hang and initial tokens; warns of dropped windows.

    Raises:
        ValueError: If ``replicas_to_aggregate`` is more than
            ``total_num_replicas``.
    """
    aggregate, total = sync_replicas_parts(sync)[-2:]
    if aggregate > total:
        raise ValueError(
            f"SyncReplicasOptimizer aggregates {aggregate} pushes per update from {total} workers: "
            f"the update would wait forever. Give it replicas_to_aggregate={total}."
        )
    if aggregate < total:
        warnings.warn(
            f"tf1_accum: the SyncReplicasOptimizer updates with the first {aggregate} of "
            f"{total} workers' windows and drops the others' as stale.",
            stacklevel=_validate._caller_stacklevel(),
        )
    original = sync.get_init_tokens_op

    def init_tokens(num_tokens: int = -1) -> tf.Operation:
        if num_tokens > 0:
            raise ValueError(
                f"tf1_accum: num_tokens={num_tokens} initial tokens let a worker start its next "
                "window from stale weights (then dropped); make the hook with num_tokens=0."
            )
        return original(0)

    sync.get_init_tokens_op = init_tokens
