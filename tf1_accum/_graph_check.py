"""`check_graph`: the bugs of hand-written accumulation, found in the graph.

Its terms (variable, accumulate op, accumulator, reset, update op) are
defined in the concepts page, "Design notes".
"""

from __future__ import annotations

import typing

from tf1_accum._compat import control_flow_context, function_bodies, tf

from tf1_accum import _count_check, _guard, _migration, _schedule_check, _validate
from tf1_accum._state import STATE_COLLECTION
from tf1_accum.check._catalogue import KINDS, message

# The order of the findings (their kinds).
_KINDS = """apply_needs_feed apply_accumulates ops_in_one_run never_reset sum_not_mean
step_not_per_update schedule_in_micro_batches mean_over_data_count""".split()

_VARIABLE_OPS = frozenset({"VariableV2", "Variable", "VarHandleOp"})
# Ops that hand a ref or resource tensor on unchanged (input 0), and their Ref twins.
_FORWARDING_OPS = frozenset(
    prefix + name
    for name in ("Identity", "Switch", "Merge", "Enter", "Exit", "NextIteration")
    for prefix in ("", "Ref")
)
# Ops that output a variable's value (input 0) unchanged, or rows of it added: a sum stays one.
_VALUE_OPS = _FORWARDING_OPS | frozenset(
    "ReadVariableOp Cast Snapshot StopGradient Reshape Gather GatherV2 ResourceGather "
    "UnsortedSegmentSum AssignAdd ScatterAdd".split()
)
# Ops that read a variable's value (input 0).
_READ_OPS = frozenset("ReadVariableOp Identity RefIdentity ResourceGather Gather GatherV2".split())
# Accumulate ops and assigns: input 0 the variable, the value input 1 (a scatter's: 2).
_ADDED = frozenset(
    "AssignAdd AssignAddVariableOp ScatterAdd ResourceScatterAdd ScatterNdAdd "
    "ResourceScatterNdAdd".split()
)
_ASSIGNED = frozenset(
    "Assign AssignVariableOp ScatterUpdate ResourceScatterUpdate ScatterNdUpdate "
    "ResourceScatterNdUpdate".split()
)
# Other writes in place (a sparse window marks its rows touched): state, not data.
_UPDATED = frozenset({"ScatterMax", "ResourceScatterMax", "ScatterMin", "ResourceScatterMin"})


class GraphFinding(typing.NamedTuple):
    """One problem that `check_graph` found.

    Attributes:
        kind: What is wrong, one of the kinds `check_graph` lists.
        op_name: The op at fault: the placeholder, the accumulate op, the
            accumulator (or counter) variable, the optimizer's update op, or
            the schedule op that reads the step count.
        message: Where, what goes wrong, and the tf1_accum replacement.
    """

    kind: str
    op_name: str
    message: str

    @property
    def code(self) -> str:
        """The mistake's code, as ``tf1-accum-check`` names it (``"TFA001"``)."""
        return KINDS[self.kind].code


def _finding(kind: str, op_name: str, where: str) -> GraphFinding:
    return GraphFinding(kind, op_name, message(KINDS[kind].code, where))


