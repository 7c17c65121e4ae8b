"""Packaging: the metadata in pyproject.toml, setup.py, and the one TensorFlow range."""

import ast
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

try:
    import tomllib
except ImportError:  # Python before 3.11: the same parser, which pytest installs there
    import tomli as tomllib

import tf1_accum

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
TENSORFLOW_PACKAGES = ("tensorflow", "tensorflow-cpu", "tf_keras")


def _dotted(node):
    """The dotted name an ``ast.Name`` or ``ast.Attribute`` spells (``ast.unparse`` from 3.9)."""
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ast.dump(node)


def _tensorflow_specifiers():
    """Every (extra, package, specifier, marker) that names a TensorFlow package."""
    found = []
    for extra, requirements in PROJECT["optional-dependencies"].items():
        for requirement in requirements:
            package, specifier, marker = re.fullmatch(
                r"([\w.-]+)([^;]*)(?:; (.*))?", requirement
            ).groups()
            if package in TENSORFLOW_PACKAGES:
                found.append((extra, package, specifier, marker))
    return found


# The two supported ranges, and the Pythons an extra that installs both picks them by.
TF2, TF1 = ">=2.15,<2.22", ">=1.15,<1.16"
MARKERS = {TF2: "python_version >= '3.10'", TF1: "python_version < '3.8'"}


def test_every_extra_names_one_of_the_two_tensorflow_ranges():
    found = _tensorflow_specifiers()
    assert {package for _, package, _, _ in found} == set(TENSORFLOW_PACKAGES)
    assert {extra for extra, _, _, _ in found} == {
        "cpu",
        "tensorflow",
        "tf1",
        "test",
        "examples",
        "bench",
        "docs",
    }
    assert {specifier for _, _, specifier, _ in found} == {TF2, TF1}, found
    for extra, package, specifier, marker in found:
        assert (package, specifier) != ("tf_keras", TF1), "TensorFlow 1.15 has its Keras inside"
        both = extra in ("test", "examples")
        assert marker == (MARKERS[specifier] if both else None), (extra, package, marker)
    # The extras that install both pin 1.15's protobuf where they install 1.15.
    for extra in ("tf1", "test", "examples"):
        pins = [r for r in PROJECT["optional-dependencies"][extra] if r.startswith("protobuf")]
        assert pins == ["protobuf<3.21" + ("; " + MARKERS[TF1] if extra != "tf1" else "")]


def test_readme_and_missing_tensorflow_error_state_the_same_ranges():
    readme = " ".join((ROOT / "README.rst").read_text(encoding="utf-8").split())
    assert (
        "**TensorFlow 1.15 on Python 3.7**, and **TensorFlow 2.15 to 2.21 on Python 3.10" in readme
    )
    assert 'pip install -e ".[tf1]" # tensorflow 1.15 and protobuf<3.21' in readme
    assert "TensorFlow (2.15 to 2.21, or 1.15 on Python 3.7)" in tf1_accum._NO_TENSORFLOW
    assert f"pip install 'tensorflow{TF1}' 'protobuf<3.21'" in tf1_accum._NO_TENSORFLOW
    assert PROJECT["requires-python"] == ">=3.7"
    # The script that runs the suite on each end of the TensorFlow 2 range.
    script = (ROOT / "scripts" / "test_tf_versions.sh").read_text(encoding="utf-8")
    assert "versions=(2.15 2.21)" in script


def test_missing_tensorflow_error_names_what_pip_can_install():
    # The package names of the "tensorflow" and "cpu" extras, with their range:
    # tf1_accum itself is installed from its source, not from an index.
    (tensorflow,) = PROJECT["optional-dependencies"]["tensorflow"]
    (cpu,) = PROJECT["optional-dependencies"]["cpu"]
    assert f"Install it with: pip install '{tensorflow}'" in tf1_accum._NO_TENSORFLOW
    assert f"(or '{cpu}'," in tf1_accum._NO_TENSORFLOW
    assert "tf1_accum[" not in tf1_accum._NO_TENSORFLOW


def test_version_is_read_from_the_package():
    assert "version" in PROJECT["dynamic"] and "version" not in PROJECT
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]
    assert setuptools["setuptools"]["dynamic"]["version"] == {"attr": "tf1_accum.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", tf1_accum.__version__)


def test_license_file_is_the_declared_apache_license():
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_package_ships_its_type_marker():
    assert (ROOT / "tf1_accum" / "py.typed").is_file()
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]
    assert "py.typed" in tool["setuptools"]["package-data"]["tf1_accum"]


def test_console_script_runs_the_checker():
    assert PROJECT["scripts"] == {"tf1-accum-check": "tf1_accum.check:main"}


def test_setup_py_only_hands_over_to_setuptools():
    # pyproject.toml stays the one source of metadata: setup.py passes nothing.
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and _dotted(node.func) == "setuptools.setup"
    ]
    assert len(calls) == 1 and not calls[0].args and not calls[0].keywords


CLEAN = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _run(*command, cwd, **env):
    done = subprocess.run(command, cwd=cwd, env={**CLEAN, **env}, capture_output=True, text=True)
    assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _copy_source(tmp_path):
    # A copy of the source: a build writes next to it.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.rst", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "tf1_accum", source / "tf1_accum", ignore=shutil.ignore_patterns("__pycache__")
    )
    return source


# The venvs of Python 3.7 to 3.9 bring a setuptools before 61, which cannot read
# pyproject.toml's [project]; those of 3.10 and 3.11, 65.5.
OLD_VENV_SETUPTOOLS = sys.version_info < (3, 10)


