"""The README's test and docs commands are the ones CI runs.

CI builds the docs with warnings as errors as a step of its own (``.ci/run``),
not in a test: the build does not depend on the graph mode. Then it checks, in
headless Chromium, that every built page shows all of its content
(``scripts/check_docs_layout.py``); the tests here check that check.
"""

import importlib.util
import os
import pathlib
import re
import runpy
import struct
import subprocess
import sys
import textwrap
import zlib

import pytest

import conftest

ROOT = pathlib.Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.graph_mode_independent


def test_api_summary_table_lists_every_public_name():
    import tf1_accum

    api = (ROOT / "docs" / "api.rst").read_text(encoding="utf-8")
    table = re.search(r"^\.\. autosummary::\n   :nosignatures:\n\n((?:   \w+\n)+)", api, re.M)
    assert table, "docs/api.rst has no autosummary table"
    listed = table.group(1).split()
    # A string constant has no docstring of its own for the table: the
    # sentence under the table names it.
    assert set(listed) == set(tf1_accum.__all__) - {"STATE_COLLECTION"}
    assert len(listed) == len(set(listed))


def test_intersphinx_inventories_are_the_ones_their_script_writes(tmp_path):
    script = runpy.run_path(str(ROOT / "docs" / "_inventories" / "make_inventories.py"))
    script["main"](tmp_path)
    for name in ("tensorflow.inv", "numpy.inv"):
        written = (tmp_path / name).read_bytes().split(b"\n", 4)
        committed = (ROOT / "docs" / "_inventories" / name).read_bytes().split(b"\n", 4)
        assert written[:4] == committed[:4], name
        assert zlib.decompress(written[4]) == zlib.decompress(committed[4]), name
        assert b"https://" not in zlib.decompress(committed[4])  # relative to the mapping's URL


def _readme_test_block():
    """The lines of the README's code block that installs and runs the tests."""
    text = (ROOT / "README.rst").read_text(encoding="utf-8")
    start = text.index("Install and run the tests")
    block = re.search(r"\.\. code-block:: bash\n\n((?:   .*\n)+)", text[start:])
    return [line.strip() for line in block.group(1).splitlines()]


def _ci_commands():
    """The commands of ``.ci/run`` before its TensorFlow 2.15 step, one per line."""
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    main = text[: text.index("# tf.estimator exists only up to TensorFlow 2.15")]
    return [line.strip() for line in main.splitlines() if line.strip() and not line.startswith("#")]


def test_ci_runs_the_readme_test_command_and_no_other():
    install, command = _readme_test_block()[-1].split(" && ")
    ci = _ci_commands()
    assert install in ci
    assert command == "scripts/test"
    runs_tests = [line for line in ci if "pytest" in line or "scripts/test" in line]
    assert runs_tests == [command]


def test_ci_builds_the_docs_as_the_readme_says():
    text = (ROOT / "README.rst").read_text(encoding="utf-8")
    builds = set(re.findall(r"``(python -m sphinx [^`]+)``", text))
    assert builds == {"python -m sphinx -W --keep-going -b html docs docs/_build/html"}
    ci = _ci_commands()
    assert builds.pop() in ci
    assert "ruff check ." in ci and "ruff format --check ." in ci
    assert ci.index("ruff format --check .") < ci.index("mypy") < ci.index("scripts/test")


def test_the_test_script_runs_every_graph_mode_of_conftest():
    script = (ROOT / "scripts" / "test").read_text(encoding="utf-8")
    (modes,) = re.findall(r"^for mode in ([\w ]+); do$", script, re.M)
    assert tuple(modes.split()) == conftest.GRAPH_MODES
    assert 'TF1_ACCUM_GRAPH_MODE=${mode} "${PYTHON}" -m pytest -n 2 --dist loadscope "$@"' in script


