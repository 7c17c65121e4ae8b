"""Sphinx configuration for the tf1_accum documentation."""

import os
import pathlib
import posixpath
import re
import sys

import sphinx.util.inspect
from sphinx.ext.napoleon.docstring import GoogleDocstring
from sphinx.pycode import ModuleAnalyzer
from sphinx.writers.html5 import HTML5Translator

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

project = "tf1_accum"
author = "tf1_accum developers"
copyright = "tf1_accum developers"
release = re.search(
    r'^__version__ = "([^"]+)"',
    (ROOT / "tf1_accum" / "__init__.py").read_text(encoding="utf-8"),
    re.M,
).group(1)
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    # MathJax itself, copied into the build: math typesets with no network
    # (the PyPI package sphinx-mathjax-offline, in the docs extra).
    "sphinx-mathjax-offline",
    "sphinx.ext.napoleon",
    "checker_output",  # docs/_ext: tf1-accum-check's output, run at build time
]
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# A result tuple's signature already shows its fields' types, linked; napoleon
# would repeat each one fully qualified (tensorflow.python.framework.ops...).
napoleon_attr_annotations = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
python_use_unqualified_type_names = False
# TensorFlow types read as users write them (tf.Tensor, not
# tensorflow.python.framework.tensor.Tensor or DatasetV2), and link to
# tensorflow.org through the inventory in docs/_inventories.
autodoc_type_aliases = {
    name: name
    for name in (
        "tf.Tensor",
        "tf.Operation",
        "tf.Variable",
        "tf.Graph",
        "tf.data.Dataset",
        "tf.compat.v1.Session",
        "tf.compat.v1.ConfigProto",
        "tf.compat.v1.train.Optimizer",
        "tf.compat.v1.train.SessionRunHook",
        # A callable (gradient, variable, window) -> gradient: the window options.
        "GradientTransform",
    )
}
# Sphinx prints an alias inside a Union (a dataclass field's type, such as
# WindowOptions.transform) by its repr, TypeAliasForwardRef('GradientTransform'):
# print its name, as in signatures.
sphinx.util.inspect.TypeAliasForwardRef.__repr__ = lambda self: self.name  # type: ignore[method-assign]

# One parameter a line once a signature is longer than this: long signatures
# stay readable instead of running off the page.
maximum_signature_line_length = 70
default_role = "any"

# The build has no network: the inventories are small local files, written
# by docs/_inventories/make_inventories.py, whose entries point at the real
# pages on tensorflow.org and numpy.org.
INVENTORIES = ROOT / "docs" / "_inventories"
intersphinx_mapping = {
    "tensorflow": ("https://www.tensorflow.org/", str(INVENTORIES / "tensorflow.inv")),
    "numpy": ("https://numpy.org/doc/stable/", str(INVENTORIES / "numpy.inv")),
}
intersphinx_timeout = 1
exclude_patterns = ["_build"]

html_theme = "furo"
html_title = f"tf1_accum {release}"
html_static_path = ["_static"]
html_css_files = ["custom.css"]


# Inline code breaks at spaces and after punctuation, never inside a word: a
# long name (tf.compat.v1.global_variables_initializer) may break after "."
# or "_", an ellipsis (tuple[int, ...]) nowhere. Code blocks keep their lines
# and scroll sideways (custom.css).
_BREAK_AFTER = re.compile(r"([._/=\[(])(?=[^\s)\].])")


def _break_points(html):
    parts = re.split(r"(<[^>]*>)", html)
    texts = [i for i, part in enumerate(parts) if part and not part.startswith("<")]
    for i, after in zip(texts, texts[1:] + [None]):
        # The next character may be in the next token's span.
        following = parts[after][:1] if after else ""
        text = _BREAK_AFTER.sub(r"\1<wbr>", parts[i] + following)
        parts[i] = text[: len(text) - len(following)]
    return "".join(parts)


class _Translator(HTML5Translator):
    """Inline code breaks as code does; a figure drawn for a phone is shown on one.

    Inline code: ``like_this``, names in signatures and tables. A figure in
    docs/_static drawn twice, NAME.png for a desktop's column and
    NAME_narrow.png for a phone's (with text as large as the page's), is a
    <picture> that shows the narrow one on screens up to 40em wide.
    """

    def visit_Text(self, node):
        start = len(self.body)
        super().visit_Text(node)
        if self.protect_literal_text:
            self.body[start:] = map(_break_points, self.body[start:])

    def visit_image(self, node):
        stem, extension = posixpath.splitext(node["uri"])
        narrow = f"{stem}_narrow{extension}"
        node["narrow"] = narrow.startswith("_static/") and (self.builder.srcdir / narrow).is_file()
        if node["narrow"]:
            # docs/_static is copied whole: the narrow figure is beside _images.
            source = posixpath.join(posixpath.dirname(self.builder.imgpath), narrow)
            self.body.append(f'<picture><source media="(max-width: 40em)" srcset="{source}">')
        super().visit_image(node)

    def depart_image(self, node):
        super().depart_image(node)
        if node["narrow"]:
            self.body.append("</picture>")


def _tidy_signature(app, what, name, obj, options, signature, return_annotation):
    # Sphinx prints an alias nested in a Union or a generic by its repr,
    # TypeAliasForwardRef('tf.Tensor'): print the name. A result tuple's
    # field may name a private module (_stats.GradientStatistics): every
    # public name is in the package itself.
    def tidy(text):
        text = text and re.sub(r"TypeAliasForwardRef\('([^']*)'\)", r"\1", text)
        return text and re.sub(r"\b_[a-z]\w*\.(?=[A-Z])", "", text)

    return tidy(signature), tidy(return_annotation)


def _attribute_docstring(self):
    # An attribute's or a property's type is its annotation, shown in its
    # signature. Napoleon would take a docstring's first line up to a colon
    # for a type ("Windows run ... (None: never)" -> type "Windows run ...
    # (None"): the whole docstring is the description.
    lines = self.__class__(self._dedent(self._consume_to_end()), self._config).lines()
    return self._format_field("", "", lines)


GoogleDocstring._parse_attribute_docstring = _attribute_docstring  # type: ignore[method-assign]


def _constant_docstring(app, what, name, obj, options, lines):
    # A public constant (STATE_COLLECTION) is defined, with its #: comment, in
    # the private module that __getattr__ imports it from. Autodoc looks for
    # the comment in the package and, finding none, would show the docstring
    # of the value's type (str's): show the comment instead.
    import tf1_accum

    short = name.rpartition(".")[2]
    if what == "data" and short in tf1_accum._MODULES:
        module = f"tf1_accum.{tf1_accum._MODULES[short]}"
        lines[:] = ModuleAnalyzer.for_module(module).find_attr_docs()[("", short)]


def setup(app):
    app.set_translator("html", _Translator, override=True)
    app.connect("autodoc-process-signature", _tidy_signature)
    app.connect("autodoc-process-docstring", _constant_docstring)
