"""``tf1_accum.check._compat``: on every Python the checker runs on (3.7 and later),
the tree of Python 3.9 and later, its literals and items, so the rules find the
same things.

Pure Python, run on the oldest and the newest Python supported alike.
"""

import ast

import pytest

from tf1_accum.check import _compat

# The checker does not depend on the graph mode: run in the v1 mode only.
pytestmark = pytest.mark.graph_mode_independent

# What Python 3.7 and 3.8 give in place of Constant, and items wrapped in them.
_OLD_NODES = {"Num", "Str", "Bytes", "NameConstant", "Ellipsis", "Index", "ExtSlice"}


def test_literals_are_constants_and_items_are_not_wrapped():
    tree = _compat.parse("a = 7, 2.5, 'text', b'raw', None, True, ...\nb = x[0]\nc = x[1:2, 3]\n")
    literals, item, items = (statement.value for statement in tree.body)
    assert all(type(element) is ast.Constant for element in literals.elts)
    values = [element.value for element in literals.elts]
    assert values == [7, 2.5, "text", b"raw", None, True, ...]
    assert [type(value) for value in values] == [
        int,
        float,
        str,
        bytes,
        type(None),
        bool,
        type(...),
    ]
    assert type(item.slice) is ast.Constant and item.slice.value == 0
    assert type(items.slice) is ast.Tuple
    bounds, three = items.slice.elts
    assert type(bounds) is ast.Slice and (bounds.lower.value, bounds.upper.value) == (1, 2)
    assert type(three) is ast.Constant and three.value == 3
    assert not {type(node).__name__ for node in ast.walk(tree)} & _OLD_NODES


def test_every_function_has_positional_only_parameters():
    function, lambda_ = _compat.parse("def f(a, *b, c=1, **d): pass\ng = lambda x: x\n").body
    assert function.args.posonlyargs == [] and lambda_.value.args.posonlyargs == []
    assert [a.arg for a in function.args.args + function.args.kwonlyargs] == ["a", "c"]


def test_unparse_tells_expressions_apart():
    one, same, other = (_compat.parse(s).body[0].value for s in ("w.op", "(w).op", "v.op"))
    assert _compat.unparse(one.value) == _compat.unparse(same.value) != _compat.unparse(other.value)


def test_cached_property_computes_once_per_instance():
    class Counted:
        calls = 0

        @_compat.cached_property
        def value(self):
            Counted.calls += 1
            return Counted.calls

    first = Counted()
    assert (first.value, first.value, Counted().value) == (1, 1, 2)


def test_installed_version_reads_the_metadata_of_what_is_installed():
    assert _compat.installed_version("pytest") == pytest.__version__
    assert _compat.installed_version("tf1-accum-no-such-distribution") is None