def _load_layout_check():
    spec = importlib.util.spec_from_file_location(
        "check_docs_layout", ROOT / "scripts" / "check_docs_layout.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _layout_check():
    """scripts/check_docs_layout.py, imported; skips (in CI: fails) without Chromium."""
    module = _load_layout_check()
    try:
        module._find_tools()
    except module.Skip as reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must install Chromium for the docs layout check: {reason}")
        pytest.skip(f"docs layout check not run: {reason}")
    return module


# A page laid out as the theme lays it out: a 400 px column holding the article.
PAGE = """<!DOCTYPE html><html><head><meta name="viewport" content="width=device-width">
<style>
body {{ margin: 0; font: 16px monospace; }}
div.content {{ width: 400px; }}
pre {{ overflow: auto; margin: 0; line-height: 1.5; }}
div.wrap pre {{ white-space: pre-wrap; }}
h2 {{ overflow-wrap: anywhere; }}
div.table-wrapper {{ overflow-x: auto; }}
div.table-wrapper::-webkit-scrollbar, pre::-webkit-scrollbar {{ height: 10px; }}
div.table-wrapper::-webkit-scrollbar-thumb, pre::-webkit-scrollbar-thumb {{ background: gray; }}
</style></head>
<body><div class="content"><article>{}</article></div></body></html>"""
LONG = "x" * 80  # 80 characters of monospace: twice the column's width
WORDS = " ".join(["word"] * 30)  # 149 characters that wrap at spaces
CODE = "sess.run(tf.compat.v1.global_variables_initializer())"  # 53 characters: 1.3 lines


def _png(path, width, dpi, smallest=None):
    """A blank grayscale PNG ``width`` px wide made at ``dpi``, its smallest text ``smallest``."""

    def chunk(kind, data):
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    per_metre = round(dpi / 0.0254)
    said = chunk(b"tEXt", b"Smallest text\0" + smallest.encode()) if smallest else b""
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, 4, 8, 0, 0, 0, 0))
        + chunk(b"pHYs", struct.pack(">IIB", per_metre, per_metre, 1))
        + said
        + chunk(b"IDAT", zlib.compress(b"".join(b"\0" + b"\xff" * width for _ in range(4))))
        + chunk(b"IEND", b"")
    )


# What each rule of the check finds: the defect, as the pages showed it.
FIELD = (
    '<dl class="py property"><dt class="sig">property probe_every</dt><dd><p>never).</p>'
    '<dl class="field-list"><dt>Type<span class="colon">:</span></dt>'
    "<dd><p>Windows run at a size (None</p></dd></dl></dd></dl>"
)
EMPTY_FIELD = (
    '<dl class="py function"><dt class="sig">f(x)</dt><dd><p>Does f.</p>'
    '<dl class="field-list"><dt>Returns<span class="colon">:</span></dt><dd></dd></dl></dd></dl>'
)
BUILTIN = (
    '<dl class="py data"><dt class="sig">STATE_COLLECTION = "tf1_accum_state"</dt>'
    "<dd><p>str(object=\u2019\u2019) -&gt; str str(bytes_or_buffer[, encoding[, errors]]) "
    "-&gt; str</p></dd></dl>"
)
# As sphinx.ext.mathjax wrote it: MathJax from a CDN, which the check cannot reach.
RAW_TEX = (
    '<script defer src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js"></script>'
    '<p>Write <span class="math notranslate nohighlight">\\(B_{big} = N B\\)</span>.</p>'
)


