"""check_graph: the bugs of hand-written accumulation, and none in tf1_accum's ops.

Each broken pattern is built by hand, the way it is usually written, in a
small graph: accumulators made with ``tf.compat.v1.Variable`` (reference
variables under ``disable_v2_behavior()``, resource variables otherwise),
``assign_add`` of each gradient, and an apply on what they hold.
"""

# The source checker would find those patterns here too: they are on purpose.
# tf1_accum.check: ignore-file

import importlib.util
import pathlib
import re
import sys
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf1_accum
from _helpers import Model
from tf1_accum import _graph_check
from tf1_accum.check import _catalogue, _lint

v1 = tf.compat.v1

OPTIMIZERS = {
    "sgd": lambda: v1.train.GradientDescentOptimizer(0.1),
    "momentum": lambda: v1.train.MomentumOptimizer(0.1, 0.9),
    "adam": lambda: v1.train.AdamOptimizer(0.05),
}


class HandWritten:
    """A two-variable model with hand-written accumulators (forum style)."""

    def __init__(self, optimizer="sgd", zero_ops=True, accumulate=True, variable=v1.Variable):
        self.x = v1.placeholder(tf.float32, [None, 3], name="x")
        self.y = v1.placeholder(tf.float32, [None], name="y")
        self.w = v1.get_variable("w", initializer=np.arange(1.0, 4.0, dtype=np.float32))
        self.b = v1.get_variable("b", initializer=0.5)
        prediction = tf.reduce_sum(self.x * self.w, axis=1) + self.b
        self.loss = tf.reduce_mean((prediction - self.y) ** 2)
        self.opt = OPTIMIZERS[optimizer]()
        self.grads_and_vars = self.opt.compute_gradients(self.loss)
        self.accums = [
            variable(tf.zeros_like(_initialized_value(var)), trainable=False)
            for _, var in self.grads_and_vars
        ]
        if accumulate:
            pairs = zip(self.accums, self.grads_and_vars)
            self.accum_ops = [a.assign_add(g) for a, (g, _) in pairs]
        if zero_ops:
            self.zero_ops = [a.assign(tf.zeros_like(a)) for a in self.accums]
        self.vars = [var for _, var in self.grads_and_vars]

    def feed(self):
        return {self.x: np.ones((2, 3), np.float32), self.y: np.ones(2, np.float32)}


def _initialized_value(var):
    """``var.initialized_value()``, as forum code writes it; resource variables lack it."""
    if var.op.type == "VarHandleOp":
        return var
    return var.initialized_value()  # tf1_accum.check: ignore TFA007


def update_ops(graph):
    """The names of the optimizer update ops (Apply*, ResourceApply*...) in ``graph``."""
    return sorted(
        op.name
        for op in graph.get_operations()
        if "Apply" in op.type and not op.type.startswith("Stateless")
    )


def variable_names(variables):
    return sorted(v.op.name for v in variables)


def by_kind(findings):
    kinds = {}
    for finding in findings:
        kinds.setdefault(finding.kind, []).append(finding.op_name)
    return {kind: sorted(names) for kind, names in kinds.items()}


# -- the broken patterns -----------------------------------------------------


