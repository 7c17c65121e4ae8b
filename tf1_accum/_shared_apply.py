"""One optimizer's apply, built as often as a way in needs it, over one state.

A flush or a fused apply builds ``apply_gradients`` again; a BERT-style
optimizer creating its state inside it would fail or make a second state.
`SharedApply` hands the first build's variables to every later one, creates
them in ``init_scope`` and advances ``global_step`` once per update.
"""

from __future__ import annotations

import contextlib
import functools
import typing

import numpy as np
from tf1_accum._compat import control_flow_context, tf

from tf1_accum._options import Pairs
from tf1_accum._wrapping import counts_its_own_steps

_T = typing.TypeVar("_T")
_Make = typing.Callable[..., tf.Variable]  # a variable creator, or a getter


class SharedApply:
    """Builds ``optimizer.apply_gradients`` any number of times over one state."""

    def __init__(self, optimizer: tf.compat.v1.train.Optimizer) -> None:
        self.optimizer = optimizer
        # What the first build created ((name asked for, variable) pairs) and got by name.
        self._recorded: tuple[list, dict[str, tf.Variable]] | None = None

    def apply_gradients(
        self, grads_and_vars: Pairs, global_step: tf.Variable | None = None
    ) -> tf.Operation:
        """Builds one update op: the optimizer's apply, and ``global_step`` + 1.

        Keeps the ops of a conditional's branch out of the graph's ``TRAIN_OP``
        collection: a branch op there makes an exported ``SavedModel`` or
        ``.meta`` fail to load.
        """
        with tf.init_scope():
            graph = tf.compat.v1.get_default_graph()
        try:
            return self.build(lambda: self._apply(grads_and_vars, global_step))
        finally:
            train_ops = graph.get_collection_ref(tf.compat.v1.GraphKeys.TRAIN_OP)
            train_ops[:] = [op for op in train_ops if getattr(op, "graph", graph) is graph]

    def build(self, make: typing.Callable[[], _T]) -> _T:
        """Returns ``make()``, built over the variables its first build created."""
        first = self._recorded is None
        created, got = self._recorded or ([], {})
        from_get = {id(v) for v in got.values()}
        pending = [(name, v) for name, v in created if id(v) not in from_get]

        def create(next_creator: _Make, **kwargs: typing.Any) -> tf.Variable:
            name = kwargs.get("name")
            if first:
                _check_liftable(self.optimizer, kwargs)
                with tf.init_scope():
                    var = next_creator(**kwargs)
                created.append((name, var))
                return var
            if not pending:  # nothing is created twice
                self._mismatch("no other variable", f"a new variable {name!r}")
            first_name, var = pending.pop(0)
            shape = _requested_shape(kwargs)
            dtype = kwargs.get("dtype")
            if (
                first_name != name
                or (shape is not None and not var.shape.is_compatible_with(shape))
                or (dtype is not None and tf.as_dtype(dtype).base_dtype != var.dtype.base_dtype)
            ):
                self._mismatch(_describe(first_name, var), f"variable {name!r}")
            return var

        def get(getter: _Make, name: str, *args: typing.Any, **kwargs: typing.Any) -> tf.Variable:
            if first:
                var = got[name] = getter(name, *args, **kwargs)
                return var
            var = got.get(name)
            if var is None:
                self._mismatch(f"no variable {name!r}", f"get_variable({name!r}) of a new one")
            # get_variable fills in a default dtype: only the shape is compared.
            shape = kwargs.get("shape")
            if shape is not None and not var.shape.is_compatible_with(shape):
                self._mismatch(_describe(name, var), f"{name!r} of shape {shape}")
            return var

        with _intercepting(create, get):
            result = make()
        self._recorded = (created, got)
        return result

    def _apply(self, grads_and_vars: Pairs, global_step: tf.Variable | None) -> tf.Operation:
        if global_step is None or counts_its_own_steps(self.optimizer):
            return self.optimizer.apply_gradients(grads_and_vars, global_step=global_step)
        # Ours only if its apply built none; an add, for workers sharing the step.
        graph = tf.compat.v1.get_default_graph()
        before = len(graph.get_operations())
        update = self.optimizer.apply_gradients(grads_and_vars, global_step=global_step)
        if any(_writes(op, global_step) for op in graph.get_operations()[before:]):
            return update
        with tf.control_dependencies([update]):
            advance = global_step.assign_add(1, use_locking=True, read_value=False)
        return tf.group(update, advance)

    def _mismatch(self, first: str, now: str) -> typing.NoReturn:
        raise ValueError(
            f"tf1_accum: the optimizer {type(self.optimizer).__name__} creates different state "
            f"each time its apply_gradients is built: the first build created {first}, this one "
            f"asks for {now}. Create the same variables in every call, or use apply_op with "
            "fused=False."
        )


