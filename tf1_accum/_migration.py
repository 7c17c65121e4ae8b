"""What a migrated program does wrong around the optimizer, caught where a way in sees it.

`refuse_accumulating_optimizer`, `warn_if_clipped` and `WindowStart` (a
``global_step`` moving mid-window); :ref:`migration-checklist` lists them all.
"""

from __future__ import annotations

import re
import typing
import warnings

from tf1_accum._compat import control_flow_context, function_bodies, tf

from tf1_accum import _guard, _validate
from tf1_accum._locking import values_of
from tf1_accum._options import Gradient, Pairs
from tf1_accum._state import STATE_COLLECTION, state_variable
from tf1_accum._window import _make_local


def refuse_accumulating_optimizer(optimizer: tf.compat.v1.train.Optimizer, what: str) -> None:
    """Refuses an `AccumulationOptimizer` (or Keras one) given to ``what``, which accumulates."""
    from tf1_accum._keras import given

    optimizer = given(optimizer)
    # Known by its class along the MRO: tf1_accum._optimizer imports this module.
    if any(
        (c.__module__, c.__qualname__) == ("tf1_accum._optimizer", "AccumulationOptimizer")
        for c in type(optimizer).__mro__
    ):
        kind, how = "AccumulationOptimizer", "as a drop-in: opt.minimize(loss, global_step=...)"
    elif getattr(type(optimizer), "_tf1_accum_accumulates", False):
        # A KerasAccumulationOptimizer, known by its mark: tf_keras stays unimported.
        kind, how = "KerasAccumulationOptimizer", "compiled into a tf_keras model"
    else:
        return
    inner = type(optimizer.optimizer).__name__
    raise TypeError(
        f"{what} accumulates by itself, but its optimizer is {'an' if kind[0] == 'A' else 'a'} "
        f"{kind} (steps={optimizer.steps}) wrapping {inner}: each update of {what} only adds to "
        f"the {kind}'s window, which applies nothing until it is full, so the weights would not "
        f"change while global_step advances. Give {what} the "
        f"wrapped optimizer (opt.optimizer, the {inner}), or use the {kind} alone, {how}."
    )


# A name scope of TensorFlow's clipping functions: ``clip_by_global_norm``,
# ``clip_by_global_norm_1``... anywhere in an op's name.
_CLIP_SCOPE = re.compile(r"^(clip_by_global_norm|clip_by_norm|clip_by_value)(?:_\d+)?$")
# Ops a clipped gradient may pass through unchanged on its way to the optimizer.
_PASS_THROUGH = frozenset({"Identity", "Cast", "Reshape", "CheckNumerics"})


def _clipped_by(gradient: Gradient) -> str | None:
    """The clipping function whose output ``gradient`` is, or None."""
    op = getattr(values_of(gradient), "op", None)
    for _ in range(8):
        if not isinstance(op, tf.Operation):
            return None
        scopes = [m.group(1) for m in map(_CLIP_SCOPE.match, op.name.split("/")) if m]
        if scopes:
            return scopes[0]
        if op.type not in _PASS_THROUGH or not op.inputs:
            return None
        op = op.inputs[0].op
    return None


def warn_if_clipped(pairs: Pairs, clip_norm: float | None) -> None:
    """Warns of gradients clipped per micro-batch before `AccumulationOptimizer.apply_gradients`."""
    found = [(_clipped_by(gradient), var.op.name) for gradient, var in pairs]
    if all(how is None for how, _ in found):
        return
    # One clipping function is named (the first by name), with the variables it clipped.
    how = min(how for how, _ in found if how is not None)
    names = [name for clipped, name in found if clipped == how]
    if how != "clip_by_global_norm":
        fix = "Clip the window's mean inside the wrapped optimizer's apply_gradients instead."
    elif clip_norm is None:
        fix = (
            "Pass the unclipped gradients and AccumulationOptimizer(..., clip_norm=c), which "
            "clips the window's mean to that global norm."
        )
    else:
        fix = f"clip_norm={clip_norm} already clips the window's mean: remove the tf.{how}."
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    warnings.warn(
        f"tf1_accum: the gradients given to AccumulationOptimizer.apply_gradients ({shown}) "
        f"come from tf.{how}, so each micro-batch is clipped on its own, not the large "
        f"batch's gradient once. {fix}",
        stacklevel=_validate._caller_stacklevel(),
    )