@pytest.mark.parametrize("variable", [v1.Variable, tf.Variable], ids=["v1", "v2"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_sum_handed_to_the_optimizer(optimizer, variable):
    """tf.Variable makes resource accumulators even beside reference variables."""
    with tf.Graph().as_default() as graph:
        model = HandWritten(optimizer, variable=variable)
        apply_op = model.opt.apply_gradients(list(zip(model.accums, model.vars)))
        findings = tf1_accum.check_graph(apply_op, model.accum_ops)
        assert by_kind(findings) == {"sum_not_mean": update_ops(graph)}
        assert len(findings) == 2
        for finding in findings:
            assert "the sum of the micro-batch gradients" in finding.message
            assert "tf1_accum.build_accumulation" in finding.message


def test_sum_found_through_a_cast_and_without_accum_ops():
    with tf.Graph().as_default() as graph:
        model = HandWritten()
        apply_op = model.opt.apply_gradients(
            [(tf.cast(tf.identity(a), tf.float32), v) for a, v in zip(model.accums, model.vars)]
        )
        assert by_kind(tf1_accum.check_graph(apply_op)) == {"sum_not_mean": update_ops(graph)}


def test_sparse_sum_scatter_added_and_gathered():
    with tf.Graph().as_default() as graph:
        ids = v1.placeholder(tf.int32, [None], name="ids")
        table = v1.get_variable("table", initializer=np.ones((5, 2), np.float32))
        loss = tf.reduce_mean(tf.nn.embedding_lookup(table, ids) ** 2)
        opt = v1.train.MomentumOptimizer(0.1, 0.9)
        ((grad, _),) = opt.compute_gradients(loss)
        accum = v1.Variable(tf.zeros([5, 2]), trainable=False, name="table_sum")
        accum_op = v1.scatter_add(accum, grad.indices, grad.values)
        accum.assign(tf.zeros([5, 2]))
        rows = tf.range(5)
        summed = tf.IndexedSlices(tf.gather(accum, rows), rows, tf.constant([5, 2]))
        apply_op = opt.apply_gradients([(summed, table)])
        assert by_kind(tf1_accum.check_graph(apply_op, accum_op)) == {
            "sum_not_mean": update_ops(graph)
        }
        assert update_ops(graph)[0].endswith("SparseApplyMomentum")


def test_mean_over_a_counter_that_is_reset_is_clean():
    """The hand-written version done right: a float counter, divided by, reset."""
    with tf.Graph().as_default():
        model = HandWritten("adam")
        counter = v1.Variable(0.0, trainable=False)
        accum_ops = model.accum_ops + [counter.assign_add(1.0)]
        counter.assign(0.0)  # with model.zero_ops, run at the start of each window
        apply_op = model.opt.apply_gradients(
            [(a / counter, v) for a, v in zip(model.accums, model.vars)]
        )
        assert tf1_accum.check_graph(apply_op, accum_ops) == []
        assert tf1_accum.check_graph(apply_op) == []


def test_apply_fed_the_last_batch_accumulates_it_again():
    """norm_accums = [accum_op / batches ...]: the apply runs the assign_adds."""
    with tf.Graph().as_default():
        model = HandWritten()
        norm_accums = [accum_op / 4.0 for accum_op in model.accum_ops]
        apply_op = model.opt.apply_gradients(list(zip(norm_accums, model.vars)))
        accumulates = sorted(op.op.name for op in model.accum_ops)
        expected = {"apply_accumulates": accumulates, "apply_needs_feed": ["x", "y"]}
        for accum_ops in (model.accum_ops, None):
            findings = tf1_accum.check_graph(apply_op, accum_ops)
            assert by_kind(findings) == expected
        twice = [f for f in findings if f.kind == "apply_accumulates"]
        assert all("counts twice" in f.message for f in twice)
        fed = [f for f in findings if f.kind == "apply_needs_feed"]
        assert all("needs a feed for placeholder" in f.message for f in fed)


def test_apply_grouped_with_the_accumulate_ops():
    with tf.Graph().as_default():
        model = HandWritten()
        apply_op = model.opt.apply_gradients(
            [(a / 4.0, v) for a, v in zip(model.accums, model.vars)]
        )
        train_op = tf.group(*model.accum_ops, apply_op)
        accumulates = sorted(op.op.name for op in model.accum_ops)
        expected = {"apply_accumulates": accumulates, "apply_needs_feed": ["x", "y"]}
        assert by_kind(tf1_accum.check_graph(train_op, model.accum_ops)) == expected
        assert by_kind(tf1_accum.check_graph(train_op)) == expected


def test_gradients_fed_back_through_placeholders():
    with tf.Graph().as_default():
        model = HandWritten()
        fed = [
            v1.placeholder(tf.float32, v.shape, name=f"grad_{i}") for i, v in enumerate(model.vars)
        ]
        apply_op = model.opt.apply_gradients(
            list(zip(fed, model.vars))  # tf1_accum.check: ignore TFA004
        )
        findings = tf1_accum.check_graph(apply_op)
        assert by_kind(findings) == {"apply_needs_feed": ["grad_0", "grad_1"]}


def test_a_learning_rate_placeholder_is_not_a_finding():
    with tf.Graph().as_default():
        learning_rate = v1.placeholder(tf.float32, [], name="learning_rate")
        model = Model(tf.float32, sparse=False)
        acc = tf1_accum.build_accumulation(
            model.loss, v1.train.MomentumOptimizer(learning_rate, 0.9)
        )
        assert tf1_accum.check_graph(acc.apply_op, acc.accum_op) == []


def test_accumulators_never_reset():
    with tf.Graph().as_default():
        model = HandWritten(zero_ops=False)
        apply_op = model.opt.apply_gradients(
            [(a / 4.0, v) for a, v in zip(model.accums, model.vars)]
        )
        findings = tf1_accum.check_graph(apply_op, model.accum_ops)
        assert by_kind(findings) == {"never_reset": variable_names(model.accums)}
        assert "never reset" in findings[0].message
        assert model.accum_ops[0].op.name in " ".join(f.message for f in findings)


def test_float_counter_never_reset():
    """The window's sums are reset, its counter is not: the mean shrinks."""
    with tf.Graph().as_default():
        model = HandWritten()
        counter = v1.Variable(0.0, trainable=False, name="counter")
        accum_ops = model.accum_ops + [counter.assign_add(1.0)]
        apply_op = model.opt.apply_gradients(
            [(a / counter, v) for a, v in zip(model.accums, model.vars)]
        )
        findings = tf1_accum.check_graph(apply_op, accum_ops)
        assert by_kind(findings) == {"never_reset": ["counter"]}
        assert "Counter counter is incremented" in findings[0].message
        counter.assign(0.0)
        assert tf1_accum.check_graph(apply_op, accum_ops) == []


def test_running_average_keyed_on_the_global_step_is_never_reset():
    with tf.Graph().as_default():
        model = HandWritten(zero_ops=False, accumulate=False)
        step = v1.train.get_or_create_global_step()
        n = tf.cast(step, tf.float32)
        averages = [
            a.assign(a * (n / (n + 1.0)) + g / (n + 1.0))
            for a, (g, _) in zip(model.accums, model.grads_and_vars)
        ]
        with tf.control_dependencies(averages):
            accum_op = v1.assign_add(step, 1)
        apply_op = model.opt.apply_gradients(list(zip(model.accums, model.vars)))
        findings = tf1_accum.check_graph(apply_op, accum_op)
        # A running average is a mean: never reset, but not a sum. Its count
        # is the global step, which then counts micro-batches.
        assert by_kind(findings) == {
            "never_reset": variable_names(model.accums),
            "step_not_per_update": [accum_op.op.name],
        }


def test_in_a_cond_that_accumulates_or_applies():
    with tf.Graph().as_default():
        model = HandWritten()
        counter = v1.Variable(0, trainable=False, dtype=tf.int64)

        applies = []

        def apply():
            op = model.opt.apply_gradients(list(zip(model.accums, model.vars)))
            applies.extend(update_ops(v1.get_default_graph()))  # the branch's graph in cond_v2
            with tf.control_dependencies([op]):
                resets = [a.assign(tf.zeros(a.shape)) for a in model.accums]
            with tf.control_dependencies(resets):
                return tf.identity(counter.assign(0))

        def accumulate():
            with tf.control_dependencies(model.accum_ops):
                return tf.identity(counter.assign_add(1))

        train_op = tf.cond(  # tf1_accum.check: ignore TFA006
            tf.equal(counter, 3), apply, accumulate
        )
        expected = {"sum_not_mean": sorted(applies)}
        assert len(applies) == 2
        assert by_kind(tf1_accum.check_graph(train_op, train_op)) == expected
        assert by_kind(tf1_accum.check_graph(train_op)) == expected


def test_in_a_while_loop_over_a_dataset():
    with tf.Graph().as_default() as graph:
        data = tf.data.Dataset.from_tensor_slices(np.ones((4, 2, 3), np.float32)).repeat()
        next_batch = v1.data.make_one_shot_iterator(data).get_next
        w = v1.get_variable("w", initializer=np.arange(1.0, 4.0, dtype=np.float32))
        accum = v1.Variable(tf.zeros([3]), trainable=False, name="w_sum")

        def body(i):
            loss = tf.reduce_mean(tf.reduce_sum(next_batch() * w, axis=1) ** 2)
            (grad,) = tf.gradients(loss, [w])
            with tf.control_dependencies([accum.assign_add(grad)]):
                return i + 1

        loop = tf.while_loop(lambda i: i < 4, body, [tf.constant(0)])
        with tf.control_dependencies(tf.nest.flatten(loop)):
            apply_op = v1.train.GradientDescentOptimizer(0.1).apply_gradients(
                [(accum.read_value(), w)]  # tf1_accum.check: ignore TFA001
            )
        findings = tf1_accum.check_graph(apply_op)
        assert by_kind(findings) == {"never_reset": ["w_sum"], "sum_not_mean": update_ops(graph)}


@pytest.mark.parametrize("grouped", [False, True], ids=["listed", "grouped"])
def test_window_ops_fetched_in_one_run(grouped):
    # The re-feed written with tf1_accum's ops: the last micro-batch's run
    # fetches the accumulate and the apply together.
    with tf.Graph().as_default():
        model = Model(tf.float32, sparse=False)
        acc = tf1_accum.build_accumulation(model.loss, v1.train.AdamOptimizer(0.1), fused=True)
        for fetches in ([acc.accum_op, acc.apply_op], [acc.accum_apply_op, acc.accum_op]):
            apply_op = tf.group(*fetches) if grouped else fetches
            # Grouped, the accumulate op is the apply's own: no accum_ops to give.
            findings = tf1_accum.check_graph(apply_op, None if grouped else acc.accum_op)
            assert by_kind(findings) == {"ops_in_one_run": [max(op.name for op in fetches)]}
            assert re.search(
                r"runs \w+ \(\S+\) and \w+ \(\S+\) of one accumulation in one session.run: "
                r".*in no fixed order.*accum_apply_op.*run_accumulation",
                findings[0].message,
            )


# -- tf1_accum's own ops give no findings ------------------------------------


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_build_accumulation_ops_are_clean(optimizer, sparse):
    with tf.Graph().as_default():
        model = Model(tf.float32, sparse)
        step = v1.train.get_or_create_global_step()
        acc = tf1_accum.build_accumulation(
            model.loss, OPTIMIZERS[optimizer](), global_step=step, fused=True
        )
        assert tf1_accum.check_graph(acc.apply_op, acc.accum_op) == []
        assert tf1_accum.check_graph(acc.apply_op) == []
        assert tf1_accum.check_graph(acc.accum_apply_op, acc.accum_op) == []
        assert tf1_accum.check_graph(acc.accum_apply_op) == []
        count = len(v1.get_default_graph().get_operations())
        assert tf1_accum.check_graph([acc.apply_op, acc.global_norm], raise_on_findings=True) == []
        assert len(v1.get_default_graph().get_operations()) == count  # builds nothing


@pytest.mark.parametrize(
    "options",
    [
        {"average": False},
        {"clip_norm": 1.0},
        {"skip_nonfinite": False},
        {"statistics": True, "micro_batch_size": 5},
    ],
    ids=["sum", "clip", "no_skip", "statistics"],
)
def test_build_accumulation_options_are_clean(options):
    with tf.Graph().as_default():
        model = Model(tf.float32, sparse=False)
        fused = "statistics" not in options  # statistics are fetched with apply_op
        acc = tf1_accum.build_accumulation(
            model.loss, v1.train.GradientDescentOptimizer(0.1), fused=fused, **options
        )
        assert tf1_accum.check_graph(acc.apply_op, acc.accum_op) == []
        if fused:
            assert tf1_accum.check_graph(acc.accum_apply_op, acc.accum_op) == []
        else:
            fetches = [acc.apply_op] + list(tf.nest.flatten(acc.statistics))
            assert tf1_accum.check_graph(fetches, acc.accum_op) == []


def moving_average_update(model):
    """A hand-written batch-norm-like moving mean, updated with each micro-batch."""
    moving = v1.Variable(tf.zeros([1]), trainable=False, name="moving_mean")
    batch_mean = tf.reduce_mean(model.labels, axis=0)
    update = moving.assign(0.9 * moving + 0.1 * batch_mean)
    v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, update)
    return moving


def test_moving_averages_in_update_ops_are_not_findings():
    """Never reset, like the running average of gradients, but never applied."""
    with tf.Graph().as_default():
        model = Model(tf.float32, sparse=False)
        moving_average_update(model)
        acc = tf1_accum.build_accumulation(model.loss, v1.train.AdamOptimizer(0.1), fused=True)
        assert tf1_accum.check_graph(acc.apply_op, acc.accum_op) == []
        assert tf1_accum.check_graph(acc.accum_apply_op, acc.accum_op) == []
    with tf.Graph().as_default():
        model = Model(tf.float32, sparse=False)
        moving_average_update(model)
        wrapper = tf1_accum.AccumulationOptimizer(v1.train.AdamOptimizer(0.1), steps=3)
        train_op = wrapper.minimize(model.loss)
        assert tf1_accum.check_graph(train_op, train_op) == []


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "embedding"])
def test_weighted_accumulation_is_clean(sparse):
    # An embedding's rows touched are marked by a maximum with the weight:
    # the fused apply reads them, and the ids are not what it applies.
    with tf.Graph().as_default():
        model = Model(tf.float32, sparse)
        weight = tf.cast(tf.shape(model.labels)[0], tf.float32)
        acc = tf1_accum.build_accumulation(
            model.loss, v1.train.AdamOptimizer(0.1), weight=weight, fused=True
        )
        assert tf1_accum.check_graph(acc.apply_op, acc.accum_op) == []
        assert tf1_accum.check_graph(acc.accum_apply_op, acc.accum_op) == []
        assert tf1_accum.check_graph(acc.accum_apply_op) == []


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_accumulation_optimizer_train_op_is_clean(optimizer, sparse):
    with tf.Graph().as_default():
        model = Model(tf.float32, sparse)
        step = v1.train.get_or_create_global_step()
        wrapper = tf1_accum.AccumulationOptimizer(OPTIMIZERS[optimizer](), steps=3)
        train_op = wrapper.minimize(model.loss, global_step=step)
        assert tf1_accum.check_graph(train_op, train_op) == []
        assert tf1_accum.check_graph(train_op) == []
        assert tf1_accum.check_graph(wrapper.flush_op, train_op) == []


