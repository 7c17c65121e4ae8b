"""The public API: what ``tf1_accum`` exports, and that it is documented."""

import inspect
import pathlib
import re

import tf1_accum

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_all_lists_exactly_the_public_names():
    public = {n for n in dir(tf1_accum) if not n.startswith("_")}
    modules = {n for n in public if inspect.ismodule(getattr(tf1_accum, n))}
    assert set(tf1_accum.__all__) == public - modules
    assert len(tf1_accum.__all__) == len(set(tf1_accum.__all__))


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


def test_version_is_the_one_setup_py_reads():
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    assert "tf1_accum" in setup and "__version__" in setup
    assert re.fullmatch(r"\d+\.\d+\.\d+", tf1_accum.__version__)
