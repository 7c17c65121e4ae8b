"""What each value of a module is made from: its tags, computed on demand from `_flow`.

Accumulators are known by what is done to them (zero-initialised, then added
to), not by how they were made.
"""

from __future__ import annotations

import ast
import typing
from collections.abc import Callable, Iterable, Set as AbstractSet
from typing import Any

from tf1_accum.check._flow import (
    FUNCTIONS, Definition, Key, Scope, Stores, Table, argument_of, called_name,
)  # fmt: skip

if typing.TYPE_CHECKING:  # for type checkers only: TypeGuard came with Python 3.10
    from typing import TypeGuard

#: A tag: a tuple whose first item is its kind (below).
Tag = typing.Tuple[Any, ...]
#: A variable's id: where it was made, (line, col), ("slot", ...) or (ADDED_AT, line, col).
Vid = typing.Tuple[Any, ...]

VAR = "var"  # (VAR, vid): a variable made at vid
SUM = "sum"  # (SUM, vid): what an accumulating add to vid returns
RERUN = "rerun"  # (RERUN, vid): computed from an add: running it adds again
AFTER = "after"  # (AFTER, vid): built under control dependencies on an add to vid
ZERO_OP = "zero_op"  # (ZERO_OP, vid): resets vid to zero
APPLY = "apply"  # (APPLY, vid...): an apply_gradients, with the variables it applies
ZEROS = ("zeros",)  # a zero tensor or initializer
PLACEHOLDER = ("placeholder",)
STEP = ("global_step",)
SCALED = ("scaled",)  # a quotient: a loss divided by the number of micro-batches, say
MEAN_GRADIENT = ("mean_gradient",)  # gradients of a scaled loss
GRADIENT = ("gradient",)
ADD_FUNCTION = ("add_function",)  # tf.assign_add itself, passed as a value
CONSTANT = ("constant",)
ADDED_AT = "added_at"  # vid (ADDED_AT, line, col): a variable made elsewhere, added to there
DIVIDED = "divided"  # (DIVIDED, vid): vid divided in place (assign(v / n))
COUNTER_MEAN = "counter_mean"  # (COUNTER_MEAN, vid): divided by a variable vid
STEP_MEAN = ("step_mean",)  # divided by the global step

ADDS = {"assign_add", "update_add"}
ASSIGNS = {"assign", "update"}
_VARIABLES = {
    "Variable", "VariableV1", "get_variable", "get_local_variable", "variable", "add_weight",
}  # fmt: skip
_SLOTS = {"_zeros_slot", "create_zeros_slot", "get_slot", "add_slot", "_get_or_make_slot"}
_ZEROS = {"zeros", "zeros_like", "zeros_initializer", "Zeros"}
_KERAS = {"K", "backend"}
_STEP_FUNCTIONS = {"get_or_create_global_step", "get_global_step", "create_global_step"}
GRADIENTS = {"compute_gradients", "gradients", "gradient"}
APPLIES = {"apply_gradients"}
_FRESH = {
    "zeros_like", "ones_like", "ones", "shape", "size", "rank", "int_shape", "get_shape",
    "len", "range", "xrange", "no_op", "initialized_value", "Session", "InteractiveSession",
}  # fmt: skip
# Calls whose result is still the placeholder given to them (a fed gradient stays fed).
_PASS_FEED = {
    "zip", "list", "tuple", "enumerate", "identity", "reshape", "cast", "convert_to_tensor",
    "clip_by_value", "clip_by_norm", "clip_by_global_norm", "IndexedSlices", "stop_gradient",
}  # fmt: skip
# Expressions made of their parts: their tags are the parts' tags.
_PARTS = {
    ast.ListComp: ("elt",), ast.SetComp: ("elt",), ast.GeneratorExp: ("elt",),
    ast.DictComp: ("key", "value"), ast.Tuple: ("elts",), ast.List: ("elts",), ast.Set: ("elts",),
    ast.Dict: ("values",), ast.Subscript: ("value",), ast.Starred: ("value",),
    ast.UnaryOp: ("operand",), ast.IfExp: ("body", "orelse"),
}  # fmt: skip


