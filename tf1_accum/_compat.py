"""TensorFlow's versions and private parts: the one module of tf1_accum that knows them.

Every other module imports ``tf`` from here and reaches TensorFlow's private
classes and methods only through the functions below. On TensorFlow 1.15,
``tf`` is 1.15's ``tf.compat.v2`` (the TensorFlow 2 API, ``tf.compat.v1``
inside it), so the package reads the same on every version: ``tf.where``
broadcasts and ``tf.while_loop`` returns its loop variables' structure on both.

Process-wide patches (the session's fetch handler, ``CheckpointSaverHook.end``,
Keras's ``CallbackList``) go through `patch`: each is installed once, and a
TensorFlow whose private method has another signature gets one warning naming
the guard that is off, never a broken ``session.run``. ``tests/test_compat.py``
pins every private name and signature used here on each supported TensorFlow.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import re
import sys
import threading
import traceback
import typing
import warnings

import tensorflow as _tensorflow

#: The TensorFlow releases the test suite runs on.
TESTED = "1.15 (Python 3.7) and 2.15 to 2.21"
#: Whether this is TensorFlow 1.x.
TF1 = _tensorflow.__version__.startswith("1.")

tf = _tensorflow.compat.v2 if TF1 else _tensorflow


def untested(version: str) -> str | None:
    """The warning for a TensorFlow ``version`` outside the tested releases, else None."""
    major_minor = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    if major_minor == (1, 15) or (2, 15) <= major_minor <= (2, 21):
        return None
    return (
        f"tf1_accum is tested on TensorFlow {TESTED}; this is TensorFlow {version}. "
        "It may work; if a build fails, install a tested release."
    )


_UNTESTED = untested(_tensorflow.__version__)
if _UNTESTED:
    warnings.warn(_UNTESTED, stacklevel=2)


class cached_property:  # noqa: N801 (functools' name)
    """``functools.cached_property`` (Python 3.8) for every Python: computed once, then kept.

    The value is stored on the instance, whose attribute then hides this
    non-data descriptor.
    """

    def __init__(self, compute: typing.Callable[[typing.Any], typing.Any]) -> None:
        self.compute = compute

    def __get__(self, instance: typing.Any, owner: type | None = None) -> typing.Any:
        if instance is None:
            return self
        return vars(instance).setdefault(self.compute.__name__, self.compute(instance))


# Private methods of ``tf.Operation``, the same from 1.15 to 2.21.


def control_flow_context(op: _tensorflow.Operation) -> typing.Any:
    """The version 1 ``tf.cond`` or ``tf.while_loop`` that ``op`` is built in, or None."""
    return op._get_control_flow_context()


def add_control_inputs(op: _tensorflow.Operation, inputs: typing.Sequence[typing.Any]) -> None:
    """Makes ``op`` wait for ``inputs`` too, after it was built (undone if the build fails)."""
    _record_control_inputs(op)
    op._add_control_inputs(inputs)


# Per thread: (op, its control inputs before) of each edit of the build running, or None.
_EDITS = threading.local()


def _record_control_inputs(op: _tensorflow.Operation) -> None:
    edits = getattr(_EDITS, "edits", None)
    if edits is not None:
        edits.append((op, list(op.control_inputs)))


@contextlib.contextmanager
def control_inputs_restored_on_failure() -> typing.Iterator[None]:
    """Gives back their control inputs to the ops edited inside if it raises (a failed build).

    A build may make ops it did not create (a user's update ops) wait for its
    own: a failed build must not leave them waiting for ops that never run.
    Nested, an inner success leaves its edits for the outer to undo.
    """
    outer = getattr(_EDITS, "edits", None)
    edits = _EDITS.edits = [] if outer is None else outer
    start = len(edits)
    try:
        yield
    except BaseException:
        for op, inputs in reversed(edits[start:]):
            set_control_inputs(op, inputs)
        del edits[start:]  # and the loop's own records of what it undid
        raise
    finally:
        _EDITS.edits = outer


@contextlib.contextmanager
def without_control_inputs() -> typing.Iterator[None]:
    """Builds ops that wait for none of the enclosing control dependencies (flow context kept)."""
    graph = _tensorflow.compat.v1.get_default_graph()
    context = graph._get_control_flow_context()
    with graph.control_dependencies(None):  # which clears the flow context too: put it back
        graph._set_control_flow_context(context)
        yield


def variable_store(graph: _tensorflow.Graph) -> dict:
    """``tf.compat.v1.get_variable``'s variables of ``graph`` by name (the store's dict), or {}."""
    stores = graph.get_collection(("__variable_store",))
    return stores[0]._vars if stores else {}


def write_of(total: typing.Any) -> typing.Any:
    """The write that made ``total`` (an assign's or a scatter's result), else ``total``.

    A resource variable's update returns an unread variable: waiting on it
    would read it, and a read of a scattered-into table copies the table.
    """
    return getattr(total, "_parent_op", total)


def set_input(op: _tensorflow.Operation, index: int, tensor: _tensorflow.Tensor) -> None:
    """Makes ``op`` read ``tensor`` as its input ``index``, after it was built."""
    op._update_input(index, tensor)


def set_control_inputs(op: _tensorflow.Operation, inputs: typing.Sequence[typing.Any]) -> None:
    """Makes ``inputs`` the only ops ``op`` waits for, after it was built (undone as above)."""
    _record_control_inputs(op)
    op._remove_all_control_inputs()
    op._add_control_inputs(inputs)


# A version 2 If or While's function graphs (Stateless ones alike): (attribute of the op,
# attribute naming the function).
_BODIES = {
    "If": [("_true_graph", "then_branch"), ("_false_graph", "else_branch")],
    "While": [("_cond_graph", "cond"), ("_body_graph", "body")],
}


def function_bodies(op: _tensorflow.Operation) -> list[_tensorflow.Graph]:
    """The function graphs of a version 2 ``If`` or ``While`` built in this process, else []."""
    bodies = _BODIES.get(op.type[9:] if op.type.startswith("Stateless") else op.type, ())
    if TF1:  # 1.15 keeps them in the graph's function library only
        found = [op.graph._get_function(op.get_attr(name).name) for _, name in bodies]
        return [function.graph for function in found if function is not None]
    return [graph for graph in (getattr(op, name, None) for name, _ in bodies) if graph is not None]


def patch(owner: type, name: str, parameters: str, make: typing.Callable[..., typing.Any]) -> None:
    """Replaces ``owner.name`` with ``make(original)``, once per process.

    ``parameters`` are the names the original takes (space-separated): when
    this TensorFlow's differ, the method stays as it is and one warning says
    which check of tf1_accum is off.
    """
    original: typing.Any = getattr(owner, name, None)
    if getattr(original, "_tf1_accum_patched", False):
        return
    try:
        found = " ".join(inspect.signature(original).parameters)
    except (TypeError, ValueError):  # not a function
        found = "?"
    if found != parameters:
        warnings.warn(
            f"tf1_accum: {owner.__name__}.{name} takes ({found}), not ({parameters}) as tested on "
            f"({TESTED}): on TensorFlow {_tensorflow.__version__}, {_GUARDS[name]} is off.",
            stacklevel=3,
        )
        _mark(original)  # one warning per process
        return
    setattr(owner, name, _mark(functools.wraps(original)(make(original))))


def _mark(method: typing.Any) -> typing.Any:
    with contextlib.suppress(AttributeError, TypeError):  # a builtin takes no attribute
        method._tf1_accum_patched = True
    return method


_GUARDS = {
    "__init__": "the refusal of two ops of one window fetched in one session.run",
    "_make_callable_from_options": "the refusal of two ops of one window in one Keras function",
    "before_run": "the warning of a session without its accumulation hook",
    "end": "the warning of a session that ends mid-window without its hook",
    "on_epoch_begin": "the warning of a Keras fit whose epochs end mid-window",
    "on_epoch_end": "the warning of a Keras fit whose epochs end mid-window",
    "on_train_end": "the warning of a Keras fit whose epochs end mid-window",
}


def sync_replicas_parts(sync: typing.Any) -> tuple:
    """What ``sync`` (a ``tf.compat.v1.train.SyncReplicasOptimizer``) keeps privately, that a
    window pushes through: ``(local_step, accumulators, global_step, token_queue,
    replicas_to_aggregate, total_num_replicas)``, ``accumulators`` an ``(accumulator, device)``
    per variable after ``apply_gradients``."""
    return (
        getattr(sync, "_local_step", None),
        getattr(sync, "_accumulator_list", []),
        getattr(sync, "_global_step", None),
        getattr(sync, "_sync_token_queue", None),
        sync._replicas_to_aggregate,
        sync._total_num_replicas,
    )


def wrapped_optimizer(optimizer: typing.Any) -> typing.Any:
    """The optimizer a TensorFlow wrapper keeps privately, or None: a TF1 loss-scale
    optimizer's ``_optimizer``, a ``SyncReplicasOptimizer``'s ``_opt``."""
    return getattr(optimizer, "_optimizer", None) or getattr(optimizer, "_opt", None)


def loss_scale(optimizer: typing.Any) -> typing.Any:
    """A TF1 loss-scale optimizer's ``FixedLossScale`` or ``DynamicLossScale``, or None."""
    return getattr(optimizer, "_loss_scale", None)


