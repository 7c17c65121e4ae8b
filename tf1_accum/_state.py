"""The graph state tf1_accum owns: its collections, `plain_variables`, a window's mutex."""

from __future__ import annotations

import typing

from tf1_accum._compat import tf

#: Graph collection of every variable tf1_accum creates; global variables
#: (saved), local ones under ``replica_device_setter`` (:doc:`distributed`).
STATE_COLLECTION = "tf1_accum_state"

#: Graph collection holding the mutex of every window (see `new_mutex`).
MUTEX_COLLECTION = "tf1_accum_mutexes"

# The collections of each variable tf1_accum creates.
_OWNED = (tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, STATE_COLLECTION)


def plain_variables(graph: tf.Graph | None = None) -> list[tf.Variable]:
    """Returns the global variables that tf1_accum did not create.

    To restore a plain-training checkpoint into an accumulating graph,
    initialize all variables, then restore only these::

        tf.compat.v1.train.Saver(tf1_accum.plain_variables()).restore(sess, path)

    Args:
        graph: The graph to look in; defaults to the default graph.

    Returns:
        A list of variables, in ``tf.compat.v1.global_variables()`` order.
    """
    graph = graph or tf.compat.v1.get_default_graph()
    owned = {id(v) for v in graph.get_collection(STATE_COLLECTION)}
    variables = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    return [v for v in variables if id(v) not in owned]


def new_mutex() -> tf.Tensor:
    """A window's mutex (a resource, as ``tf.CriticalSection`` uses), made in ``init_scope``.

    Its shared name is its op's name: one mutex per window and session.
    """
    with tf.init_scope():
        graph = tf.compat.v1.get_default_graph()
        name = graph.unique_name("mutex", mark_as_used=False)
        mutex = tf.raw_ops.MutexV2(shared_name=name, name="mutex")
        graph.add_to_collection(MUTEX_COLLECTION, mutex)  # what tf1_accum.Saver locks
        return mutex


def state_variable(make_initial_value: typing.Callable[..., tf.Tensor], name: str) -> tf.Variable:
    """Creates a non-trainable global variable that tf1_accum owns.

    Made in ``init_scope``: its initializer needs no feed, even built in a branch.
    """
    with tf.init_scope():
        return tf.compat.v1.Variable(
            make_initial_value(), trainable=False, name=name, collections=_OWNED
        )


class Weight(typing.NamedTuple):
    """A micro-batch's weight as the sums of a weighted window take it (``Window.add``)."""

    #: float64: the weight; in one process, over the window's reference weight.
    ratio: tf.Tensor
    #: float64: what the float sums so far are multiplied by first, the old
    #: reference over the new (1 while it stays, 0 before the window's first
    #: positive weight); None: the sums hold the weights themselves.
    scale: typing.Optional[tf.Tensor]
    #: The weighting's sums' new bounds (largest and least positive weight); () if none.
    bounds: tuple = ()


class Part:
    """Optional state of a window beside its counter and accumulators, owning its sums.

    The window calls `add` per micro-batch, reads the sums in its mean (the
    variables, or what `add` returned), and zeroes them in its `reset`.
    """

    #: Whether a cross-replica sum keeps these float64 sums exact (in integer chunks).
    exact = False

    def __init__(self, *sums: tf.Variable) -> None:
        self.sums = sums

    def state(self) -> list[tf.Variable]:
        """Every variable of the part."""
        return list(self.sums)

    def increments(self, gradients: typing.Sequence[typing.Any], weight: typing.Any) -> list:
        """What one micro-batch adds to each of `sums`."""
        raise NotImplementedError

    def add(self, gradients: typing.Sequence[typing.Any], weight: typing.Any) -> tuple:
        """Adds one micro-batch; returns the sums after the add.

        A `Weight` with a ``scale`` first rescales the float sums to its reference.
        """
        scale = getattr(weight, "scale", None)
        return tuple(
            total.assign_add(increment, use_locking=True)
            if scale is None or total.dtype.base_dtype.is_integer
            else total.assign(rescaled(total, scale) + increment, use_locking=True)
            for total, increment in zip(self.sums, self.increments(gradients, weight))
        )

    def reset(self) -> list[tf.Operation]:
        return [
            s.assign(tf.constant(0, s.dtype.base_dtype), use_locking=True, read_value=False)
            for s in self.sums
        ]


def rescaled(variable: tf.Variable, scale: tf.Tensor) -> tf.Tensor:
    """``variable``'s value times ``scale`` in its dtype; 0 where ``scale`` is 0, even for NaN."""
    value = variable.read_value()
    return tf.math.multiply_no_nan(value, tf.cast(scale, value.dtype.base_dtype))
