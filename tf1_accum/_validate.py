"""Argument checks the ways in run before building anything (the graph stays as it was)."""

from __future__ import annotations

import collections.abc
import contextlib
import math
import numbers
import os
import sys
import types
import typing
import warnings

import numpy as np
from tf1_accum._compat import tf

from tf1_accum import _compat, _keras


def describe(value: object) -> str:
    """Returns ``value`` and its type, for error messages."""
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} (a {type(value).__module__}.{type(value).__qualname__})"


def type_error(name: str, value: object, expected: str) -> TypeError:
    """The TypeError saying that ``name`` must be ``expected``, and what ``value`` is."""
    return TypeError(f"{name} must be {expected}, got {describe(value)}.")


def check_graph_mode(what: str) -> None:
    """Raises RuntimeError when eager execution is on."""
    if tf.executing_eagerly():
        raise RuntimeError(
            f"{what} builds TF1 graph-mode ops, but eager execution is active: call "
            "tf.compat.v1.disable_eager_execution() at program start, before any graph is built."
        )


def check_loss(loss: object) -> None:
    """Checks that ``loss`` is a scalar floating-point graph tensor."""
    _check_scalar("loss", loss, "floating-point", "the micro-batch's mean: tf.reduce_mean(...)")


def _check_scalar(
    name: str, value: object, kind: str, what: str, graph: tf.Graph | None = None
) -> None:
    """Checks that ``value`` is a scalar tensor (of ``graph``, if given) of ``kind``:
    ``"floating-point"`` or ``"real number"`` (integers too). ``what``: what it should hold."""
    if not isinstance(value, tf.Tensor) or not hasattr(value, "graph"):
        raise type_error(name, value, f"a scalar {kind} tf.Tensor of a graph ({what})")
    dtype = value.dtype.base_dtype
    if not (dtype.is_floating or (dtype.is_integer and kind == "real number")):
        raise TypeError(
            f"{name} must be a {kind} tensor ({what}), got {value.name} of dtype {dtype.name}: "
            f"cast it, e.g. tf.cast({name}, tf.float32)."
        )
    if value.shape.ndims not in (0, None):  # unknown: checked when run
        shape = value.shape.as_list()
        raise ValueError(f"{name} must be a scalar ({what}), got {value.name} of shape {shape}.")
    check_same_graph(f"{name} {value.name}", value.graph, graph)


def check_instance(optimizer: object) -> None:
    """Raises TypeError, saying to make one, if ``optimizer`` is an optimizer's class."""
    if isinstance(optimizer, type) and hasattr(optimizer, "apply_gradients"):
        raise TypeError(
            f"optimizer must be an optimizer instance, got the class {optimizer.__module__}."
            f"{optimizer.__qualname__} itself: pass {optimizer.__name__}(learning_rate=...)."
        )


def check_optimizer(optimizer: object) -> tf.compat.v1.train.Optimizer:
    """Returns ``optimizer`` checked (a tf_keras legacy one behind a ``KerasOptimizerAdapter``)."""
    check_instance(optimizer)
    adapted = _keras.adapt(optimizer)
    if adapted is not None:
        return adapted
    raise TypeError(
        _compat.keras_names(
            "optimizer must be a tf.compat.v1.train.Optimizer or a tf_keras legacy optimizer "
            f"(tf_keras.optimizers.legacy.Adam, ...), got {describe(optimizer)}."
        )
        + _keras.refusal_hint(optimizer)
    )


def check_var_list(var_list: object, graph: tf.Graph) -> list[tf.Variable]:
    """Returns the variables to train (None: ``graph``'s trainable ones) as a list, checked."""
    if var_list is None:
        keys = tf.compat.v1.GraphKeys
        found = graph.get_collection(keys.TRAINABLE_VARIABLES)
        found += graph.get_collection(keys.TRAINABLE_RESOURCE_VARIABLES)
        # Resource variables can sit in both collections.
        var_list = list({id(v): v for v in found}.values())
        if not var_list:
            raise ValueError(
                "No variables to train: the loss's graph has no trainable variables. "
                "Build the model first, or pass var_list."
            )
        return var_list
    if not is_list(var_list, tf.Variable):
        raise type_error("var_list", var_list, "a list of tf.Variable or None")
    var_list = list(var_list)
    if not var_list:
        raise ValueError("var_list is empty: expected at least one tf.Variable.")
    for i, v in enumerate(var_list):
        if not isinstance(v, tf.Variable):
            raise type_error(f"var_list[{i}]", v, "a tf.Variable")
        check_same_graph(f"var_list[{i}] {v.op.name}", v.graph, graph)
    return var_list


