"""The documentation builds with warnings as errors."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.skipif(
    os.environ.get("TF1_ACCUM_NESTED_RUN") == "1",
    reason="the docs do not depend on the graph mode: built once, by the outer run",
)
def test_sphinx_build_has_no_warnings(tmp_path):
    pytest.importorskip("sphinx")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            str(ROOT / "docs"),
            str(tmp_path / "html"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    warnings = [
        line
        for line in result.stderr.splitlines()
        if "WARNING" in line and "tensorflow" not in line.lower() and "absl" not in line
    ]
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert warnings == []
    assert (tmp_path / "html" / "api.html").exists()