class WindowStart:
    """``global_step`` at a window's first micro-batch: `check` stops a run where it moved.

    A step shared on a parameter server moves with the other workers' updates:
    there `hand_written` looks in the graph instead.
    """

    def __init__(self, global_step: tf.Variable, counter: tf.Variable, scope: str) -> None:
        self.global_step = global_step
        self.counter = counter
        self.scope = scope
        here = tf.DeviceSpec.from_string(counter.device or "")
        there = tf.DeviceSpec.from_string(global_step.device or "")
        self.shared = bool(there.job) and (there.job, there.task) != (here.job, here.task)
        # Ops of the wrapper's own built outside the conditional (a synchronous update).
        self.own: set[str] = set()
        self.applied: tf.Tensor | None = None  # the train op's, once built
        # The op a write of the step takes as input 0: the variable, or its resource handle.
        handle = getattr(global_step, "handle", None)
        self.target = global_step.op if handle is None else handle.op
        dtype = global_step.dtype.base_dtype
        with tf.compat.v1.name_scope(scope), tf.device(counter.device):
            self.variable = state_variable(
                lambda: tf.constant(0, dtype), "global_step_at_window_start"
            )
        local = counter.graph.get_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES)
        if any(v is counter for v in local):
            # The window's state is local to the worker (replica_device_setter): so is this.
            _make_local([self.variable])

    def given(self) -> tuple[tf.Operation, tf.Tensor]:
        """(the step's variable op, ``applied``), kept in `APPLIED_WITH_STEP` as names."""
        assert self.applied is not None
        return self.target, self.applied

    def check(self, steps: int) -> tf.Operation:
        """The op to run before a micro-batch is added: record, or check, the step."""
        with tf.compat.v1.name_scope(self.scope):
            if self.shared:
                return tf.no_op(name="global_step_shared")
            count = tf.identity(self.counter.read_value(), name="micro_batches_before")
            step = tf.identity(self.global_step.read_value(), name="global_step_now")
            start = tf.identity(self.variable.read_value(), name="global_step_at_start")
            empty = tf.equal(count, 0)
            unmoved = tf.logical_or(empty, tf.equal(step, start))
            message = (
                "tf1_accum: global_step moved in the middle of an accumulation window: the "
                f"wrapper advances it once per update (every {steps} runs of the train op), and "
                f"something else too, {_HAND_WRITTEN}. {_ONE_INCREMENT} This micro-batch was not "
                "accumulated. Values: global_step at the window's start, global_step now, "
                "micro-batches in the window:"
            )
            checked = _guard.refuse_unless(
                unmoved, message, start, step, count, name="global_step_unmoved", summarize=3
            )
            with tf.control_dependencies([checked]):
                record = self.variable.assign(
                    tf.where(empty, step, start), use_locking=True, read_value=False
                )
            return tf.group(record, name="record_global_step")

    def hand_written(self) -> list[str]:
        """The ops outside control flow adding to ``global_step`` (an apply's are inside)."""
        step = self.global_step
        skipped = self.own | {step.initializer.name}
        found = []
        for op in step.graph.get_operations():
            if op.type not in _STEP_WRITES or op.inputs[0].op is not self.target:
                continue
            if control_flow_context(op) is not None or op.name in skipped:
                continue
            if op.type.startswith("AssignAdd") or _reads(op.inputs[1], self.target):
                found.append(op.name)
        return found


def refuse_hand_written(starts: typing.Sequence[WindowStart | None]) -> None:
    """Refuses a hand-written increment beside the wrapper's own (`hung_on_applied`).

    On a shared ``global_step``, any one outside control flow (`hand_written`) too.
    """
    for start in starts:
        hung = [] if start is None or start.applied is None else hung_on_applied(*start.given())
        if start is not None and hung:
            raise ValueError(twice_per_update(hung[0], start.global_step.op.name))
        found = [] if start is None or not start.shared else start.hand_written()
        if start is not None and found:
            step = start.global_step
            raise ValueError(
                f"tf1_accum: {found[0]!r} adds to global_step ({step.op.name}, shared by "
                f"the workers on {step.device}) besides AccumulationOptimizer, which "
                f"advances it once per update: {_HAND_WRITTEN}, which would count every "
                f"micro-batch of every worker. {_ONE_INCREMENT}"
            )


def hung_on_applied(step: tf.Operation, applied: tf.Tensor) -> list[str]:
    """The writes to the variable op ``step`` in a ``tf.cond`` on a window's ``applied``.

    By name: the write, or the version 2 ``If`` whose branch writes.

    A wrapper given that step advances it in the same updates: each counts twice.
    """
    found = []
    for op in step.graph.get_operations():
        pred = getattr(control_flow_context(op), "pred", None)  # of a version 1 tf.cond
        if op.type in _STEP_WRITES and pred is not None and _reads(pred, applied.op):
            if _variable_of(op.inputs[0]) is step:
                found.append(op.name)
        if op.type in ("If", "StatelessIf") and _reads(op.inputs[0], applied.op):
            for body in function_bodies(op):  # a version 2 tf.cond
                outer = dict(zip([t.op for t in body.inputs], op.inputs[1:]))
                for inner in body.get_operations():
                    handle = outer.get(inner.inputs[0].op) if inner.type in _STEP_WRITES else None
                    if handle is not None and _variable_of(handle) is step:
                        found.append(op.name)
    return found


