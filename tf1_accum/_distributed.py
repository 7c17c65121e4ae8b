"""Accumulation across workers: one all-reduce per window (see docs/distributed.rst)."""

from __future__ import annotations

import typing

import numpy as np
from tf1_accum._compat import COLLECTIVE_TIMEOUT, collective_broadcast, collective_sum, tf

from tf1_accum import _validate
from tf1_accum._state import Part, plain_variables
from tf1_accum._window import Added


class Engine:
    """What ``cross_replica=`` accepts: an engine that sums a window across workers.

    `CollectiveAllReduce` and `HorovodAllReduce`. An engine hands out keys in
    graph-building order and builds a sum over workers (`_all_reduce`) and a
    broadcast from worker 0 (`_broadcast`) of one flat vector.
    """

    #: Named in error messages: "the <kind> broadcast cannot send ...".
    _kind = "cross-replica"
    #: The dtypes `_broadcast` can send.
    _broadcast_dtypes: tuple = ()

    #: The next key `_take_instance_key` hands out.
    _next_key = 0

    #: A method ``(flat, key)``: the sum of the 1-D tensor ``flat`` over every worker.
    _all_reduce: typing.Callable[[tf.Tensor, int], tf.Tensor]
    #: A method ``(flat, key)``: worker 0's value of the 1-D tensor ``flat`` on every worker.
    _broadcast: typing.Callable[[tf.Tensor, int], tf.Tensor]

    def _take_instance_key(self) -> int:
        self._next_key += 1
        return self._next_key - 1

    def _reducer(self) -> _WindowReducer:
        """Returns a `_WindowReducer` with a key of its own."""
        return _WindowReducer(self, self._take_instance_key())


#: What an `Engine` is, to the user: "... must be <_ENGINES>".
_ENGINES = "a tf1_accum.CollectiveAllReduce or a tf1_accum.HorovodAllReduce"


def check_cross_replica(cross_replica: object) -> None:
    """Raises TypeError unless ``cross_replica`` is None or an `Engine`."""
    if cross_replica is not None and not isinstance(cross_replica, Engine):
        raise _validate.type_error("cross_replica", cross_replica, f"{_ENGINES} or None")


class CollectiveAllReduce(Engine):
    """Where and how the windows of W workers are all-reduced.

    Pass one as ``cross_replica=`` to any way in; every worker builds the
    same graph, in the same order, with its own ``task_index``, and applies
    the update of large-batch training on all W x N micro-batches. Servers and
    sessions need ``session_config()``; run `broadcast_variables` once after
    initialization. See :doc:`distributed` for a complete program.

    Args:
        num_workers: W, the number of workers (tasks of ``job_name``) taking
            part; each window waits for all of them.
        task_index: This worker's index, 0 to W - 1. Worker 0 is the group
            leader and the source of `broadcast_variables`.
        job_name: The cluster job the workers belong to.
        timeout: Optional positive number of seconds after which a collective
            op fails instead of waiting forever (see :doc:`distributed`);
            TensorFlow 2 only.
        group_key: The collective group's key; the same on every worker.
        instance_key: The first collective instance key this object hands
            out, one per accumulation and per dtype `broadcast_variables`
            sends; use distinct ranges for objects whose graphs share a server.

    Raises:
        TypeError: If ``num_workers``, ``task_index``, ``group_key`` or
            ``instance_key`` is not an int, ``job_name`` is not a string, or
            ``timeout`` is not a number.
        ValueError: If ``num_workers`` is less than 1, ``task_index`` is not
            in ``[0, num_workers)``, or ``timeout`` is not positive or is
            given on TensorFlow 1.15.
    """

    def __init__(
        self,
        num_workers: int,
        task_index: int,
        *,
        job_name: str = "worker",
        timeout: float | None = None,
        group_key: int = 1,
        instance_key: int = 1000,
    ) -> None:
        _validate.check_int("num_workers", num_workers)
        labels = ("task_index", "group_key", "instance_key")
        for label, value in zip(labels, (task_index, group_key, instance_key)):
            _validate.check_int(label, value, least=None)
        if not 0 <= task_index < num_workers:
            raise ValueError(
                f"task_index must be in [0, num_workers) = [0, {num_workers}), got {task_index}."
            )
        if not isinstance(job_name, str):
            raise _validate.type_error("job_name", job_name, "a string")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float, np.number)):
                raise _validate.type_error("timeout", timeout, "a positive number or None")
            if not timeout > 0:
                raise ValueError(f"timeout must be positive (seconds), got {timeout}.")
            if not COLLECTIVE_TIMEOUT:
                raise ValueError(
                    f"timeout={timeout} needs TensorFlow 2: the collective ops of 1.15 cannot be "
                    "cancelled. Leave timeout=None, or use asynchronous parameter servers."
                )
        self.num_workers = int(num_workers)
        self.task_index = int(task_index)
        self.job_name = job_name
        self.timeout = None if timeout is None else float(timeout)
        self.group_key = int(group_key)
        self._next_key = int(instance_key)

    @property
    def leader(self) -> str:
        """The device name of the collective group leader, worker 0."""
        return f"/job:{self.job_name}/replica:0/task:0"

    def session_config(
        self, config: tf.compat.v1.ConfigProto | None = None
    ) -> tf.compat.v1.ConfigProto:
        """A copy of ``config`` (or a new ``ConfigProto``) for this worker's server and sessions.

        It sets ``experimental.collective_group_leader`` to worker 0 and, with a
        ``timeout``, ``operation_timeout_in_ms`` to twice it.
        """
        result = tf.compat.v1.ConfigProto()
        if config is not None:
            result.CopyFrom(config)
        result.experimental.collective_group_leader = self.leader
        if self.timeout is not None:
            result.operation_timeout_in_ms = int(2000 * self.timeout)
        return result

    def _attrs(self) -> dict[str, typing.Any]:
        # timeout_seconds only when set (its default, 0, waits forever): 1.15's ops lack it.
        timeout = {} if self.timeout is None else {"timeout_seconds": self.timeout}
        return dict(group_size=self.num_workers, group_key=self.group_key, **timeout)

    _kind = "collective"
    _broadcast_dtypes = (tf.bool, tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)

    def _all_reduce(self, flat: tf.Tensor, key: int) -> tf.Tensor:
        return collective_sum(flat, key, self._attrs(), "all_reduce_window")

    def _broadcast(self, flat: tf.Tensor, key: int) -> tf.Tensor:
        name = "send" if self.task_index == 0 else "receive"
        return collective_broadcast(flat, self.task_index == 0, key, self._attrs(), name)


