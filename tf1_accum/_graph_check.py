"""A graph-level check for hand-written gradient accumulation.

`check_graph` walks the ops that fetching an apply runs (and those that each
micro-batch's fetch runs) and reports the known bugs of hand-written
accumulation as `GraphFinding` tuples. The terms used here (variable,
accumulate op, accumulator, reset, update op) are defined in the concepts
page, "Design notes".
"""

from __future__ import annotations

import typing

import tensorflow as tf

from tf1_accum import _accumulation
from tf1_accum import _schedule_check
from tf1_accum import _validate
from tf1_accum._state import STATE_COLLECTION
from tf1_accum.check._catalogue import KINDS, message

# The order of the findings (their kinds).
_KINDS = """apply_needs_feed apply_accumulates ops_in_one_run never_reset sum_not_mean
step_not_per_update schedule_in_micro_batches""".split()

_VARIABLE_OPS = frozenset({"VariableV2", "Variable", "VarHandleOp"})
# Ops that hand a ref or resource tensor on unchanged (input 0), and their Ref twins.
_FORWARDING_OPS = frozenset(
    prefix + name
    for name in ("Identity", "Switch", "Merge", "Enter", "Exit", "NextIteration")
    for prefix in ("", "Ref")
)
# Ops whose output is a variable's value, unchanged (input 0 is the variable,
# or a tensor holding it), or rows of it added together (the optimizers'
# merge of duplicate sparse indices): a gradient that reaches an accumulator
# through these alone is still a sum.
_VALUE_OPS = _FORWARDING_OPS | frozenset(
    "ReadVariableOp Cast Snapshot StopGradient Reshape Gather GatherV2 ResourceGather "
    "UnsortedSegmentSum AssignAdd ScatterAdd".split()
)
# Ops that read a variable's value (input 0).
_READ_OPS = frozenset(
    {"ReadVariableOp", "Identity", "RefIdentity", "ResourceGather", "Gather", "GatherV2"}
)
# Accumulate ops and assigns: input 0 is the variable, ``_ADDED[type]`` the
# added value, ``_ASSIGNED[type]`` the value written (a scatter's input 2).
_ADDED = {"AssignAdd": 1, "AssignAddVariableOp": 1} | dict.fromkeys(
    ["ScatterAdd", "ResourceScatterAdd", "ScatterNdAdd", "ResourceScatterNdAdd"], 2
)
_ASSIGNED = {"Assign": 1, "AssignVariableOp": 1} | dict.fromkeys(
    ["ScatterUpdate", "ResourceScatterUpdate", "ScatterNdUpdate", "ResourceScatterNdUpdate"], 2
)
# Other writes in place (input 0 is the variable): a sparse window's rows
# touched are marked with a maximum. What they output is state, not data.
_UPDATED = frozenset({"ScatterMax", "ResourceScatterMax", "ScatterMin", "ResourceScatterMin"})
# Ops that read a tensor's shape, not its values.
_SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank", "ZerosLike", "OnesLike"})


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
    """The `GraphFinding` of ``kind`` at ``op_name``, its message from the catalogue."""
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
    into ``tf.cond`` and ``tf.while_loop`` (version 1 control flow, and the
    function bodies of version 2 ``If`` and ``While`` ops built in this
    process), and reports each kind of `GraphFinding`, by its code:

    * ``"apply_needs_feed"`` (TFA004): a gradient handed to an optimizer
      depends on a placeholder (a learning rate's is fine).
    * ``"apply_accumulates"`` (TFA003): fetching the apply runs an accumulate
      op that the micro-batch fetches run too; without ``accum_ops``, one of
      fed data that the apply runs without resetting its accumulator.
    * ``"ops_in_one_run"`` (TFA010): fetching the apply runs two ops of one
      `build_accumulation` window.
    * ``"never_reset"`` (TFA011): an accumulator the applied gradients come
      from, or a floating-point counter the apply divides by, is assigned
      nothing but its initializer.
    * ``"sum_not_mean"`` (TFA001): an optimizer's update op takes an
      accumulator's value unchanged (read, cast or gathered); tf1_accum's own
      accumulators are not reported (``average=False`` is a choice).
    * ``"step_not_per_update"`` (TFA012): the global step is incremented
      outside any conditional by a fetch that runs with every micro-batch,
      or twice by one apply.
    * ``"schedule_in_micro_batches"`` (TFA013): for `AccumulationOptimizer`'s
      train op reading a ``tf.data`` pipeline of known, finite size, a
      schedule's step count equals the micro-batches of a whole number of
      epochs and lies past the last update (see :ref:`real-programs-schedules`).

    tf1_accum's ``apply_op``, ``accum_apply_op``, ``AccumulationOptimizer``'s
    train op and ``build_dataset_accumulation``'s train op give no findings.
    Not checked: functions called through ``tf.function``
    (``PartitionedCall``) and the function bodies of a graph imported from a
    ``GraphDef``; sums in sparse updates made without an ``Apply`` op
    (``GradientDescentOptimizer``'s); and what depends on the data or the
    loop: micro-batches of different sizes averaged equally, a ``tf.cond``
    whose applying run skips its own micro-batch (``tf1-accum-check`` finds
    those in the source), or other schedules whose step counts were worked
    out in micro-batches.

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
    facts = _Graph(graph)
    findings = _findings(facts, apply_fetches, accum_fetches, accum_ops is not None)
    if findings and raise_on_findings:
        lines = "\n".join(f"  {f.kind} at {f.op_name}: {f.message}" for f in findings)
        raise ValueError(
            f"check_graph found {len(findings)} problem(s) in the accumulation "
            f"applied by {_names(apply_fetches)}:\n{lines}"
        )
    return findings


def _fetch_ops(label: str, fetches: object) -> list[tf.Operation]:
    """Returns the ops of ``fetches`` (an op, a tensor, or a list of them)."""
    items = list(fetches) if isinstance(fetches, (list, tuple)) else [fetches]
    ops: list[tf.Operation] = []
    for item in items:
        if isinstance(item, tf.Operation):
            ops.append(item)
        elif isinstance(item, (tf.Tensor, tf.Variable)) and isinstance(
            getattr(item, "op", None), tf.Operation
        ):
            # A variable's op is its variable op, or (for what assign_add
            # returns) the assign op that a fetch runs before reading.
            ops.append(item.op)
        else:
            raise TypeError(
                f"{label} must be a tf.Operation, tf.Tensor or tf.Variable of a graph, "
                f"or a list of them, got {_validate.describe(item)}."
            )
    return ops


def _names(ops: typing.Iterable[tf.Operation]) -> str:
    return ", ".join(op.name for op in ops)


def _bodies(op: tf.Operation) -> list[tuple[tf.Graph, list[tf.Tensor]]]:
    """The function graphs of a version 2 ``If`` or ``While`` op, with their inputs.

    Returns ``(graph, [outer tensor for each of the graph's inputs])`` pairs.
    """
    if op.type in ("If", "StatelessIf"):
        branches = [getattr(op, "_true_graph", None), getattr(op, "_false_graph", None)]
        outer = list(op.inputs)[1:]
    elif op.type in ("While", "StatelessWhile"):
        branches = [getattr(op, "_cond_graph", None), getattr(op, "_body_graph", None)]
        outer = list(op.inputs)
    else:
        return []
    return [(g, outer) for g in branches if g is not None]


class _Graph:
    """What the checks read of one graph: its ops (version 2 bodies included),
    its variables by role, and what each write does (`classify`)."""

    def __init__(self, graph: tf.Graph) -> None:
        self.graph = graph
        # Function-graph input placeholder -> outer tensor.
        self.outer: dict[tf.Operation, tf.Tensor] = {}
        # Version 2 control-flow op -> its graphs' outputs.
        self.body_outputs: dict[tf.Operation, list[list[tf.Tensor]]] = {}
        self.all_ops: list[tf.Operation] = []
        self._scan(graph.get_operations())
        self.trainable = _variable_ops(graph, tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
        self.owned = _variable_ops(graph, STATE_COLLECTION)
        self.metrics = _variable_ops(graph, tf.compat.v1.GraphKeys.METRIC_VARIABLES)
        self.steps = _variable_ops(graph, tf.compat.v1.GraphKeys.GLOBAL_STEP)
        self.initializers: set[tf.Operation] = set()
        for key in graph.get_all_collection_keys():
            for item in graph.get_collection(key):
                initializer = getattr(item, "initializer", None)
                if isinstance(initializer, tf.Operation):
                    self.initializers.add(initializer)
        self.classify()

    def _scan(self, ops: typing.Iterable[tf.Operation]) -> None:
        """Lists every op, entering version 2 control-flow bodies."""
        for op in ops:
            self.all_ops.append(op)
            bodies = _bodies(op)
            if bodies:
                self.body_outputs[op] = [g.outputs for g, _ in bodies]
            for body, outer in bodies:
                for inner, tensor in zip(body.inputs, outer):
                    self.outer[inner.op] = tensor
                self._scan(body.get_operations())

    # -- walking -----------------------------------------------------------

    def inputs(self, op: tf.Operation, control: bool = True) -> list[tf.Operation]:
        """The ops ``op`` reads from, across function-graph boundaries.

        Without ``control``, only the ops its value is computed from: no
        control inputs, and not the predicate of a ``Switch``.
        """
        if op.type == "MutexLock":
            # A window's lock waits for every input of its section (see
            # Window.exclusive): an order, not something the section reads.
            found = [t.op for t in op.inputs]
        elif control:
            found = [t.op for t in op.inputs] + list(op.control_inputs)
        elif op.type in ("Switch", "RefSwitch"):
            found = [op.inputs[0].op]
        else:
            found = [t.op for t in op.inputs]
        if op in self.outer:
            found.append(self.outer[op].op)
        if op in self.body_outputs:
            found += [t.op for outputs in self.body_outputs[op] for t in outputs]
        return found

    def run_set(self, fetches: typing.Iterable[tf.Operation]) -> set[tf.Operation]:
        """Every op that fetching ``fetches`` may run, bodies included."""
        seen: set[tf.Operation] = set()
        stack = list(fetches)
        while stack:
            op = stack.pop()
            if op in seen:
                continue
            seen.add(op)
            stack += self.inputs(op)
            for body, _ in _bodies(op):
                stack += body.get_operations()
        return seen

    def reaches(
        self,
        start_ops: typing.Iterable[tf.Operation],
        stop: typing.Callable[..., bool],  # called with an op (classify's binds one more)
        control: bool,
    ) -> set[tf.Operation]:
        """Ops reached backwards from ``start_ops``, not walking past ``stop(op)``."""
        seen: set[tf.Operation] = set()
        stack = list(start_ops)
        while stack:
            op = stack.pop()
            if op in seen:
                continue
            seen.add(op)
            if stop(op) or op.type in _SHAPE_OPS:
                continue
            stack += self.inputs(op, control)
        return seen

    def variable_of(self, tensor: tf.Tensor) -> tf.Operation | None:
        """The variable op that a ref or resource ``tensor`` stands for, or None."""
        op = tensor.op
        for _ in range(10000):
            if op.type in _VARIABLE_OPS:
                return op
            if op in self.outer:
                op = self.outer[op].op
            elif op.type in _FORWARDING_OPS and op.inputs:
                op = op.inputs[0].op
            else:
                return None
        return None

    @staticmethod
    def is_data(op: tf.Operation) -> bool:
        if op.type == "Placeholder":
            return True
        return "IteratorGetNext" in op.type or op.type == "OptionalGetValue"

    def is_placeholder(self, op: tf.Operation) -> bool:
        return op.type == "Placeholder" and op not in self.outer

    # -- what the ops do ---------------------------------------------------

    def classify(self) -> None:
        """Finds accumulate ops, accumulators and resets in the whole graph."""
        self.accumulates: dict[tf.Operation, tf.Operation] = {}  # accumulate op -> variable op
        self.fresh: set[tf.Operation] = set()  # accumulate ops that add fresh data
        self.resets: dict[tf.Operation, list[tf.Operation]] = {}  # variable op -> reset ops
        self.writes = set()
        for op in self.all_ops:
            if op.type in _UPDATED:
                self.writes.add(op)
            elif op.type in _ADDED:
                var = self.variable_of(op.inputs[0])
                if var is not None:
                    self.accumulates[op] = var
            elif op.type in _ASSIGNED and op not in self.initializers:
                var = self.variable_of(op.inputs[0])
                if var is None:
                    continue
                value = op.inputs[_ASSIGNED[op.type]].op
                if var in self.reaches([value], lambda o, var=var: o is var, control=False):
                    self.accumulates[op] = var  # reads itself: a self-update
                else:
                    self.resets.setdefault(var, []).append(op)
        self.writes.update(self.accumulates)
        self.writes.update(op for ops in self.resets.values() for op in ops)
        # A version 2 conditional that writes a variable in a branch (a
        # window's first add assigns, the others add) is a write too: what
        # it outputs is the variable's new value, not what was fed.
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
            if any(self.is_data(o) and o not in self.outer for o in reached):
                self.fresh.add(op)
            if any(self.is_placeholder(o) for o in reached):
                self.fed.add(op)
            if op.type in _ADDED and not any(
                o.type in _VARIABLE_OPS or o in self.writes or self.is_data(o) for o in reached
            ):
                self.constant_adds.add(op)
        self.accumulators: set[tf.Operation] = set()
        # Accumulators that fresh data is added to: sums.
        self.summing: set[tf.Operation] = set()
        for op in self.fresh:
            var = self.accumulates[op]
            if not tf.as_dtype(var.get_attr("dtype")).is_floating:
                continue
            if var in self.trainable or var in self.metrics:
                continue
            self.accumulators.add(var)
            if op.type in _ADDED:
                self.summing.add(var)
        # Floating-point counters of micro-batches (an int global_step is not one).
        self.counters: set[tf.Operation] = set()
        for op in self.constant_adds:
            var = self.accumulates[op]
            if (
                tf.as_dtype(var.get_attr("dtype")).is_floating
                and var not in self.accumulators
                and var not in self.trainable | self.metrics | self.owned | self.steps
            ):
                self.counters.add(var)

    def conditional(self, op: tf.Operation) -> bool:
        """Whether ``op`` runs only on a branch or in a loop: not with every fetch."""
        return op.graph is not self.graph or op._get_control_flow_context() is not None

    def summed_accumulator(self, op: tf.Operation) -> tf.Operation | None:
        """The summing accumulator whose value ``op`` outputs unchanged, or None."""
        for _ in range(10000):
            if op.type in _VARIABLE_OPS:
                break
            if op in self.outer:
                op = self.outer[op].op
            elif op.type in _VALUE_OPS and op.inputs:
                op = op.inputs[0].op
            else:
                return None
        else:
            return None
        if op in self.summing and op not in self.owned:
            return op
        return None


def _findings(
    g: _Graph,
    apply_fetches: list[tf.Operation],
    accum_fetches: list[tf.Operation],
    accum_given: bool,
) -> list[GraphFinding]:
    """The `GraphFinding` list of `check_graph`, ordered."""
    accum_fetches = [op for op in accum_fetches if op not in apply_fetches]
    apply_set = g.run_set(apply_fetches)
    accum_set = g.run_set(accum_fetches)
    apply_name = _names(apply_fetches)
    findings: list[GraphFinding] = []

    reset_in_apply = {var for var, ops in g.resets.items() if any(o in apply_set for o in ops)}
    # The variables the applied gradients come from: only their
    # accumulate ops matter below, not, say, those of a batch-norm moving
    # average that a fused step updates too.
    updates = [op for op in apply_set if _gradient_index(op) is not None]
    used: set[tf.Operation] = set()
    for update in updates:
        grad = update.inputs[_gradient_index(update)].op
        for op in g.reaches([grad], lambda o: o in g.writes, control=False):
            if op.type in _VARIABLE_OPS:
                used.add(op)
            elif op in g.accumulates:
                used.add(g.accumulates[op])

    # (ii) accumulate ops that the apply runs again.
    again: set[tf.Operation] = set()
    for op in apply_set:
        var = g.accumulates.get(op)
        if var is None or var not in g.accumulators or var not in used:
            continue
        if accum_given:
            if op in accum_set:
                again.add(op)
        elif op in g.fed and var not in reset_in_apply:
            again.add(op)
    for op in again:
        which = "the micro-batch fetches run too" if accum_given else "adds its feed"
        where = f"Fetching {apply_name} runs accumulate op {op.name} (into "
        where += f"{g.accumulates[op].name}), which {which}"
        findings.append(_finding("apply_accumulates", op.name, where))

    # (i) and (iv): the gradients handed to the optimizer, and what the
    # accumulate ops run again add.
    starts = [(op.inputs[_gradient_index(op)].op, op) for op in updates]
    starts += [(op.inputs[_value_index(op)].op, op) for op in again]
    # Variables carry what was accumulated; only the writes that run
    # again carry this run's feed. A gradient may wait for the update of
    # another variable (a window makes one mean at a time): an order, not
    # something the gradient is computed from.
    applying = set(updates)
    stop = lambda o: (o in g.writes and o not in again) or o in applying  # noqa: E731
    needs_feed: dict[tf.Operation, tf.Operation] = {}  # placeholder -> its first user
    for start, user in starts:
        reached = g.reaches([start], stop, control=True)
        for op in reached:
            if g.is_placeholder(op):
                needs_feed.setdefault(op, user)
        var = None if user in again else g.summed_accumulator(start)
        if var is not None:
            where = f"{user.name} ({user.type}) applies accumulator {var.name} as it is"
            findings.append(_finding("sum_not_mean", user.name, where))
    for placeholder, user in needs_feed.items():
        what = "accumulate op" if user in again else "the gradient of update op"
        where = f"Fetching {apply_name} needs a feed for placeholder {placeholder.name}, "
        where += f"on which {what} {user.name} depends"
        findings.append(_finding("apply_needs_feed", placeholder.name, where))

    # (iii) accumulators that the applied gradients come from and
    # nothing resets.
    for var in sorted(used & g.accumulators, key=lambda v: v.name):
        if var in g.resets:
            continue
        adders = sorted(o.name for o, v in g.accumulates.items() if v is var)
        where = f"Accumulator {var.name} is added to (by {', '.join(adders)}) but never reset"
        findings.append(_finding("never_reset", var.name, where))
    read = {
        g.variable_of(op.inputs[0])
        for op in apply_set
        if op.type in _READ_OPS and op.inputs and op not in g.writes
    }
    for var in sorted(g.counters & read, key=lambda v: v.name):
        if var in g.resets:
            continue
        adders = sorted(o.name for o, v in g.accumulates.items() if v is var)
        where = f"Counter {var.name} is incremented (by {', '.join(adders)}) and read "
        where += "by the apply, but never reset (a mean divided by it shrinks)"
        findings.append(_finding("never_reset", var.name, where))
    findings += _one_run_findings(apply_set, apply_name)
    findings += _step_findings(g, apply_set, accum_set, apply_name)
    for op_name, where in _schedule_check.schedule_findings(g.graph, g.steps, apply_set):
        findings.append(_finding("schedule_in_micro_batches", op_name, where))
    findings.sort(key=lambda f: (_KINDS.index(f.kind), f.op_name))
    return findings


def _one_run_findings(apply_set: set[tf.Operation], apply_name: str) -> list[GraphFinding]:
    """Two ops of one `build_accumulation` window that fetching the apply runs."""
    first: dict[object, tuple[tf.Operation, str]] = {}
    findings = []
    for op in sorted(apply_set, key=lambda o: o.name):
        window, field = _accumulation.window_op_of(op) or (None, "")
        if window is None:
            continue
        if window not in first:
            first[window] = (op, field)
            continue
        other, other_field = first[window]
        where = f"Fetching {apply_name} runs {other_field} ({other.name}) "
        where += f"and {field} ({op.name}) of one accumulation in one session.run"
        findings.append(_finding("ops_in_one_run", op.name, where))
    return findings


def _step_findings(
    g: _Graph, apply_set: set[tf.Operation], accum_set: set[tf.Operation], apply_name: str
) -> list[GraphFinding]:
    """(v) increments of the global step that do not follow the updates."""
    increments = {op for op, var in g.accumulates.items() if var in g.steps}
    if not increments:
        return []
    findings: list[GraphFinding] = []
    # An apply that adds to a window's state unconditionally (its
    # accumulators, or its counter: a window whose first add assigns
    # adds to its accumulators on a branch) and resets it only on a
    # branch runs once per micro-batch (a fused step resets
    # unconditionally: it runs once per window).
    adds = [
        op
        for op in apply_set & set(g.accumulates)
        if not g.conditional(op)
        and g.accumulates[op] not in g.steps
        and (
            (op in g.fresh and g.accumulates[op] in g.accumulators) or g.accumulates[op] in g.resets
        )
    ]
    unconditional_resets = {
        var
        for var, ops in g.resets.items()
        if any(o in apply_set and not g.conditional(o) for o in ops)
    }
    per_micro_batch_apply = any(g.accumulates[op] not in unconditional_resets for op in adds)
    per_micro_batch = [(accum_set - apply_set, "a micro-batch's fetch (accum_ops)")]
    if per_micro_batch_apply:
        per_micro_batch.append((apply_set, f"{apply_name}, run once per micro-batch,"))
    reported: set[tf.Operation] = set()
    for ops, what in per_micro_batch:
        for op in sorted(increments & ops, key=lambda o: o.name):
            if g.conditional(op) or op in reported:
                continue
            reported.add(op)
            where = f"{what} runs {op.name}, which increments the global step "
            where += f"{g.accumulates[op].name} with every micro-batch"
            findings.append(_finding("step_not_per_update", op.name, where))
    if not per_micro_batch_apply:
        in_apply = sorted(increments & apply_set, key=lambda o: o.name)
        if len(in_apply) >= 2 and any(not g.conditional(o) for o in in_apply):
            names = ", ".join(o.name for o in in_apply)
            where = f"Fetching {apply_name} runs {len(in_apply)} increments of the "
            where += f"global step ({names}; an optimizer given global_step is one)"
            findings.append(_finding("step_not_per_update", in_apply[-1].name, where))
    return findings


def _value_index(op: tf.Operation) -> int | None:
    """The index of the value an accumulate op adds or assigns."""
    return _ADDED.get(op.type, _ASSIGNED.get(op.type))


def _gradient_index(op: tf.Operation) -> int | None:
    """The index of an optimizer update op's gradient input, or None."""
    if not op.type.startswith(("Apply", "SparseApply", "ResourceApply", "ResourceSparseApply")):
        return None
    names = [arg.name for arg in op.op_def.input_arg]
    for name in ("grad", "delta"):
        if name in names:
            return names.index(name)
    return None


def _variable_ops(graph: tf.Graph, key: str) -> set[tf.Operation]:
    """The variable ops of the variables in collection ``key``."""
    return {v.op for v in graph.get_collection(key) if hasattr(v, "op")}
