"""Installs tf1_accum with setuptools; the metadata is in pyproject.toml.

For tools and habits that call ``setup.py`` (``python setup.py develop``,
older pip): this file only hands over to setuptools, which reads every field
(name, version from ``tf1_accum/__init__.py``, extras, the ``tf1-accum-check``
console script) from ``pyproject.toml``. Prefer ``pip install -e .``.
"""

import re
import sys

try:
    import setuptools
    from setuptools.config import pyprojecttoml
except ImportError:  # Python 3.12's venv installs pip alone; a setuptools before 61
    sys.exit(
        "tf1_accum's setup.py needs setuptools>=61, which reads pyproject.toml. "
        "Run: python -m pip install --upgrade setuptools"
    )

# pyproject.toml's "license" is an SPDX expression with "license-files", which
# setuptools reads from release 77 on. The one that `python3 -m venv` installs
# on Python 3.10 and 3.11 (65.5) reads a license table and includes LICENSE
# by default: hand it that form.
if tuple(int(part) for part in re.findall(r"\d+", setuptools.__version__)[:1]) < (77,):
    _load_file = pyprojecttoml.load_file

    def _older_license_form(path):
        config = _load_file(path)
        project = config.get("project", {})
        project["license"] = {"text": project["license"]}
        project.pop("license-files")
        return config

    pyprojecttoml.load_file = _older_license_form

setuptools.setup()
