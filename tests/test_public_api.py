"""The public API: what ``tf1_accum`` exports, and that it is documented."""

import inspect
import os
import pathlib
import re
import subprocess
import sys

import pytest

import tf1_accum

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_all_lists_exactly_the_public_names():
    assert len(tf1_accum.__all__) == len(set(tf1_accum.__all__))
    # Each name of __all__ imports, from the module that defines it (the
    # names load lazily: after this, the module's namespace holds them all).
    for name in tf1_accum.__all__:
        exec(f"from tf1_accum import {name}", {})
    # The namespace itself, not __dir__ (which is built from __all__): a
    # public name defined or imported in __init__.py is in __all__, and no
    # name of __all__ is missing from it.
    namespace = {n: v for n, v in vars(tf1_accum).items() if not n.startswith("_")}
    public = {n for n, v in namespace.items() if not inspect.ismodule(v)}
    assert public == set(tf1_accum.__all__)
    # The subpackage and the private modules are the only modules in it.
    modules = {n for n, v in vars(tf1_accum).items() if inspect.ismodule(v)}
    assert {n for n in modules if not n.startswith("_")} <= {"check"}
    # dir() shows the same public names.
    shown = {n for n in dir(tf1_accum) if not n.startswith("_")}
    assert shown - {"check"} == set(tf1_accum.__all__)


def test_private_modules_are_not_exported():
    for name in tf1_accum.__all__:
        assert not name.startswith("_")
        obj = getattr(tf1_accum, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert obj.__module__.startswith("tf1_accum._"), name


def test_every_public_callable_has_a_docstring_with_sections():
    for name in tf1_accum.__all__:
        obj = getattr(tf1_accum, name)
        if inspect.isfunction(obj):
            doc = inspect.getdoc(obj)
            assert doc and "Args:" in doc and "Returns:" in doc, name


def test_api_reference_lists_every_public_name():
    api = (ROOT / "docs" / "api.rst").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\.\. auto\w+:: tf1_accum\.(\w+)", api, re.M))
    documented |= set(re.findall(r"^\.\. data:: (\w+)", api, re.M))
    missing = sorted(set(tf1_accum.__all__) - documented)
    assert not missing, f"docs/api.rst does not document: {missing}"
    extra = sorted(documented - set(tf1_accum.__all__))
    assert not extra, f"docs/api.rst documents names that are not public: {extra}"


def test_api_reference_lists_every_public_member_of_each_class():
    """A class's own public methods and properties are in its ``:members:``."""
    api = (ROOT / "docs" / "api.rst").read_text(encoding="utf-8")
    for name in tf1_accum.__all__:
        obj = getattr(tf1_accum, name)
        if not inspect.isclass(obj) or issubclass(obj, tuple):
            continue  # NamedTuples document their fields in the docstring
        entry = re.search(
            rf"^\.\. autoclass:: tf1_accum\.{name}\n((?:   .*\n|\s+\S.*\n)*)", api, re.M
        )
        assert entry, f"docs/api.rst has no autoclass entry for {name}"
        listed = set(re.findall(r"\w+", entry.group(1).replace(":members:", "")))
        own = {m for m in vars(obj) if not m.startswith("_")}
        missing = sorted(own - listed)
        assert not missing, f"docs/api.rst does not list these members of {name}: {missing}"


def test_version_is_the_one_pyproject_reads():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'version = { attr = "tf1_accum.__version__" }' in pyproject
    assert re.fullmatch(r"\d+\.\d+\.\d+", tf1_accum.__version__)


def test_every_public_name_is_mapped_to_its_module():
    # __getattr__ imports each public name from the private module listed here.
    assert set(tf1_accum._MODULES) == set(tf1_accum.__all__)
    for name, module in tf1_accum._MODULES.items():
        assert getattr(tf1_accum, name) is getattr(getattr(tf1_accum, module), name), name


def test_unknown_names_raise_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'build_accumulator'"):
        tf1_accum.build_accumulator  # noqa: B018


# Spawns its own process, which does not depend on the graph mode: run in the
# v1 mode only.
@pytest.mark.graph_mode_independent
def test_without_tensorflow_import_works_and_first_use_says_what_is_missing():
    # sys.modules["tensorflow"] = None makes "import tensorflow" fail, as if
    # it were not installed.
    script = (
        "import sys\n"
        "sys.modules['tensorflow'] = None\n"
        "import tf1_accum\n"
        "print(tf1_accum.__version__, sorted(m for m in sys.modules if m.startswith('tf1_')))\n"
        "try:\n"
        "    tf1_accum.build_accumulation\n"
        "except ImportError as error:\n"
        "    print('ImportError:', error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # Only the package itself: its modules load on first use.
    assert lines[0] == f"{tf1_accum.__version__} ['tf1_accum']"
    assert lines[1].startswith(
        "ImportError: tf1_accum needs TensorFlow (2.15 to 2.21, or 1.15 on Python 3.7)"
    )
    assert "Install it with: pip install 'tensorflow>=2.15,<2.22'" in lines[1]
    assert "on Python 3.7: pip install 'tensorflow>=1.15,<1.16' 'protobuf<3.21'" in lines[1]