def is_list(value: object, *items: type) -> typing.TypeGuard[typing.Iterable[typing.Any]]:
    """Whether ``value`` is an iterable of items: not a string, nor one of ``items`` itself."""
    return isinstance(value, collections.abc.Iterable) and not isinstance(value, (str, *items))


def check_global_step(global_step: object, graph: tf.Graph | None = None) -> None:
    """Checks that ``global_step`` is None or an integer variable (of ``graph``, if given)."""
    if global_step is None:
        return
    if not isinstance(global_step, tf.Variable):
        raise type_error("global_step", global_step, "an integer tf.Variable or None")
    dtype = global_step.dtype.base_dtype
    if not dtype.is_integer:
        raise TypeError(
            f"global_step must be an integer variable, got {global_step.op.name} of {dtype.name}."
        )
    check_same_graph(f"global_step {global_step.op.name}", global_step.graph, graph)


def check_same_graph(label: str, graph_of: tf.Graph, graph: tf.Graph | None) -> None:
    """Raises ValueError if ``graph_of``, the graph of ``label``, is not ``graph`` (if given)."""
    if graph is not None and graph_of is not graph:
        raise ValueError(f"{label} is not in the graph of the loss: build it in that graph.")


def check_bool(name: str, value: object) -> None:
    """Checks that ``value`` is a Python bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise type_error(name, value, "True or False")


def check_weight(weight: object, graph: tf.Graph) -> None:
    """Checks that ``weight`` is None or a scalar real tensor of ``graph``."""
    if weight is None:
        return
    what = "computed from each micro-batch, e.g. its size"
    _check_scalar("weight", weight, "real number", what, graph)


def check_statistics_options(statistics: object, micro_batch_size: object, weighted: bool) -> None:
    """Checks ``statistics=`` and ``micro_batch_size=``; ``weighted``: a weight was given."""
    check_bool("statistics", statistics)
    if micro_batch_size is None:
        if statistics and not weighted:
            raise ValueError(
                "statistics=True needs micro_batch_size= (examples per micro-batch) or weight=."
            )
        return
    check_positive("micro_batch_size", micro_batch_size, "a positive number of examples")
    if not statistics:
        raise ValueError(
            "micro_batch_size is used only by the gradient statistics: add statistics=True."
        )
    if weighted:
        raise ValueError("Pass weight= or micro_batch_size=, not both (weight= sets the size).")


def check_clip_norm(clip_norm: object) -> None:
    """Checks that ``clip_norm`` is None or a positive, finite number."""
    if clip_norm is not None:
        check_positive("clip_norm", clip_norm, "a positive, finite number or None (no clipping)")


def check_positive(name: str, value: object, expected: str) -> None:
    """Checks that ``value`` is a positive, finite real number (not a bool): ``expected``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise type_error(name, value, expected)
    # A numbers.Real, which typeshed gives no comparison with an int.
    number = typing.cast(float, value)
    if not (number > 0 and math.isfinite(number)):
        raise ValueError(f"{name} must be {expected}, got {value}.")


def check_update_ops(
    update_ops: object, graph: tf.Graph | None = None
) -> list[tf.Operation] | None:
    """Returns ``update_ops`` as a list of ops (of ``graph``, if given), or None for the default."""
    if update_ops is None:
        return None
    if not is_list(update_ops, tf.Operation, tf.Tensor, tf.Variable):
        expected = "None (the graph's UPDATE_OPS) or a list of tf.Operation or tf.Tensor"
        raise type_error("update_ops", update_ops, expected + " ([] for none)")
    ops = []
    for i, item in enumerate(update_ops):
        op = graph_op(item)
        if op is None:
            raise type_error(f"update_ops[{i}]", item, "a tf.Operation or tf.Tensor of a graph")
        check_same_graph(f"update_ops[{i}] {op.name}", op.graph, graph)
        ops.append(op)
    return ops


def graph_op(item: object) -> tf.Operation | None:
    """``item`` if an op, else the graph op of a tensor or an assign's result; None for
    anything else (an eager tensor has none)."""
    op = item
    if isinstance(item, (tf.Tensor, tf.Variable)):
        with contextlib.suppress(AttributeError, NotImplementedError):
            op = item.op
    return op if isinstance(op, tf.Operation) else None


def check_not_under_sync_replicas(
    grads_and_vars: typing.Iterable[tuple[tf.Tensor | tf.IndexedSlices | None, tf.Variable]],
) -> None:
    """Refuses gradients a ``SyncReplicasOptimizer`` aggregated (a ``ConditionalAccumulator``'s)."""
    for gradient, var in grads_and_vars:
        values = getattr(gradient, "values", gradient)
        op = getattr(values, "op", None)
        # A SyncReplicasOptimizer's gradient accumulators hand their aggregate out by
        # AccumulatorTakeGradient, or its Resource or Sparse form.
        if op is not None and op.type.endswith("AccumulatorTakeGradient"):
            raise ValueError(
                "SyncReplicasOptimizer cannot wrap an AccumulationOptimizer: the gradient of "
                f"{var.op.name} comes from its {op.type}, and micro-batch 2 would wait forever. "
                "Nest them the other way round, AccumulationOptimizer(SyncReplicasOptimizer(opt, "
                "...), steps) (docs: Across several machines)."
            )


