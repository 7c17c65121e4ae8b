"""Where each value of a module is kept, with the control dependencies in force.

A name is keyed by its scope (as the compiler's symbol table resolves it), an
attribute of ``self`` by class, a return value by its function.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import symtable
import typing
from collections.abc import Iterable
from typing import Any

from tf1_accum.check import _compat

#: Where a value is kept: ("name", scope id, name), ("attribute", class
#: name or None, attribute), ("return", function id), ("control", call id).
Key = typing.Tuple[Any, ...]
#: The control dependencies in force where a value is built.
Control = typing.Tuple[ast.expr, ...]
#: A function or method definition.
Definition = typing.Union[ast.FunctionDef, ast.AsyncFunctionDef]
#: A parent class's symbol table, copied from another file, and its line offset.
Table = typing.Tuple[symtable.SymbolTable, int]

_MUTATORS = {"append", "extend", "insert", "add", "update", "setdefault"}
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_UNSCOPED = (ast.expr_context, ast.operator, ast.cmpop, ast.unaryop, ast.boolop)
#: Comprehensions, by the name of their symbol tables.
COMPREHENSIONS = {
    ast.ListComp: "listcomp", ast.SetComp: "setcomp", ast.GeneratorExp: "genexpr",
    ast.DictComp: "dictcomp",
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


@dataclasses.dataclass(eq=False)  # each scope is one of its own: compared by identity
class Scope:
    """A scope: the scope it is in (a method's: its class's), its symbol table (None:
    rejected by the compiler), its node, and the functions and classes it defines."""

    parent: Scope | None
    table: symtable.SymbolTable | None
    node: ast.AST
    functions: dict[str, list[Definition]] = dataclasses.field(default_factory=dict)
    classes: dict[str, ast.ClassDef] = dataclasses.field(default_factory=dict)


class Stores(ast.NodeVisitor):
    """``values[key]``: the (expression, control dependencies) stored at ``key``.
    ``tables``: the symbol tables of parent classes copied in (`_parents`)."""

    def __init__(self, tree: ast.Module, source: str, path: str, tables: Iterable[Table]) -> None:
        self.tree = tree
        self.values: dict[Key, list[tuple[ast.expr, Control]]] = {}
        self.scope_of: dict[int, Scope] = {}  # id(node) -> Scope the node is evaluated in
        self.classes: dict[str, list[ast.ClassDef]] = {}
        self.stored_attributes: dict[str, set[str | None]] = {}  # attribute -> {class or None}
        self.calls: list[tuple[ast.Call, Scope]] = []
        # tuple targets given a call: split once every function is known
        self.unpacked: list[tuple[ast.Tuple | ast.List, ast.Call, Scope, Control]] = []
        # (name, line) -> symbol tables, in the order the compiler made them
        self._tables: dict[tuple[str, int], list[symtable.SymbolTable]] = {}
        with contextlib.suppress(SyntaxError, ValueError):  # what the compiler refuses, ast not
            self._index_tables(symtable.symtable(source, path, "exec"))
        for table, offset in tables:  # parent classes copied from other files, moved down
            self._index_tables(table, offset)
        self.root = self._scope = Scope(None, None, tree)
        self._control: Control = ()
        self.visit(tree)

    def _index_tables(self, table: symtable.SymbolTable, offset: int = 0) -> None:
        for child in table.get_children():
            key = (child.get_name(), child.get_lineno() + offset)
            self._tables.setdefault(key, []).append(child)
            self._index_tables(child, offset)

    def _enter(self, node: ast.stmt | ast.expr, name: str) -> Scope:
        """The scope ``node`` opens (its table: the next one made for its line)."""
        tables = self._tables.get((name, _compat.scope_line(node)))
        scope = Scope(self._scope, tables.pop(0) if tables else None, node)
        self.scope_of[id(node)] = scope
        return scope

    def _store(self, key: Key | None, value: ast.expr, control: Control = ()) -> None:
        """Stores ``value`` at ``key`` (None: a target kept nowhere, such as ``f().x``)."""
        if key is not None:
            self.values.setdefault(key, []).append((value, control))

    def _visit_in(self, nodes: Iterable[ast.AST], scope: Scope, control: Control) -> None:
        outer = self._scope, self._control
        self._scope, self._control = scope, control
        for node in nodes:
            self.visit(node)
        self._scope, self._control = outer

    def generic_visit(self, node: ast.AST) -> None:
        self.scope_of[id(node)] = self._scope
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, _UNSCOPED):
                self.visit(child)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._visit_in([*node.decorator_list, *node.bases, *node.keywords], self._scope, ())
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
        self._visit_in(outer, self._scope, ())
        inner = self._enter(node, getattr(node, "name", "lambda"))
        positional = arguments.posonlyargs + arguments.args
        defaults = [*zip(reversed(positional), reversed(arguments.defaults))]
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
        inner = self._enter(node, COMPREHENSIONS[type(node)])
        for generator in node.generators:
            if generator is not first:
                self._visit_in([generator.iter], inner, self._control)
            self._bind(generator.target, generator.iter, inner, self._control)
            self._visit_in([generator.target, *generator.ifs], inner, self._control)
        elements = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        self._visit_in(elements, inner, self._control)

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
            self._visit_in([item.context_expr], self._scope, control)
            if item.optional_vars is not None:
                self._bind(item.optional_vars, item.context_expr, self._scope, control)
            call = item.context_expr
            if isinstance(call, ast.Call) and called_name(call) == "control_dependencies":
                control += tuple(d for d in [argument_of(call, 0, "control_inputs")] if d)
        self._visit_in(node.body, self._scope, control)

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
            for argument in call.args:
                self._store(key, argument, self._control)
        self.generic_visit(call)

    def _bind(self, target: ast.expr, value: ast.expr, scope: Scope, control: Control) -> None:
        """Stores ``value`` where ``target`` keeps it (each item its part, where known)."""
        if isinstance(target, ast.Starred):
            target = target.value
        if not isinstance(target, (ast.Tuple, ast.List)):
            self._store(self._target_key(target, scope), value, control)
        elif isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
            for element, part in zip(target.elts, value.elts):
                self._bind(element, part, scope, control)
        elif isinstance(value, ast.Call) and called_name(value) not in ("zip", "enumerate"):
            self.unpacked.append((target, value, scope, control))  # a function's tuple, maybe
        else:
            for element, part in _parts(target.elts, value):
                self._bind(element, part, scope, control)

    def _target_key(self, target: ast.expr, scope: Scope) -> Key | None:
        """Where a store to ``target`` (a name, attribute or item) goes."""
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

    def _resolve(self, scope: Scope, name: str) -> Scope:
        """The scope whose variable ``name`` is, read in ``scope``, as Python resolves it."""
        start = scope
        while scope.parent is not None:
            # A class's names are not seen from its methods; a table lists the names used there.
            seen = scope is start or not isinstance(scope.node, ast.ClassDef)
            if seen and scope.table is not None and name in scope.table.get_identifiers():
                symbol = scope.table.lookup(name)
                if symbol.is_global():
                    return self.root
                if symbol.is_local() and not symbol.is_free():
                    return scope
            scope = scope.parent
        return scope

    def _self_class(self, node: ast.expr, scope: Scope) -> ast.ClassDef | None:
        """The class whose method has ``node`` as its first parameter (``self``)."""
        if not isinstance(node, ast.Name):
            return None
        home = self._resolve(scope, node.id)
        cls = home.parent.node if home.parent is not None else None  # a method's class
        if not isinstance(cls, ast.ClassDef) or not isinstance(home.node, FUNCTIONS[:2]):
            return None
        first = (home.node.args.posonlyargs + home.node.args.args)[:1]
        return cls if first and first[0].arg == node.id else None

    def keys(self, node: ast.expr, scope: Scope | None = None) -> list[Key]:
        """Where what a name or an attribute reads is kept."""
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

    def stored(self, node: ast.expr, scope: Scope | None = None) -> list[ast.expr]:
        """The expressions stored where a name or an attribute is kept."""
        return [value for key in self.keys(node, scope) for value, _ in self.values.get(key, ())]


def _parts(elements: list[ast.expr], value: ast.expr) -> list[tuple[ast.expr, ast.expr]]:
    """The (item, part) pairs of ``a, b = zip(x, y)`` or ``i, x = enumerate(xs)``."""
    name, args = (called_name(value), value.args) if isinstance(value, ast.Call) else (None, [])
    if name == "zip" and len(args) == len(elements):
        return list(zip(elements, args))
    if name == "enumerate" and args and len(elements) == 2:
        return [(elements[1], args[0])]
    return [(element, value) for element in elements]
