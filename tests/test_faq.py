"""Every snippet of docs/faq.rst runs as shown."""

import doctest
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FAQ = ROOT / "docs" / "faq.rst"


def test_faq_doctests_pass(capsys):
    """The ``>>>`` examples, in this process's graph mode."""
    result = doctest.testfile(
        str(FAQ),
        module_relative=False,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
    )
    report = capsys.readouterr().out
    assert result.failed == 0, report
    examples = FAQ.read_text(encoding="utf-8").count("\n>>> ")
    assert result.attempted == examples > 0  # every example ran


def python_blocks():
    """The bodies of the ``.. code-block:: python`` directives, dedented."""
    text = FAQ.read_text(encoding="utf-8")
    blocks = re.findall(r"^\.\. code-block:: python\n\n((?:(?:   .*)?\n)+)", text, re.M)
    return [textwrap.dedent(block) for block in blocks]


# Each block enters graph mode itself: run in the v1 mode only.
@pytest.mark.graph_mode_independent
@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_faq_code_block_runs(index, tmp_path):
    """A fresh interpreter, without TF_USE_LEGACY_KERAS: the block sets what it needs."""
    script = tmp_path / f"faq_block_{index}.py"
    script.write_text(python_blocks()[index], encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    result = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_faq_fragments_are_lines_its_doctests_run():
    # A fragment (a line to copy, with the session of the reader's program)
    # does not run alone: each of its lines runs in a doctest of the page.
    text = FAQ.read_text(encoding="utf-8")
    fragments = re.findall(
        r"^\.\. code-block:: python\n   :class: fragment\n\n((?:   .*\n)+)", text, re.M
    )
    assert len(fragments) == 1
    for line in textwrap.dedent(fragments[0]).splitlines():
        assert re.search(r"^(>>>|\.\.\.) +" + re.escape(line) + "$", text, re.M), line


def test_faq_has_the_code_blocks_it_promises():
    blocks = python_blocks()
    assert len(blocks) == 1
    assert 'os.environ["TF_USE_LEGACY_KERAS"] = "1"' in blocks[0]
    assert blocks[0].index("TF_USE_LEGACY_KERAS") < blocks[0].index("import tensorflow")