_NOTHING_ACCUMULATED_ANYWHERE = (
    "tf1_accum: apply_op ran with nothing accumulated on any worker (summed counter 0); no "
    "variable was changed. Run accum_op on at least one micro-batch before apply_op."
)


class _WindowReducer(typing.NamedTuple):
    """A window's cross-replica sum: one key, as a step applies through one op."""

    collective: Engine
    instance_key: int

    def reduce(
        self, slots: typing.Sequence[typing.Any], added: Added, parts: typing.Sequence[Part]
    ) -> tuple[Added, list[tf.Operation]]:
        """All-reduces (sums) a window's totals (``added``) in one flat vector.

        Every worker joins, an empty window with zeros, so the apply fails on
        every worker or on none: the check returned is that the summed count
        is positive. A slot's totals are its sum (and a sparse one's touched
        rows); integers cross a float32 vector exactly up to 2^24, an exact
        part's float64 sums (the weight total) in integer chunks.
        """
        # An empty window's dense accumulators hold the last window's values.
        holds = tf.greater(added.count, 0)
        per_slot = [
            slot.masked(slot.totals() if t is None else t, holds)
            for slot, t in zip(slots, added.per_slot)
        ]
        tensors = [t for totals in per_slot for t in totals]
        # Base dtypes: after an add in the same run (fused) the totals of
        # reference variables are float64_ref, which must still send float64.
        dtype = tf.float64 if any(t.dtype.base_dtype == tf.float64 for t in tensors) else tf.float32
        scalars = [(added.count, False)]
        scalars += [(s, part.exact) for part, sums in zip(parts, added.parts) for s in sums]
        tail = [_weight_pieces(s, dtype) if exact else [tf.cast(s, dtype)] for s, exact in scalars]
        pieces = [tf.reshape(tf.cast(t, dtype), [-1]) for t in tensors]
        flat = tf.concat(pieces + [tf.stack([p for s in tail for p in s])], 0, name="window_flat")
        summed = self.collective._all_reduce(flat, self.instance_key)
        sizes = [int(np.prod(t.shape.as_list())) for t in tensors] + [sum(map(len, tail))]
        splits = iter(tf.split(summed, sizes, name="window_parts"))
        per_slot = [
            tuple(tf.reshape(tf.cast(next(splits), t.dtype.base_dtype), t.shape) for t in totals)
            for totals in per_slot
        ]
        values = iter(tf.unstack(next(splits)))
        got = []
        for (s, _), sent in zip(scalars, tail):
            value = _join_weight_pieces([next(values) for _ in sent])
            rounded = tf.round(value) if s.dtype.is_integer else value
            got.append(tf.cast(rounded, s.dtype.base_dtype))
        rest = iter(got[1:])
        sums = [tuple(next(rest) for _ in part) for part in added.parts]
        check = tf.compat.v1.assert_positive(got[0], message=_NOTHING_ACCUMULATED_ANYWHERE)
        return added._replace(per_slot=per_slot, count=got[0], parts=sums), [check]


