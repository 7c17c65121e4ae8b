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
import inspect
import re
import sys
import typing
import warnings

import tensorflow as _tensorflow

#: The TensorFlow releases the test suite runs on.
TESTED = "1.15 (Python 3.7) and 2.15 to 2.21"
VERSION = tuple(int(part) for part in re.findall(r"\d+", _tensorflow.__version__)[:2])
#: Whether this is TensorFlow 1.x.
TF1 = VERSION[0] == 1

tf = _tensorflow.compat.v2 if TF1 else _tensorflow

if VERSION != (1, 15) and not (2, 15) <= VERSION <= (2, 21):
    warnings.warn(
        f"tf1_accum is tested on TensorFlow {TESTED}; this is TensorFlow "
        f"{_tensorflow.__version__}. It may work; if a build fails, install a tested release.",
        stacklevel=2,
    )

if sys.version_info >= (3, 8):
    cached_property = functools.cached_property
else:

    class cached_property:  # noqa: N801 (functools' name)
        """``functools.cached_property`` for Python 3.7: computed once, kept on the instance."""

        def __init__(self, compute: typing.Callable[[typing.Any], typing.Any]) -> None:
            self.compute, self.__doc__ = compute, compute.__doc__

        def __set_name__(self, owner: type, name: str) -> None:
            self.name = name

        def __get__(self, instance: typing.Any, owner: type | None = None) -> typing.Any:
            if instance is None:
                return self
            value = instance.__dict__[self.name] = self.compute(instance)
            return value


# Private methods of ``tf.Operation``, the same from 1.15 to 2.21.


def control_flow_context(op: _tensorflow.Operation) -> typing.Any:
    """The version 1 ``tf.cond`` or ``tf.while_loop`` that ``op`` is built in, or None."""
    return op._get_control_flow_context()


def add_control_inputs(
    op: _tensorflow.Operation, inputs: typing.Sequence[_tensorflow.Operation]
) -> None:
    """Makes ``op`` wait for ``inputs`` too, after it was built."""
    op._add_control_inputs(inputs)


def set_control_inputs(
    op: _tensorflow.Operation, inputs: typing.Sequence[_tensorflow.Operation]
) -> None:
    """Makes ``inputs`` the only ops ``op`` waits for, after it was built."""
    op._remove_all_control_inputs()
    op._add_control_inputs(inputs)


_BODIES = dict.fromkeys(["If", "StatelessIf"], ("_true_graph", "_false_graph"))
_BODIES.update(dict.fromkeys(["While", "StatelessWhile"], ("_cond_graph", "_body_graph")))


def function_bodies(op: _tensorflow.Operation) -> list[_tensorflow.Graph]:
    """The function graphs of a version 2 ``If`` or ``While`` built in this process, else []."""
    graphs = [getattr(op, name, None) for name in _BODIES.get(op.type, ())]
    return [graph for graph in graphs if graph is not None]


def patch(
    owner: type, name: str, parameters: str, make: typing.Callable[[typing.Any], typing.Any]
) -> None:
    """Replaces ``owner.name`` with ``make(original)``, once per process.

    ``parameters`` are the names the original takes (space-separated): when
    this TensorFlow's differ, the method stays as it is and one warning says
    which check of tf1_accum is off.
    """
    original: typing.Any = getattr(owner, name, None)
    if getattr(original, "_tf1_accum_patched", False):
        return
    found = " ".join(_parameters(original))
    if found != parameters:
        warnings.warn(
            f"tf1_accum: {owner.__name__}.{name} takes ({found}) in TensorFlow "
            f"{_tensorflow.__version__}, not ({parameters}) as in the releases tf1_accum is "
            f"tested on ({TESTED}); tf1_accum leaves it as it is, so {_GUARDS[name]} is off.",
            stacklevel=3,
        )
        _mark(original)  # one warning per process
        return
    setattr(owner, name, _mark(functools.wraps(original)(make(original))))


def _mark(method: typing.Any) -> typing.Any:
    with contextlib.suppress(AttributeError, TypeError):  # a builtin takes no attribute
        method._tf1_accum_patched = True
    return method


def _parameters(method: typing.Any) -> list[str]:
    try:
        return list(inspect.signature(method).parameters)
    except (TypeError, ValueError):  # not a function
        return ["?"]


_GUARDS = {
    "__init__": "the refusal of two ops of one window fetched in one session.run",
    "end": "the warning of a session that ends mid-window without its hook",
    "on_epoch_end": "the warning of a Keras fit whose epochs end mid-window",
    "on_train_end": "the warning of a Keras fit whose epochs end mid-window",
}


def fetch_handler() -> type:
    """The class ``Session.run``, ``make_callable`` and ``partial_run`` read their fetches with."""
    from tensorflow.python.client import session

    return session._FetchHandler


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


# Collective ops (`CollectiveAllReduce`). TensorFlow 1.15 has only their first
# version: keys are attributes, the broadcast sends no bool (an int32 carries
# it), and a wait can be neither bounded nor cancelled (a session's
# operation_timeout_in_ms cancels the step, but the op waits on).

#: Whether ``CollectiveAllReduce(timeout=...)`` can end a wait for a lost worker.
COLLECTIVE_TIMEOUT = not TF1


def collective_sum(flat: typing.Any, key: int, attrs: dict, name: str) -> typing.Any:
    """The sum over the group of the 1-D ``flat``; ``attrs``: group_size, group_key, timeout."""
    if not TF1:
        reduce = functools.partial(tf.raw_ops.CollectiveReduceV2, ordering_token=[], **attrs)
    else:
        group = dict(group_size=attrs["group_size"], group_key=attrs["group_key"])
        reduce = functools.partial(tf.raw_ops.CollectiveReduce, subdiv_offsets=[0], **group)
    return reduce(input=flat, instance_key=key, merge_op="Add", final_op="Id", name=name)


def collective_broadcast(
    flat: typing.Any, send: bool, key: int, attrs: dict, name: str
) -> typing.Any:
    """The group leader's 1-D ``flat`` (``send``: this worker is the leader)."""
    shape, dtype = flat.shape.as_list(), flat.dtype.base_dtype
    if not TF1:
        if send:
            return tf.raw_ops.CollectiveBcastSendV2(
                input=flat, instance_key=key, name=name, **attrs
            )
        return tf.raw_ops.CollectiveBcastRecvV2(
            instance_key=key, shape=shape, T=dtype, name=name, **attrs
        )
    if dtype == tf.bool:
        sent = collective_broadcast(tf.cast(flat, tf.int32), send, key, attrs, name)
        return tf.not_equal(sent, 0)
    group = dict(group_size=attrs["group_size"], group_key=attrs["group_key"], shape=shape)
    if send:
        return tf.raw_ops.CollectiveBcastSend(input=flat, instance_key=key, name=name, **group)
    return tf.raw_ops.CollectiveBcastRecv(instance_key=key, T=dtype, name=name, **group)
