"""What differs between the Python versions the checker runs on, 3.7 and later: the
other modules read each tree as Python 3.9 and later give it (`parse`), and take
`cached_property`, `unparse` and `installed_version` from here.

Before 3.9, ``ast`` wraps an item in ``Index`` or ``ExtSlice``; before 3.8 it
gives literals as ``Num``, ``Str``, ``Bytes``, ``NameConstant`` and
``Ellipsis``, and functions no ``posonlyargs``.
"""

from __future__ import annotations

import ast
import glob
import os
import sys
import typing

if sys.version_info >= (3, 9):
    from ast import unparse
    from functools import cached_property
else:

    def unparse(node: ast.AST) -> str:
        """Text that tells expressions apart, as ``ast.unparse`` (3.9) does."""
        return ast.dump(node)

    if sys.version_info >= (3, 8):
        from functools import cached_property
    else:

        class cached_property:  # functools.cached_property (3.8), as the rules use it
            def __init__(self, function: typing.Callable[[typing.Any], typing.Any]) -> None:
                self.function = function

            def __get__(self, instance: object, owner: type | None = None) -> typing.Any:
                value = instance.__dict__[self.function.__name__] = self.function(instance)
                return value


_LITERALS = {"Num": "n", "Str": "s", "Bytes": "s", "NameConstant": "value", "Ellipsis": ""}


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """The module tree of ``source`` as Python 3.9 and later give it; SyntaxError where
    this Python cannot parse it."""
    tree = ast.parse(source, filename)
    if sys.version_info < (3, 9):
        tree = _shape(tree)
    return tree


def installed_version(distribution: str) -> str | None:
    """The version of ``distribution`` as installed (None: it is not), read without
    importing it (before 3.8: from its metadata file, as ``importlib.metadata`` does)."""
    try:
        from importlib import metadata
    except ImportError:
        patterns = (f"{distribution}-*.dist-info/METADATA", f"{distribution}*.egg-info/PKG-INFO")
        for path in (p for f in sys.path for g in patterns for p in glob.glob(os.path.join(f, g))):
            with open(path, encoding="utf-8") as lines:
                return next((line[8:].strip() for line in lines if line[:8] == "Version:"), None)
        return None
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _shape(tree: ast.Module) -> ast.Module:
    """Literals as ``Constant``, items unwrapped and an empty ``posonlyargs``, made
    without recursion (the tree may be as deep as the parser allows)."""
    for node in ast.walk(tree):
        for name, value in ast.iter_fields(node):
            if isinstance(value, list):
                value[:] = [_shaped(item) for item in value]
            elif isinstance(value, ast.AST):
                setattr(node, name, _shaped(value))
        if isinstance(node, ast.Subscript) and not hasattr(node.slice, "lineno"):
            ast.copy_location(node.slice, node)  # a tuple made of an ExtSlice
        if isinstance(node, ast.arguments) and not hasattr(node, "posonlyargs"):
            node.posonlyargs = []
    return tree


def _shaped(node: typing.Any) -> typing.Any:
    name = type(node).__name__
    if name in _LITERALS:
        value = getattr(node, _LITERALS[name]) if _LITERALS[name] else ...
        return ast.copy_location(ast.Constant(value=value), node)
    if name == "Index":
        return _shaped(node.value)
    if name == "ExtSlice":
        return ast.Tuple(elts=[_shaped(dimension) for dimension in node.dims], ctx=ast.Load())
    return node