@pytest.mark.parametrize(
    "options",
    [
        {"average": False},
        {"clip_norm": 1.0},
        {"skip_nonfinite": False},
        {"weight": "size"},
        {"statistics": True, "micro_batch_size": 5},
    ],
    ids=["sum", "clip", "no_skip", "weighted", "statistics"],
)
def test_accumulation_optimizer_options_are_clean(options):
    with tf.Graph().as_default():
        model = Model(tf.float32, sparse=False)
        if options.get("weight") == "size":
            options = {"weight": tf.cast(tf.shape(model.labels)[0], tf.float32)}
        wrapper = tf1_accum.AccumulationOptimizer(
            v1.train.MomentumOptimizer(0.1, 0.9), steps=3, **options
        )
        train_op = wrapper.minimize(model.loss)
        assert tf1_accum.check_graph(train_op, train_op) == []


@pytest.mark.parametrize("weighted", [False, True], ids=["mean", "weighted"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_dataset_loop_train_op_is_clean(optimizer, weighted):
    def loss_fn(batch):
        w = v1.get_variable("w", initializer=np.arange(1.0, 4.0, dtype=np.float32))
        return tf.reduce_mean(tf.reduce_sum(batch * w, axis=1) ** 2)

    with tf.Graph().as_default():
        data = tf.data.Dataset.from_tensor_slices(np.ones((6, 2, 3), np.float32))
        weight = (lambda batch: tf.cast(tf.shape(batch)[0], tf.float32)) if weighted else None
        acc = tf1_accum.build_dataset_accumulation(
            loss_fn, OPTIMIZERS[optimizer](), data, 3, weight=weight
        )
        assert tf1_accum.check_graph(acc.train_op) == []
        assert tf1_accum.check_graph([acc.train_op, acc.loss]) == []


# -- arguments and raise_on_findings -----------------------------------------


def test_raise_on_findings_lists_them():
    with tf.Graph().as_default():
        model = HandWritten(zero_ops=False)
        apply_op = model.opt.apply_gradients(list(zip(model.accums, model.vars)))
        findings = tf1_accum.check_graph(apply_op, model.accum_ops)
        assert len(findings) == 4
        with pytest.raises(ValueError, match=r"check_graph found 4 problem\(s\)") as raised:
            tf1_accum.check_graph(apply_op, model.accum_ops, raise_on_findings=True)
        text = str(raised.value)
        for finding in findings:
            assert f"{finding.kind} at {finding.op_name}: {finding.message}" in text


def test_findings_are_named_tuples():
    with tf.Graph().as_default():
        model = HandWritten()
        apply_op = model.opt.apply_gradients(list(zip(model.accums, model.vars)))
        finding = tf1_accum.check_graph(apply_op)[0]
        assert isinstance(finding, tf1_accum.GraphFinding)
        assert finding._fields == ("kind", "op_name", "message")
        assert finding.code == "TFA001"
        assert finding == (finding.kind, finding.op_name, finding.message)


@pytest.mark.parametrize("bad", [None, "train", 3, {"op": 1}])
def test_apply_op_of_the_wrong_type(bad):
    expected = "apply_op must be a tf.Operation, tf.Tensor or tf.Variable"
    with pytest.raises(TypeError, match=expected):
        tf1_accum.check_graph(bad)


def test_empty_apply_op():
    with pytest.raises(TypeError, match=r"apply_op must not be empty, got \[\]"):
        tf1_accum.check_graph([])


def test_accum_ops_of_the_wrong_type():
    with tf.Graph().as_default():
        op = tf.no_op()
        with pytest.raises(TypeError, match="accum_ops must be a tf.Operation.*got 'accumulate'"):
            tf1_accum.check_graph(op, ["accumulate"])


def test_raise_on_findings_must_be_a_bool():
    with tf.Graph().as_default():
        op = tf.no_op()
        with pytest.raises(TypeError, match="raise_on_findings must be True or False, got 1"):
            tf1_accum.check_graph(op, raise_on_findings=1)


def test_accum_ops_from_another_graph():
    with tf.Graph().as_default():
        other = tf.no_op(name="elsewhere")
    with tf.Graph().as_default():
        op = tf.no_op(name="apply")
        with pytest.raises(ValueError, match="must come from one graph: elsewhere is in another"):
            tf1_accum.check_graph(op, other)


# -- the migration examples: befores found, afters clean ----------------------

MIGRATION = pathlib.Path(__file__).resolve().parent.parent / "examples" / "migration"


def run_example(name, monkeypatch):
    """Runs examples/migration/NAME.py, recording what each session.run fetched.

    Returns (apply ops, their feed's placeholders, per-micro-batch ops): the
    apply is whatever fetch runs an optimizer update op, the micro-batch
    fetches are the other fetches made with a feed.
    """
    if str(MIGRATION) not in sys.path:
        sys.path.insert(0, str(MIGRATION))  # the scripts import common
    spec = importlib.util.spec_from_file_location(f"migration_{name}", MIGRATION / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    calls = []
    original = v1.Session.run

    def run(self, fetches, feed_dict=None, *args, **kwargs):
        ops = [f if isinstance(f, tf.Operation) else f.op for f in tf.nest.flatten(fetches)]
        calls.append((ops, list(feed_dict or {})))
        return original(self, fetches, feed_dict, *args, **kwargs)

    monkeypatch.setattr(v1.Session, "run", run)
    module.main()
    monkeypatch.undo()
    apply_ops, fed, accum_ops = [], [], []
    for ops, feeds in calls:
        runs = _graph_check._Graph(ops[0].graph).reaches(ops, None)
        if any(_graph_check._gradient_index(op) is not None for op in runs):
            apply_ops += [op for op in ops if op not in apply_ops]
            fed += [t.op.name for t in feeds if t.op.name not in fed]
        elif feeds:
            accum_ops += [op for op in ops if op not in accum_ops]
    assert apply_ops, f"{name}: no fetch ran an optimizer update"
    return apply_ops, sorted(fed), [op for op in accum_ops if op not in apply_ops]


def test_migration_before_a_sum_not_mean(monkeypatch):
    if v1.resource_variables_enabled():
        pytest.skip("this before calls initialized_value(), which resource variables lack")
    apply_ops, _, accum_ops = run_example("a_sum_not_mean_before", monkeypatch)
    findings = tf1_accum.check_graph(apply_ops, accum_ops)
    assert by_kind(findings) == {"sum_not_mean": update_ops(apply_ops[0].graph)}


def test_migration_before_c_last_batch_twice(monkeypatch):
    apply_ops, fed, accum_ops = run_example("c_last_batch_twice_before", monkeypatch)
    findings = tf1_accum.check_graph(apply_ops, accum_ops)
    assert fed
    assert by_kind(findings) == {
        "apply_needs_feed": fed,
        "apply_accumulates": sorted(op.name for op in accum_ops),
    }


def test_migration_before_d_numpy_round_trip(monkeypatch):
    apply_ops, fed, accum_ops = run_example("d_numpy_round_trip_before", monkeypatch)
    findings = tf1_accum.check_graph(apply_ops, accum_ops)
    trained = apply_ops[0].graph.get_collection(v1.GraphKeys.TRAINABLE_VARIABLES)
    assert len(fed) == len(trained) == 3  # one placeholder per gradient
    assert by_kind(findings) == {"apply_needs_feed": fed}


def test_migration_before_e_running_average(monkeypatch):
    apply_ops, _, accum_ops = run_example("e_running_average_before", monkeypatch)
    graph = apply_ops[0].graph
    averages = [v for v in graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES) if not v.trainable]
    averages = [v for v in averages if v.op.name != "global_step"]
    assert len(averages) == len(graph.get_collection(v1.GraphKeys.TRAINABLE_VARIABLES)) == 3
    findings = tf1_accum.check_graph(apply_ops, accum_ops)
    # Keyed on the global step, the average makes it count micro-batches.
    increments = [
        op.name for op in graph.get_operations() if op.type in ("AssignAdd", "AssignAddVariableOp")
    ]
    assert by_kind(findings) == {
        "never_reset": variable_names(averages),
        "step_not_per_update": increments,
    }


@pytest.mark.parametrize(
    "name",
    [
        "a_sum_not_mean_after",
        "b_counter_mean_after",
        "c_last_batch_twice_after",
        "d_numpy_round_trip_after",
        "e_running_average_after",
        "f_cond_apply_after",
    ],
)
def test_migration_afters_are_clean(name, monkeypatch):
    apply_ops, _, accum_ops = run_example(name, monkeypatch)
    assert tf1_accum.check_graph(apply_ops, accum_ops or None) == []


def _bert_loss():
    x = v1.placeholder(tf.float64, [None, 2], name="x")
    w = v1.get_variable("w", initializer=np.array([1.0, -0.5]))
    return tf.reduce_mean((tf.reduce_sum(x * w, axis=1) - 1.0) ** 2), w


def test_a_hand_written_increment_beside_the_wrappers_counts_micro_batches():
    # BERT's create_optimizer with the wrapper line only: its own increment,
    # grouped with a train op that runs once per micro-batch.
    with tf.Graph().as_default():
        loss, _ = _bert_loss()
        step = v1.train.get_or_create_global_step()
        opt = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), 4)
        tvars = v1.trainable_variables()
        train_op = opt.apply_gradients(zip(tf.gradients(loss, tvars), tvars), global_step=step)
        increment = step.assign(step + 1)
        findings = tf1_accum.check_graph(tf.group(train_op, [increment]))
    assert [(f.kind, f.op_name) for f in findings] == [("step_not_per_update", increment.op.name)]
    assert "run once per micro-batch" in findings[0].message
    assert "increments the global step global_step with every micro-batch" in findings[0].message
    assert "tf.cond(opt.window.applied, ...)" in findings[0].message