def session_closed(session: typing.Any) -> bool:
    """Whether ``session`` (a ``tf.compat.v1.Session``) was closed."""
    return getattr(session, "_closed", False)


def guard_runs(check: typing.Callable[[typing.Any, list, list], None]) -> None:
    """Makes every step a session runs call ``check(graph, ops, tensors)`` (its fetches) first.

    ``Session.run``, ``make_callable`` and ``partial_run`` read their fetches
    with the fetch handler; Keras makes its callables from options, whose
    targets (``tf.group`` of the updates) are op names.
    """
    from tensorflow.python.client import session

    def handler(original: typing.Any) -> typing.Any:
        def init(self: typing.Any, graph: typing.Any, *args: object, **kwargs: object) -> None:
            original(self, graph, *args, **kwargs)
            check(graph, self.targets(), self.fetches())

        return init

    def from_options(original: typing.Any) -> typing.Any:
        def make(self: typing.Any, options: typing.Any) -> typing.Any:
            ops = [self.graph.get_operation_by_name(name) for name in options.target]
            check(self.graph, ops, [self.graph.get_tensor_by_name(name) for name in options.fetch])
            return original(self, options)

        return make

    patch(session._FetchHandler, "__init__", "self graph fetches feeds feed_handles", handler)
    patch(session.BaseSession, "_make_callable_from_options", "self callable_options", from_options)