@pytest.mark.graph_mode_independent
@pytest.mark.skipif(OLD_VENV_SETUPTOOLS, reason="this Python's venv brings a setuptools before 61")
def test_setup_py_reads_the_metadata_with_a_fresh_venvs_setuptools(tmp_path):
    # `python3 -m venv` installs the setuptools bundled with Python (65.5 on
    # 3.10 and 3.11), older than the SPDX "license" of pyproject.toml.
    source = _copy_source(tmp_path)
    _run(sys.executable, "-m", "venv", str(tmp_path / "env"), cwd=tmp_path)
    python = str(tmp_path / "env" / "bin" / "python")
    assert _run(python, "setup.py", "--version", cwd=source).split()[-1] == tf1_accum.__version__
    _run(python, "setup.py", "-q", "egg_info", cwd=source)
    metadata = (source / "tf1_accum.egg-info" / "PKG-INFO").read_text(encoding="utf-8")
    assert "\nLicense: Apache-2.0\n" in metadata and "\nLicense-File: LICENSE\n" in metadata
    assert "\nProvides-Extra: cpu\n" in metadata


@pytest.mark.graph_mode_independent
@pytest.mark.skipif(not OLD_VENV_SETUPTOOLS, reason="this Python's venv brings setuptools 61+")
def test_setup_py_with_a_fresh_venvs_older_setuptools_says_what_to_upgrade(tmp_path):
    source = _copy_source(tmp_path)
    _run(sys.executable, "-m", "venv", str(tmp_path / "env"), cwd=tmp_path)
    done = subprocess.run(
        [str(tmp_path / "env" / "bin" / "python"), "setup.py", "--version"],
        cwd=source,
        env=CLEAN,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and not done.stdout
    assert done.stderr == (
        "tf1_accum's setup.py needs setuptools>=61, which reads pyproject.toml. "
        "Run: python -m pip install --upgrade setuptools\n"
    )


@pytest.mark.graph_mode_independent
def test_a_wheel_built_by_setup_py_installs_the_version_and_the_checker(tmp_path):
    # Through setup.py itself, as old TF1 environments call it: a wheel built
    # by `python setup.py bdist_wheel`, with the build requirement of
    # pyproject.toml alone on the path, then installed into a fresh virtual
    # environment.
    source = _copy_source(tmp_path)
    clean = CLEAN

    def run(*command, cwd=tmp_path, **env):
        return _run(*command, cwd=cwd, **env)

    requirements = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))[
        "build-system"
    ]["requires"]
    pip = (sys.executable, "-m", "pip")
    run(*pip, "install", "--quiet", "--target", str(tmp_path / "build"), *requirements)
    build = {"PYTHONPATH": str(tmp_path / "build")}
    version = run(sys.executable, "setup.py", "--version", cwd=source, **build)
    assert version.split()[-1] == tf1_accum.__version__
    run(sys.executable, "setup.py", "-q", "bdist_wheel", "-d", str(tmp_path), cwd=source, **build)
    (wheel,) = tmp_path.glob("tf1_accum-*.whl")
    assert wheel.name == f"tf1_accum-{tf1_accum.__version__}-py3-none-any.whl"
    # Every module of the package is in it, the checker's subpackage included.
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if name.endswith(".py")}
    modules = {path.relative_to(source).as_posix() for path in (source / "tf1_accum").rglob("*.py")}
    assert "tf1_accum/check/__main__.py" in modules
    assert shipped == modules

    env = tmp_path / "env"
    run(sys.executable, "-m", "venv", "--without-pip", str(env))
    python, script = env / "bin" / "python", env / "bin" / "tf1-accum-check"
    # --no-deps: numpy (and TensorFlow) are not what is tested here.
    run(*pip, "--python", str(python), "install", "--quiet", "--no-deps", str(wheel))

    # The installed package, not a source tree, outside the source directory.
    installed = run(
        python, "-c", "import tf1_accum; print(tf1_accum.__version__, tf1_accum.__file__)"
    )
    assert installed.split()[0] == tf1_accum.__version__
    assert env in pathlib.Path(installed.split()[1]).parents
    # Its metadata, through pip (importlib.metadata is Python 3.8's).
    shown = run(*pip, "--python", str(python), "show", "tf1_accum")
    assert f"\nVersion: {tf1_accum.__version__}\n" in shown
    # The console script runs the checker (it needs no TensorFlow).
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import tensorflow as tf\n\n"
        "w = tf.Variable(1.0)\n"
        "acc = tf.Variable(tf.zeros_like(w.initialized_value()))\n",
        encoding="utf-8",
    )
    done = subprocess.run(
        [script, str(bad)], cwd=tmp_path, env=clean, capture_output=True, text=True
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith(f"{bad}:4:33: TFA007 Variable.initialized_value() raises")


def test_type_checkers_see_every_lazily_exported_name():
    # The "if TYPE_CHECKING:" imports in __init__.py, for editors and type
    # checkers, name the same module as _MODULES, which serves run time.
    tree = ast.parse((ROOT / "tf1_accum" / "__init__.py").read_text(encoding="utf-8"))
    (block,) = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and _dotted(node.test) == "_typing.TYPE_CHECKING"
    ]
    seen = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom), ast.dump(node)
        assert node.module.startswith("tf1_accum."), node.module
        for alias in node.names:
            assert alias.asname == alias.name, "re-export as the same name"
            seen[alias.name] = node.module[len("tf1_accum.") :]
    assert seen == tf1_accum._MODULES
