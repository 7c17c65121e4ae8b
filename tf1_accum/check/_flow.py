"""What each value in a module is made from (`tf1_accum.check._rules` reads it).

One pass records the expressions stored at each place a value is kept (a name
in its scope, a ``self`` attribute of a class, a function's parameters and
return value); tags ("made from zero variable ``v``", "an ``assign_add`` on
``v``", "a placeholder", ...) are computed on demand. Accumulators are known by
what is done to them (zero-initialised, then added to), not by how they were
made, so ``tf.Variable``, ``get_variable``, slots and Keras variables all count.
"""

from __future__ import annotations

import ast
import functools
import symtable
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from typing import Any, TypeGuard

#: A tag: a tuple whose first item is its kind (below).
Tag = tuple[Any, ...]
#: Where a value is kept: ("name", scope id, name), ("attribute", class
#: name or None, attribute), ("return", function id), ("control", call id).
Key = tuple[Any, ...]
#: A variable's id: where it was made, (line, col) or ("slot", ...), or an
#: (ADDED_AT, line, col) for one made in another module.
Vid = tuple[Any, ...]
#: The control dependencies in force where a value is built.
Control = tuple[ast.expr, ...]
#: A function or method definition.
Definition = ast.FunctionDef | ast.AsyncFunctionDef
#: A node that opens a scope.
Scoped = (
    Definition
    | ast.Lambda
    | ast.ClassDef
    | ast.ListComp
    | ast.SetComp
    | ast.GeneratorExp
    | ast.DictComp
)
#: A parent class's symbol table, copied from another file, and its line offset.
Table = tuple[symtable.SymbolTable, int]

# Tag kinds. A tag is a tuple whose first item is its kind.
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
# Calls whose result is still the placeholder given to them: a fed gradient
# stays one through these, and through names, containers and arithmetic.
_PASS_FEED = {
    "zip", "list", "tuple", "enumerate", "identity", "reshape", "cast", "convert_to_tensor",
    "clip_by_value", "clip_by_norm", "clip_by_global_norm", "IndexedSlices", "stop_gradient",
}  # fmt: skip
_MUTATORS = {"append", "extend", "insert", "add", "update", "setdefault"}
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_UNSCOPED = (ast.expr_context, ast.operator, ast.cmpop, ast.unaryop, ast.boolop)
_COMPREHENSIONS = {  # their symbol tables' names
    ast.ListComp: "listcomp", ast.SetComp: "setcomp", ast.GeneratorExp: "genexpr",
    ast.DictComp: "dictcomp",
}  # fmt: skip
# Expressions made of their parts: their tags are the parts' tags.
_PARTS = {
    ast.ListComp: ("elt",), ast.SetComp: ("elt",), ast.GeneratorExp: ("elt",),
    ast.DictComp: ("key", "value"), ast.Tuple: ("elts",), ast.List: ("elts",), ast.Set: ("elts",),
    ast.Dict: ("values",), ast.Subscript: ("value",), ast.Starred: ("value",),
    ast.UnaryOp: ("operand",), ast.IfExp: ("body", "orelse"),
}  # fmt: skip


def called_name(call: ast.Call) -> str | None:
    """The last name of what a call calls: ``tf.train.Foo(...)`` -> ``"Foo"``."""
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def argument_of(call: ast.Call, index: int, *keywords: str) -> ast.expr | None:
    """The argument given by one of ``keywords``, or else at position ``index`` (None: absent)."""
    for keyword in call.keywords:
        if keyword.arg in keywords:
            return keyword.value
    if len(call.args) > index and not any(isinstance(a, ast.Starred) for a in call.args[:index]):
        return call.args[index]
    return None


def kinds_of(tags: Iterable[Tag], kind: str) -> set[Any]:
    """The second items of the tags of one kind: ``kinds_of(tags, VAR)``, the variables."""
    return {t[1] for t in tags if t[0] == kind}


