"""Parent classes from another file of the same check (``from ppo_base import Trainer``),
copied into the child's tree with their lines moved past `OFFSET` (findings
there belong to the other file, checked on its own, and are dropped).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import functools
import os
import symtable
import typing
from collections.abc import Iterable

from tf1_accum.check import _source
from tf1_accum.check._flow import Table

#: Lines of a copied parent start past this: a module longer than it is not real code.
OFFSET = 10_000_000
_DEPTH = 3  # a parent's parent in a third file, and one more

#: The files of a check by module name (see `index`).
Modules = typing.Dict[str, typing.List[str]]


def index(paths: Iterable[str]) -> Modules:
    """The files of a check by module name (``trainer_base`` of ``a/trainer_base.py``)."""
    modules: Modules = {}
    for path in paths:
        name = os.path.basename(path)
        # The test corpus keeps modules as *.py.txt.
        suffix = next((s for s in (".py.txt", ".py") if name.endswith(s)), None)
        if suffix is not None:
            modules.setdefault(name[: -len(suffix)], []).append(path)
    return modules


def graft(tree: ast.Module, path: str, modules: Modules) -> list[Table]:
    """Appends to ``tree`` each parent class it imports from ``modules`` (a few
    levels); returns the symbol table and line offset of each copy's file."""
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    tables: list[Table] = []
    defined = {node.name for node in classes}
    # Breadth first, the queue growing as it is read: the nth copy is its nth entry after tree's.
    pending: list[tuple[ast.Module, list[ast.ClassDef], str]] = [(tree, classes, path)]
    for module_tree, children, home in pending:
        if len(pending) > _DEPTH:
            break
        for module, name in _imported_bases(module_tree, children, defined):
            found = _class_in(module, name, modules, home) if len(pending) <= _DEPTH else None
            if found is None:
                continue
            node, parent_tree, source, where = found
            offset = OFFSET * len(pending)
            node = ast.increment_lineno(copy.deepcopy(node), offset)
            tree.body.append(node)
            defined.add(name)
            with contextlib.suppress(SyntaxError, ValueError):
                tables.append((symtable.symtable(source, where, "exec"), offset))
            pending.append((parent_tree, [node], where))
    return tables


def _imported_bases(
    tree: ast.Module, classes: list[ast.ClassDef], defined: set[str]
) -> list[tuple[str, str]]:
    """(module, class) of each base of ``classes`` imported by ``from module import Class``."""
    bases = [
        base.id for node in classes for base in node.bases
        if isinstance(base, ast.Name) and base.id not in defined
    ]  # fmt: skip
    imported: dict[str, tuple[str, str]] = {}
    statements: list[ast.stmt] = list(tree.body)
    for statement in statements:  # imports at the top, or in a try or if there
        if isinstance(statement, (ast.Try, ast.If)):
            statements += statement.body + statement.orelse
            statements += [s for h in getattr(statement, "handlers", ()) for s in h.body]
        elif isinstance(statement, ast.ImportFrom) and statement.module:
            for alias in statement.names:
                module = statement.module.split(".")[-1]
                imported[alias.asname or alias.name] = (module, alias.name)
    return [imported[b] for b in dict.fromkeys(bases) if b in imported]


def _class_in(
    module: str, name: str, modules: Modules, importer: str
) -> tuple[ast.ClassDef, ast.Module, str, str] | None:
    """(ClassDef, its module's tree, source, path) of class ``name`` of ``module``, or None."""
    for where in modules.get(module, ()):
        # Nothing to find in the importer itself, nor in a file that does not parse.
        if os.path.abspath(where) == os.path.abspath(importer):
            continue
        parsed = _parsed(where)
        if parsed is None:
            continue
        tree, source = parsed
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node, tree, source, where
    return None


def _parsed(path: str) -> tuple[ast.Module, str] | None:
    with contextlib.suppress(OSError):
        status = os.stat(path)
        return _parsed_version(path, status.st_mtime_ns, status.st_size)
    return None


@functools.lru_cache(maxsize=64)
def _parsed_version(path: str, mtime: int, size: int) -> tuple[ast.Module, str] | None:
    """Parsed once per version of the file (a parent serves many children)."""
    try:
        return _source.parse(_source.decode(_source.read(path)), path)
    except (OSError, _source.Unreadable, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