def counted_twice(graph: tf.Graph) -> list[tuple[str, str, str]]:
    """(increment, applied, step) names of each `hung_on_applied` beside the wrapper's own.

    Read from `APPLIED_WITH_STEP`, so a graph imported again keeps it.
    """
    found = []
    entries = graph.get_collection(APPLIED_WITH_STEP)
    ops = {op.name: op for op in graph.get_operations()} if entries else {}
    for entry in entries:
        applied, step = tf.compat.as_str(entry).split(" ")
        # import_meta_graph(import_scope=...) prefixes an entry's first name only.
        parts = applied.split("/")
        scoped = ["/".join(parts[:i] + [step]) for i in range(len(parts))]
        step_op = next((ops[name] for name in scoped if name in ops), None)
        if step_op is not None:
            for name in hung_on_applied(step_op, graph.get_tensor_by_name(applied)):
                found.append((name, applied, step_op.name))
    return found


def _counted_twice_in_runs(graph: tf.Graph) -> tuple[str, set[str]] | None:
    """`counted_twice` for the guard: refuses every run of the train op or the increment."""
    hung = counted_twice(graph)
    return (twice_per_update(hung[0][0], hung[0][2]), {h[0] for h in hung}) if hung else None


# Caught in every run, in a loop that neither the wrapper's hook nor check_graph sees.
_guard.GRAPH_CHECKS.append(_counted_twice_in_runs)


def twice_per_update(increment: str, step: str) -> str:
    """Why an increment of ``step`` hung on ``window.applied`` beside the wrapper's is refused."""
    return (
        f"tf1_accum: {increment} increments global_step ({step}) in a tf.cond on window.applied, "
        "and AccumulationOptimizer, given that global_step (minimize(..., global_step=...)), "
        f"increments it with each update too: every update would count twice. {_ONE_INCREMENT}"
    )


def _variable_of(tensor: tf.Tensor) -> tf.Operation:
    """The op that ``tensor`` hands on unchanged through a version 1 conditional, or its own."""
    op = tensor.op
    while op.type in ("Switch", "RefSwitch", "Identity", "RefIdentity", "Enter") and op.inputs:
        op = op.inputs[0].op
    return op


#: Graph collection of "applied step" names: a wrapper's ``window.applied``, and
#: the variable op of the ``global_step`` it was given (which `check_graph` reads).
APPLIED_WITH_STEP = "tf1_accum_applied_with_step"

_HAND_WRITTEN = "typically a global_step.assign(global_step + 1) grouped with the train op"
_ONE_INCREMENT = (
    "Keep one: delete that increment, or give the wrapper no global_step and increment with "
    "global_step.assign_add(1) in tf.cond(opt.window.applied, ...) "
    "(docs: Real programs, Per-update work)."
)
_STEP_WRITES = frozenset({"Assign", "AssignAdd", "AssignVariableOp", "AssignAddVariableOp"})


def _reads(tensor: tf.Tensor, target: tf.Operation, depth: int = 8) -> bool:
    """Whether ``tensor`` is computed, within ``depth`` ops, from a read of ``target``."""
    # Breadth first, each op once: a wide predicate reaches an op by many paths.
    frontier, seen = {tensor.op}, set()
    for _ in range(depth + 1):
        if target in frontier:
            return True
        seen |= frontier
        frontier = {t.op for op in frontier for t in op.inputs} - seen
    return False


def uninitialized_hint(error: BaseException, graph: tf.Graph) -> str:
    """A hint for a run that read tf1_accum's state uninitialized; "" otherwise."""
    if not isinstance(error, (tf.errors.NotFoundError, tf.errors.FailedPreconditionError)):
        return ""
    state = {v.op.name for v in graph.get_collection(STATE_COLLECTION)}
    named = [name for name in sorted(state) if name in error.message]
    if not named:
        return ""
    return (
        f"tf1_accum: the accumulation's variables are not initialized ({named[0]}): make "
        "global_variables_initializer() (and run it) after the accumulation is built, or also "
        "run variables_initializer(tf.compat.v1.get_collection(tf1_accum.STATE_COLLECTION)). "
    )
