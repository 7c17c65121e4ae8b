"""Crash safety: a training process killed with SIGKILL resumes bit for bit.

examples/resumable_training.py trains by accumulation (Adam, an embedding
table and an MLP: sparse and dense accumulators), checkpointing after every
3rd micro-batch and right after each apply, with windows of 4 micro-batches:
so checkpoints fall inside windows, between a window's last micro-batch and
its apply, and right after an apply. A process of its own, in this test's graph
mode, kills itself with SIGKILL at a chosen point; the run is then resumed
(in this process) from its last checkpoint and must end with every variable
bit-identical to a run that was never interrupted, each window applied once.
"""

import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

from _run_example import load_example

ROOT = pathlib.Path(__file__).resolve().parent.parent
STEPS, WINDOWS, BETA1 = 4, 4, 0.9
ARGS = [
    "--steps",
    str(STEPS),
    "--windows",
    str(WINDOWS),
    "--micro-batch",
    "8",
    "--save-every",
    "3",
    "--save-after-apply",
]

# kill point -> the state the resumed run must restore (its last checkpoint).
CASES = {
    # Mid window 3; the last checkpoint (after micro-batch 9) is inside it too.
    "inside_window": (
        ["--simulate-crash-after-micro-batch", "11"],
        {"position": 9, "counter": 1, "global_step": 2},
    ),
    # Right after window 3's apply, before its checkpoint: the last checkpoint
    # was taken between micro-batch 12 and that apply, with a full window. The
    # resumed run must apply window 3 (once) and not skip or repeat it.
    "after_apply_from_full_window": (
        ["--simulate-crash-after-apply", "3"],
        {"position": 12, "counter": 4, "global_step": 2},
    ),
    # Mid window 4; the last checkpoint was taken right after window 3's apply.
    "inside_window_from_after_apply": (
        ["--simulate-crash-after-micro-batch", "14"],
        {"position": 12, "counter": 0, "global_step": 3},
    ),
}


@pytest.fixture(scope="module")
def example():
    return load_example("resumable_training")


@pytest.fixture(scope="module")
def uninterrupted(example, tmp_path_factory):
    result = example.main(ARGS + ["--checkpoint-dir", str(tmp_path_factory.mktemp("whole"))])
    assert result["resumed_from"] is None
    assert result["applies"] == WINDOWS
    return result["variables"]


def _killed_run(checkpoint_dir, crash_args):
    env = dict(
        os.environ,
        TF1_ACCUM_GRAPH_MODE=os.environ.get("TF1_ACCUM_GRAPH_MODE", "v1"),
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    return subprocess.run(
        [sys.executable, str(ROOT / "tests" / "_run_example.py"), "resumable_training"]
        + ARGS
        + ["--checkpoint-dir", str(checkpoint_dir)]
        + crash_args,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _applied_windows(stdout):
    return [int(line.split()[2]) for line in stdout.splitlines() if line.startswith("applied")]


@pytest.mark.parametrize("case", sorted(CASES))
def test_killed_run_resumes_bit_identical_and_applies_each_window_once(
    case, example, uninterrupted, tmp_path
):
    crash_args, restored = CASES[case]
    killed = _killed_run(tmp_path, crash_args)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-3000:] + killed.stderr[-3000:]
    applied_before_kill = _applied_windows(killed.stdout)
    assert applied_before_kill == list(range(1, len(applied_before_kill) + 1))
    assert "done:" not in killed.stdout

    resumed = example.main(ARGS + ["--checkpoint-dir", str(tmp_path)])

    assert resumed["resumed_from"] == restored
    # Every window not in the checkpoint is applied once, even one that the
    # killed process had applied after its last checkpoint.
    assert resumed["applies"] == WINDOWS - restored["global_step"]
    got = resumed["variables"]
    assert got["global_step"] == WINDOWS
    assert got["micro_batch_position"] == STEPS * WINDOWS
    assert got["accumulation/counter"] == 0
    # Adam's beta1 power is beta1 ** (1 + number of updates applied).
    beta1_power = np.float32(BETA1)
    for _ in range(WINDOWS):
        beta1_power = np.float32(beta1_power * np.float32(BETA1))
    np.testing.assert_allclose(got["beta1_power"], beta1_power, rtol=1e-6)

    assert set(got) == set(uninterrupted)
    for name, value in sorted(uninterrupted.items()):
        np.testing.assert_array_equal(got[name], value, err_msg=f"{case}: {name}")


def test_uninterrupted_run_trains(example, uninterrupted, tmp_path):
    # The comparison above means something only if the run moved every
    # trained variable, which a run of zero windows would not.
    untrained = example.main(
        ARGS[:2] + ["--windows", "0"] + ARGS[4:] + ["--checkpoint-dir", str(tmp_path)]
    )["variables"]
    assert untrained["global_step"] == 0
    for name in ("embedding", "w1", "b1", "w2"):
        assert not np.array_equal(untrained[name], uninterrupted[name]), name
