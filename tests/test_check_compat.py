"""``tf1_accum.check._compat``: on every Python the checker runs on (3.7 and later),
the tree of Python 3.9 and later, its literals, items and positions, so the rules
find the same things at the same lines and columns.

Pure Python, run on the oldest and the newest Python supported alike.
"""

import ast
import symtable

import pytest

from tf1_accum.check import _compat

# The checker does not depend on the graph mode: run in the v1 mode only.
pytestmark = pytest.mark.graph_mode_independent

# What Python 3.7 and 3.8 give in place of Constant, and items wrapped in them.
_OLD_NODES = {"Num", "Str", "Bytes", "NameConstant", "Ellipsis", "Index", "ExtSlice"}


def _starts(source, kind):
    """The (line, column) of each ``kind`` node of ``source``, outermost first."""
    return [(n.lineno, n.col_offset) for n in ast.walk(_compat.parse(source)) if type(n) is kind]


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


@pytest.mark.parametrize(
    "source, kind, starts",
    [
        # Comprehensions, generators and tuples at their opening bracket.
        ("step = opt.apply_gradients([\n    (g, v) for g, v in pairs])\n", ast.ListComp, [(1, 27)]),
        (
            "step = opt.apply_gradients(\n    (g, v) for g, v in pairs)\n",
            ast.GeneratorExp,
            [(1, 26)],
        ),
        ("pairs = ((a, b), (c, d)), ()\n", ast.Tuple, [(1, 8), (1, 8), (1, 26), (1, 9), (1, 17)]),
        ("x[a, b] = (\n  c, d)\n", ast.Tuple, [(1, 10), (1, 2)]),
        ("ok = {k for k in keys}, {k: v for k, v in items}\n", ast.SetComp, [(1, 5)]),
        # A call, attribute or item of a value in parentheses, at the parenthesis.
        ("out = (sess).run(ops)\n", ast.Call, [(1, 6)]),
        ("out = ((a)(b))(c)[d].e\n", ast.Call, [(1, 6), (1, 7)]),
        ("out = ((a).b).c\n", ast.Attribute, [(1, 6), (1, 7)]),
        ("out = (a + b + c).total()\n", ast.Attribute, [(1, 6)]),
        ("out = f((x).y)\n", ast.Attribute, [(1, 8)]),
        ("out = [g for g in grads].copy()\n", ast.Call, [(1, 6)]),
        # a + b + c at its first operand, a string on several lines at its first.
        (
            "total = a - b + (c + d) * e + f\n",
            ast.BinOp,
            [(1, 8), (1, 8), (1, 8), (1, 16), (1, 17)],
        ),
        ('text = """two\nlines""".format(a)\n', ast.Call, [(1, 7)]),
        ('text = ("one"\n        """two\nlines""", b)\n', ast.Constant, [(1, 8)]),
        # Columns count UTF-8 bytes, as ast does: é takes two.
        ('note = "é" + (a).b()\n', ast.Call, [(1, 14)]),
        # The expressions of an f-string where they stand, a format spec's too.
        (
            'print(f"{sess.run(a)} {b.c()!r:>{w.d()}}", f"""\n  {(e).f()}""")\n',
            ast.Call,
            [(1, 0), (1, 9), (1, 23), (2, 3), (1, 33)],
        ),
        ('note = "é" + f"é{a.b():{\'>\'}{c.d()}}"\n', ast.Call, [(1, 19), (1, 31)]),
    ],
)
def test_starts_are_where_python_3_8_and_later_put_them(source, kind, starts):
    assert _starts(source, kind) == starts


def test_each_comprehension_and_lambda_finds_its_symbol_table():
    # The checker matches a scope to its table by name and line, as its compiler made it.
    source = (
        "a = [\n  x for x in y]\n"
        "b = f(\n  x for x in y)\n"
        "c = {\n  k: v for k, v in e}\n"
        'd = f"""{[\n  z for z in w]} {(lambda: 1)()}"""\n'
        "e = (\n  lambda: [\n    q for q in r])\n"
    )
    names = {ast.ListComp: "listcomp", ast.GeneratorExp: "genexpr", ast.DictComp: "dictcomp"}
    names[ast.Lambda] = "lambda"
    nodes = [n for n in ast.walk(_compat.parse(source)) if type(n) in names]
    scopes = sorted((names[type(n)], _compat.scope_line(n)) for n in nodes)

    def tables(table):
        for child in table.get_children():
            yield (child.get_name(), child.get_lineno())
            yield from tables(child)

    assert len(scopes) == 7
    assert scopes == sorted(tables(symtable.symtable(source, "train.py", "exec")))


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
