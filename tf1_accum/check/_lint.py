"""Checks files for the forum-style accumulation patterns, without running them."""

from __future__ import annotations

import ast
import json
import os
import re
import typing
from collections.abc import Iterable, Iterator

from tf1_accum.check import _catalogue, _parents, _rules, _source


class Finding(typing.NamedTuple):
    """One problem found in a file (``rule`` ``"TFA000"``: it cannot be read or parsed)."""

    path: str
    line: int
    rule: str
    message: str
    col: int = 1

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.rule} {self.message}"


_IGNORE = re.compile(r"#\s*tf1_accum\.check:\s*ignore\b(?:\s+(TFA\d{3}(?:\s*,\s*TFA\d{3})*))?")

# Every rule starts from one of these words; most modules of a project hold none.
_RELEVANT = re.compile(
    r"apply_gradients|initialized_value|assign|update_add|\bcond\b|apply_op|build_accumulation"
    r"|AccumulationOptimizer|dataset_accumulation"
)
_IGNORE_FILE = re.compile(r"^#\s*tf1_accum\.check:\s*ignore-file\b", re.M)


def _keep(finding: Finding, lines: list[str]) -> bool:
    """False when the finding's line says ``# tf1_accum.check: ignore`` (bare or its code)."""
    match = _IGNORE.search(lines[finding.line - 1] if 0 < finding.line <= len(lines) else "")
    codes = match.group(1) if match else ""  # "": no ignore; None: a bare ignore, every rule
    return codes is not None and finding.rule not in re.findall(r"TFA\d{3}", codes)


def check_source(
    source: str, path: str = "<string>", modules: _parents.Modules | None = None
) -> list[Finding]:
    """Returns the `Finding` list for one module's source text, by line.

    >>> source = '''
    ... accum = [tf.Variable(tf.zeros_like(v), trainable=False) for v in tvs]
    ... accum_ops = [a.assign_add(g) for a, (g, v) in zip(accum, gvs)]
    ... train_step = opt.apply_gradients(zip(accum, tvs))
    ... '''
    >>> for finding in check_source(source, "train.py"):
    ...     print(finding.path, finding.line, finding.rule)
    train.py 4 TFA001

    ``modules`` (`_parents.index`): the other files of the check, whose classes
    a class here may extend.
    """
    if _IGNORE_FILE.search(source):
        return []
    lines = source.splitlines()
    try:
        tree, parsed = _source.parse(source, path)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        reason = getattr(error, "msg", None) or str(error) or type(error).__name__
        fix = "fix the syntax, then check it again"
        if isinstance(error, (RecursionError, MemoryError)):  # CPython's parser, nested deep
            reason = f"nested too deeply for Python's parser: {type(error).__name__}"
            fix = "check it by hand"
        message = f"cannot parse this file ({reason}); {fix}"
        line, col = getattr(error, "lineno", None) or 1, getattr(error, "offset", None) or 1
        return [f for f in [Finding(path, line, "TFA000", message, col)] if _keep(f, lines)]
    if not _RELEVANT.search(parsed):
        return []  # nothing any rule looks at: parsing was the whole check
    tables = _parents.graft(tree, path, modules) if modules else []
    try:
        found = _rules.findings(tree, parsed, path, tables)
    except RecursionError:
        why = "its names are chained too deeply to follow"
        return [Finding(path, 1, "TFA000", f"cannot check this file ({why}); check it by hand")]
    except Exception:  # a shape of code the analysis does not know: report what is certain
        found = {
            (node.lineno, node.col_offset + 1, "TFA007")
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "initialized_value"
        }
    found = {f for f in found if f[0] < _parents.OFFSET}  # not in a parent copied in
    findings = [Finding(path, ln, rule, _catalogue.message(rule), col) for ln, col, rule in found]
    return sorted((f for f in findings if _keep(f, lines)), key=lambda f: (f.line, f.col, f.rule))


def python_files(paths: Iterable[str]) -> Iterator[str]:
    """Yields each file given, and the *.py under each directory (and any it cannot
    list); FileNotFoundError for a path that does not exist, or a directory with no
    *.py file under it (a mistyped path, which would otherwise pass unchecked)."""
    for path in paths:
        if os.path.isdir(path):
            found: list[str | OSError] = []  # a directory the walk cannot list: where it is met
            for root, dirs, files in os.walk(path, onerror=found.append):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
                found += [os.path.join(root, f) for f in sorted(files) if f.endswith(".py")]
            if not found:
                raise FileNotFoundError(f"no Python files under {path}")
            yield from (f if isinstance(f, str) else f.filename or path for f in found)
        elif os.path.exists(path):
            yield path
        else:
            raise FileNotFoundError(f"no such file or directory: {path}")


class FileResult(typing.NamedTuple):
    """The `Finding` list of one file; ``readable`` is False when it cannot be read (exit 2)."""

    findings: list[Finding]
    readable: bool


def check_file(path: str, modules: _parents.Modules | None = None) -> FileResult:
    """The `FileResult` of one file; one that cannot be read gives a TFA000."""
    try:
        source = _source.decode(_source.read(path))
    except (OSError, _source.Unreadable) as error:
        what = "directory" if os.path.isdir(path) else "file"
        message = f"cannot read this {what} ({error}); check it by hand"
        return FileResult([Finding(path, 1, "TFA000", message)], False)
    return FileResult(check_source(source, path, modules), True)


def check_paths(paths: Iterable[str], jobs: int = 1) -> list[Finding]:
    """The `Finding` list of files and directories, checked by ``jobs`` processes."""
    return [f for result in check_files(python_files(paths), jobs) for f in result.findings]


def check_files(files: Iterable[str], jobs: int = 1) -> Iterator[FileResult]:
    """Yields the `FileResult` of each file in order, from ``jobs`` processes."""
    listed = list(files)
    modules = _parents.index(listed) if len(listed) > 1 else None
    if jobs <= 1 or len(listed) < 2 * jobs:
        yield from (check_file(path, modules) for path in listed)
        return
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with context.Pool(jobs, initializer=_share, initargs=(modules,)) as pool:
        yield from pool.imap(_check_shared, listed, chunksize=16)


_SHARED: dict[str, _parents.Modules | None] = {}  # in a worker process: the check's modules


def _share(modules: _parents.Modules | None) -> None:
    _SHARED["modules"] = modules


def _check_shared(path: str) -> FileResult:
    return check_file(path, _SHARED["modules"])


def as_json(findings: Iterable[Finding]) -> str:
    """The findings as a JSON array of objects (path, line, col, code, message)."""
    return json.dumps([
        {"path": f.path, "line": f.line, "col": f.col, "code": f.rule, "message": f.message}
        for f in findings
    ], indent=2)  # fmt: skip