def saver_hook_state(hook: typing.Any) -> tuple[typing.Any, typing.Any]:
    """``(global step tensor, step of its last save or None)`` of a ``CheckpointSaverHook``."""
    last_triggered = getattr(getattr(hook, "_timer", None), "last_triggered_step", None)
    return getattr(hook, "_global_step_tensor", None), last_triggered and last_triggered()


def keras_callback_list() -> type | None:
    """The ``CallbackList`` of the Keras 2 in use (tf_keras, or 1.15's ``tf.keras``), else None."""
    if TF1:
        from tensorflow.python.keras import callbacks
    else:
        callbacks = getattr(sys.modules.get("tf_keras"), "callbacks", None)
    return getattr(callbacks, "CallbackList", None)


# The in-graph dataset loop's draws: 1.15's iterator has no get_next_as_optional,
# and its Optional is tf.data.experimental.Optional, made empty by none_from_structure.


def next_as_optional(iterator: typing.Any) -> typing.Any:
    """The iterator's next element as an ``Optional``, empty at the end of the data."""
    if TF1:
        return tf.data.experimental.get_next_as_optional(iterator)
    return iterator.get_next_as_optional()


def empty_optional(iterator: typing.Any) -> typing.Any:
    """An empty ``Optional`` of the type of the iterator's elements."""
    if TF1:
        return tf.data.experimental.Optional.none_from_structure(iterator.element_spec)
    return tf.experimental.Optional.empty(iterator.element_spec)


