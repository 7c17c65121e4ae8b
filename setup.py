"""Installs tf1_accum with setuptools; the metadata is in pyproject.toml.

For tools and habits that call ``setup.py`` (``python setup.py develop``,
older pip): this file only hands over to setuptools, which reads every field
(name, version from ``tf1_accum/__init__.py``, extras, the ``tf1-accum-check``
console script) from ``pyproject.toml``. Prefer ``pip install -e .``.
"""

import re
import sys

import setuptools

# pyproject.toml's "license" is an SPDX expression, which setuptools reads
# from release 77 on (its [build-system] table says so); an older one stops
# with an error about the field, not about itself.
_REQUIRED = (77,)
_found = tuple(int(part) for part in re.findall(r"\d+", setuptools.__version__)[:1])
if _found < _REQUIRED:
    sys.exit(
        f"tf1_accum needs setuptools>=77 to read pyproject.toml; this is setuptools "
        f"{setuptools.__version__}. Run: python -m pip install 'setuptools>=77'"
    )

setuptools.setup()
