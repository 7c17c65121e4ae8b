"""The order of a window's ops: its mutex's sections, version 1 control flow, one mean at a time."""

from __future__ import annotations

import contextlib
import typing

from tf1_accum._compat import add_control_inputs, control_flow_context, set_control_inputs, tf

from tf1_accum._options import Gradient
from tf1_accum._shared_apply import SharedApply


def values_of(gradient: Gradient) -> tf.Tensor:
    """A gradient's values: a dense one itself, an ``IndexedSlices``' ``values``."""
    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient


def on_device(device: str | None) -> typing.ContextManager[object]:
    """``tf.device(device)``, or no device scope for an empty ``device`` or None."""
    return tf.device(device) if device else contextlib.nullcontext()


def exclusive(
    mutex: tf.Tensor,
    scope: str,
    build: typing.Callable[[], tuple[typing.Any, typing.Any]],
    state: typing.Callable[[], typing.Iterable[tf.Variable]],
    name: str | None = None,
) -> tuple[typing.Any, typing.Any]:
    """Builds ``build()`` so that its runs hold a window's mutex (see :doc:`performance`).

    ``build()`` returns ``(done, other)``; ``done``'s ops and tensors come
    back made to finish after the release (ops named ``name``), ``other`` as
    it is. ``state()`` gives the window's variables.
    """
    graph = tf.compat.v1.get_default_graph()
    before = {op.name for op in graph.get_operations()}
    # On the mutex's device, the window's (the placer keeps it there too).
    with tf.compat.v1.name_scope(scope), on_device(mutex.device):
        lock = tf.raw_ops.MutexLock(mutex=mutex, name="lock")
        # What the section waits for. A version 1 while loop pulls an outside
        # control input in as data, with the op it is on (a parameter server's
        # read): a scalar can go there, the lock (a variant) cannot be sent.
        with tf.control_dependencies([lock]):
            locked = tf.constant(True, name="locked").op
    with tf.control_dependencies([locked]):
        done, other = build()
    finished = [t for t in tf.nest.flatten(done) if t is not None]
    created = [op for op in graph.get_operations() if op.name not in before]
    _lock_section(created, finished, locked, state())

    def after_release(t: tf.Tensor | tf.Operation | None) -> tf.Tensor | tf.Operation | None:
        if isinstance(t, tf.Operation):
            return tf.group(t, name=name)
        return None if t is None else tf.identity(t)

    with tf.compat.v1.name_scope(scope):
        with tf.control_dependencies(finished), on_device(mutex.device):
            release = tf.raw_ops.ConsumeMutexLock(mutex_lock=lock, name="unlock")
        with tf.control_dependencies([release]):
            done = tf.nest.map_structure(after_release, done)
    return done, other


@contextlib.contextmanager
def reference_control_flow(
    variables: typing.Iterable[tf.Variable | None], references: bool = False
) -> typing.Iterator[None]:
    """Builds ``tf.cond`` and ``tf.while_loop`` as version 1 control flow if needed.

    Version 2 control flow cannot take references: with a reference variable
    among ``variables`` (or ``references=True``, for ones the body creates)
    it is off while the body builds. The switch is process-wide.
    """
    references = references or any(
        v is not None and v.dtype != v.dtype.base_dtype for v in variables
    )
    if not references or not tf.compat.v1.control_flow_v2_enabled():
        yield
        return
    tf.compat.v1.disable_control_flow_v2()
    try:
        yield
    finally:
        tf.compat.v1.enable_control_flow_v2()