# Where TensorFlow's frames are, skipped when a warning points at the caller's line.


def tensorflow_dir() -> str:
    """The directory TensorFlow's Python code runs from, ``tensorflow_core`` on 1.15.

    1.15's ``tf.__file__`` is an API module inside it, and its ``tensorflow``
    package only loads ``tensorflow_core``.
    """
    import os

    # Three levels up from .../python/framework/ops.py.
    return os.path.abspath(os.path.join(inspect.getfile(_tensorflow.Graph), "..", "..", ".."))


# Keras 2: the tf_keras package on TensorFlow 2, TensorFlow 1.15's own tf.keras
# (Keras 2.2.4-tf, whose tf.keras.optimizers are the OptimizerV2 ones that
# tf_keras calls legacy). The callers name tf_keras's paths in their messages:
# `keras_names` gives a 1.15 user the paths that exist there.


def keras() -> typing.Any:
    """The Keras 2 module: ``tf_keras`` on TensorFlow 2, ``tf.keras`` on 1.15.

    Raises:
        ImportError: On TensorFlow 2 without the tf_keras package.
    """
    return _tensorflow.keras if TF1 else importlib.import_module("tf_keras")


def keras_optimizer_name(optimizer: typing.Any) -> str:
    """The name a Keras 2 optimizer was made with (``Adam``, ...)."""
    return str(optimizer._name)


def keras_optimizers() -> typing.Any:
    """The module of Keras 2's ``OptimizerV2`` classes (``Optimizer``, ``Adam``, ...)."""
    return keras().optimizers if TF1 else keras().optimizers.legacy


def keras_track_variable(variable: typing.Any) -> None:
    """Has Keras initialize ``variable`` in its session, as it does the model's."""
    if TF1:
        from tensorflow.python.keras import backend

        backend.track_variable(variable)
    else:
        keras().__internal__.backend.track_variable(variable)


def keras_serializable(cls: type) -> type:
    """Registers ``cls`` with Keras, so that ``load_model`` finds it without ``custom_objects``."""
    if TF1:  # 1.15 saves a class by its bare name
        keras().utils.get_custom_objects()[cls.__name__] = cls
        return cls
    return keras().saving.register_keras_serializable(package="tf1_accum")(cls)


def keras_deserialize_optimizer(config: typing.Any, custom_objects: typing.Any) -> typing.Any:
    """The Keras 2 optimizer of ``config``, as ``keras().optimizers.serialize`` gave it."""
    legacy = {} if TF1 else {"use_legacy_optimizer": True}
    return keras().optimizers.deserialize(config, custom_objects=custom_objects, **legacy)


def keras_inner_optimizer(loss_scale_optimizer: typing.Any) -> typing.Any:
    """The optimizer a Keras ``LossScaleOptimizer`` wraps, or None."""
    return getattr(loss_scale_optimizer, "_optimizer" if TF1 else "inner_optimizer", None)


def keras_create_all_weights(optimizer: typing.Any, var_list: typing.Any) -> None:
    """Makes a Keras optimizer's slots for ``var_list`` (what ``load_model`` asks of it)."""
    optimizer._create_all_weights(var_list)


