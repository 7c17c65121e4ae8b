"""The command line ``tf1-accum-check PATH...``: one line per finding, as flake8
and ruff print them; options and exit status in docs/cli.rst.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

# The package's __init__ imports no TensorFlow (its names load on first use),
# and Python has imported it already, as the parent of this one.
from tf1_accum import __version__
from tf1_accum.check import _catalogue, _lint


def _codes(text: str) -> set[str]:
    """The rule codes of a ``--select``/``--ignore`` value (``TFA001,TFA003``)."""
    codes = {code.strip().upper() for code in text.split(",") if code.strip()}
    known = ("TFA000", *_catalogue.RULES)
    unknown = sorted(codes.difference(known))
    if unknown:
        graph = [code for code in unknown if code in _catalogue.CATALOGUE]
        raise argparse.ArgumentTypeError(
            f"unknown rule code(s) {', '.join(unknown)}: expected some of {', '.join(known)}"
            + (f" ({', '.join(graph)}: found by tf1_accum.check_graph only)" if graph else "")
        )
    return codes


def main(argv: Sequence[str] | None = None) -> int:
    """Checks the paths in ``argv`` (default: the command line); returns the exit status.

    >>> import pathlib, tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = pathlib.Path(folder, "train.py")
    ...     _ = path.write_text("w = tf.Variable(tf.zeros_like(v.initialized_value()))\\n")
    ...     status = main([str(path)])  # doctest: +ELLIPSIS
    /.../train.py:1:31: TFA007 Variable.initialized_value() raises NotImplementedError ...
    >>> status
    1
    """
    parser = argparse.ArgumentParser(
        prog="tf1-accum-check",
        description="find forum-style accumulation bugs.",
        epilog="Exit status: 0 nothing found, 1 findings, 2 an unreadable file or a usage error.",
    )
    parser.add_argument("-V", "--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files or directories")
    parser.add_argument(
        "--select", type=_codes, metavar="CODES", help="report only these rules (TFA001,TFA003)"
    )
    parser.add_argument("--ignore", type=_codes, metavar="CODES", help="leave out these rules")
    parser.add_argument(
        "--format", choices=("text", "json"), default="text", help="output format (default text)"
    )
    parser.add_argument(
        "--jobs", type=int, default=0, metavar="N",
        help="processes checking files in parallel (default 0: one per CPU)",
    )  # fmt: skip
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # argparse has printed the usage error (or --help)
        return stop.code if isinstance(stop.code, int) else 2
    try:
        jobs = args.jobs if args.jobs > 0 else (os.cpu_count() or 1)
        results = list(_lint.check_files(_lint.python_files(args.paths), jobs))
    except FileNotFoundError as error:  # raised before any file is checked
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    # An unparsed file was not checked for the selected rules: its TFA000 stays.
    shown = {"TFA000", *(_catalogue.RULES if args.select is None else args.select)}
    shown -= args.ignore or set()
    findings = [f for result in results for f in result.findings if f.rule in shown]
    try:
        if args.format == "json":
            print(_lint.as_json(findings))
        elif findings:
            print(*findings, sep="\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader stopped early (``| head``): the flush at exit must not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    unreadable = not all(result.readable for result in results)
    return 2 if unreadable else 1 if findings else 0