def check_steps(steps: object) -> None:
    """Checks that ``steps`` is an int of at least 1."""
    check_int("steps", steps, " (micro-batches per update)")


def check_int(name: str, value: object, unit: str = "", least: int | None = 1) -> None:
    """Checks that ``value`` is an int (not a bool) of at least ``least`` (None: any int).

    ``unit`` says what it counts, e.g. ``" (windows)"``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise type_error(name, value, f"an int{unit}")
    if least is not None and value < least:
        raise ValueError(f"{name} must be at least {least}{unit}, got {value}.")


def check_feed_dict(label: str, feed_dict: object) -> None:
    """Checks one feed: a mapping, or None for no feed. ``label`` names it."""
    if feed_dict is not None and not isinstance(feed_dict, collections.abc.Mapping):
        raise type_error(label, feed_dict, "a dict (or None for a run that needs no feed)")


def check_session_graph(sess: object, graph: tf.Graph, what: str) -> None:
    """Raises ValueError if ``sess`` runs another graph than ``graph``, the graph of ``what``.

    Running would fail in TensorFlow with a message that names neither graph
    (and, after a failed micro-batch, would leave the window unknown).
    """
    session_graph = getattr(sess, "graph", None)  # a session wrapper may have none: let it run
    if session_graph is None or session_graph is graph:
        return
    ops = len(session_graph.get_operations())
    raise ValueError(
        f"sess runs another graph than {what}: {what} was built in a graph of "
        f"{len(graph.get_operations())} ops, the session runs a graph of {ops} ops. Make "
        "the session with tf.compat.v1.Session(graph=graph), or inside graph.as_default()."
    )


def check_trainable(loss: tf.Tensor, var_list: typing.Sequence[tf.Variable]) -> None:
    """Checks that ``loss`` reads a variable of ``var_list``, and those it reads have full shapes.

    Nothing is built: no gradient is taken.
    """
    read = _ancestors(loss.op)
    reached = [v for v in var_list if v.op in read]
    if not reached:
        raise _no_gradients([v.op.name for v in var_list], loss)
    check_shapes(reached)


def _no_gradients(names: list[str], loss: tf.Tensor | None) -> ValueError:
    of_loss = "" if loss is None else f" {loss.name}"
    return ValueError(
        f"No gradients provided for any variable: {names}. Check the graph for ops that do not "
        f"support gradients between these variables and the loss{of_loss}, or pass var_list."
    )


def check_shapes(variables: typing.Iterable[tf.Variable]) -> None:
    """Checks that every variable has a fully defined shape (for its accumulator)."""
    for var in variables:
        if not var.shape.is_fully_defined():
            raise ValueError(
                f"Variable {var.op.name} has shape {var.shape}, which is not fully defined: give "
                "it a static shape (for its accumulator), or leave it out of var_list."
            )


def _ancestors(op: tf.Operation, known: typing.Container[str] = ()) -> set[tf.Operation]:
    """Every op reaching ``op`` through data inputs and captures, stopping before ``known``."""
    seen = {op}
    stack = [op]
    captured = {}  # per function graph: placeholder op -> the outer tensor
    while stack:
        current = stack.pop()
        inputs = [t.op for t in current.inputs]
        if current.type == "Placeholder" and hasattr(current.graph, "captures"):
            graph = current.graph
            if graph not in captured:
                captured[graph] = {inner.op: outer for outer, inner in graph.captures}
            if current in captured[graph]:
                inputs.append(captured[graph][current].op)
        for input_op in inputs:
            if input_op not in seen and input_op.name not in known:
                seen.add(input_op)
                stack.append(input_op)
    return seen


def usable_gradients(
    grads_and_vars: typing.Iterable[tuple[tf.Tensor | tf.IndexedSlices | None, tf.Variable]],
    loss: tf.Tensor | None = None,
) -> list[tuple[tf.Tensor | tf.IndexedSlices, tf.Variable]]:
    """The pairs whose gradient is not None; warns of the others, refuses none at all."""
    grads_and_vars = list(grads_and_vars)
    missing = [v.op.name for g, v in grads_and_vars if g is None]
    pairs = [(g, v) for g, v in grads_and_vars if g is not None]
    of_loss = "" if loss is None else f" for loss {loss.name}"
    if not pairs:
        raise _no_gradients(missing, loss)
    if missing:
        warnings.warn(
            f"tf1_accum: these variables have no gradient{of_loss} and are left "
            f"untouched: {', '.join(missing)}.",
            stacklevel=_caller_stacklevel(),  # a UserWarning
        )
    return pairs


_LIBRARY_DIRS = (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
    os.path.join(_compat.tensorflow_dir(), ""),
    os.path.join(os.path.dirname(_compat.tensorflow_dir()), "tf_keras", ""),
)


def warn_of_other_models(
    update_ops: typing.Sequence[tf.Operation | tf.Tensor], reads: typing.Container[str], runner: str
) -> None:
    """Warns of an op of ``UPDATE_OPS`` needing a feed the loss does not read (another model's).

    ``reads``: the names of the ops the loss (and weight) reads; ``runner``:
    what runs the update ops with each micro-batch (``"the train op of ..."``).
    """
    for update in update_ops:
        # UPDATE_OPS may hold tensors too (an assign's value, a moving average's).
        op = getattr(update, "op", update)
        fed = sorted(o.name for o in _ancestors(op, known=reads) if o.type == "Placeholder")
        if fed:
            warnings.warn(
                f"tf1_accum: the update op {op.name} of UPDATE_OPS, which {runner} runs with "
                f"each micro-batch (update_ops=None), needs placeholder {', '.join(fed)} fed, "
                "which the loss does not read: it is another model's, and each run would fail. "
                "Pass update_ops= this model's ops (get_collection(UPDATE_OPS, scope)), or [].",
                stacklevel=_caller_stacklevel(),  # a UserWarning
            )
            return


def _caller_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside tf1_accum, TensorFlow and tf_keras."""
    frame: types.FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_LIBRARY_DIRS):
        frame, level = frame.f_back, level + 1
    return level


