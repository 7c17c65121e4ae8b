"""The migration checker: ``tf1-accum-check PATH...`` (or ``python -m tf1_accum.check``).

Reads Python source, without running it or importing TensorFlow (or anything
else of tf1_accum), and reports the forum-style accumulation bugs in it; see
docs/cli.rst. Its one public function is `main`, the command itself; the
modules beside it are its parts:

- ``_cli``: the command line (`main`);
- ``_catalogue``: the mistakes, one code, title, why and fix each (which
  ``tf1_accum.check_graph`` reports by too);
- ``_lint``: one file or many checked, the findings;
- ``_source``: reading a file (Python 2 and encoded source too);
- ``_parents``: parent classes copied in from the other files checked;
- ``_flow``: where each value of a module is kept;
- ``_tags``: what each value is made from;
- ``_rules``: the rules, read from the tags.
"""

import typing

__all__ = ("main",)


def __getattr__(name: str) -> typing.Any:
    # Imported on first use: check_graph reads only the catalogue beside it.
    if name == "main":
        from tf1_accum.check._cli import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