class _Scope:
    """A module, class, function, lambda or comprehension: its symbol table
    (None where the compiler rejects the module), the functions and classes
    it defines by name, and, for a method, its class."""

    def __init__(
        self,
        parent: _Scope | None,
        table: symtable.SymbolTable | None,
        node: ast.AST,
        cls: ast.ClassDef | None = None,
    ) -> None:
        self.parent, self.table, self.node, self.cls = parent, table, node, cls
        self.functions: dict[str, list[Definition]] = {}
        self.classes: dict[str, ast.ClassDef] = {}


def _symbol(table: symtable.SymbolTable | None, name: str) -> symtable.Symbol | None:
    """The symbol table's entry for ``name`` (None: the name is not used there)."""
    if table is None:  # the compiler rejected the module
        return None
    try:
        return table.lookup(name)
    except KeyError:  # not used there
        return None


class Module(ast.NodeVisitor):
    """The values kept in one module, and their tags.

    Visiting the tree records, under a key for each place a value is kept,
    the expressions stored there with the control dependencies in force: a
    name's key is its scope's (found with the compiler's symbol table, as
    Python resolves it), an attribute of ``self`` is keyed by class, a
    parameter also receives each argument the module passes to it, and a
    function's return value is kept under the function. ``tables`` holds the
    (symbol table, line offset) of each parent class copied in from another
    file (`tf1_accum.check._parents`).
    """

    def __init__(
        self, tree: ast.Module, source: str, path: str, tables: Iterable[Table] = ()
    ) -> None:
        self.tree = tree
        # key -> [(expression, control dependencies)]
        self.values: dict[Key, list[tuple[ast.expr, Control]]] = {}
        self.scope_of: dict[int, _Scope] = {}  # id(node) -> _Scope the node is evaluated in
        self.classes: dict[str, list[ast.ClassDef]] = {}
        # attribute name -> {class name or None}
        self.stored_attributes: dict[str, set[str | None]] = {}
        self.calls: list[tuple[ast.Call, _Scope]] = []
        self._unpacked: list[tuple[ast.Tuple | ast.List, ast.expr, _Scope, Control]] = []
        self._functions_known = False
        self._cache: dict[Key, frozenset[Tag]] = {}
        self._stack: dict[Key, int] = {}  # the lookups under way, by depth
        self._low: int | None = None
        self._provisional: dict[Key, tuple[frozenset[Tag], int]] = {}
        # (name, line) -> symbol tables, in the order the compiler made them
        self._tables: dict[tuple[str, int], list[symtable.SymbolTable]] = {}
        try:
            self._index_tables(symtable.symtable(source, path, "exec"))
        except (SyntaxError, ValueError):  # what ast accepts and the compiler does not
            pass
        for table, offset in tables:  # parent classes copied from other files, moved down
            self._index_tables(table, offset)
        self.root = self._scope = _Scope(None, None, tree)
        self._control: Control = ()
        self.visit(tree)
        self._functions_known = True
        for target, value, scope, control in self._unpacked:
            self._bind(target, value, scope, control)
        for call, scope in self.calls:
            self._bind_call(call, scope)

    def _index_tables(self, table: symtable.SymbolTable, offset: int = 0) -> None:
        """Files every symbol table under ``table`` by its (name, line + offset)."""
        for child in table.get_children():
            key = (child.get_name(), child.get_lineno() + offset)
            self._tables.setdefault(key, []).append(child)
            self._index_tables(child, offset)

    def _enter(self, node: Scoped, name: str, cls: ast.ClassDef | None = None) -> _Scope:
        """The scope that ``node`` opens (its symbol table is the next one made for its line)."""
        tables = self._tables.get((name, node.lineno))
        scope = _Scope(self._scope, tables.pop(0) if tables else None, node, cls)
        self.scope_of[id(node)] = scope
        return scope

    def _store(self, key: Key, value: ast.expr, control: Control = ()) -> None:
        """Records that ``value`` is kept at ``key``, built under ``control``."""
        self.values.setdefault(key, []).append((value, control))

    def _visit_in(
        self,
        nodes: Iterable[ast.AST | None],
        scope: _Scope | None = None,
        control: Control | None = None,
    ) -> None:
        """Visits ``nodes`` in ``scope`` under ``control`` (default: the current ones)."""
        outer = self._scope, self._control
        self._scope = outer[0] if scope is None else scope
        self._control = outer[1] if control is None else control
        for node in nodes:
            if node is not None:
                self.visit(node)
        self._scope, self._control = outer

    # -- visiting: what each kind of node stores --------------------------------

    def generic_visit(self, node: ast.AST) -> None:
        self.scope_of[id(node)] = self._scope
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, _UNSCOPED):
                self.visit(child)

    def visit_Name(self, node: ast.Name | ast.Constant) -> None:
        self.scope_of[id(node)] = self._scope

    visit_Constant = visit_Name

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.scope_of[id(node)] = self._scope
        self.visit(node.value)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._visit_in([*node.decorator_list, *node.bases, *node.keywords], control=())
        self._scope.classes[node.name] = node
        self.classes.setdefault(node.name, []).append(node)
        self._visit_in(node.body, self._enter(node, node.name), ())

    def visit_FunctionDef(self, node: Definition | ast.Lambda) -> None:
        """Parameters hold their defaults (and, later, the arguments of each call)."""
        arguments = node.args
        outer = arguments.defaults + [d for d in arguments.kw_defaults if d]
        if not isinstance(node, ast.Lambda):
            self._scope.functions.setdefault(node.name, []).append(node)
            outer += node.decorator_list
        self._visit_in(outer, control=())
        cls = self._scope.node if isinstance(self._scope.node, ast.ClassDef) else None
        if isinstance(node, ast.Lambda):
            inner = self._enter(node, "lambda")
        else:
            inner = self._enter(node, node.name, cls)
        positional = arguments.posonlyargs + arguments.args
        defaults = list(
            zip(positional[len(positional) - len(arguments.defaults) :], arguments.defaults)
        )
        defaults += [(p, d) for p, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d]
        for parameter, default in defaults:
            self._store(("name", id(inner), parameter.arg), default)
        if isinstance(node, ast.Lambda):
            self._store(("return", id(node)), node.body)
        self._visit_in([node.body] if isinstance(node, ast.Lambda) else node.body, inner, ())

    visit_AsyncFunctionDef = visit_Lambda = visit_FunctionDef

    def visit_ListComp(
        self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp
    ) -> None:
        """The first iterable is read outside, the rest in the comprehension's own scope."""
        first = node.generators[0]
        self.visit(first.iter)
        inner = self._enter(node, _COMPREHENSIONS[type(node)])
        for generator in node.generators:
            if generator is not first:
                self._visit_in([generator.iter], inner)
            self._bind(generator.target, generator.iter, inner, self._control)
            self._visit_in([generator.target, *generator.ifs], inner)
        elements = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        self._visit_in(elements, inner)

    visit_SetComp = visit_GeneratorExp = visit_DictComp = visit_ListComp

    def visit_Assign(
        self,
        node: ast.Assign | ast.AnnAssign | ast.AugAssign | ast.NamedExpr | ast.For | ast.AsyncFor,
    ) -> None:
        """``x = v``, ``x: T = v``, ``x += v``, ``(x := v)``, ``for x in v``: ``x`` holds ``v``."""
        value = node.iter if isinstance(node, (ast.For, ast.AsyncFor)) else node.value
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if value is not None:
            for target in targets:
                self._bind(target, value, self._scope, self._control)
        self.generic_visit(node)

    visit_AnnAssign = visit_AugAssign = visit_NamedExpr = visit_For = visit_AsyncFor = visit_Assign

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        """What is built under ``tf.control_dependencies(ops)`` runs ``ops``."""
        self.scope_of[id(node)] = self._scope
        control = self._control
        for item in node.items:
            self._visit_in([item.context_expr], control=control)
            if item.optional_vars is not None:
                self._bind(item.optional_vars, item.context_expr, self._scope, control)
            call = item.context_expr
            if isinstance(call, ast.Call) and called_name(call) == "control_dependencies":
                control += tuple(d for d in [argument_of(call, 0, "control_inputs")] if d)
        self._visit_in(node.body, control=control)

    visit_AsyncWith = visit_With

    def visit_Return(self, node: ast.Return) -> None:
        if node.value is not None and isinstance(self._scope.node, FUNCTIONS[:2]):
            self._store(("return", id(self._scope.node)), node.value, self._control)
        self.generic_visit(node)

    def visit_Call(self, call: ast.Call) -> None:
        """A call's control dependencies; ``x.append(v)`` stores ``v`` where ``x`` is kept."""
        self.calls.append((call, self._scope))
        for dependency in self._control:
            self._store(("control", id(call)), dependency)
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr in _MUTATORS and call.args:
            key = self._target_key(func.value, self._scope)
            if key is not None:
                for argument in call.args:
                    self._store(key, argument, self._control)
        self.generic_visit(call)

    # -- where a store goes, and what a name reads ------------------------------

    def _bind(self, target: ast.expr, value: ast.expr, scope: _Scope, control: Control) -> None:
        """Stores ``value`` where ``target`` keeps it; each item of a tuple target
        gets its own part of the value where that part is known."""
        if isinstance(target, ast.Starred):
            target = target.value
        if not isinstance(target, (ast.Tuple, ast.List)):
            key = self._target_key(target, scope)
            if key is not None:
                self._store(key, value, control)
            return
        pairs = self._unpack(target.elts, value, scope)
        if pairs is None:  # a call to a function the visit may not have reached yet
            self._unpacked.append((target, value, scope, control))
        for element, part in pairs or ():
            self._bind(element, part, scope, control)

    def _unpack(
        self, elements: list[ast.expr], value: ast.expr, scope: _Scope
    ) -> list[tuple[ast.expr, ast.expr]] | None:
        """The (item, part) pairs of ``a, b = x, y``, ``zip(x, y)``, ``enumerate(x)``
        or a call to a module function that returns a tuple; else each item
        may hold any part. None for a call before every function is known."""
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(elements):
            return list(zip(elements, value.elts))
        if isinstance(value, ast.Call):
            called = called_name(value)
            if called == "zip" and len(value.args) == len(elements):
                return list(zip(elements, value.args))
            if called == "enumerate" and value.args and len(elements) == 2:
                return [(elements[1], value.args[0])]
            if not self._functions_known:
                return None
            callees = self.callees(value, scope)
            returned = [v for f, _ in callees for v, _ in self.values.get(("return", id(f)), ())]
            tuples = [
                v for v in returned if isinstance(v, ast.Tuple) and len(v.elts) == len(elements)
            ]
            if returned and len(tuples) == len(returned):
                return [(e, part) for v in tuples for e, part in zip(elements, v.elts)]
        return [(element, value) for element in elements]

    def _target_key(self, target: ast.expr, scope: _Scope) -> Key | None:
        """Where a store to ``target`` goes: a name, an attribute, or what an item is set in."""
        while isinstance(target, ast.Subscript):
            target = target.value
        if isinstance(target, ast.Name):
            return ("name", id(self._resolve(scope, target.id)), target.id)
        if isinstance(target, ast.Attribute):
            owner = self._self_class(target.value, scope)
            name = owner.name if owner is not None else None
            self.stored_attributes.setdefault(target.attr, set()).add(name)
            return ("attribute", name, target.attr)
        return None

    def _resolve(self, scope: _Scope, name: str) -> _Scope:
        """The scope whose variable ``name`` is, read in ``scope``, as Python resolves it."""
        start = scope
        while scope.parent is not None:
            seen = scope is start or not isinstance(scope.node, ast.ClassDef)
            symbol = _symbol(scope.table, name) if seen else None
            if symbol is not None and symbol.is_global():
                return self.root
            if symbol is not None and symbol.is_local() and not symbol.is_free():
                return scope
            scope = scope.parent
        return scope

    def _self_class(self, node: ast.expr, scope: _Scope) -> ast.ClassDef | None:
        """The class whose method has ``node`` as its first parameter (``self``)."""
        if not isinstance(node, ast.Name):
            return None
        home = self._resolve(scope, node.id)
        if home.cls is None or not isinstance(home.node, FUNCTIONS[:2]):  # cls: a method's
            return None
        first = (home.node.args.posonlyargs + home.node.args.args)[:1]
        return home.cls if first and first[0].arg == node.id else None

    # -- calls to the module's own functions ---------------------------------

    def callees(self, call: ast.Call, scope: _Scope | None = None) -> list[tuple[Definition, int]]:
        """The module's function definitions a call runs, with the number of
        implicit leading arguments (1 for a method's ``self``)."""
        scope = scope or self.scope_of.get(id(call), self.root)
        func = call.func
        if isinstance(func, ast.Name):
            home = self._resolve(scope, func.id)
            found = [(f, 0) for f in home.functions.get(func.id, ())]
            cls = home.classes.get(func.id)
            if cls is not None:
                found += [(f, 1) for f in self._methods(cls, "__init__")]
            return found
        if isinstance(func, ast.Attribute):
            cls = self._self_class(func.value, scope)
            classes = [cls] if cls is not None else self._instance_classes(func.value, scope)
            return [(f, 1) for c in classes for f in self._methods(c, func.attr)]
        return []

    def _methods(self, cls: ast.ClassDef, name: str) -> list[Definition]:
        """The definitions of method ``name`` in ``cls``, or else in the nearest
        of its bases defined in the module (by name)."""
        queue = [cls]
        for current in queue:  # breadth first: the queue grows as it is read
            found = [n for n in current.body if isinstance(n, FUNCTIONS[:2]) and n.name == name]
            if found:
                return found
            for base in current.bases:
                parents = self.classes.get(base.id, ()) if isinstance(base, ast.Name) else ()
                queue += [parent for parent in parents if parent not in queue]
        return []

    def _instance_classes(self, node: ast.expr, scope: _Scope) -> list[ast.ClassDef]:
        """Module classes whose instance a name or attribute holds (``x = Model()``)."""
        return [
            c for v in self.stored(node, scope)
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name)
            for c in self.classes.get(v.func.id, ())
        ]  # fmt: skip

    def _bind_call(self, call: ast.Call, scope: _Scope) -> None:
        """Stores each argument of ``call`` in the parameter of the module's function it is for."""
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

    def keys(self, node: ast.expr, scope: _Scope | None = None) -> list[Key]:
        """Where what a name or an attribute reads is kept (none for other expressions)."""
        scope = self.scope_of.get(id(node), self.root) if scope is None else scope
        if isinstance(node, ast.Name):
            return [("name", id(self._resolve(scope, node.id)), node.id)]
        if not isinstance(node, ast.Attribute):
            return []
        owners = self.stored_attributes.get(node.attr, set())
        cls = self._self_class(node.value, scope)
        if cls is not None and cls.name in owners:
            return [("attribute", cls.name, node.attr)]
        return [("attribute", owner, node.attr) for owner in owners]

    def stored(self, node: ast.expr, scope: _Scope | None = None) -> list[ast.expr]:
        """The expressions stored where a name or an attribute is kept."""
        return [value for key in self.keys(node, scope) for value, _ in self.values.get(key, ())]

    # -- tags -------------------------------------------------------------------

    def tags(self, node: ast.expr) -> frozenset[Tag]:
        """The tags of an expression: what it is made from."""
        if isinstance(node, ast.Name):
            extra = {STEP} if "global_step" in node.id else set()
            return frozenset(self._union_keys(self.keys(node))) | extra
        if isinstance(node, ast.Attribute):
            keys = self.keys(node)
            extra = {STEP} if "global_step" in node.attr else set()
            extra |= {ADD_FUNCTION} if node.attr in ADDS else set()
            extra |= {ZEROS} if node.attr in _ZEROS else set()  # tf.zeros_initializer, uncalled
            held = self._union_keys(keys) if keys else self.tags(node.value)
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
        """The tags of any of ``nodes``."""
        return frozenset().union(*(self.tags(node) for node in nodes if node is not None))

    def _union_keys(self, keys: Iterable[Key]) -> set[Tag]:
        """The tags of what is stored at any of ``keys``."""
        return set().union(*map(self.lookup, keys))

    def lookup(self, key: Key) -> frozenset[Tag]:
        """The tags of what is stored at ``key``.

        Stores can form cycles (``x = f(x)``, methods that call each other).
        A result computed while an outer lookup of its cycle was unfinished
        is kept as provisional (so the cycle is walked once, not once per
        path into it) and dropped when that outer lookup finishes, to be
        computed again, complete, if it is asked for later.
        """
        if key in self._cache:
            return self._cache[key]
        if key in self._stack:
            self._lower(self._stack[key])
            return frozenset()
        if key in self._provisional:
            result, low = self._provisional[key]
            self._lower(low)
            return result
        depth = self._stack[key] = len(self._stack)
        outer_low, self._low = self._low, depth
        try:
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
        finally:
            del self._stack[key]
            low, self._low = self._low, outer_low
        if low >= depth:
            self._cache[key] = result
            self._provisional = {k: v for k, v in self._provisional.items() if v[1] < depth}
        else:
            self._provisional[key] = (result, low)
        if outer_low is not None:
            self._low = min(outer_low, low)
        return result

    def _lower(self, low: int) -> None:
        """Marks the lookup under way as unfinished down to depth ``low``."""
        self._low = low if self._low is None else min(self._low, low)

    def _call_tags(self, call: ast.Call) -> AbstractSet[Tag]:
        """The tags of a call's result, by what it calls (the first match wins)."""
        name = called_name(call)
        if name in _ARITHMETIC and len(call.args) == 2:  # tf.div(a, n), tf.multiply(s, a)
            left, right = self.tags(call.args[0]), self.tags(call.args[1])
            return _arithmetic(left, right, _ARITHMETIC[name])
        if name == "cond":  # one train op: what a branch adds is not run again apart
            branches = self._union(call.args[1:] + [k.value for k in call.keywords])
            return {t for t in branches if t[0] != RERUN}
        func = call.func
        receiver = func.value if isinstance(func, ast.Attribute) else None
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
            gradients = argument_of(call, 0, "grads_and_vars")
            tags = self.tags(gradients) if gradients is not None else frozenset()
            applied = tuple(sorted(kinds_of(tags, VAR) | kinds_of(tags, SUM), key=repr))
            return {(APPLY,) + applied} | {t for t in tags if t[0] in (SUM, RERUN, AFTER)}
        result = self._union(list(call.args) + [k.value for k in call.keywords])
        if receiver is not None:
            result |= self.tags(receiver)
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
        """(zero-initialised, scalar) for the variable made at vid."""
        call = self._made.get(vid)
        if vid[0] == "slot" or call is not None and called_name(call) in ("zeros", "zeros_like"):
            return True, False
        if call is None:
            return False, False
        name = called_name(call)
        initial = argument_of(call, 0, "initial_value", "value")
        if name in ("get_variable", "get_local_variable", "add_weight"):
            initial = argument_of(call, 3, "initializer")
        if initial is None:
            return False, False
        if isinstance(initial, ast.Constant):
            if initial.value == "zeros":  # Keras add_weight(initializer="zeros")
                return True, False
            return initial.value == 0, True
        zeros = isinstance(initial, ast.Call) and called_name(initial) == "zeros"
        # tf.zeros([]): a scalar
        shape = (
            argument_of(initial, 0, "shape") if isinstance(initial, ast.Call) and zeros else None
        )
        return ZEROS in self.tags(initial), isinstance(
            shape, (ast.List, ast.Tuple)
        ) and not shape.elts

    @functools.cached_property
    def _made(self) -> dict[Vid, ast.Call]:
        """The calls by position: a variable id is where it was made."""
        return {(c.lineno, c.col_offset): c for c, _ in self.calls}

    def accumulation(self, call: ast.Call) -> tuple[set[Vid], frozenset[Tag]] | None:
        """(variables added to, tags of what is added) for an accumulating call:
        ``v.assign_add(g)``, ``tf.assign_add(v, g)``, ``add_fn(v, g)``,
        ``v.assign(v + g)``; None for any other call."""
        name = called_name(call)
        func = call.func
        target, value = operands(call)
        if target is None or value is None:
            return None
        if name in ADDS or (
            isinstance(func, ast.Name) and ADD_FUNCTION in self.tags(func) and len(call.args) > 1
        ):
            return kinds_of(self.tags(target), VAR), self.tags(value)
        if name in ASSIGNS and self.holds(value, _addition):
            vids, tags = kinds_of(self.tags(target), VAR), self.tags(value)
            added = vids & (kinds_of(tags, VAR) | kinds_of(tags, SUM))
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
        return (left - {STEP}) | (right - {STEP})
    quotient = op is ast.Div or (op is ast.Mult and (SCALED in left or SCALED in right))
    if not quotient:
        if op is ast.Mult:  # avg * step: scaled, but not a mean
            return {t for t in left | right if t[0] not in (VAR, SUM)}
        return left | right
    numerators = kinds_of(left, VAR) | kinds_of(left, SUM)
    if op is ast.Mult:
        numerators |= kinds_of(right, VAR) | kinds_of(right, SUM)
    result = {t for t in left | right if t[0] not in (VAR, SUM)} | {SCALED}
    result |= {(DIVIDED, vid) for vid in numerators}
    if op is ast.Div:
        result |= {(COUNTER_MEAN, vid) for vid in kinds_of(right, VAR) if numerators}
        if STEP in right and (numerators or GRADIENT in left):
            result.add(STEP_MEAN)
    return result