def _lock_section(
    created: typing.Sequence[tf.Operation],
    finished: typing.Sequence[tf.Tensor | tf.Operation],
    lock_op: tf.Operation,
    state: typing.Iterable[tf.Variable],
) -> None:
    """Orders the ops of ``created`` that running ``finished`` runs (the section) after the lock.

    Those reading the window's ``state`` wait for ``lock_op``: ops built
    under ``tf.control_dependencies(None)`` (a flush), which the lock's own
    control dependency does not reach. The others (a ``SyncReplicasOptimizer``'s
    chief queue runner, which the apply waits for) lose the lock as a control
    input, or would deadlock.
    """
    names = {op.name for op in created}
    section = ancestors([t.op if isinstance(t, tf.Tensor) else t for t in finished], names)
    sources = {v.op.name for v in state}
    context = control_flow_context(lock_op)
    for op in created:
        # Nor the ops making state those runs share (a SyncReplicasOptimizer's queues).
        if op.name not in section or _makes_state(op):
            if lock_op in op.control_inputs:
                set_control_inputs(op, [c for c in op.control_inputs if c is not lock_op])
        elif control_flow_context(op) is context and lock_op not in op.control_inputs:
            if any(t.op.name in sources for t in op.inputs):
                add_control_inputs(op, [lock_op])


def _makes_state(op: tf.Operation) -> bool:
    """Whether ``op`` creates a resource or a variable: takes no input, returns a handle."""
    return not op.inputs and any(
        t.dtype == tf.resource or t.dtype != t.dtype.base_dtype for t in op.outputs
    )


def ancestors(
    ops: typing.Iterable[tf.Operation], names: typing.Container[str] | None = None
) -> dict[str, tf.Operation]:
    """``ops`` and every op they read or wait for (among those named in ``names``), by name."""
    found: dict[str, tf.Operation] = {}
    stack = list(ops)
    while stack:
        op = stack.pop()
        if op.name in found or (names is not None and op.name not in names):
            continue
        found[op.name] = op
        stack += [t.op for t in op.inputs] + list(op.control_inputs)
    return found


def apply_one_at_a_time(
    shared: SharedApply,
    make_grads: typing.Callable[[], list[Gradient]],
    var_list: typing.Sequence[tf.Variable],
    global_step: tf.Variable | None,
) -> tf.Operation:
    """Builds the apply of ``make_grads()``, one large gradient alive at a time; returns its op.

    Each large gradient waits for the ops reading the one before, unless an
    op reads two of them (a global norm), which would deadlock.
    """
    graph = tf.compat.v1.get_default_graph()
    first = len(graph.get_operations())
    grads = make_grads()
    update = shared.apply_gradients(list(zip(grads, var_list)), global_step)
    built = graph.get_operations()[first:]

    def before(op: tf.Operation) -> typing.List[tf.Operation]:
        return [t.op for t in op.inputs] + list(op.control_inputs)

    # The ops each gradient needs, and those only it needs (safe to hold back).
    names = {op.name for op in built}
    needs = [set(ancestors([values_of(g).op], names).values()) for g in grads]
    shared_ops = {op for k, a in enumerate(needs) for b in needs[k + 1 :] for op in a & b}
    own = [a - shared_ops for a in needs]
    owner = {op: k for k, ops in enumerate(own) for op in ops}
    # Which gradients' own ops each op built here depends on.
    reads: typing.Dict[tf.Operation, typing.Set[int]] = {}
    for op in built:
        found = {owner[op]} if op in owner else set()
        for dependency in before(op):
            found |= reads.get(dependency, set())
        reads[op] = found
    users = [[c for c in values_of(g).consumers() if c.name in names] for g in grads]
    if any(reads[user] != {k} for k, mine in enumerate(users) for user in mine):
        return update
    # Only large gradients wait: a small one is cheaper run at once.
    sizes = [var.shape.num_elements() or 0 for var in var_list]  # 0: not static
    large = [k for k, size in enumerate(sizes) if size >= _ONE_AT_A_TIME_FROM]
    for k, following in zip(large, large[1:]):
        starts = [op for op in own[following] if not any(d in own[following] for d in before(op))]
        for op in starts if users[k] else ():
            add_control_inputs(op, users[k])
    return update


# Gradients of this many elements (256 KiB of float32) or more are made one at a time.
_ONE_AT_A_TIME_FROM = 1 << 16