def test_the_increment_hung_on_applied_is_clean():
    with tf.Graph().as_default():
        loss, _ = _bert_loss()
        step = v1.train.get_or_create_global_step()
        opt = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), 4)
        train_op = opt.minimize(loss)
        increment = tf.cond(opt.window.applied, lambda: step.assign(step + 1), step.read_value)
        assert tf1_accum.check_graph(tf.group(train_op, increment)) == []


@pytest.mark.parametrize("form", ["assign_add", "assign"])
def test_an_increment_hung_on_applied_beside_the_wrappers_own_counts_twice(form):
    with tf.Graph().as_default():
        loss, _ = _bert_loss()
        step = v1.train.get_or_create_global_step()
        opt = tf1_accum.AccumulationOptimizer(v1.train.GradientDescentOptimizer(0.1), 4)
        train_op = opt.minimize(loss, global_step=step)

        def count():
            if form == "assign_add":
                return tf.identity(v1.assign_add(step, 1))
            return tf.identity(v1.assign(step, step + 1))

        counted = tf.cond(opt.window.applied, count, lambda: tf.identity(step), name="count")
        findings = tf1_accum.check_graph(tf.group(train_op, counted))
    assert [f.kind for f in findings] == ["step_not_per_update"]
    assert findings[0].op_name.startswith("count")
    assert "(window.applied) holds, and the AccumulationOptimizer given that step" in (
        findings[0].message
    )