def kinds_of(tags: Iterable[Tag], *kinds: str) -> set[Any]:
    """The second items of the tags of the given kinds: ``kinds_of(tags, VAR, SUM)``."""
    return {t[1] for t in tags if t[0] in kinds}


class Module(Stores):
    """The values kept in one module (a parameter holds each argument), and their tags."""

    def __init__(self, tree: ast.Module, source: str, path: str, tables: Iterable[Table]) -> None:
        super().__init__(tree, source, path, tables)
        self._cache: dict[Key, frozenset[Tag]] = {}
        self._stack: dict[Key, int] = {}  # the lookups under way, by depth
        self._low = 0  # the lowest depth of a lookup under way that a cycle reached
        self._provisional: dict[Key, tuple[frozenset[Tag], int]] = {}
        for target, value, scope, control in self.unpacked:  # grows with nested tuples
            for element, part in self._returned_parts(target.elts, value, scope):
                self._bind(element, part, scope, control)
        for call, scope in self.calls:
            self._bind_call(call, scope)
        self._made = {(c.lineno, c.col_offset): c for c, _ in self.calls}  # vid -> its call

    def _returned_parts(
        self, elements: list[ast.expr], call: ast.Call, scope: Scope
    ) -> list[tuple[ast.expr, ast.expr]]:
        """The (item, part) pairs of ``a, b = f()`` for a module function returning tuples."""
        returned = [v for f, _ in self.callees(call, scope) for v in self.returns(f)]
        tuples = [v for v in returned if isinstance(v, ast.Tuple) and len(v.elts) == len(elements)]
        if returned and len(tuples) == len(returned):
            return [(e, part) for v in tuples for e, part in zip(elements, v.elts)]
        return [(element, call) for element in elements]

    def returns(self, function: Definition) -> list[ast.expr]:
        return [value for value, _ in self.values.get(("return", id(function)), ())]

    def callees(self, call: ast.Call, scope: Scope | None = None) -> list[tuple[Definition, int]]:
        """The module's functions a call runs, each with 1 for a method's ``self`` (else 0)."""
        scope = scope or self.scope_of.get(id(call), self.root)
        func = call.func
        if isinstance(func, ast.Name):
            home = self._resolve(scope, func.id)
            cls = home.classes.get(func.id)  # a class: calling it runs its __init__
            methods = self._methods(cls, "__init__") if cls is not None else []
            return [(f, 0) for f in home.functions.get(func.id, ())] + [(f, 1) for f in methods]
        if isinstance(func, ast.Attribute):
            cls = self._self_class(func.value, scope)
            classes = [cls] if cls is not None else self._instance_classes(func.value, scope)
            return [(f, 1) for c in classes for f in self._methods(c, func.attr)]
        return []

    def _methods(self, cls: ast.ClassDef, name: str) -> list[Definition]:
        """Method ``name`` of ``cls``, or of its nearest base defined in the module."""
        queue = [cls]
        for current in queue:  # breadth first: the queue grows as it is read
            found = [n for n in current.body if isinstance(n, FUNCTIONS[:2]) and n.name == name]
            if found:
                return found
            for base in current.bases:
                parents = self.classes.get(base.id, ()) if isinstance(base, ast.Name) else ()
                queue += [parent for parent in parents if parent not in queue]
        return []

    def _instance_classes(self, node: ast.expr, scope: Scope) -> list[ast.ClassDef]:
        """Module classes whose instance a name or attribute holds (``x = Model()``)."""
        return [
            c for v in self.stored(node, scope)
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name)
            for c in self.classes.get(v.func.id, ())
        ]  # fmt: skip

    def _bind_call(self, call: ast.Call, scope: Scope) -> None:
        """Stores each argument of ``call`` in its parameter."""
        for function, skip in self.callees(call, scope):
            inner = self.scope_of[id(function)]
            arguments = function.args
            positional = (arguments.posonlyargs + arguments.args)[skip:]
            for parameter, argument in zip(positional, call.args):
                if isinstance(argument, ast.Starred):
                    break
                self._store(("name", id(inner), parameter.arg), argument)
            named = {a.arg for a in positional + arguments.kwonlyargs}
            for keyword in call.keywords:
                if keyword.arg in named:
                    self._store(("name", id(inner), keyword.arg), keyword.value)

    def tags(self, node: ast.expr | None) -> frozenset[Tag]:
        """What an expression is made from (None, a missing one: nothing)."""
        if isinstance(node, (ast.Name, ast.Attribute)):
            keys, name = self.keys(node), _receiver_name(node) or ""
            held = self._union_keys(keys) if keys else self.tags(getattr(node, "value", None))
            extra = {STEP} if "global_step" in name else set()
            if isinstance(node, ast.Attribute):  # tf.assign_add, tf.zeros_initializer, uncalled
                extra |= {ADD_FUNCTION} if name in ADDS else set()
                extra |= {ZEROS} if name in _ZEROS else set()
            return frozenset(held) | extra
        if isinstance(node, ast.Call):
            return frozenset(self._call_tags(node))
        if isinstance(node, ast.BinOp):
            left, right = self.tags(node.left), self.tags(node.right)
            return frozenset(_arithmetic(left, right, type(node.op)))
        if isinstance(node, ast.Lambda):
            return frozenset(self.lookup(("return", id(node))))
        if type(node) in _PARTS:
            fields = [getattr(node, field) for field in _PARTS[type(node)]]
            return self._union([p for f in fields for p in (f if isinstance(f, list) else [f])])
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return frozenset({CONSTANT})
        return frozenset()

    def _union(self, nodes: Iterable[ast.expr | None]) -> frozenset[Tag]:
        return frozenset().union(*map(self.tags, nodes))

    def _union_keys(self, keys: Iterable[Key]) -> set[Tag]:
        return set().union(*map(self.lookup, keys))

    def lookup(self, key: Key) -> frozenset[Tag]:
        """The tags of what is stored at ``key``.

        In a cycle (``x = f(x)``), a result computed while an outer lookup was
        unfinished is provisional: reused until that lookup ends, then dropped.
        (An exception leaves the lookups under way behind: the module is then dropped.)
        """
        if key in self._cache:
            return self._cache[key]
        if key in self._stack or key in self._provisional:  # a cycle, or a result it left
            result, low = self._provisional.get(key) or (frozenset(), self._stack[key])
            self._low = min(self._low, low)
            return result
        depth = self._stack[key] = len(self._stack)
        outer_low, self._low = self._low, depth
        found: set[Tag] = set()
        for value, control in self.values.get(key, ()):
            found |= self.tags(value)
            for dependency in control:  # runs the add, but does not hold the sum
                found |= {
                    (AFTER,) + t[1:] if t[0] == SUM else t
                    for t in self.tags(dependency)
                    if t[0] in (SUM, AFTER, APPLY, ZERO_OP)
                }
        result = frozenset(found)
        del self._stack[key]
        low, self._low = self._low, outer_low
        if low >= depth:
            self._cache[key] = result
            self._provisional = {k: v for k, v in self._provisional.items() if v[1] < depth}
        else:
            self._provisional[key] = (result, low)
        self._low = min(outer_low, low)
        return result

    def _call_tags(self, call: ast.Call) -> AbstractSet[Tag]:
        """The tags of a call's result (the first match wins)."""
        name = called_name(call)
        if name in _ARITHMETIC and len(call.args) == 2:  # tf.div(a, n), tf.multiply(s, a)
            left, right = self.tags(call.args[0]), self.tags(call.args[1])
            return _arithmetic(left, right, _ARITHMETIC[name])
        if name == "cond":  # one train op: what a branch adds is not run again apart
            branches = self._union(call.args[1:] + [k.value for k in call.keywords])
            return {t for t in branches if t[0] != RERUN}
        receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
        keras_zeros = name in ("zeros", "zeros_like") and _receiver_name(receiver) in _KERAS
        if name in _VARIABLES or name in _SLOTS or keras_zeros:  # K.zeros makes a variable
            return self._variable_tags(call, name)
        if name in _ZEROS:
            return {ZEROS}
        if name == "constant_initializer":
            value = argument_of(call, 0, "value")
            return {ZEROS} if isinstance(value, ast.Constant) and value.value == 0 else set()
        if name in _FRESH:
            return set()
        if name in ("placeholder", "placeholder_with_default"):
            return {PLACEHOLDER}
        if name in _STEP_FUNCTIONS:
            return {STEP}
        callees = self.callees(call)
        if callees:
            return self._union_keys([("return", id(f)) for f, _ in callees])
        if name in GRADIENTS:
            loss = argument_of(call, 0, "loss", "ys", "target")
            mean = loss is not None and self.holds(loss, _quotient)
            return {GRADIENT, MEAN_GRADIENT} if mean else {GRADIENT}
        accumulation = self.accumulation(call)
        if accumulation is not None:
            return {(kind, v) for v in added_to(call, accumulation[0]) for kind in (SUM, RERUN)}
        if name in ASSIGNS:
            vids, assigned = self.assigned(call) or (set(), frozenset())
            zero = ZEROS in assigned or _is_zero(operands(call)[1])
            return {(ZERO_OP if zero else VAR, v) for v in vids}
        if name in APPLIES:
            tags = self.tags(argument_of(call, 0, "grads_and_vars"))
            applied = tuple(sorted(kinds_of(tags, VAR, SUM), key=repr))
            return {(APPLY,) + applied} | {t for t in tags if t[0] in (SUM, RERUN, AFTER)}
        result = self._union([*call.args, *[k.value for k in call.keywords], receiver])
        if name not in _PASS_FEED:  # a tensor computed from fed inputs is not itself fed
            result -= {PLACEHOLDER}
        return result

    def holds(self, node: ast.expr, shape: Callable[[ast.expr], bool], depth: int = 0) -> bool:
        """``shape(node)``, or of what the name, attribute or item ``node`` holds."""
        while isinstance(node, ast.Subscript):
            node = node.value
        if shape(node):
            return True
        return depth < 3 and any(self.holds(v, shape, depth + 1) for v in self.stored(node))

    def _variable_tags(self, call: ast.Call, name: str | None) -> set[Tag]:
        """A new variable (or slot: one per slot name), or the global step."""
        keywords = {k.arg: k.value for k in call.keywords}
        label = keywords.get("name", argument_of(call, 0, "name") if name != "Variable" else None)
        if isinstance(label, ast.Constant) and label.value == "global_step":
            return {STEP}
        if name not in _SLOTS:
            return {(VAR, (call.lineno, call.col_offset))}
        slot = argument_of(call, 1, "slot_name", "name")  # one variable per slot name
        where = (slot.value,) if isinstance(slot, ast.Constant) else (call.lineno, call.col_offset)
        return {(VAR, ("slot", *where))}

    def variable(self, vid: Vid) -> tuple[bool, bool]:
        """(zero-initialised, scalar) of the variable made at vid."""
        call = self._made.get(vid)
        if vid[0] == "slot" or call is not None and called_name(call) in ("zeros", "zeros_like"):
            return True, False
        if call is None:
            return False, False
        initial = argument_of(call, 0, "initial_value", "value")
        if called_name(call) in ("get_variable", "get_local_variable", "add_weight"):
            initial = argument_of(call, 3, "initializer")
        if isinstance(initial, ast.Constant):  # a number, or Keras add_weight(initializer="zeros")
            return initial.value in (0, "zeros"), initial.value != "zeros"
        zeros = isinstance(initial, ast.Call) and called_name(initial) == "zeros"
        shape = argument_of(initial, 0, "shape") if isinstance(initial, ast.Call) else None
        scalar = zeros and isinstance(shape, (ast.List, ast.Tuple)) and not shape.elts  # zeros([])
        return ZEROS in self.tags(initial), scalar

    def accumulation(self, call: ast.Call) -> tuple[set[Vid], frozenset[Tag]] | None:
        """(variables added to, tags of what is added) of ``v.assign_add(g)``,
        ``add_fn(v, g)`` or ``v.assign(v + g)``; None for any other call."""
        name = called_name(call)
        by_name = isinstance(call.func, ast.Name) and len(call.args) > 1  # add_fn(v, g)
        if name in ADDS or (by_name and ADD_FUNCTION in self.tags(call.func)):
            return self.assigned(call)
        value = operands(call)[1]
        if name in ASSIGNS and value is not None and self.holds(value, _addition):
            vids, tags = self.assigned(call) or (set(), frozenset())
            added = vids & kinds_of(tags, VAR, SUM)
            if added:
                return added, tags
        return None

    def assigned(self, call: ast.Call) -> tuple[set[Vid], frozenset[Tag]] | None:
        """(variables assigned, tags of the value) for ``v.assign(x)`` or ``tf.assign(v, x)``."""
        target, value = operands(call)
        if target is None or value is None:
            return None
        return kinds_of(self.tags(target), VAR), self.tags(value)


