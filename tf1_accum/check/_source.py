"""Reads a Python file as Python reads it; Python 2 source is fixed up token by
token (`_FIXES`), each statement kept on its line, and parsed again.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import stat
import tokenize
import typing
from collections.abc import Callable, Iterator
from tokenize import TokenInfo

from tf1_accum.check import _compat

#: A rewrite of the source: (start, end, replacement), each a (row, col) position.
Edit = typing.Tuple[typing.Tuple[int, int], typing.Tuple[int, int], str]


class Unreadable(Exception):
    """A file that is not text: it cannot be read at all."""


_NOT_REGULAR = {
    stat.S_IFDIR: "a directory", stat.S_IFIFO: "a named pipe (FIFO)", stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
}  # fmt: skip


def read(path: str) -> bytes:
    """The bytes of a regular file, opened without blocking (a FIFO would wait for a
    writer); `Unreadable` for anything else, OSError where it cannot be read."""
    if os.path.isdir(path):  # one the walk could not list: say why
        with os.scandir(path):
            raise Unreadable("it is a directory, to be walked, not read")
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with open(descriptor, "rb") as file:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            kind = _NOT_REGULAR.get(stat.S_IFMT(mode), "a special file")
            raise Unreadable(f"it is {kind}, not a regular file: skipped unread")
        return file.read()


def decode(data: bytes) -> str:
    """The text of a Python file's bytes, as Python decodes them (`Unreadable`: binary)."""
    if b"\0" in data:
        raise Unreadable("it holds null bytes: not a Python source file")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError):
        # Python 2 accepted undeclared Latin-1 in comments and strings.
        return data.decode("latin-1")


def parse(source: str, path: str = "<string>") -> tuple[ast.Module, str]:
    """The module tree of ``source`` and the source that parsed (Python 2: converted);
    when neither parses, the original source's SyntaxError."""
    try:
        return _compat.parse(source, path), source
    except SyntaxError as error:
        first = error
    converted = source
    for _ in range(3):
        fixed, converted = converted, _python2_to_3(converted)
        if fixed == converted:
            break
        with contextlib.suppress(SyntaxError):
            return _compat.parse(converted, path), converted
    raise first


_OPEN, _CLOSE = set("([{"), set(")]}")
_SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT}
_COMPOUND = set("if elif else for while try except finally with def class".split())


def _python2_to_3(source: str) -> str:
    """``source`` with each Python 2 form of `_FIXES` rewritten."""
    lines = [line.expandtabs(8) if line[:1] in " \t" else line for line in source.split("\n")]
    edits: set[Edit] = set()
    for tokens in _statements("\n".join(lines)):
        depths = _depths(tokens)
        for fix in _FIXES:
            edits.update(fix(tokens, depths))
    # Edits run from the end, never overlapping the last one made (it started at done).
    done: tuple[int, int] | None = None
    for (row, col), (end_row, end_col), text in sorted(edits, reverse=True):
        if row == end_row and (done is None or (end_row, end_col) <= done):
            lines[row - 1] = lines[row - 1][:col] + text + lines[row - 1][end_col:]
            done = (row, col)
    return "\n".join(lines)


def _statements(source: str) -> Iterator[list[TokenInfo]]:
    """Yields each simple statement (or compound statement's header) as its tokens."""
    current: list[TokenInfo] = []
    depth = 0
    with contextlib.suppress(tokenize.TokenError, IndentationError, SyntaxError):
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type in (tokenize.NEWLINE, tokenize.ENDMARKER) or token.string == ";":
                if current:
                    yield current
                current, depth = [], 0
            elif token.type not in _SKIPPED and not (
                token.type == tokenize.ERRORTOKEN and token.string.isspace()
            ):
                current.append(token)
                depth += (token.string in _OPEN) - (token.string in _CLOSE)
                # "if x: print y": a colon at the top level ends a clause header.
                if token.string == ":" and depth == 0 and current[0].string in _COMPOUND:
                    yield current
                    current = []
    if current:
        yield current


def _depths(tokens: list[TokenInfo]) -> list[int]:
    """The depth of brackets around each token (a bracket is outside itself)."""
    depths, depth = [], 0
    for token in tokens:
        depth -= token.string in _CLOSE
        depths.append(depth)
        depth += token.string in _OPEN
    return depths


def _statement_calls(tokens: list[TokenInfo], depths: list[int]) -> list[Edit]:
    """``print x``, ``print >>f, x`` and ``exec code``: calls."""
    first, last = tokens[0], tokens[-1]
    if first.type != tokenize.NAME or first.string not in ("print", "exec"):
        return []
    following = tokens[1].string if len(tokens) > 1 else ""
    if following in ("=", ".", ")", ",", "[", "+=", ":"):  # print used as a name
        return []
    if following == "(":  # print(x), unless more follows the parenthesis: print (a), b
        ends = [i for i, token in enumerate(tokens) if depths[i] == 0 and token.string in _CLOSE]
        if not ends or ends[0] == len(tokens) - 1:
            return []
    edits = [(first.start, first.end, first.string + "("), (last.end, last.end, ")")]
    if following == ">>":
        edits.append((tokens[1].start, tokens[1].end, ""))
    return edits