def test_an_increment_with_each_accumulate_op_counts_micro_batches():
    with tf.Graph().as_default():
        model = HandWritten()
        step = v1.train.get_or_create_global_step()
        count = v1.Variable(0.0, trainable=False)
        accum = model.accum_ops + [count.assign_add(1.0), v1.assign_add(step, 1)]
        mean = [(a / count, v) for a, v in zip(model.accums, model.vars)]
        apply_op = tf.group(model.opt.apply_gradients(mean), model.zero_ops, count.assign(0.0))
        findings = tf1_accum.check_graph(apply_op, accum)
    assert [(f.kind, f.op_name) for f in findings] == [("step_not_per_update", accum[-1].op.name)]
    assert findings[0].message.startswith("a micro-batch's fetch (accum_ops) runs")


def test_an_apply_that_increments_twice():
    with tf.Graph().as_default():
        model = HandWritten()
        step = v1.train.get_or_create_global_step()
        count = v1.Variable(0.0, trainable=False)
        mean = [(a / count, v) for a, v in zip(model.accums, model.vars)]
        update = model.opt.apply_gradients(mean, global_step=step)
        with tf.control_dependencies([update]):
            apply_op = tf.group(update, step.assign(step + 1), model.zero_ops, count.assign(0.0))
        accum = model.accum_ops + [count.assign_add(1.0)]
        findings = tf1_accum.check_graph(apply_op, accum)
        once = tf1_accum.check_graph(
            tf.group(model.opt.apply_gradients(mean, global_step=step), model.zero_ops), accum
        )
    assert [f.kind for f in findings] == ["step_not_per_update"]
    assert "runs 2 increments of the global step" in findings[0].message
    assert "delete the hand-written" in findings[0].message
    assert [f.kind for f in once] == []