def check_graph(
    apply_op: tf.Operation | tf.Tensor | tf.Variable | list,
    accum_ops: tf.Operation | tf.Tensor | tf.Variable | list | None = None,
    *,
    raise_on_findings: bool = False,
) -> list[GraphFinding]:
    """Finds the known bugs of hand-written gradient accumulation in a graph.

    Give it what your loop fetches to apply an update and, if you have them,
    what it fetches for each micro-batch. It walks the ops those fetches run,
    into ``tf.cond``, ``tf.while_loop`` and the bodies of version 2 ``If`` and
    ``While`` ops built in this process, and reports, by kind (code):

    * ``"apply_needs_feed"`` (TFA004): a gradient handed to an optimizer
      depends on a placeholder (a learning rate may).
    * ``"apply_accumulates"`` (TFA003): the apply runs an accumulate op that
      the micro-batch fetches run too (without ``accum_ops``: one of fed data
      whose accumulator the apply does not reset).
    * ``"ops_in_one_run"`` (TFA010): the apply runs two ops of one tf1_accum window.
    * ``"never_reset"`` (TFA011): an applied accumulator, or a floating-point
      counter the apply reads, is assigned nothing but its initializer.
    * ``"sum_not_mean"`` (TFA001): an update op takes an accumulator's value
      unchanged (tf1_accum's own, ``average=False``, are not reported).
    * ``"step_not_per_update"`` (TFA012): the global step is incremented with
      every micro-batch, or twice by one apply.
    * ``"schedule_in_micro_batches"`` (TFA013): see
      :ref:`real-programs-schedules`.
    * ``"mean_over_data_count"`` (TFA014): the gradients accumulated by hand
      are of a loss divided by a count the fed data decides (its tokens), and
      nothing multiplies them by it (:ref:`real-programs-token-mean`).

    tf1_accum's own train ops give no findings of their own; a program's
    mistakes around them still show: TFA013 on an `AccumulationOptimizer`'s
    train op given a schedule counted in micro-batches, and TFA012 for an
    increment hung on ``window.applied`` beside a wrapper given that same
    global step. Not checked: ``tf.function``
    calls, function bodies of an imported ``GraphDef``, sparse sums without
    an ``Apply`` op, and what depends on the data or the loop (the
    source checker's part, docs/migration.rst, "Which tool finds which bug").

    Example:

    >>> with tf.Graph().as_default():
    ...     x = tf.compat.v1.placeholder(tf.float32, [None])
    ...     w = tf.compat.v1.get_variable("w", initializer=1.0)
    ...     loss = tf.reduce_mean((w * x - 2.0 * x) ** 2)
    ...     opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    ...     (grad, _), = opt.compute_gradients(loss)
    ...     total = tf.Variable(tf.zeros_like(w), trainable=False)
    ...     accum_op = total.assign_add(grad)
    ...     apply_op = opt.apply_gradients([(total, w)])
    ...     findings = tf1_accum.check_graph(apply_op, [accum_op])
    >>> [(finding.kind, finding.code) for finding in findings]
    [('never_reset', 'TFA011'), ('sum_not_mean', 'TFA001')]
    >>> findings[0].op_name
    'Variable'

    Args:
        apply_op: What you fetch to apply an update: a ``tf.Operation``,
            ``tf.Tensor`` or ``tf.Variable``, or a list of them.
        accum_ops: Optional: what you fetch for each micro-batch, in the same
            form. Given, ``"apply_accumulates"`` reports exactly the
            accumulate ops that both run.
        raise_on_findings: True raises ``ValueError`` listing the findings
            instead of returning them.

    Returns:
        A list of `GraphFinding`, ordered by kind (in the order listed
        above), then by op name; empty when nothing was found.

    Raises:
        TypeError: If ``apply_op`` is empty, ``apply_op`` or ``accum_ops``
            holds something other than graph ops, tensors and variables, or
            ``raise_on_findings`` is not a bool.
        ValueError: If ``accum_ops`` belongs to another graph than
            ``apply_op``, or ``raise_on_findings=True`` and there are findings.
    """
    apply_fetches = _fetch_ops("apply_op", apply_op)
    if not apply_fetches:
        raise TypeError(f"apply_op must not be empty, got {_validate.describe(apply_op)}.")
    accum_fetches = [] if accum_ops is None else _fetch_ops("accum_ops", accum_ops)
    _validate.check_bool("raise_on_findings", raise_on_findings)
    graph = apply_fetches[0].graph
    for op in apply_fetches + accum_fetches:
        if op.graph is not graph:
            raise ValueError(
                f"apply_op and accum_ops must come from one graph: {op.name} is in "
                f"another graph than {apply_fetches[0].name}."
            )
    found = _findings(_Graph(graph), apply_fetches, accum_fetches, accum_ops is not None)
    findings = sorted(found, key=lambda f: (_KINDS.index(f.kind), f.op_name))
    if findings and raise_on_findings:
        lines = "\n".join(f"  {f.kind} at {f.op_name}: {f.message}" for f in findings)
        raise ValueError(
            f"check_graph found {len(findings)} problem(s) in the accumulation "
            f"applied by {', '.join(op.name for op in apply_fetches)}:\n{lines}"
        )
    return findings


def _fetch_ops(label: str, fetches: object) -> list[tf.Operation]:
    items = list(fetches) if isinstance(fetches, (list, tuple)) else [fetches]
    ops = [_validate.graph_op(item) for item in items]
    for item, op in zip(items, ops):
        if op is None:
            expected = "a tf.Operation, tf.Tensor or tf.Variable of a graph, or a list of them"
            raise _validate.type_error(label, item, expected)
    return ops


def _bodies(op: tf.Operation) -> list[tuple[tf.Graph, list[tf.Tensor]]]:
    """(function graph, outer tensor of each of its inputs) of a version 2 ``If`` or ``While``."""
    outer = list(op.inputs)[1:] if op.type in ("If", "StatelessIf") else list(op.inputs)
    return [(g, outer) for g in function_bodies(op)]


