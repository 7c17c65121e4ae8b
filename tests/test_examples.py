"""Smoke tests of the examples, with tiny settings, so they cannot rot."""

import importlib.util
import pathlib

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _load(name):
    spec = importlib.util.spec_from_file_location(
        f"example_{name}", ROOT / "examples" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quickstart(tmp_path, capsys):
    quickstart = _load("quickstart")
    plot = tmp_path / "curves.png"
    result = quickstart.main(
        [
            "--micro-batch",
            "4",
            "--steps",
            "3",
            "--updates",
            "5",
            "--examples",
            "64",
            "--plot",
            str(plot),
        ]
    )
    out = capsys.readouterr().out
    assert "largest parameter difference, accumulated vs big batch" in out
    for mode in ("small batch", "accumulated", "big batch"):
        assert mode in out
        assert len(result["curves"][mode]) == 5
    assert result["max_param_diff"] < 1e-5
    np.testing.assert_allclose(
        result["curves"]["accumulated"], result["curves"]["big batch"], rtol=1e-5
    )
    # The three runs really trained: losses moved from where they started.
    assert result["curves"]["big batch"][0] != result["curves"]["big batch"][-1]
    pytest.importorskip("matplotlib")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(
    __import__("os").environ.get("TF1_ACCUM_NESTED_RUN") == "1",
    reason="starts its own worker processes: run once, by the outer run",
)
def test_distributed_launcher_trains_two_equal_workers(capsys):
    distributed = _load("distributed")
    result = distributed.main(["--local", "2", "--updates", "4", "--steps", "3"])
    assert "largest parameter difference between workers" in capsys.readouterr().out
    assert result["spread"] == 0.0
    for worker in result["results"]:
        assert worker["after"] < 0.5 * worker["before"]
