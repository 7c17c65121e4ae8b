"""What differs between the Python versions the checker runs on, 3.7 and later: the
other modules read each tree as Python 3.9 and later give it (`parse`), and take
`cached_property` and `unparse` from here.

Before 3.9, ``ast`` wraps an item in ``Index`` or ``ExtSlice``. Before 3.8 it
gives literals as ``Num``, ``Str``, ``Bytes``, ``NameConstant`` and
``Ellipsis`` and functions no ``posonlyargs``, and it puts the start of some
expressions elsewhere: a comprehension, a generator or a tuple inside its
brackets, a call, attribute or item of a value in parentheses inside them,
``a + b + c`` at its second ``+``, a string on several lines at column -1 of
its last, and an f-string's expressions at lines and columns not theirs.
`parse` moves each where 3.8 and later put it, from the tokens, so findings
keep their lines and columns.
"""

from __future__ import annotations

import ast
import concurrent.futures
import contextlib
import functools
import io
import sys
import threading
import tokenize
import typing

#: Text that tells expressions apart (before 3.9, without ``ast.unparse``: the tree's dump).
unparse = getattr(ast, "unparse", ast.dump)


class cached_property:  # functools.cached_property (3.8) as the rules use it, on every Python
    def __init__(self, function: typing.Callable[[typing.Any], typing.Any]) -> None:
        self.function = function

    def __get__(self, instance: object, owner: type | None = None) -> typing.Any:
        return vars(instance).setdefault(self.function.__name__, self.function(instance))


_LITERALS = {"Num": "n", "Str": "s", "Bytes": "s", "NameConstant": "value", "Ellipsis": ""}
_INSIDE = (ast.ListComp, ast.GeneratorExp, ast.Tuple)  # 3.7 starts them inside their brackets
_ATOMS = (ast.List, ast.Set, ast.Dict, ast.SetComp, ast.DictComp, *_INSIDE)
_SCOPES = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """The module tree of ``source`` as Python 3.9 and later give it; SyntaxError where
    this Python cannot parse it."""
    tree = (ast.parse if sys.version_info >= (3, 8) else _parse_37)(source, filename)
    if sys.version_info < (3, 9):
        tree = _shape(tree)
    if sys.version_info < (3, 8):
        with contextlib.suppress(tokenize.TokenError, SyntaxError):  # then 3.7's columns
            _Starts(source).move(tree)
    return tree


def _parse_37(source: str, filename: str) -> ast.Module:
    """``ast.parse`` on Python 3.7, whose C code overflows the stack (a crash) on an
    expression nested some 100,000 deep: on a thread with a stack that holds it, then
    refused, as later Pythons' parser refuses it, if deeper than Python recursion goes."""
    previous = threading.stack_size(1 << 30)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # its thread starts at submit
            tree = pool.submit(ast.parse, source, filename).result()  # or its error raised
    finally:
        threading.stack_size(previous)
    level, depth = [typing.cast(ast.AST, tree)], 0
    while level:  # one level of the tree deeper each time
        level, depth = [child for node in level for child in ast.iter_child_nodes(node)], depth + 1
    if depth > sys.getrecursionlimit():
        raise RecursionError("maximum recursion depth exceeded during ast.parse")
    return tree


def scope_line(node: ast.stmt | ast.expr) -> int:
    """The line of the symbol table this Python's compiler makes for the scope ``node``
    opens (3.7's, for a comprehension or lambda whose start `parse` moved)."""
    return node.lineno + getattr(node, "_table_below", 0)  # type: ignore[no-any-return]


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
    """``node``, or what Python 3.9 gives in its place."""
    name = type(node).__name__
    if name in _LITERALS:
        # Ellipsis has no field (""): its value is the default.
        return ast.copy_location(ast.Constant(value=getattr(node, _LITERALS[name], ...)), node)
    if name == "Index":
        return _shaped(node.value)
    if name == "ExtSlice":
        return ast.Tuple(elts=[_shaped(dimension) for dimension in node.dims], ctx=ast.Load())
    return node