class _Graph:
    """One graph's ops (version 2 bodies included), variables by role, and writes."""

    def __init__(self, graph: tf.Graph) -> None:
        self.graph = graph
        self.outer: dict[tf.Operation, tf.Tensor] = {}  # a function's input -> outer tensor
        self.body_outputs: dict[tf.Operation, list[tf.Operation]] = {}  # If/While -> outputs
        self.all_ops: list[tf.Operation] = []
        self._scan(graph.get_operations())
        self.trainable = _variable_ops(graph, tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
        self.owned = _variable_ops(graph, STATE_COLLECTION)
        self.metrics = _variable_ops(graph, tf.compat.v1.GraphKeys.METRIC_VARIABLES)
        self.steps = _variable_ops(graph, tf.compat.v1.GraphKeys.GLOBAL_STEP)
        items = [i for key in graph.get_all_collection_keys() for i in graph.get_collection(key)]
        initializers = [getattr(item, "initializer", None) for item in items]
        self.initializers = {op for op in initializers if isinstance(op, tf.Operation)}
        self.classify()

    def _scan(self, ops: typing.Iterable[tf.Operation]) -> None:
        for op in ops:
            self.all_ops.append(op)
            bodies = _bodies(op)
            if bodies:
                self.body_outputs[op] = [t.op for g, _ in bodies for t in g.outputs]
            for body, outer in bodies:
                for inner, tensor in zip(body.inputs, outer):
                    self.outer[inner.op] = tensor
                self._scan(body.get_operations())

    def inputs(self, op: tf.Operation, control: bool = True) -> list[tf.Operation]:
        """The ops ``op`` reads (``control=False``: only those its value is computed from)."""
        found = [t.op for t in op.inputs]
        if control and op.type != "MutexLock":  # a window's lock waits: an order, not a read
            found += op.control_inputs
        elif not control and op.type in ("Switch", "RefSwitch"):
            found = found[:1]
        if op in self.outer:
            found.append(self.outer[op].op)
        found += self.body_outputs.get(op, [])
        return found

    def reaches(
        self,
        start_ops: typing.Iterable[tf.Operation],
        stop: typing.Callable[..., bool] | None,  # None: every op a fetch may run, bodies too
        control: bool = True,
    ) -> set[tf.Operation]:
        """Ops reached backwards from ``start_ops``, not walking past ``stop(op)``."""

        def follow(op: tf.Operation) -> list[tf.Operation]:
            if stop is None:
                bodies = [o for body, _ in _bodies(op) for o in body.get_operations()]
                return bodies + self.inputs(op, control)
            return [] if stop(op) or op.type in _count_check.SHAPE_OPS else self.inputs(op, control)

        return _count_check.walk(start_ops, follow)

    def variable_of(
        self, op: tf.Operation, through: frozenset[str] = _FORWARDING_OPS
    ) -> tf.Operation | None:
        """The variable op whose value ``op`` hands on through ``through`` ops, or None."""
        for _ in range(10000):
            if op.type in _VARIABLE_OPS:
                return op
            if op in self.outer:
                op = self.outer[op].op
            elif op.type in through and op.inputs:
                op = op.inputs[0].op
            else:
                return None
        return None

    def is_placeholder(self, op: tf.Operation) -> bool:
        return op.type == "Placeholder" and op not in self.outer

    def classify(self) -> None:
        self.accumulates: dict[tf.Operation, tf.Operation] = {}  # accumulate op -> variable op
        self.fresh: set[tf.Operation] = set()  # accumulate ops that add fresh data
        self.resets: dict[tf.Operation, list[tf.Operation]] = {}  # variable op -> reset ops
        self.writes = {op for op in self.all_ops if op.type in _UPDATED}
        for op in self.all_ops:
            if op.type in _ADDED or (op.type in _ASSIGNED and op not in self.initializers):
                var = self.variable_of(op.inputs[0].op)
                if var is None:
                    continue
                self.writes.add(op)
                value = op.inputs[_value_index(op)].op
                # An assign that reads itself is a self-update; but a window of tf1_accum's
                # own that rescales as it assigns still starts afresh.
                if op.type in _ADDED or (
                    var not in self.owned
                    and var in self.reaches([value], lambda o, var=var: o is var, control=False)
                ):
                    self.accumulates[op] = var
                else:
                    self.resets.setdefault(var, []).append(op)
        # A version 2 conditional that writes a variable in a branch outputs state too.
        for op in self.all_ops:
            if op.type in ("If", "StatelessIf") and any(
                o in self.writes for graph, _ in _bodies(op) for o in graph.get_operations()
            ):
                self.writes.add(op)
        self.fed: set[tf.Operation] = set()  # accumulate ops that add what a placeholder is fed
        self.constant_adds: set[tf.Operation] = set()  # counter increments: add a constant
        for op in self.accumulates:
            value = op.inputs[_value_index(op)].op
            # What was written to a variable is state, not fresh data.
            reached = self.reaches([value], lambda o: o in self.writes, control=False)
            if any(_count_check.is_fed(o) and o not in self.outer for o in reached):
                self.fresh.add(op)
            if any(self.is_placeholder(o) for o in reached):
                self.fed.add(op)
            if op.type in _ADDED and not any(
                o.type in _VARIABLE_OPS or o in self.writes or _count_check.is_fed(o)
                for o in reached
            ):
                self.constant_adds.add(op)
        # Floating-point (a counter is not an int global_step), not a weight nor a metric.
        kept = {v for v in self.accumulates.values() if v.get_attr("dtype").is_floating}
        kept -= self.trainable | self.metrics
        self.accumulators = {self.accumulates[op] for op in self.fresh} & kept
        self.summing = {self.accumulates[op] for op in self.fresh if op.type in _ADDED} & kept
        others = self.accumulators | self.owned | self.steps
        self.counters = {self.accumulates[op] for op in self.constant_adds} & kept - others

    def conditional(self, op: tf.Operation) -> bool:
        """Whether ``op`` runs only on a branch or in a loop: not with every fetch."""
        return op.graph is not self.graph or control_flow_context(op) is not None


def _findings(
    g: _Graph,
    apply_fetches: list[tf.Operation],
    accum_fetches: list[tf.Operation],
    accum_given: bool,
) -> typing.Iterator[GraphFinding]:
    """The findings, in no order."""
    accum_fetches = [op for op in accum_fetches if op not in apply_fetches]
    apply_set, accum_set = g.reaches(apply_fetches, None), g.reaches(accum_fetches, None)
    apply_name = ", ".join(op.name for op in apply_fetches)

    reset_in_apply = {var for var, ops in g.resets.items() if any(o in apply_set for o in ops)}
    # The variables the applied gradients come from (not a batch-norm moving average).
    updates = {op for op in apply_set if _gradient_index(op) is not None}
    gradients = [(op.inputs[_gradient_index(op)].op, op) for op in updates]
    reached = g.reaches([grad for grad, _ in gradients], lambda o: o in g.writes, control=False)
    used = {op for op in reached if op.type in _VARIABLE_OPS}
    used |= {g.accumulates[op] for op in reached if op in g.accumulates}

    # (ii) accumulate ops that the apply runs again.
    again = {
        op
        for op in apply_set
        if g.accumulates.get(op) in g.accumulators & used
        and (op in accum_set if accum_given else op in g.fed)
        and (accum_given or g.accumulates[op] not in reset_in_apply)
    }
    for op in again:
        which = "the micro-batch fetches run too" if accum_given else "adds its feed"
        where = f"Fetching {apply_name} runs accumulate op {op.name} (into "
        where += f"{g.accumulates[op].name}), which {which}"
        yield _finding("apply_accumulates", op.name, where)

    # (i) and (iv): the applied gradients, and what the accumulate ops run again add.
    starts = gradients + [(op.inputs[_value_index(op)].op, op) for op in again]
    # Only writes run again carry this run's feed; a wait for another update is an order.
    stop = lambda o: (o in g.writes and o not in again) or o in updates  # noqa: E731
    needs_feed: dict[tf.Operation, tf.Operation] = {}  # placeholder -> its first user
    for start, user in starts:
        for op in g.reaches([start], stop, control=True):
            if g.is_placeholder(op):
                needs_feed.setdefault(op, user)
        # A summing accumulator whose value the update takes unchanged.
        var = g.variable_of(start, _VALUE_OPS)
        if var is not None and user not in again and var in g.summing and var not in g.owned:
            where = f"{user.name} ({user.type}) applies accumulator {var.name} as it is"
            yield _finding("sum_not_mean", user.name, where)
    for placeholder, user in needs_feed.items():
        what = "accumulate op" if user in again else "the gradient of update op"
        where = f"Fetching {apply_name} needs a feed for placeholder {placeholder.name}, "
        where += f"on which {what} {user.name} depends"
        yield _finding("apply_needs_feed", placeholder.name, where)

    # (iii) applied accumulators and read counters that nothing resets.
    read = {
        g.variable_of(op.inputs[0].op)
        for op in apply_set
        if op.type in _READ_OPS and op.inputs and op not in g.writes
    }
    for variables, text in (
        (used & g.accumulators, "Accumulator {} is added to (by {}) but never reset"),
        (g.counters & read, "Counter {} is incremented (by {}) and read by the apply, "
         "but never reset (a mean divided by it shrinks)"),
    ):  # fmt: skip
        for var in sorted(variables - set(g.resets), key=lambda v: v.name):
            adders = sorted(o.name for o, v in g.accumulates.items() if v is var)
            where = text.format(var.name, ", ".join(adders))
            yield _finding("never_reset", var.name, where)
    # The pairs `_guard` refuses, among the ops the apply runs (a function body's have no mark).
    ops = sorted((op for op in apply_set if op.graph is g.graph), key=lambda o: o.name)
    for first, second in _guard.pairs(m for op in ops for m in _guard.marks(op)):
        where = f"Fetching {apply_name} runs {first.field} ({first.op}) "
        where += f"and {second.field} ({second.op}) of one accumulation in one session.run"
        yield _finding("ops_in_one_run", second.op, where)
    yield from _step_findings(g, apply_set, accum_set, apply_name)
    # (vi) an increment hung on ``window.applied`` of a wrapper that advances the step too.
    reached = apply_set | accum_set
    for name, applied, step in _migration.counted_twice(g.graph):
        if g.graph.get_operation_by_name(name) in reached:
            where = f"Fetching {apply_name} runs {name}, which increments the global step {step} "
            where += f"when {applied} (window.applied) holds, and the AccumulationOptimizer "
            where += "given that step increments it too: twice per update"
            yield _finding("step_not_per_update", name, where)
    for op_name, where in _schedule_check.schedule_findings(g.graph, g.steps, apply_set):
        yield _finding("schedule_in_micro_batches", op_name, where)
    # The gradients hand-written accumulate ops add (tf1_accum's own warned when built).
    adds = [op for op in g.fresh if g.accumulates[op] in (used & g.accumulators) - g.owned]
    for count in _count_check.data_counts([op.inputs[_value_index(op)] for op in adds]):
        where = f"The gradients accumulated are of a loss that {count.where}, "
        where += f"and nothing weighs them by it: weight={count.weight}"
        yield _finding("mean_over_data_count", count.op_name, where)


def _step_findings(
    g: _Graph, apply_set: set[tf.Operation], accum_set: set[tf.Operation], apply_name: str
) -> typing.Iterator[GraphFinding]:
    """(v) increments of the global step that do not follow the updates."""
    increments = {op for op, var in g.accumulates.items() if var in g.steps}
    unconditional_resets = {
        var
        for var, ops in g.resets.items()
        if any(o in apply_set and not g.conditional(o) for o in ops)
    }
    # An apply that adds to a window's state always but resets it on a branch runs per micro-batch.
    per_micro_batch_apply = any(
        var not in unconditional_resets
        and var not in g.steps
        and ((op in g.fresh and var in g.accumulators) or var in g.resets)
        for op, var in g.accumulates.items()
        if op in apply_set and not g.conditional(op)
    )
    # Disjoint sets: an increment is reported once.
    per_micro_batch = [(accum_set - apply_set, "a micro-batch's fetch (accum_ops)")]
    if per_micro_batch_apply:
        per_micro_batch.append((apply_set, f"{apply_name}, run once per micro-batch,"))
    for ops, what in per_micro_batch:
        for op in sorted(increments & ops, key=lambda o: o.name):
            if not g.conditional(op):
                where = f"{what} runs {op.name}, which increments the global step "
                where += f"{g.accumulates[op].name} with every micro-batch"
                yield _finding("step_not_per_update", op.name, where)
    if not per_micro_batch_apply:
        in_apply = sorted(increments & apply_set, key=lambda o: o.name)
        if len(in_apply) >= 2 and any(not g.conditional(o) for o in in_apply):
            names = ", ".join(o.name for o in in_apply)
            where = f"Fetching {apply_name} runs {len(in_apply)} increments of the "
            where += f"global step ({names}; an optimizer given global_step is one)"
            yield _finding("step_not_per_update", in_apply[-1].name, where)


def _value_index(op: tf.Operation) -> int:
    """The input of accumulate op or assign ``op`` that holds the value written."""
    return 2 if "Scatter" in op.type else 1


def _gradient_index(op: tf.Operation) -> int | None:
    if not op.type.startswith(("Apply", "SparseApply", "ResourceApply", "ResourceSparseApply")):
        return None
    names = [arg.name for arg in op.op_def.input_arg]
    return next((names.index(name) for name in ("grad", "delta") if name in names), None)


def _variable_ops(graph: tf.Graph, key: str) -> set[tf.Operation]:
    return {v.op for v in graph.get_collection(key) if hasattr(v, "op")}