_ARITHMETIC = {
    "div": ast.Div, "divide": ast.Div, "truediv": ast.Div, "realdiv": ast.Div,
    "divide_no_nan": ast.Div, "div_no_nan": ast.Div, "multiply": ast.Mult, "mul": ast.Mult,
    "scalar_mul": ast.Mult, "pow": ast.Pow, "floormod": ast.Mod, "mod": ast.Mod,
    "truncatemod": ast.Mod,
}  # fmt: skip


def _arithmetic(
    left: AbstractSet[Tag], right: AbstractSet[Tag], op: type[ast.operator]
) -> AbstractSet[Tag]:
    """The tags of ``left <op> right``: a quotient of a sum is a mean, not a sum."""
    if op in (ast.Mod, ast.Pow):  # a position in a window, a decay: not a count of steps
        return (left | right) - {STEP}
    if op not in (ast.Div, ast.Mult):
        return left | right
    kept = {t for t in left | right if t[0] not in (VAR, SUM)}
    if op is ast.Mult and SCALED not in left | right:  # avg * step: scaled, but not a mean
        return kept
    numerators = kinds_of(left | right if op is ast.Mult else left, VAR, SUM)
    result = kept | {SCALED} | {(DIVIDED, vid) for vid in numerators}
    if op is ast.Div:
        result |= {(COUNTER_MEAN, vid) for vid in kinds_of(right, VAR) if numerators}
        if STEP in right and (numerators or GRADIENT in left):
            result.add(STEP_MEAN)
    return result