@contextlib.contextmanager
def restored_on_failure(graph: tf.Graph, what: str) -> typing.Iterator[None]:
    """Puts the graph's collections back if the build inside raises; the error says what stays.

    The control inputs the build added to ops of the graph go too: a user's
    update op made to wait for a weight's check would otherwise wait, in a
    later build's run, for variables no initializer sets.
    """
    kept = {key: list(graph.get_collection(key)) for key in graph.get_all_collection_keys()}
    ops_before = len(graph.get_operations())
    names_before = set(_compat.variable_store(graph))
    try:
        # The control inputs a build added to ops it did not create go too.
        with _compat.control_inputs_restored_on_failure():
            yield
    except Exception as error:
        # Names tf.compat.v1.get_variable gave (a transform's variable): free for a retry.
        store = _compat.variable_store(graph)
        for name in set(store) - names_before:
            del store[name]
        keys = tf.compat.v1.GraphKeys
        variables = (keys.GLOBAL_VARIABLES, keys.LOCAL_VARIABLES)
        kept_ids = {id(v) for key in variables for v in kept.get(key, ())}
        made = [v for key in variables for v in graph.get_collection(key)]
        made = [v.op.name for v in made if id(v) not in kept_ids]
        for key in graph.get_all_collection_keys():
            if key in kept:
                graph.get_collection_ref(key)[:] = kept[key]
            elif not key.startswith("__"):  # TensorFlow's variable store and scope stay
                graph.clear_collection(key)
        built = len(graph.get_operations()) - ops_before
        if built or made:
            note = f"tf1_accum: {what} failed after building {built} ops, which stay unused"
            note += "; the graph's collections are as they were"
            if made:
                note += f", without the variables it made ({', '.join(made)}), whose names are free"
            _add_note(error, note + ".")
        if isinstance(error, AttributeError) and KERAS_3_SYMPTOM in str(error):
            _add_note(error, KERAS_3_HINT)
        raise


# With Keras 3 (TensorFlow 2.16+), tf.compat.v1.layers raise "`dense` is not available...".
KERAS_3_SYMPTOM = "is not available with Keras 3"
KERAS_3_HINT = (
    "tf1_accum: tf.compat.v1.layers needs Keras 2 on TensorFlow 2.16 and newer: pip install "
    "tf_keras (the release of your TensorFlow) and set TF_USE_LEGACY_KERAS=1 before TensorFlow "
    'is imported (os.environ["TF_USE_LEGACY_KERAS"] = "1" at the top of the script).'
)


def _add_note(error: BaseException, note: str) -> None:
    if hasattr(error, "add_note"):  # Python 3.11
        error.add_note(note)
    elif isinstance(error, (ValueError, TypeError, AttributeError)) and len(error.args) == 1:
        error.args = (f"{error.args[0]}\n{note}",)