def _load_example(name):
    path = pathlib.Path(__file__).parent.parent / "examples" / "real_programs" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"real_programs_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bert = _load_example("bert_style_optimizer")

EXAMPLES, MICRO_BATCH, WINDOW = 96, 8, 4  # 12 micro-batches per epoch, 4 per update


def _input(epochs, iterator="initializable"):
    """An Estimator-style input_fn's pipeline of BERT's examples, in micro-batches."""
    x, y = bert.make_data(EXAMPLES, 1)
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(EXAMPLES)
    data = data.repeat(epochs).batch(MICRO_BATCH)
    if iterator == "one_shot":
        return v1.data.make_one_shot_iterator(data).get_next()
    return v1.data.make_initializable_iterator(data).get_next()


def _bert_findings(num_train_steps, num_warmup_steps, epochs=3, iterator="initializable"):
    """check_graph of BERT's migrated train op: its schedule, its optimizer, the wrapper."""
    with tf.Graph().as_default():
        x, y = _input(epochs, iterator)
        loss = bert.build_model(x, y)
        step = v1.train.get_or_create_global_step()
        optimizer = bert.create_optimizer(step, 0.01, num_train_steps, num_warmup_steps)
        wrapper = tf1_accum.AccumulationOptimizer(optimizer, WINDOW, clip_norm=1.0)
        return tf1_accum.check_graph(wrapper.minimize(loss, global_step=step))


