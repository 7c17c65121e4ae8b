"""Sphinx configuration for the tf1_accum documentation."""

import os
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

project = "tf1_accum"
author = "tf1_accum developers"
release = re.search(
    r'^__version__ = "([^"]+)"',
    (ROOT / "tf1_accum" / "__init__.py").read_text(encoding="utf-8"),
    re.M,
).group(1)
version = release

extensions = ["sphinx.ext.autodoc", "sphinx.ext.mathjax", "sphinx.ext.napoleon"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "none"
default_role = "any"
exclude_patterns = ["_build"]
html_theme = "alabaster"
