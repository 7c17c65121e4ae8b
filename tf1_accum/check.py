"""``python -m tf1_accum.check PATH...``: find forum-style accumulation bugs.

Reads Python files (directories are walked for ``*.py``) without running or
importing them, and without importing TensorFlow, and prints one line per
finding::

    path:line: RULE what is wrong; the tf1_accum replacement

Rules: TFA001 sums applied without averaging; TFA002 accumulators divided by
a counter variable; TFA003 an apply computed from the ``assign_add`` ops
(reruns the accumulation); TFA004 gradients fed back through placeholders;
TFA005 a running average keyed on the global step; TFA006 a ``tf.cond`` that
accumulates or applies; TFA007 ``Variable.initialized_value()``; TFA000 a file
that cannot be read or parsed. The migration guide explains each one. A
comment ``# tf1_accum.check: ignore TFA001`` (or several codes, comma-separated)
on the reported line silences that finding, for code that builds a pattern on
purpose.

Exit status: 0 when nothing is found, 1 when something is (a file that cannot
be parsed included), 2 for a usage error (no path, a path that does not exist).
"""

import argparse
import sys

from tf1_accum import _lint


def main(argv=None):
    """Checks the paths in ``argv`` (default: the command line).

    Example:

    >>> import pathlib, tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = pathlib.Path(folder, "train.py")
    ...     _ = path.write_text("w = tf.Variable(tf.zeros_like(v.initialized_value()))\\n")
    ...     status = main([str(path)])  # doctest: +ELLIPSIS
    /.../train.py:1: TFA007 Variable.initialized_value() raises NotImplementedError ...
    >>> status
    1

    Args:
        argv: Command-line arguments, without the program name.

    Returns:
        The exit status: 0 (nothing found), 1 (findings) or 2 (usage error).
    """
    parser = argparse.ArgumentParser(
        prog="python -m tf1_accum.check",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        epilog="Exit status: 0 nothing found, 1 findings, 2 usage error.",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files or directories")
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # argparse has printed the usage error (or --help)
        return stop.code if isinstance(stop.code, int) else 2
    try:
        findings = _lint.check_paths(args.paths)
    except FileNotFoundError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    for finding in findings:
        print(finding)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
