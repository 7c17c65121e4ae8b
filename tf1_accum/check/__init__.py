"""The migration checker: ``tf1-accum-check PATH...`` (or ``python -m tf1_accum.check``).

Reads Python source without running it or importing TensorFlow; see
docs/cli.rst. Parts: ``_cli`` (`main`), ``_catalogue`` (the mistakes, shared
with ``check_graph``), ``_lint`` (files checked), ``_source`` (reading them),
``_parents`` (parent classes from other files), ``_flow`` (where values are
kept), ``_tags`` (what they are made from), ``_rules`` (the rules), ``_compat``
(the same trees and findings on each Python version, 3.7 and later).
"""

from __future__ import annotations

import typing

__all__ = ("main",)


def __getattr__(name: str) -> typing.Any:
    # Imported on first use: check_graph reads only the catalogue beside it.
    if name == "main":
        from tf1_accum.check._cli import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
