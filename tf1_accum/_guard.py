"""The one guard of every window: two ops that change it never share a session.run.

Every way in marks what it builds that changes a window (`mark`); the first
mark makes every step TensorFlow runs (``Session.run``, ``make_callable``,
``partial_run``, the callables Keras makes) pass its fetches to `_check`
first, and `check_graph` reads the same marks. Ops of one run run in no fixed
order, so two that change one window in different ways are refused before
anything runs. A graph-wide mistake that a module above registers in
`GRAPH_CHECKS` (a global step counted twice per update, in `_migration`) is
refused the same way, in a loop that no hook or `check_graph` looks at.
A refusal that depends on a run's values is built in the graph by
`refuse_unless`.
"""

from __future__ import annotations

import typing
import weakref

from tf1_accum._compat import guard_runs, tf

from tf1_accum._locking import ancestors
from tf1_accum.check._catalogue import refusal

#: Graph collection of the marks, strings "op window field": kept in the
#: graph, so a graph exported with ``export_meta_graph`` and imported again
#: keeps its refusal.
COLLECTION = "tf1_accum_window_ops"

#: Checks of a whole graph with a window, each ``graph -> (refusal, op names)``
#: or None, made once per version of the graph: a run that runs a marked op,
#: or an op named, is then refused with that refusal.
GRAPH_CHECKS: list[typing.Callable[[tf.Graph], tuple[str, set[str]] | None]] = []


class Mark(typing.NamedTuple):
    """An op changes ``window`` as ``field`` (the attribute a user fetches, e.g. ``apply_op``)."""

    window: str
    field: str
    op: str


def mark(windows: str | typing.Sequence[str], field: str, *built: typing.Any) -> None:
    """Marks the ops (and the ops of the tensors) in ``built`` as changing ``windows``."""
    items = [item for item in tf.nest.flatten(built) if isinstance(item, (tf.Tensor, tf.Operation))]
    for op in dict.fromkeys(getattr(item, "op", item) for item in items):
        for window in [windows] if isinstance(windows, str) else windows:
            op.graph.add_to_collection(COLLECTION, f"{op.name} {window} {field}")
    guard_runs(_check)


def refuse_unless(
    holds: tf.Tensor, message: str, *values: tf.Tensor, name: str, summarize: int = 8
) -> tf.Operation:
    """An op failing its run unless ``holds`` (a bool): with ``message``, then ``values``.

    Each value shows ``summarize`` entries at most. The ``Assert`` op itself:
    ``tf.debugging.Assert`` would wrap it in a conditional, at a cost per run.
    """
    data = [tf.constant(message), *values]
    return tf.raw_ops.Assert(condition=holds, data=data, summarize=summarize, name=name)


def marks(op: tf.Operation) -> list[Mark]:
    """The marks of ``op`` itself (not those of the ops a ``tf.group`` groups)."""
    found = _marks(op.graph)
    return found.named.get(op.name, []) if found else []


def pairs(found: typing.Iterable[Mark]) -> typing.Iterator[tuple[Mark, Mark]]:
    """Each mark of a window an earlier mark changes as another field, with that one."""
    first: dict[str, Mark] = {}
    for one in found:
        other = first.setdefault(one.window, one)
        # One field is one op (with the tensors it computes), or flushes, which wait in turn.
        if other.field != one.field:
            yield other, one


class _Graph:
    """One graph's marks: by op name, and reached from an op through ``tf.group``'s NoOps."""

    def __init__(self, entries: list[typing.Any]) -> None:
        self.size = len(entries)
        self.named: dict[str, list[Mark]] = {}
        self.reached: dict[int, list[Mark]] = {}  # by id: ops live as long as their graph
        for entry in entries:
            name, window, field = tf.compat.as_str(entry).split(" ")
            self.named.setdefault(name, []).append(Mark(window, field, name))
        self.version = -1  # of the graph when `GRAPH_CHECKS` last ran
        self.wrong: tuple[str, set[str]] | None = None  # what the first that found one said
        self.reaching: dict[int, bool] = {}  # by id: whether an op runs an op `wrong` names

    def graph_wrong(self, graph: tf.Graph) -> tuple[str, set[str]] | None:
        """The first of `GRAPH_CHECKS` to find a mistake in ``graph`` (its answer), or None.

        Made once per version of the graph: the mistake may be built after
        the window, never after the run it is in.
        """
        version = graph.version
        if self.version != version:
            found = [wrong for wrong in (check(graph) for check in GRAPH_CHECKS) if wrong]
            self.reaching, self.wrong = {}, found[0] if found else None
            self.version = version  # last: a run of another thread looks again meanwhile
        return self.wrong

    def runs_any(self, op: tf.Operation, names: set[str]) -> bool:
        """Whether running ``op`` runs an op named in ``names`` (the same on every call)."""
        if id(op) not in self.reaching:
            self.reaching[id(op)] = not names.isdisjoint(ancestors([op]))
        return self.reaching[id(op)]

    def of(self, op: tf.Operation) -> list[Mark]:
        found = self.reached.get(id(op))
        if found is None:
            found = self.named.get(op.name, [])
            if not found and op.type == "NoOp":
                found = [m for each in op.control_inputs for m in self.of(each)]
            self.reached[id(op)] = found
        return found


_GRAPHS: weakref.WeakKeyDictionary[tf.Graph, _Graph] = weakref.WeakKeyDictionary()


def _marks(graph: tf.Graph) -> _Graph | None:
    entries = graph.get_collection(COLLECTION)
    if not entries:
        return None
    found = _GRAPHS.get(graph)
    if found is None or found.size != len(entries):  # a window was built since
        found = _GRAPHS[graph] = _Graph(entries)
    return found


def _check(graph: tf.Graph, ops: list[tf.Operation], tensors: list[tf.Tensor]) -> None:
    """Refuses a step that fetches two marks of one window: a ValueError before anything runs.

    In a graph one of `GRAPH_CHECKS` finds wrong, it refuses a step that runs
    a marked op, or an op that check names, the same way.
    """
    found = _marks(graph)
    if found is None:
        return
    ran = ops + [t.op for t in tensors]
    fetched = [m for op in ran for m in found.of(op)]
    wrong = found.graph_wrong(graph)
    if wrong and (fetched or any(found.runs_any(op, wrong[1]) for op in ran)):
        raise ValueError(wrong[0] + " Refused before this session.run ran anything.")
    for first, second in pairs(fetched):
        what = f"{first.field} ({first.op}) and {second.field} ({second.op}) of one accumulation"
        raise ValueError(
            refusal("TFA010", what + " are fetched in one session.run", _fix(first, second))
        )


#: What each op does to its window, for the pairs whose fix is not fused=True.
_DOES = {
    "zero_op": "zero_op discards the window: run it before a window or instead of its apply",
    "flush_op": "flush_op applies what the window holds: run it after the loop's last train op",
    "accum_apply_op": "accum_apply_op adds the last micro-batch and applies: run it alone, with "
    "that micro-batch's feed",
    "apply_op": "apply_op applies the window, fed nothing, after its micro-batches",
}


def _fix(first: Mark, second: Mark) -> str | None:
    """What to do instead of fetching ``first`` with ``second`` (None: the catalogue's fix)."""
    if {first.field, second.field} == {"accum_op", "apply_op"}:
        return None  # the catalogue's: each alone, or fused=True's accum_apply_op
    does = [_DOES[m.field] for m in (first, second) if m.field in _DOES]
    return f"run {first.field} and {second.field} each in a session.run of its own; " + (
        "; ".join(does) or "each changes the window"
    )