# A float64 weight total crosses a float32 all-reduce as integers of
# _CHUNK_BITS bits each (float32 sums them exactly across up to
# 2^(24 - _CHUNK_BITS) workers), the highest unbounded, plus the fraction.
# Two float32 halves (hi = f32(x), lo = x - hi) would not do: the sum of the
# workers' halves rounds again wherever their exponents differ.
_CHUNK_BITS = 12
_CHUNKS = 4  # integers exact up to 2^48 (higher ones as exact as float32 allows)


def _weight_pieces(weight: tf.Tensor, dtype: tf.DType) -> list[tf.Tensor]:
    """Splits the float64 scalar ``weight`` (>= 0) into ``dtype`` scalars that sum exactly."""
    weight = tf.cast(weight, tf.float64)
    if dtype == tf.float64:
        return [weight]
    whole = tf.floor(weight)
    pieces = [weight - whole]
    for k in range(_CHUNKS):
        chunk = tf.floor(whole / 2.0 ** (_CHUNK_BITS * k))
        if k < _CHUNKS - 1:
            chunk = tf.math.floormod(chunk, 2.0**_CHUNK_BITS)
        pieces.append(chunk)
    return [tf.cast(p, dtype) for p in pieces]


def _join_weight_pieces(pieces: typing.Sequence[tf.Tensor]) -> tf.Tensor:
    """The float64 weight total from what `_weight_pieces` sent, summed."""
    head, *chunks = [tf.cast(p, tf.float64) for p in pieces]
    return sum((c * 2.0 ** (_CHUNK_BITS * k) for k, c in enumerate(chunks)), head)


def broadcast_variables(
    collective: Engine,
    var_list: typing.Sequence[tf.Variable] | None = None,
    name: str | None = None,
) -> tf.Operation:
    """Returns an op that sets every worker's variables to worker 0's values.

    Run it once on every worker, after initialization (on worker 0, after
    restoring a checkpoint, if any), before the first window.

    Args:
        collective: The engine of this worker: a `CollectiveAllReduce` or a
            `HorovodAllReduce`.
        var_list: Variables to broadcast; defaults to every global variable
            that tf1_accum did not create (see `plain_variables`): the model,
            the optimizer's slots, ``global_step``.
        name: Name scope for the ops; defaults to ``"broadcast_variables"``.

    Returns:
        A ``tf.Operation`` that assigns every variable its value on worker 0.

    Raises:
        TypeError: If ``collective`` is not a `CollectiveAllReduce` or a
            `HorovodAllReduce`, or ``var_list`` holds something other than
            variables.
        ValueError: If ``var_list`` is empty or holds a variable of a dtype
            the engine's broadcast cannot send.
    """
    _validate.check_graph_mode("broadcast_variables")
    if not isinstance(collective, Engine):
        raise _validate.type_error("collective", collective, _ENGINES)
    graph = tf.compat.v1.get_default_graph()
    if var_list is None:
        var_list = plain_variables(graph)
        if not var_list:
            raise ValueError("var_list is empty: the graph has no variables to broadcast.")
    var_list = _validate.check_var_list(var_list, graph)
    by_dtype: dict[tf.DType, list[tf.Variable]] = {}
    supported = collective._broadcast_dtypes
    for var in var_list:
        dtype = var.dtype.base_dtype
        if dtype not in supported:
            raise ValueError(
                f"Variable {var.op.name} has dtype {dtype.name}, which the {collective._kind} "
                f"broadcast cannot send; supported: {', '.join(d.name for d in supported)}. "
                "Leave it out of var_list."
            )
        by_dtype.setdefault(dtype, []).append(var)
    with tf.compat.v1.name_scope(name, "broadcast_variables"):
        assigns = []
        for variables in by_dtype.values():
            sizes = [int(np.prod(v.shape.as_list())) for v in variables]
            # Read on every worker; a receiver's engine may not send it.
            flat = tf.concat([tf.reshape(v.read_value(), [-1]) for v in variables], 0)
            values = collective._broadcast(flat, collective._take_instance_key())
            for var, part in zip(variables, tf.split(values, sizes)):
                assigns.append(var.assign(tf.reshape(part, var.shape), read_value=False))
        return tf.group(*assigns, name="broadcast")