def operands(call: ast.Call) -> tuple[ast.expr | None, ast.expr | None]:
    """(variable, value) of ``v.assign(x)``, ``tf.assign(v, x)``, ``v.assign_add(x)``,
    ``K.update_add(v, x)``, ``add_fn(v, x)``: None where one is missing."""
    func = call.func
    modules = {"tf", "K", "backend", "state_ops", "v1"}  # tf.assign(v, x) is not a method
    receiver = func.value if isinstance(func, ast.Attribute) and len(call.args) < 2 else None
    method = receiver is not None and _receiver_name(receiver) not in modules
    target = receiver if method else argument_of(call, 0, "ref", "x", "variable")
    value = argument_of(call, 0 if method else 1, "value", "new_value", "increment", "delta")
    return target, value


def added_to(call: ast.Call, vids: AbstractSet[Vid]) -> AbstractSet[Vid]:
    """The variables an accumulating call adds to: ``vids``, or when the module
    does not make the variable (an attribute set by a class of another module,
    a parameter), one known only as "what the add at this call adds to"."""
    return vids or {(ADDED_AT, call.lineno, call.col_offset)}


def _is_zero(node: ast.expr | None) -> bool:
    """The literal ``0`` (or ``0.0``): ``count.assign(0.0)`` resets."""
    return isinstance(node, ast.Constant) and node.value == 0 and type(node.value) is not bool


def binary(node: ast.expr | None, op: type[ast.operator]) -> TypeGuard[ast.BinOp]:
    """True for ``a <op> b``: ``binary(node, ast.Div)``."""
    return isinstance(node, ast.BinOp) and isinstance(node.op, op)


def _quotient(node: ast.expr) -> bool:
    """``loss / n`` or ``loss * (1 / n)``: already divided by the number of micro-batches."""
    if isinstance(node, ast.Call):
        return called_name(node) in ("divide", "truediv", "div")
    halves = binary(node, ast.Mult) and (binary(node.left, ast.Div) or binary(node.right, ast.Div))
    return binary(node, ast.Div) or halves


def _addition(node: ast.expr) -> bool:
    """``v + g`` or ``tf.add(v, g)``: what ``v.assign(...)`` accumulates with; a
    tensor merely computed from ``v`` (a model's new state) is not an add to it."""
    if isinstance(node, ast.Call):
        return called_name(node) in ("add", "add_n", "accumulate_n", "scatter_nd_add")
    return binary(node, ast.Add)


def _receiver_name(node: ast.expr | None) -> str | None:
    """``tf`` of ``tf.assign``, ``backend`` of ``K.backend.zeros``."""
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