def _except_raise(tokens: list[TokenInfo], depths: list[int]) -> list[Edit]:
    """``except E, e:`` and ``raise E, message``."""
    commas = [token for token, depth in zip(tokens, depths) if token.string == "," and depth == 0]
    if tokens[0].string == "except" and len(commas) == 1:
        return [(commas[0].start, commas[0].end, " as")]
    if tokens[0].string == "raise" and commas:
        return [(commas[0].start, commas[0].end, "("), (tokens[-1].end, tokens[-1].end, ")")]
    return []


def _backticks(tokens: list[TokenInfo], depths: list[int]) -> list[Edit]:
    """```x```: ``repr(x)``."""
    ticks = [token for token in tokens if token.string == "`"]
    return [
        edit for opening, closing in zip(ticks[::2], ticks[1::2])
        for edit in ((opening.start, opening.end, "repr("), (closing.start, closing.end, ")"))
    ]  # fmt: skip


def _literals(tokens: list[TokenInfo], depths: list[int]) -> list[Edit]:
    """``10L``, ``0777``, ``ur"..."`` and ``<>``."""
    edits = []
    for token in tokens:  # Python 3.12 and later: 0777 and <> are one token each
        number = token.type == tokenize.NUMBER and token.string.isdigit()
        if number and token.string[0] == "0" and len(token.string) > 1:
            edits.append((token.start, (token.start[0], token.start[1] + 1), "0o"))
        elif token.string == "<>":
            edits.append((token.start, token.end, "!="))
    for before, token in zip(tokens, tokens[1:]):
        if before.end != token.start:
            continue
        if before.type == tokenize.NUMBER and token.type == tokenize.NAME and token.string in "lL":
            edits.append((token.start, token.end, ""))
        elif before.string == "0" and token.type == tokenize.NUMBER and token.string[:1].isdigit():
            edits.append((before.start, before.end, "0o"))
        elif before.string.lower() == "ur" and token.type == tokenize.STRING:
            edits.append((before.start, before.end, "r"))
        elif before.string == "<" and token.string == ">":
            edits.append((before.start, token.end, "!="))
    return edits


def _tuple_parameters(tokens: list[TokenInfo], depths: list[int]) -> list[Edit]:
    """``def f(a, (b, c)):`` and ``lambda (k, v): v``: a one-line unpacked parameter, a name."""
    edits = []
    for index, token in enumerate(tokens):
        if token.string not in ("def", "lambda"):
            continue
        level = depths[index] + (token.string == "def")  # a def's parameters are in parentheses
        start = None
        for previous, inner, depth in zip(tokens[index:], tokens[index + 1 :], depths[index + 1 :]):
            closed = inner.string in _CLOSE and depth < level
            if closed or inner.string == ":" and depth == depths[index]:
                break  # the end of the parameters
            if inner.string == "(" and depth == level and previous.string != "=":
                start = inner  # a parameter that unpacks (not a default value's parenthesis)
            elif inner.string in _CLOSE and depth == level and start is not None:
                if start.start[0] == inner.end[0]:
                    edits.append((start.start, inner.end, f"_unpacked_{start.start[1]}"))
                start = None
    return edits


def _comprehension_tuples(tokens: list[TokenInfo], depths: list[int]) -> list[Edit]:
    """``[x for x in a, b]``: the tuple ``a, b`` gets its parentheses."""
    edits = []
    for index, token in enumerate(tokens):
        depth = depths[index]
        if token.string != "in" or depth == 0:
            continue
        opening = max(i for i in range(index) if depths[i] < depth)
        closing = next((i for i in range(index, len(tokens)) if depths[i] < depth), len(tokens))
        level = [i for i in range(opening + 1, closing) if depths[i] == depth]  # the bracket's own
        words = [i for i in level if tokens[i].string in ("for", "if")]
        clause = [tokens[i].string for i in words if i < index][-1:]  # "for" ... "in", or "if"
        end = min([i for i in words if i > index] + [closing])
        commas = [i for i in level if index < i < end and tokens[i].string == ","]
        if tokens[opening].string == "[" and clause == ["for"] and commas:
            edits.append((tokens[index + 1].start, tokens[index + 1].start, "("))
            edits.append((tokens[end - 1].end, tokens[end - 1].end, ")"))
    return edits


# Where ``async`` and ``await`` are still keywords (``async def``, ``await x``).
_ASYNC_KEYWORD_BEFORE = {"def", "for", "with"}
_OPERAND_START = {tokenize.NAME, tokenize.NUMBER, tokenize.STRING}
_OPERAND_SIGNS = {"[", "{", "-", "+", "~"}


def _async_names(tokens: list[TokenInfo], depths: list[int]) -> list[Edit]:
    """``FLAGS.async``, ``async = True``, ``def await(...)``: ``ASYNC``, ``AWAIT``."""
    edits = []
    for index, token in enumerate(tokens):
        if token.type != tokenize.NAME or token.string not in ("async", "await"):
            continue
        before = tokens[index - 1].string if index else ""
        after = tokens[index + 1] if index + 1 < len(tokens) else None
        if before != "." and after is not None:
            operand = after.type in _OPERAND_START or after.string in _OPERAND_SIGNS
            keyword = operand if token.string == "await" else after.string in _ASYNC_KEYWORD_BEFORE
            if keyword:
                continue  # await x; async def, async for, async with
        edits.append((token.start, token.end, token.string.upper()))
    return edits


_FIXES: tuple[Callable[[list[TokenInfo], list[int]], list[Edit]], ...] = (
    _statement_calls, _except_raise, _backticks, _literals, _tuple_parameters,
    _comprehension_tuples, _async_names,
)  # fmt: skip
