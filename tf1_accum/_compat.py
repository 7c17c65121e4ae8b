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


# A version 2 If or While's function graphs: (attribute of the op, attribute naming the function).
_BODIES = dict.fromkeys(
    ["If", "StatelessIf"], [("_true_graph", "then_branch"), ("_false_graph", "else_branch")]
)
_BODIES.update(
    dict.fromkeys(["While", "StatelessWhile"], [("_cond_graph", "cond"), ("_body_graph", "body")])
)


def function_bodies(op: _tensorflow.Operation) -> list[_tensorflow.Graph]:
    """The function graphs of a version 2 ``If`` or ``While`` built in this process, else []."""
    if TF1:  # 1.15 keeps them in the graph's function library only
        found = [
            op.graph._get_function(op.get_attr(name).name) for _, name in _BODIES.get(op.type, ())
        ]
        return [function.graph for function in found if function is not None]
    graphs = [getattr(op, name, None) for name, _ in _BODIES.get(op.type, ())]
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
    "_make_callable_from_options": "the refusal of two ops of one window in one Keras function",
    "end": "the warning of a session that ends mid-window without its hook",
    "on_epoch_end": "the warning of a Keras fit whose epochs end mid-window",
    "on_train_end": "the warning of a Keras fit whose epochs end mid-window",
}


def fetch_handler() -> type:
    """The class ``Session.run``, ``make_callable`` and ``partial_run`` read their fetches with."""
    from tensorflow.python.client import session

    return session._FetchHandler


def guard_runs(check: typing.Callable[[typing.Any, list, list], None]) -> None:
    """Makes every step a session runs call ``check(graph, ops, tensors)`` (its fetches) first.

    ``Session.run``, ``make_callable`` and ``partial_run`` read their fetches
    with the fetch handler; Keras makes its callables from options, whose
    targets (``tf.group`` of the updates) are op names.
    """
    from tensorflow.python.client import session

    def handler(original: typing.Any) -> typing.Any:
        def init(
            self: typing.Any, graph: typing.Any, *args: typing.Any, **kwargs: typing.Any
        ) -> None:
            original(self, graph, *args, **kwargs)
            check(graph, self.targets(), self.fetches())

        return init

    def from_options(original: typing.Any) -> typing.Any:
        def make(self: typing.Any, options: typing.Any) -> typing.Any:
            graph = self.graph
            ops = [graph.get_operation_by_name(name) for name in options.target]
            check(graph, ops, [graph.get_tensor_by_name(name) for name in options.fetch])
            return original(self, options)

        return make

    patch(fetch_handler(), "__init__", "self graph fetches feeds feed_handles", handler)
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