@pytest.mark.parametrize(
    "body, finding",
    [
        (
            f'<div class="highlight-python"><pre style="scrollbar-width: none">{LONG}</pre></div>',
            "px of its lines sideways, with no scroll bar",
        ),
        (
            f'<div class="table-wrapper" style="scrollbar-width: none"><table><tr><td>{LONG}</td>'
            "</tr></table></div>",
            "px of its columns sideways, with no scroll bar",
        ),
        (f'<div style="width: 900px">{LONG}</div>', "px past the edge of the column"),
        (f"<h2>{LONG}</h2>", f'breaks the word "{LONG}" across lines'),
        (
            f'<div class="highlight-python"><pre style="white-space: pre-wrap; '
            f'overflow-wrap: anywhere">{CODE}</pre></div>',
            'breaks a line of code inside "sess.run(tf.compat.v1.global_variables_',
        ),
        (
            f'<div class="highlight-python"><pre style="white-space: pre-wrap">{WORDS}</pre></div>',
            f'shows 4 lines for its 1: it re-flows "{WORDS[:57]}..."; a code block keeps its',
        ),
        (
            '<div class="highlight-python"><pre>x = 1\n\n</pre></div>',
            "shows 2 lines for its 1: a blank line at its end",
        ),
        (
            "<table><tr><td>averages over)</td><td>the large batch's</td></tr></table>",
            'has a cell that closes a bracket it does not open, "averages over)": one row',
        ),
        (
            FIELD,
            '<dt.sig> "property probe_every" has a cut "Type", "Windows run at a size (None": '
            "a description read as a type",
        ),
        (EMPTY_FIELD, '<dt.sig> "f(x)" has an empty "Returns" field'),
        (
            BUILTIN,
            "shows the docstring of a Python built-in type, \"str(object='') -> str\", not its own",
        ),
        (RAW_TEX, 'shows raw TeX, not typeset with no network: 1 formula, the first "\\(B_{big}'),
        (
            '<img src="plot.png" alt="a plot" style="max-width: 100%">',
            "shows its smallest text at 6.0 px (8 pt at 200 dpi, 1480 px shown 399 px wide), "
            "under 12 px",
        ),
        (
            '<div class="highlight-default"><pre><span class="n">window</span>  rows  why\n'
            "     0  - -&gt; 120  first window</pre></div>",
            'a block highlighted as Python is not Python: "window rows why 0 - -> 120 first',
        ),
    ],
    ids=[
        "code-cut",
        "table-cut",
        "past-column",
        "broken-word",
        "code-broken-inside-token",
        "code-reflowed",
        "code-blank-line-at-end",
        "row-in-two",
        "cut-type",
        "empty-field",
        "builtin-docstring",
        "raw-tex-offline",
        "small-figure-text",
        "output-as-python",
    ],
)
def test_layout_check_reports_what_a_reader_cannot_read(tmp_path, body, finding):
    check = _layout_check()
    _png(tmp_path / "plot.png", 1480, 200, smallest="8 pt")
    (tmp_path / "page.html").write_text(PAGE.format(body), encoding="utf-8")
    (found,) = check.check(tmp_path, widths=(1280,))
    assert found.startswith("page.html @ 1280 px: ") and finding in found, found