def operands(call: ast.Call) -> tuple[ast.expr | None, ast.expr | None]:
    """(variable, value) of ``v.assign(x)``, ``tf.assign(v, x)``, ``v.assign_add(x)``,
    ``K.update_add(v, x)``, ``add_fn(v, x)``: None where one is missing."""
    modules = {"tf", "K", "backend", "state_ops", "v1"}  # tf.assign(v, x) is not a method
    func = call.func
    receiver = func.value if isinstance(func, ast.Attribute) and len(call.args) < 2 else None
    method = receiver is not None and _receiver_name(receiver) not in modules
    target = receiver if method else argument_of(call, 0, "ref", "x", "variable")
    return target, argument_of(call, 0 if method else 1, "value", "new_value", "increment", "delta")


def added_to(call: ast.Call, vids: AbstractSet[Vid]) -> AbstractSet[Vid]:
    """``vids``, or for a variable made elsewhere, "what the add at this call adds to"."""
    return vids or {(ADDED_AT, call.lineno, call.col_offset)}


def _is_zero(node: ast.expr | None) -> bool:
    """The literal ``0`` (or ``0.0``): ``count.assign(0.0)`` resets."""
    return isinstance(node, ast.Constant) and node.value == 0 and type(node.value) is not bool


def binary(node: ast.expr | None, op: type[ast.operator]) -> TypeGuard[ast.BinOp]:
    return isinstance(node, ast.BinOp) and isinstance(node.op, op)


def _quotient(node: ast.expr) -> bool:
    """``loss / n`` or ``loss * (1 / n)``: already divided by the number of micro-batches."""
    if isinstance(node, ast.Call):
        return called_name(node) in ("divide", "truediv", "div")
    halves = binary(node, ast.Mult) and (binary(node.left, ast.Div) or binary(node.right, ast.Div))
    return binary(node, ast.Div) or halves


def _addition(node: ast.expr) -> bool:
    """``v + g`` or ``tf.add(v, g)``: what ``v.assign(...)`` accumulates with."""
    if isinstance(node, ast.Call):
        return called_name(node) in ("add", "add_n", "accumulate_n", "scatter_nd_add")
    return binary(node, ast.Add)


def _receiver_name(node: ast.expr | None) -> str | None:
    """``tf`` of ``tf.assign``, ``backend`` of ``K.backend.zeros``."""
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