class _Starts:
    """Each expression's first token as 3.8 reads it (ast counts columns in UTF-8
    bytes, tokenize in characters)."""

    def __init__(self, source: str) -> None:
        tokens = tokenize.generate_tokens(io.StringIO(source).readline)
        self.tokens = [t for t in tokens if t.type not in (tokenize.COMMENT, tokenize.NL)]
        self.starts = [(t.start[0], len(t.line[: t.start[1]].encode())) for t in self.tokens]
        self.index = {start: i for i, start in enumerate(self.starts)}
        self.closer: dict[int, int] = {}  # opening bracket -> its closing one
        opened: list[int] = []
        for i, token in enumerate(self.tokens):
            if token.type == tokenize.STRING and token.start[0] < token.end[0]:
                self.index[token.end[0], -1] = i  # where 3.7 starts a string on several lines
            elif token.string in ("(", "[", "{"):
                opened.append(i)
            elif token.string in (")", "]", "}") and opened:
                self.closer[opened.pop()] = i
        self.span = functools.lru_cache(maxsize=None)(self._span)

    def move(self, tree: ast.AST) -> None:
        """Moves each start where 3.8 and later put it; parses each f-string's expressions
        again where they stand."""
        nodes = [node for node in ast.walk(tree) if isinstance(node, ast.expr)]
        # Inner expressions first, so that span() recurses one level only; all read, then moved.
        for node, span in [(node, self.span(node)) for node in reversed(nodes)]:
            if span is not None:
                if isinstance(node, _SCOPES):  # the line of 3.7's symbol table, for scope_line
                    vars(node)["_table_below"] = node.lineno - self.starts[span[0]][0]
                node.lineno, node.col_offset = self.starts[span[0]]
        for node in [n for n in nodes if isinstance(n, ast.JoinedStr)]:
            span = self.span(node)
            tokens = self.tokens[span[0] : span[1] + 1] if span and span[1] else []
            fields = [field for token in tokens for field in _fields(token)]
            values = list(_formatted(node))
            if not tokens or len(fields) != len(values):
                continue  # one inside another f-string's expression, or a format spec
            for value, (line, col, text) in zip(values, fields):
                where = "\n" * (line - 1) + "(" + " " * (col - 1) + text + ")"
                new = typing.cast(ast.Expr, parse(where).body[0]).value
                for old, scope in zip(ast.walk(value.value), ast.walk(new)):
                    if isinstance(scope, _SCOPES):
                        below = scope_line(typing.cast(ast.expr, old)) - scope.lineno
                        vars(scope)["_table_below"] = below
                value.value = new

    def _span(self, node: ast.expr) -> tuple[int, int | None] | None:
        """The first and last token of ``node`` (None: not known)."""
        if isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):  # a value, then a trailer
            value = node.func if isinstance(node, ast.Call) else node.value
            head, tail = self.span(value) or (0, None)  # token 0: no parenthesis before it
            while self.tokens[head - 1].string == "(" and tail in (None, self.closer[head - 1] - 1):
                head, tail = head - 1, self.closer[head - 1]  # the value's parentheses
            if tail is None:
                return None
            return head, tail + 2 if isinstance(node, ast.Attribute) else self.closer.get(tail + 1)
        first = self.index.get((node.lineno, node.col_offset))
        if first is None:
            return None  # a position no token has (in an f-string, say)
        if isinstance(node, ast.BinOp) and isinstance(node.left, ast.BinOp):
            left = self.span(node.left)  # 3.7: a + b + c at its second +, (a + b) + c right
            if self.tokens[first].string != "(":
                return None if left is None else (left[0], None)
        if isinstance(node, _INSIDE) and getattr(node, "elts", True):  # not (): that one's right
            if self.tokens[first - 1].string != ("[" if isinstance(node, ast.ListComp) else "("):
                return first, None  # a tuple without parentheses
            first -= 1
        if isinstance(node, _ATOMS):
            return first, self.closer.get(first)
        end = first
        while self.tokens[first].type == self.tokens[end + 1].type == tokenize.STRING:
            end += 1  # implicitly concatenated
        return first, end if isinstance(node, (ast.Name, ast.Constant, ast.JoinedStr)) else None


def _formatted(joined: ast.JoinedStr) -> typing.Iterator[ast.FormattedValue]:
    """The replacement fields of an f-string in order (a format spec's after its own)."""
    for value in joined.values:
        if isinstance(value, ast.FormattedValue):
            yield value
            if isinstance(value.format_spec, ast.JoinedStr):
                yield from _formatted(value.format_spec)


def _fields(token: tokenize.TokenInfo) -> list[tuple[int, int, str]]:
    """(line, column, text) of each expression of an f-string token."""
    text = token.string
    prefix = len(text) - len(text.lstrip("rRbBuUfF"))
    if "f" not in text[:prefix].lower():
        return []
    quote = 3 if text[prefix : prefix + 3] in ('"""', "'''") else 1
    found: list[tuple[int, int]] = []
    _scan(text, prefix + quote, len(text) - quote, found)
    heads = [token.line[: token.start[1]] + text[:start] for start, _ in found]  # up to each
    return [
        (token.start[0] + head.count("\n"), len(head.split("\n")[-1].encode()), text[start:end])
        for head, (start, end) in zip(heads, found)
    ]


def _scan(text: str, i: int, end: int, found: list[tuple[int, int]], spec: bool = False) -> int:
    """Adds the (start, end) of each expression in ``text[i:end]`` to ``found``; returns
    where it ends (in a format ``spec``: at its closing brace)."""
    while i < end and not (spec and text[i] == "}"):
        if text[i] != "{" or text.startswith("{{", i):
            i += 1 + text.startswith(("{{", "}}"), i)
            continue
        j, depth, quote = i + 1, 0, ""
        while quote or depth or text[j] not in "!:}" or text.startswith("!=", j):
            if quote and text.startswith(quote, j):  # the end of a string in the expression
                j, quote = j + len(quote) - 1, ""
            elif not quote and text[j] in "'\"":
                quote = text[j] * 3 if text.startswith(text[j] * 3, j) else text[j]
                j += len(quote) - 1
            elif not quote:
                depth += (text[j] in "([{") - (text[j] in ")]}")
            j += 1
        found.append((i + 1, j))
        j += 2 if text[j] == "!" else 0
        i = 1 + (_scan(text, j + 1, end, found, True) if text[j] == ":" else j)
    return i
