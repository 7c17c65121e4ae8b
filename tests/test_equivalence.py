"""Every way in equals plain large-batch training: the equivalence grid.

N accumulated micro-batches, then the apply, must equal one step of the plain
optimizer on the N micro-batches joined, window after window, for every
optimizer, in float64 (1e-10 relative) and float32 (1e-6), with dense and
with sparse (embedding) gradients, through each way in:

* ``ops``: ``build_accumulation``'s ``accum_op`` per micro-batch, then ``apply_op``;
* ``helper``: ``run_accumulation``;
* ``fused``: ``run_accumulation`` over ``build_accumulation(fused=True)``;
* ``optimizer``: ``AccumulationOptimizer``'s train op per micro-batch;
* ``dataset``: ``build_dataset_accumulation``'s train op, one window per run.

Where the way in runs one micro-batch at a time (``ops``, ``optimizer``), no
variable may move before the apply. The ways are those of tests/_ways.py; the
plain reference is trained once per process and configuration
(tests/_helpers.py).
"""

import pytest
import tensorflow as tf

from _helpers import OPTIMIZERS
from _helpers import check_equivalence
from _helpers import check_short_window
from _ways import BY_NAME
from _ways import WAYS


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("dtype", [tf.float64, tf.float32], ids=lambda d: d.name)
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("way", WAYS, ids=str)
def test_equals_large_batch_training(way, optimizer_name, dtype, sparse):
    check_equivalence(optimizer_name, dtype, sparse, path=way)


@pytest.mark.parametrize(
    "way, optimizer_name, sizes, sparse, b",
    [
        pytest.param("ops", "momentum", (4, 4, 2), False, 3, id="ops-momentum"),
        pytest.param("helper", "momentum", (4, 4, 2), False, 3, id="helper-momentum"),
        pytest.param("fused", "momentum", (4, 4, 2), False, 3, id="fused-momentum"),
        # steps=4: the train op applies the windows of 4, flush_op the last 2.
        pytest.param("optimizer", "momentum", (4, 4, 2), False, 3, id="optimizer-momentum"),
        pytest.param("optimizer", "adam", (4, 4, 2), False, 3, id="optimizer-adam"),
        pytest.param("optimizer", "adam", (4, 4, 2), True, 3, id="optimizer-adam-sparse"),
        # steps=3: the end of the data cuts the last window to 1 micro-batch.
        pytest.param("dataset", "adam", (3, 3, 1), True, 5, id="dataset-adam-sparse"),
    ],
)
def test_a_short_last_window_is_applied_with_its_true_count(way, optimizer_name, sizes, sparse, b):
    # global_step advances once per window, the short one included.
    check_short_window(optimizer_name, way, sizes=sizes, sparse=sparse, b=b)


@pytest.mark.parametrize("way", [BY_NAME["fused"], BY_NAME["optimizer"]], ids=str)
def test_many_windows_in_one_run_each_never_race(way):
    """Where forward, gradients and update share one session.run, order holds.

    Regression test: with reference variables, Grappler once let an update
    run before a gradient that reads the updated variable.
    """
    check_equivalence("momentum", tf.float64, False, path=way, windows=25, n=2, b=3)