def test_layout_check_passes_code_that_scrolls_and_what_fits(tmp_path, capsys):
    check = _layout_check()
    _png(tmp_path / "plot.png", 600, 200, smallest="10 pt")  # 3 inches: whole at either width
    _png(tmp_path / "photo.png", 1480, 200)  # not a plot: the size of its text is not known
    body = (
        f'<div class="highlight-python"><pre>{CODE}\n    {LONG}\n</pre></div>'
        f'<div class="table-wrapper"><table><tr><td>{LONG}</td></tr></table></div>'
        f'<div class="highlight-text wrap"><pre>{WORDS} micro-batch {WORDS}</pre></div>'
        '<div class="highlight-text"><pre>run  loss\nbig  0.31</pre></div>'
        "<table><tr><td>weight= (rows, or what the loss averages over)</td></tr></table>"
        "<h2>a heading of short words that wraps over several lines of the column</h2>"
        '<dl class="py property"><dt class="sig">property window: TrainOpWindow</dt><dd>'
        '<p>The window.</p><dl class="field-list"><dt>Type<span class="colon">:</span></dt>'
        "<dd><p>dict[str, tf.Tensor] | None</p></dd></dl></dd></dl>"
        '<img src="plot.png" alt="a plot" style="max-width: 100%">'
        '<img src="photo.png" alt="a photo" style="max-width: 100%">'
    )
    (tmp_path / "page.html").write_text(PAGE.format(body), encoding="utf-8")
    screenshots = tmp_path / "shots"
    assert check.main([str(tmp_path), "--screenshots", str(screenshots)]) == 0
    assert "every page reads whole (1 pages at 1280 px and 390 px)" in capsys.readouterr().out
    for width in check.WIDTHS:
        assert (screenshots / f"page_{width}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ci_checks_the_built_docs_layout_with_chromium():
    ci = _ci_commands()
    build = ci.index("python -m sphinx -W --keep-going -b html docs docs/_build/html")
    assert ci.index("CI=true python scripts/check_docs_layout.py docs/_build/html") > build
    (install,) = [line for line in ci if "apt-get install" in line]
    assert "chromium" in install.split() and "chromium-driver" in install.split()
    # Installed in the background while pip installs the package, waited for
    # before the check.
    started = ci.index('install_chromium > "$chromium_log" 2>&1 &')
    assert started < ci.index('pip install -e ".[test]"')
    waited = ci.index('wait "$chromium_install" || { cat "$chromium_log"; exit 1; }')
    assert build < waited < ci.index("CI=true python scripts/check_docs_layout.py docs/_build/html")


@pytest.mark.parametrize("ci, status", [(None, 0), ("true", 2)])
def test_layout_check_without_chromium_says_so_and_fails_only_in_ci(
    tmp_path, monkeypatch, capsys, ci, status
):
    check = _load_layout_check()
    monkeypatch.setattr(check.shutil, "which", lambda name: None)
    for name in ("CHROMIUM", "CHROMEDRIVER", "CI"):
        monkeypatch.delenv(name, raising=False)
    if ci:
        monkeypatch.setenv("CI", ci)
    (tmp_path / "page.html").write_text(PAGE.format("<p>text</p>"), encoding="utf-8")
    assert check.main([str(tmp_path)]) == status
    said = "FAILED to run in CI" if ci else "SKIPPED"
    assert capsys.readouterr().err == (
        f"docs layout check {said}: chromium and chromedriver not found (Debian: apt-get "
        "install chromium chromium-driver; or set CHROMIUM and CHROMEDRIVER)\n"
    )


def test_landing_page_where_to_go_lists_every_guide_page():
    index = (ROOT / "docs" / "index.rst").read_text(encoding="utf-8")
    (pages,) = re.findall(r":caption: Guide\n(?:   :\w+:.*\n)*\n((?:   \w+\n)+)", index)
    table = index[index.index("Where to go") : index.index(".. toctree::")]
    listed = re.findall(r"^   \* - :doc:`(\w+)`", table, re.M)
    assert {"faq", "performance", "statistics"} <= set(pages.split())
    assert set(pages.split()) <= set(listed)


def test_quickstart_shows_the_table_the_example_prints():
    page = (ROOT / "docs" / "quickstart.rst").read_text(encoding="utf-8")
    source = (ROOT / "examples" / "quickstart.py").read_text(encoding="utf-8")
    (table,) = re.findall(
        r"The table it prints [^`]*?\n\n\.\. list-table::\n((?:(?:   .*)?\n)+)", page
    )
    rows = re.findall(r"^   \* - (.+)$", table, re.M)
    assert rows[1:] == ["small batch", "accumulated", "big batch"]
    assert 'for mode in ("small batch", "accumulated", "big batch"):' in source


def test_readme_use_it_says_what_the_keras_3_note_says():
    from tf1_accum import _validate

    text = (ROOT / "README.rst").read_text(encoding="utf-8")
    use_it = " ".join(
        text[text.index("Use it\n------") : text.index("With the session helper")].split()
    )
    assert "AttributeError: `dense` is not available with Keras 3." in use_it
    assert 'os.environ["TF_USE_LEGACY_KERAS"] = "1"' in use_it
    assert 'os.environ["TF_USE_LEGACY_KERAS"] = "1"' in _validate.KERAS_3_HINT
    assert "tf_keras" in use_it and "tf_keras" in _validate.KERAS_3_HINT


def test_readme_usage_block_runs_as_shown(tmp_path):
    """The README's first Python block is a whole program: it trains and applies 8 updates."""
    text = (ROOT / "README.rst").read_text(encoding="utf-8")
    start = text.index(".. code-block:: python\n\n")
    assert text[:start].count("\n") < 100, "the usage block must start on the README's first screen"
    (block,) = re.findall(r"\A\.\. code-block:: python\n\n((?:(?:   .*)?\n)+)", text[start:])
    script = tmp_path / "usage.py"
    script.write_text(textwrap.dedent(block), encoding="utf-8")
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    result = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("updates: 8 loss: "), result.stdout


def test_design_notes_list_every_module_in_layers_that_import_only_downwards():
    import _imports

    text = (ROOT / "docs" / "concepts.rst").read_text(encoding="utf-8")
    notes = text.split("**The modules, layer by layer.**")[1].split("\n\n**")[0]
    items = re.split(r"^\d\. ", notes, flags=re.M)[1:]
    layer = {name: k for k, item in enumerate(items) for name in re.findall(r"``(_?\w+)``", item)}
    for name in ("run_accumulation", "check_graph", "prepare", "make_window"):
        layer.pop(name, None)  # names of functions, not modules

    def own(module):  # tf1_accum.check._lint -> check
        return module.split(".")[1] if "." in module else None

    graph = _imports.package_imports()
    modules = {own(m) for m in graph} - {None}
    assert sorted(layer) == sorted(modules)
    for module, imported in graph.items():
        if own(module) is None or own(module) == "check":
            continue
        for other in imported:
            if own(other) is not None and own(other) != own(module):
                assert layer[own(other)] >= layer[own(module)], (module, other)