@pytest.mark.parametrize("iterator", ["initializable", "one_shot"])
def test_bert_steps_worked_out_from_the_micro_batch_size_are_reported(iterator):
    # run_classifier's arithmetic with the micro-batch as the batch: 36 steps,
    # where training makes 9 updates.
    num_train_steps = int(EXAMPLES / MICRO_BATCH * 3)
    findings = _bert_findings(num_train_steps, int(num_train_steps * 0.1), iterator=iterator)
    assert [(f.kind, f.op_name) for f in findings] == [
        ("schedule_in_micro_batches", "PolynomialDecay/Minimum")
    ]
    message = findings[0].message
    assert message.startswith(
        "Schedule op PolynomialDecay/Minimum (Minimum) sets the global step global_step "
        "against the step count 36, the micro-batches of all epoch(s) of the input "
        "pipeline (12 per epoch, 36 in all)"
    )
    assert "one per 4 micro-batches: training ends at update 9" in message
    assert "N = 4: a schedule's step count worked out from the micro-batch size" in message
    assert "divide every step count by N" in message
    assert "num_train_steps = int(examples / (batch_size * N) * epochs)" in message


def test_bert_steps_divided_by_n_are_clean():
    num_train_steps = int(EXAMPLES / (MICRO_BATCH * WINDOW) * 3)
    assert num_train_steps == 9
    assert _bert_findings(num_train_steps, int(num_train_steps * 0.1)) == []
    assert _bert_findings(num_train_steps, 2) == []


def test_an_input_repeated_forever_does_not_tell_the_unit():
    # BERT's own input_fn repeats forever and stops at max_steps: 36 could be
    # 3 epochs of micro-batches or 12 of updates, and is not reported.
    assert _bert_findings(36, 3, epochs=-1) == []


def _built_warnings(build, *args, **kwargs):
    """``(result of build(...), its tf1_accum warnings)``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = build(*args, **kwargs)
    return result, [str(w.message) for w in caught if str(w.message).startswith("tf1_accum")]


def test_the_wrapper_says_a_step_count_is_in_micro_batches_as_it_builds_the_train_op():
    # Before any session: minimize warns with check_graph's finding.
    findings, warned = _built_warnings(_bert_findings, int(EXAMPLES / MICRO_BATCH * 3), 3)
    [finding] = findings
    assert warned == [f"tf1_accum: {finding.message}"]
    assert "step count 36" in warned[0] and "divide every step count by N" in warned[0]
    findings, warned = _built_warnings(_unet_findings, EXAMPLES // MICRO_BATCH, epochs=2)
    assert warned == [f"tf1_accum: {findings[0].message}"]


def test_the_wrapper_is_silent_on_step_counts_in_updates_or_of_unknown_unit():
    assert _built_warnings(_bert_findings, 9, 2) == ([], [])
    assert _built_warnings(_bert_findings, 36, 3, epochs=-1) == ([], [])
    assert _built_warnings(_unet_findings, EXAMPLES // MICRO_BATCH / WINDOW, epochs=2) == ([], [])


def _unet_findings(decay_steps, epochs):
    """check_graph of a U-Net trainer's migrated train op, decaying every ``decay_steps``."""
    with tf.Graph().as_default():
        x, y = _input(epochs)
        loss = bert.build_model(x, y)
        step = v1.train.get_or_create_global_step()
        rate = v1.train.exponential_decay(0.2, step, decay_steps, 0.95, staircase=True)
        opt = tf1_accum.AccumulationOptimizer(v1.train.MomentumOptimizer(rate, 0.99), WINDOW)
        return tf1_accum.check_graph(opt.minimize(loss, global_step=step))


def test_a_decay_per_epoch_in_micro_batches_is_reported():
    training_iters = EXAMPLES // MICRO_BATCH  # the trainer's iterations per epoch
    findings = _unet_findings(training_iters, epochs=2)
    assert [(f.kind, f.op_name) for f in findings] == [
        ("schedule_in_micro_batches", "ExponentialDecay/truediv")
    ]
    assert "step count 12, the micro-batches of 1 of the 2 epoch(s)" in findings[0].message
    assert "training ends at update 6" in findings[0].message


