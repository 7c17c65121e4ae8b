"""One value per window for what only the update reads and each run feeds (a learning rate).

A train op that accumulates and, every ``steps`` runs, applies reads such a
placeholder in every run but uses only the last run's value: a window fed
0.05, 0.05 then 0.5 would be applied at 0.5. `hold` makes each run check its
value against the window's first micro-batch's, in the graph, before the run
adds anything, so it holds whatever runs the op (a session, Keras, a hook).
"""

from __future__ import annotations

import typing

from tf1_accum._compat import add_control_inputs
from tf1_accum._compat import tf

from tf1_accum._guard import refuse_unless
from tf1_accum._locking import ancestors

_PLACEHOLDERS = ("Placeholder", "PlaceholderWithDefault")


class Held(typing.NamedTuple):
    """The placeholders held to one value per window, and the session's record of it."""

    fed: typing.List[tf.Tensor]
    table: tf.Tensor  # key 0: their values at the window's first micro-batch, as `_values`

    def check(self, count: tf.Tensor, who: str) -> tf.Tensor:
        """The values fed now, once asserted those of the window's first micro-batch.

        An empty window (``count`` 0) holds any. ``who``: the run, as a refusal names it.
        """
        value = tf.concat([_values(t) for t in self.fed], 0)
        unknown = tf.fill(tf.shape(value), tf.constant(float("nan"), tf.float64))
        first = tf.raw_ops.LookupTableFindV2(
            table_handle=self.table, keys=tf.constant([0], tf.int64), default_value=unknown
        )[0]
        # No record (a new session, a restored window), or the values it holds.
        held = [tf.reduce_any(tf.math.is_nan(first)), tf.reduce_all(tf.equal(first, value))]
        holds = tf.reduce_any(held + [tf.equal(count, 0)])
        summary = _SUMMARY if any(not t.shape.is_fully_defined() for t in self.fed) else ""
        message = (
            f"tf1_accum: {who} feeds {', '.join(t.name for t in self.fed)} another value than "
            "micro-batch 0 of the window fed it: the update reads it once per window. Feed one "
            "value per window (change it once window.applied is True). Neither the window nor "
            f"the variables changed (UPDATE_OPS may have run). Values{summary}: fed now, fed "
            "with micro-batch 0, micro-batches in the window:"
        )
        checked = refuse_unless(holds, message, value, first, count, name="one_value_per_window")
        with tf.control_dependencies([checked]):
            return tf.identity(value)


def hold(
    counter: tf.Variable, gate: tf.Operation, added: tf.Operation, applied: tf.Tensor
) -> Held | None:
    """Makes ``gate`` (which every op of the add waits for) check the fed values.

    The placeholders checked (numbers, of any shape) are those ``applied``
    (the conditional apply) reads and ``added`` (the micro-batch's add) does
    not: not the batch, nor a weight. The value of the window's first micro-batch (``counter`` 0) is
    kept in a hash table of the session (nothing to initialize or save); a
    session that finds none (a new one, a restored window) keeps the first it
    sees. Returns what `Held.check` checks a flush with, or None (nothing fed).
    """
    batch = ancestors([added])
    fed = [
        op.outputs[0]
        for op in ancestors([applied.op]).values()
        if op.type in _PLACEHOLDERS
        and op.name not in batch
        and (op.outputs[0].dtype.is_floating or op.outputs[0].dtype.is_integer)
    ]
    if not fed:
        return None
    fed.sort(key=lambda t: t.name)
    size = sum(t.shape.num_elements() if t.shape.is_fully_defined() else 5 for t in fed)
    with tf.init_scope(), tf.device(counter.device):
        table = tf.raw_ops.MutableHashTableOfTensorsV2(
            key_dtype=tf.int64,
            value_dtype=tf.float64,
            value_shape=[size],
            use_node_name_sharing=True,
            name="fed_at_first_micro_batch",
        )
    held = Held(fed, table)
    value = held.check(tf.identity(counter.read_value()), "this micro-batch")
    keep = tf.raw_ops.LookupTableInsertV2(
        table_handle=table, keys=tf.constant([0], tf.int64), values=tf.expand_dims(value, 0)
    )
    add_control_inputs(gate, [keep])
    return held


def _values(fed: tf.Tensor) -> tf.Tensor:
    """The float64 values ``fed`` holds: flattened, or 5 if its shape is not fully defined.

    A placeholder without a full shape (``placeholder(tf.float32)``, a common
    way to feed a learning rate) is summarized in a size the table can hold:
    its size, sum, sum of squares, first and last element. A scalar's value is
    in it, so any change of a scalar shows; of a tensor, any change of its size,
    sum, spread or ends.
    """
    flat = tf.reshape(tf.cast(fed, tf.float64), [-1])
    if fed.shape.is_fully_defined():
        return flat
    # Slices, not indexing: an empty tensor sums to 0 where [0] would fail.
    ends = [tf.reduce_sum(flat[:1]), tf.reduce_sum(flat[-1:])]
    size = tf.cast(tf.size(flat), tf.float64)
    return tf.stack([size, tf.reduce_sum(flat), tf.reduce_sum(tf.square(flat))] + ends)


_SUMMARY = " (of a placeholder without a full shape: size, sum, sum of squares, first, last)"