def keras_clip(optimizer: typing.Any, grads_and_vars: list[typing.Any]) -> list[typing.Any]:
    """``grads_and_vars`` clipped as by ``optimizer``'s ``clipnorm`` and ``clipvalue``, on 1.15.

    tf_keras clips in ``apply_gradients``; 1.15's Keras in ``get_gradients``
    instead, which the window's mean does not go through.
    """
    norm, value = getattr(optimizer, "clipnorm", None), getattr(optimizer, "clipvalue", None)
    if TF1 and norm is not None:
        grads_and_vars = [(tf.clip_by_norm(g, norm), v) for g, v in grads_and_vars]
    if TF1 and value is not None:
        grads_and_vars = [(tf.clip_by_value(g, -value, value), v) for g, v in grads_and_vars]
    return grads_and_vars


def in_keras_saved_model_save() -> bool:
    """Whether Keras is saving a model in the SavedModel format right now."""
    if TF1:  # no flag tells it: the caller is found on the stack
        from tensorflow.python.keras.saving.saved_model import save

        return any(frame.f_code is save.save.__code__ for frame, _ in traceback.walk_stack(None))
    try:
        from tf_keras.src.saving.legacy.saved_model import utils
    except ImportError:  # pragma: no cover - a tf_keras that moved it
        return False
    return bool(utils.in_tf_saved_model_scope())


_KERAS_1_15_NAMES = (
    (r" \(from the tf_keras package[^)]*\)", ""),  # 1.15 has none: tf.keras is Keras 2
    (r"tf_keras\.optimizers\.legacy", "tf.keras.optimizers"),
    (r"tf_keras legacy", "tf.keras"),
    (r"the legacy ones", "those of tf.keras.optimizers"),
    (r"tf_keras", "tf.keras"),
)


def keras_names(message: str) -> str:
    """``message``, with tf_keras's names of Keras 2 replaced by this TensorFlow's.

    On 1.15, ``tf_keras.optimizers.legacy.Adam`` reads ``tf.keras.optimizers.Adam``.
    """
    for pattern, name in _KERAS_1_15_NAMES if TF1 else ():
        message = re.sub(pattern, name, message)
    return message


# Collective ops (`CollectiveAllReduce`). TensorFlow 1.15 has only their first
# version: keys are attributes, the broadcast sends no bool (an int32 carries
# it), and a wait can be neither bounded nor cancelled (a session's
# operation_timeout_in_ms cancels the step, but the op waits on).

#: Whether ``CollectiveAllReduce(timeout=...)`` can end a wait for a lost worker.
COLLECTIVE_TIMEOUT = not TF1


def collective_sum(flat: typing.Any, key: int, attrs: dict, name: str) -> typing.Any:
    """The sum over the group of the 1-D ``flat``.

    ``attrs``: group_size, group_key and, if a timeout is set (TensorFlow 2), timeout_seconds.
    """
    if TF1:
        reduce = functools.partial(tf.raw_ops.CollectiveReduce, subdiv_offsets=[0])
    else:
        reduce = functools.partial(tf.raw_ops.CollectiveReduceV2, ordering_token=[])
    return reduce(input=flat, instance_key=key, merge_op="Add", final_op="Id", name=name, **attrs)


def collective_broadcast(
    flat: typing.Any, send: bool, key: int, attrs: dict, name: str
) -> typing.Any:
    """The group leader's 1-D ``flat`` (``send``: this worker is the leader)."""
    shape, dtype = flat.shape.as_list(), flat.dtype.base_dtype
    if TF1 and dtype == tf.bool:
        sent = collective_broadcast(tf.cast(flat, tf.int32), send, key, attrs, name)
        return tf.not_equal(sent, 0)
    if TF1 or not send:  # the first version takes the shape on both ops
        attrs = dict(attrs, shape=shape)
    op = ("CollectiveBcastSend" if send else "CollectiveBcastRecv") + ("" if TF1 else "V2")
    operand = {"input": flat} if send else {"T": dtype}
    return getattr(tf.raw_ops, op)(instance_key=key, name=name, **operand, **attrs)