def test_a_decay_per_epoch_in_updates_is_clean():
    assert _unet_findings(EXAMPLES // MICRO_BATCH / WINDOW, epochs=2) == []


def test_a_count_that_may_be_in_updates_is_not_reported():
    # 12 micro-batches is one epoch, or 4 epochs of updates: within the 12
    # updates of training, it may be right.
    assert _unet_findings(EXAMPLES // MICRO_BATCH, epochs=WINDOW) == []


# -- the catalogue: each mistake reported by its code, by each detector that claims it --


def _sums():
    model = HandWritten()
    return model.opt.apply_gradients(list(zip(model.accums, model.vars))), model.accum_ops


def _refed():
    model = HandWritten()
    norm_accums = [accum_op / 4.0 for accum_op in model.accum_ops]
    return model.opt.apply_gradients(list(zip(norm_accums, model.vars))), model.accum_ops


def _in_one_run():
    acc = tf1_accum.build_accumulation(Model(tf.float32, sparse=False).loss, OPTIMIZERS["sgd"]())
    return [acc.accum_op, acc.apply_op], acc.accum_op


def _never_reset():
    model = HandWritten(zero_ops=False)
    return model.opt.apply_gradients([(a / 4.0, v) for a, v in zip(model.accums, model.vars)]), None


def _step_per_micro_batch():
    model = HandWritten()
    step = v1.train.get_or_create_global_step()
    count = v1.Variable(0.0, trainable=False)
    accum = model.accum_ops + [count.assign_add(1.0), v1.assign_add(step, 1)]
    mean = [(a / count, v) for a, v in zip(model.accums, model.vars)]
    return tf.group(model.opt.apply_gradients(mean), model.zero_ops, count.assign(0.0)), accum


def _refused_in_one_run():
    """The error of a session.run that fetches a window's add and apply together."""
    acc = tf1_accum.build_accumulation(Model(tf.float32, sparse=False).loss, OPTIMIZERS["sgd"]())
    with v1.Session() as sess, pytest.raises(ValueError) as refused:
        sess.run([acc.accum_op, acc.apply_op])
    return str(refused.value)


def _token_mean_by_hand():
    """Gradients of a loss averaged over the fed mask's tokens, accumulated unweighted."""
    model = HandWritten()
    mask = v1.placeholder(tf.float32, [None], name="mask")
    loss = tf.reduce_sum(tf.reduce_sum(model.x * model.w, axis=1) * mask) / tf.reduce_sum(mask)
    grads = tf.gradients(loss, model.vars[:1])
    accum = model.accums[0].assign_add(grads[0])
    return model.opt.apply_gradients([(model.accums[0] / 4.0, model.vars[0])]), accum


# Each mistake by code: a corpus file the source checker finds it in, a graph
# check_graph finds it in, an error refusing it at run time (None: not that detector's).
MISTAKES = {
    "TFA001": ("accumulate_function_value", _sums, None),
    "TFA002": ("counter_mean_self", None, None),
    "TFA003": ("refeed_whole_window", _refed, None),
    "TFA004": ("placeholder_list_attribute", _refed, None),
    "TFA005": ("running_average_global_step", None, None),
    "TFA006": ("cond_methods", None, None),
    "TFA007": ("byte_order_mark", None, None),
    "TFA008": ("n_minus_one_loop", None, None),
    "TFA009": ("refeed_helper_method", None, None),
    "TFA010": ("accumulate_and_apply_in_one_run", _in_one_run, _refused_in_one_run),
    "TFA011": (None, _never_reset, None),
    "TFA012": (None, _step_per_micro_batch, None),
    "TFA013": ("schedule_micro_batches", lambda: None, None),  # built by _bert_findings
    "TFA014": ("token_mean_loss", _token_mean_by_hand, None),
}
CORPUS_DIR = pathlib.Path(__file__).parent / "check_corpus"


@pytest.mark.parametrize("code", sorted(_catalogue.CATALOGUE))
def test_each_mistake_is_reported_by_its_code_and_text(code):
    mistake = _catalogue.CATALOGUE[code]
    source, graph, refusal = MISTAKES[code]
    assert (source is not None, graph is not None) == (mistake.source, bool(mistake.kind))
    if source is not None:
        findings = _lint.check_paths([str(CORPUS_DIR / f"{source}.py.txt")])
        texts = {f.message for f in findings if f.rule == code}
        assert texts == {f"{mistake.why}; {mistake.fix}"}
    if graph is not None:
        with tf.Graph().as_default():
            if mistake.kind == "schedule_in_micro_batches":
                findings = _bert_findings(int(EXAMPLES / MICRO_BATCH * 3), 3)
            else:
                findings = tf1_accum.check_graph(*graph())
        [finding] = [f for f in findings if f.kind == mistake.kind][:1]
        assert finding.code == code
        assert finding.message.endswith(f": {mistake.why}; {mistake.fix}")
    if refusal is not None:
        with tf.Graph().as_default():
            text = refusal()
        assert f" ({code}, {mistake.title}): {mistake.why}. Nothing was run. " in text
        assert text.endswith(f"Instead, {mistake.fix} (see {mistake.doc}).")


def test_the_catalogue_names_each_mistake_once_in_the_docs():
    catalogue = _catalogue.CATALOGUE.values()
    for field in ("code", "title", "why", "fix", "kind"):
        values = [getattr(m, field) for m in catalogue if getattr(m, field)]
        assert len(set(values)) == len(values), field
    assert sorted(MISTAKES) == sorted(_catalogue.CATALOGUE)
    assert sorted(_graph_check._KINDS) == sorted(_catalogue.KINDS)
    docs = pathlib.Path(__file__).parent.parent / "docs"
    cli = (docs / "cli.rst").read_text(encoding="utf-8").replace("``", "")
    guide = (docs / "migration.rst").read_text(encoding="utf-8")
    for mistake in catalogue:
        assert cli.count(f"* {mistake.code} {mistake.title}") == 1, mistake.code
        assert guide.count(f"* {mistake.code} ") == 1, mistake.code
        page, anchor = mistake.doc.split(".html#")
        text = (docs / f"{page}.rst").read_text(encoding="utf-8")
        headings = re.findall(r"^(.+)\n[-~=]{3,}$", text, re.M)
        slugs = {re.sub(r"[^a-z0-9]+", "-", h.lower()).strip("-") for h in headings}
        assert anchor in slugs or f".. _{anchor}:" in text, mistake.doc