@contextlib.contextmanager
def _intercepting(create: _Make, get: _Make) -> typing.Iterator[None]:
    """Routes variable creation through ``create`` and ``get_variable`` through ``get``.

    ``get_variable`` checks its store before any creator runs: a custom getter.
    """
    # Set on the current scope, not by re-entering it: leaving a re-entered
    # scope resets its counts, and the next optimizer would get "w/Momentum"
    # again (already exists) instead of "w/Momentum_1".
    scope = tf.compat.v1.get_variable_scope()
    outer = scope.custom_getter

    def getter(getter: _Make, *args: typing.Any, **kwargs: typing.Any) -> tf.Variable:
        # TensorFlow passes every argument by name.
        if outer is not None:
            getter = functools.partial(outer, getter)
        return get(getter, *args, **kwargs)

    with tf.variable_creator_scope(create):
        scope.set_custom_getter(getter)
        try:
            yield
        finally:
            scope.set_custom_getter(outer)


_WRITES = frozenset({"Assign", "AssignAdd", "AssignVariableOp", "AssignAddVariableOp"})
# What a variable passes through into a conditional's branch.
_INTO_BRANCH = frozenset({"Switch", "RefSwitch", "Identity", "RefIdentity"})


def _writes(op: tf.Operation, variable: tf.Variable) -> bool:
    """Whether ``op`` assigns ``variable`` (through a conditional's branch, or captured)."""
    if op.type not in _WRITES or not op.inputs:
        return False
    tensor = op.inputs[0]
    for _ in range(8):
        if tensor.op is variable.op:  # a resource variable's op is its handle's
            return True
        if tensor.op.type in _INTO_BRANCH:
            tensor = tensor.op.inputs[0]
            continue
        outer = {id(inner): ext for ext, inner in getattr(tensor.graph, "captures", ())}
        if id(tensor) not in outer:
            return False
        tensor = outer[id(tensor)]
    return False


def _check_liftable(optimizer: object, kwargs: typing.Mapping[str, typing.Any]) -> None:
    """Refuses an initial value computed inside the conditional the apply is built in."""
    value = kwargs.get("initial_value")
    if not isinstance(value, tf.Tensor):
        return
    with tf.init_scope():
        outer = tf.compat.v1.get_default_graph()
    if value.graph is not outer or control_flow_context(value.op) is not None:
        raise ValueError(
            f"tf1_accum: the optimizer {type(optimizer).__name__} creates variable "
            f"{kwargs.get('name')!r} inside apply_gradients from a tensor computed there "
            f"({value.name}), in a conditional. Pass a callable instead (tf.Variable(lambda: "
            "tf.zeros(shape))), an initializer, or create the state in _create_slots."
        )


def _requested_shape(kwargs: typing.Mapping[str, typing.Any]) -> tf.TensorShape | None:
    """The shape a creation asks for, when it is known without building anything."""
    if kwargs.get("shape") is not None:
        return tf.TensorShape(kwargs["shape"])
    value = kwargs.get("initial_value")
    if value is None or callable(value):
        return None
    return tf.TensorShape(np.shape(value))  # a tensor's own shape, or a Python value's


def _describe(name: str | None, var: tf.Variable) -> str:
    return f"variable {name!r} ({var.op.name}, shape {var.shape}, {var.dtype.base_dtype.name})"
