"""``python -m tf1_accum.check``: each forum pattern found at its line, in the
migration examples and in the corpus of real-world shapes under
tests/check_corpus, nothing found in clean code or in the corpus's clean twins,
Python 2 and encoded files read, unreadable files and usage errors reported,
and no TensorFlow import.

Pure Python: the graph mode does not matter, so the nested run skips it.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

import tf1_accum.check
from _imports import package_imports
from tf1_accum.check import _catalogue, _cli, _lint, _source

# The checker does not depend on the graph mode: run in the v1 mode only.
pytestmark = pytest.mark.graph_mode_independent

ROOT = pathlib.Path(__file__).resolve().parent.parent
MIGRATION = ROOT / "examples" / "migration"
BEFORES = sorted(MIGRATION.glob("*_before.py"))
MARKER = re.compile(r"# <- (TFA\d{3}(?:, TFA\d{3})*)$")
CORPUS = sorted((ROOT / "tests" / "check_corpus").glob("*.py.txt"))
EXPECT = re.compile(rb"# expect: (TFA\d{3}(?:, TFA\d{3})*)\s*$")


def _marked(path):
    """The (line, rule) pairs a file marks with "# <- RULE" comments."""
    expected = set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        match = MARKER.search(line)
        if match:
            expected |= {(number, rule) for rule in match.group(1).split(", ")}
    return expected


def _expected(path):
    """The (line, rule) pairs a corpus file marks with "# expect: RULE" comments."""
    expected = set()
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        match = EXPECT.search(line)
        if match:
            expected |= {(number, rule) for rule in match.group(1).decode().split(", ")}
    return expected


def _run(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "tf1_accum.check", *map(str, args)],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("before", BEFORES, ids=lambda path: path.stem)
def test_each_before_is_found_at_its_lines_by_its_rule(before):
    expected = _marked(before)
    assert expected, f"{before.name} marks no line"
    found = {(f.line, f.rule) for f in _lint.check_paths([str(before)])}
    assert found == expected


def test_the_befores_cover_every_pattern_but_the_loops():
    # TFA008 to TFA010 are about the session loop, TFA013 and TFA014 about
    # schedules and losses given to tf1_accum itself; the corpus holds them.
    assert len(BEFORES) == 6
    rules = {rule for before in BEFORES for _, rule in _marked(before)}
    assert rules == set(_catalogue.RULES) - {"TFA008", "TFA009", "TFA010", "TFA013", "TFA014"}


@pytest.mark.parametrize("path", CORPUS, ids=lambda path: path.name[: -len(".py.txt")])
def test_the_corpus_is_found_at_its_lines_by_its_rules(path):
    result = _lint.check_file(str(path))
    assert result.readable
    found = {(f.line, f.rule) for f in result.findings}
    assert found == _expected(path)
    if path.name.endswith("_clean.py.txt"):
        assert found == set()


def test_the_corpus_covers_every_rule_with_clean_twins():
    counts = {}
    for path in CORPUS:
        for _, rule in _expected(path):
            counts[rule] = counts.get(rule, 0) + 1
    assert set(counts) == set(_catalogue.RULES) | {"TFA000"}
    clean = [path for path in CORPUS if path.name.endswith("_clean.py.txt")]
    assert len(clean) >= 12
    assert all(_expected(path) == set() for path in clean)


def test_no_findings_in_clean_code():
    # Code that builds a pattern on purpose marks it with the ignore comment;
    # the corpus is not walked (*.py.txt), the befores are checked above.
    clean = [str(ROOT / name) for name in ("tf1_accum", "tests", "examples", "benchmarks")]
    befores = {str(path) for path in BEFORES}
    found = [str(f) for f in _lint.check_paths(clean) if f.path not in befores]
    assert found == []
    # The walk did reach the afters and the library.
    walked = set(_lint.python_files(clean))
    assert str(MIGRATION / "f_cond_apply_after.py") in walked
    assert str(ROOT / "tf1_accum" / "_window.py") in walked


@pytest.mark.parametrize(
    "source",
    [
        # Divided by the number of micro-batches: a mean, not a sum.
        "acc = [tf.Variable(tf.zeros_like(v), trainable=False) for v in tvs]\n"
        "ops = [a.assign_add(g) for a, (g, v) in zip(acc, gvs)]\n"
        "step = opt.apply_gradients([(a / N, v) for a, v in zip(acc, tvs)])\n",
        # The gradients of a loss fed through placeholders: plain training.
        "x = tf.placeholder(tf.float32, [None, 3])\n"
        "loss = tf.reduce_sum(tf.matmul(x, w))\n"
        "step = opt.apply_gradients(opt.compute_gradients(loss))\n"
        "grads = tf.gradients(loss, tvs)\n"
        "other = opt.apply_gradients(zip(grads, tvs))\n",
        # A learning-rate placeholder goes to the optimizer, not apply_gradients.
        "lr = tf.placeholder(tf.float32, [])\n"
        "step = tf.train.GradientDescentOptimizer(lr).apply_gradients(gvs)\n",
        # A tf.cond that applies or skips, accumulating in neither branch.
        "op = tf.cond(finite, lambda: opt.apply_gradients(gvs), lambda: tf.no_op())\n",
        # The global step in an update that is not an accumulator's.
        "lr = tf.Variable(0.1)\n"
        "decay = lr.assign(lr * tf.cast(tf.train.get_global_step(), tf.float32))\n",
        # Accumulators a cond applies after an unconditional add: nothing dropped.
        "acc = [tf.Variable(tf.zeros_like(v), trainable=False) for v in tvs]\n"
        "with tf.control_dependencies([a.assign_add(g) for a, g in zip(acc, grads)]):\n"
        "    op = tf.cond(due, lambda: opt.apply_gradients(zip([a / 4 for a in acc], tvs)),\n"
        "                 tf.no_op)\n",
    ],
)
def test_clean_variants_are_not_reported(source):
    assert _lint.check_source(source) == []


@pytest.mark.parametrize(
    "source, line, rule",
    [
        # (a) written with the function form of assign_add.
        (
            "acc = [tf.Variable(tf.zeros(v.shape), trainable=False) for v in tvs]\n"
            "ops = [tf.assign_add(a, g) for a, (g, _) in zip(acc, gvs)]\n"
            "train = opt.apply_gradients(list(zip(acc, tvs)))\n",
            3,
            "TFA001",
        ),
        # (c) the assign_add results applied as they are: a sum, and a rerun.
        (
            "acc = [tf.Variable(tf.zeros_like(v), trainable=False) for v in tvs]\n"
            "ops = [a.assign_add(g) for a, (g, _) in zip(acc, gvs)]\n"
            "train = opt.apply_gradients(zip(ops, tvs))\n",
            3,
            "TFA003",
        ),
        # (f) with the branches given as keywords and lambdas.
        (
            "op = tf.cond(due, true_fn=lambda: opt.apply_gradients(pairs),\n"
            "             false_fn=lambda: tf.group([a.assign_add(g) for a, g in pairs]))\n",
            1,
            "TFA006",
        ),
    ],
)
def test_variants_are_reported(source, line, rule):
    assert (line, rule) in {(f.line, f.rule) for f in _lint.check_source(source, "x.py")}


_TOKEN_MEAN = "loss = tf.reduce_sum(xent * mask) / tf.reduce_sum(mask)\n"


@pytest.mark.parametrize(
    "source, found",
    [
        # Divided by the mask's sum, given to build_accumulation without weight=.
        (_TOKEN_MEAN + "acc = tf1_accum.build_accumulation(loss, opt)\n", [(2, 7)]),
        # tf.math.divide by the lengths' sum, cast, through a function, at minimize.
        (
            "def token_mean(xent, lengths):\n"
            "    tokens = tf.cast(tf.reduce_sum(lengths), tf.float32)\n"
            "    return tf.math.divide(tf.reduce_sum(xent), tokens)\n"
            "opt = tf1_accum.AccumulationOptimizer(base, 4)\n"
            "step = opt.minimize(token_mean(xent, lengths) + 0.1 * l2)\n",
            [(5, 8)],
        ),
        # A mean over what boolean_mask keeps, the wrapper built in place.
        (
            "valid = tf.boolean_mask(xent, mask)\n"
            "loss = tf.reduce_mean(valid)\n"
            "step = AccumulationOptimizer(base, 4).minimize(loss=loss)\n",
            [(3, 8)],
        ),
        # A term added in a loop: each value of the name is followed once.
        (
            _TOKEN_MEAN + "for scale, term in zip(scales, terms):\n"
            "    loss += scale * term + loss * 0.0\n"
            "acc = tf1_accum.build_accumulation(loss, opt)\n",
            [(4, 7)],
        ),
        # Silent: the count given as weight= (a tensor, or a callable to the wrapper).
        (
            _TOKEN_MEAN
            + "acc = tf1_accum.build_accumulation(loss, opt, weight=tf.reduce_sum(mask))\n",
            [],
        ),
        (
            _TOKEN_MEAN + "opt = tf1_accum.AccumulationOptimizer(base, 4, weight=lambda: n)\n"
            "step = opt.minimize(loss)\n",
            [],
        ),
        # Silent: means over counts the data does not decide, or of a variable.
        (
            "loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(labels=y, logits=z))\n"
            "acc = tf1_accum.build_accumulation(loss, opt)\n",
            [],
        ),
        (
            "batch_size = 32\n"
            "loss = tf.reduce_sum(xent) / batch_size\n"
            "loss += tf.reduce_sum(xent) / tf.cast(tf.shape(xent)[0], tf.float32)\n"
            "w = tf.Variable(tf.ones([4]))\n"
            "acc = build_accumulation(loss + tf.reduce_sum(w * x) / tf.reduce_sum(w), opt)\n",
            [],
        ),
        # Silent: a plain optimizer's minimize, and a function of the module's own.
        (
            _TOKEN_MEAN + "step = tf.train.AdamOptimizer().minimize(loss)\n"
            "def build_accumulation(loss, opt):\n"
            "    return opt.minimize(loss)\n"
            "acc = build_accumulation(loss, opt)\n",
            [],
        ),
    ],
)
def test_a_mean_over_a_count_of_the_data_is_found_without_weight(source, found):
    findings = _lint.check_source(source, "x.py")
    assert [(f.line, f.col) for f in findings] == found
    assert {f.rule for f in findings} <= {"TFA014"}


_WINDOW = "opt = tf1_accum.AccumulationOptimizer(base, FLAGS.accum_steps)\n"


@pytest.mark.parametrize(
    "source, found",
    [
        # BERT's step count from the micro-batch size, to the schedule and max_steps.
        (
            _WINDOW + "num_train_steps = int(len(examples) / FLAGS.train_batch_size * 3)\n"
            "num_warmup_steps = int(num_train_steps * 0.1)\n"
            "lr = tf.train.polynomial_decay(0.1, step, num_train_steps)\n"
            "estimator.train(input_fn, max_steps=num_train_steps)\n",
            [(2, 23)],
        ),
        # decay_steps= worked out in place, the window a constant.
        (
            "opt = tf1_accum.AccumulationOptimizer(base, 4)\n"
            "lr = tf.train.exponential_decay(0.1, step, decay_steps=n // batch_size)\n",
            [(2, 56)],
        ),
        # Silent: the count divided by N, in the divisor or afterwards.
        (
            _WINDOW + "num_train_steps = int(n / (FLAGS.train_batch_size * FLAGS.accum_steps))\n"
            "estimator.train(input_fn, max_steps=num_train_steps)\n",
            [],
        ),
        (
            _WINDOW + "decay_steps = n // batch_size\n"
            "decay_steps //= FLAGS.accum_steps\n"
            "lr = tf.train.exponential_decay(0.1, step, decay_steps, 0.5)\n",
            [],
        ),
        # Silent: the batch size is the large batch's (split by N, or told as
        # micro_batch_size=), or nothing accumulates in the module.
        (
            _WINDOW + "micro = FLAGS.train_batch_size // FLAGS.accum_steps\n"
            "estimator.train(input_fn, max_steps=n // FLAGS.train_batch_size)\n",
            [],
        ),
        (
            "opt = tf1_accum.AccumulationOptimizer(base, 4, micro_batch_size=8)\n"
            "estimator.train(input_fn, max_steps=n // batch_size)\n",
            [],
        ),
        ("estimator.train(input_fn, max_steps=n // batch_size)\n", []),
    ],
)
def test_a_step_count_in_micro_batches_is_found_where_the_module_accumulates(source, found):
    findings = _lint.check_source(source, "x.py")
    assert [(f.line, f.col) for f in findings] == found
    assert {f.rule for f in findings} <= {"TFA013"}


@pytest.mark.parametrize(
    "source, expected",
    [
        # A placeholder named v in one function is not the v of a comprehension
        # in another: the counter mean is found, no placeholder.
        (
            "def placeholders():\n"
            "    v = tf.placeholder(tf.float32, [None])\n"
            "    return v\n"
            "def forum():\n"
            "    accums = [tf.Variable(tf.zeros(v.shape), trainable=False) for v in tvars]\n"
            "    count = tf.Variable(0.0, trainable=False)\n"
            "    ops = [a.assign_add(g) for a, (g, _) in zip(accums, grads)]\n"
            "    return opt.apply_gradients([(a / count, v) for a, v in zip(accums, tvars)])\n",
            {(8, "TFA002")},
        ),
        # Each comprehension's a is its own: the one applied holds means, not sums.
        (
            "sums = [tf.Variable(tf.zeros_like(v), trainable=False) for v in tvs]\n"
            "ops = [a.assign_add(g) for a, g in zip(sums, grads)]\n"
            "means = [tf.Variable(tf.zeros_like(v), trainable=False) for v in tvs]\n"
            "step = opt.apply_gradients([(a, v) for a, v in zip(means, tvs)])\n",
            set(),
        ),
        # A parameter is the function's own name, not another function's
        # accumulators of the same name: stored gradients are not sums.
        (
            "def adds_alone():\n"
            "    variables = [tf.Variable(tf.zeros(s), trainable=False) for s in shapes]\n"
            "    return [a.assign_add(g) for a, g in zip(variables, grads)]\n"
            "def stored(variables):\n"
            "    return [tf.Variable(tf.ones(v.shape), trainable=False) for v in variables]\n"
            "def limit():\n"
            "    store = stored([v for _, v in pairs])\n"
            "    return opt.apply_gradients(list(zip(store, [v for _, v in pairs])))\n",
            set(),
        ),
        # A nested function and a lambda see the names of the function around
        # them, and every function sees the module's.
        (
            "acc = [tf.Variable(tf.zeros_like(v), trainable=False) for v in tvs]\n"
            "def main():\n"
            "    ops = [a.assign_add(g) for a, g in zip(acc, grads)]\n"
            "    fed = [tf.placeholder(tf.float32) for _ in tf.gradients(loss, tvs)]\n"
            "    def apply():\n"
            "        return opt.apply_gradients(zip(acc, tvs))\n"
            "    late = lambda: opt.apply_gradients(zip(fed, tvs))\n"
            "    return apply, late\n",
            {(6, "TFA001"), (7, "TFA004")},
        ),
        # A name declared global is the module's; a class body's names are not
        # seen by the methods in it.
        (
            "acc = None\n"
            "def build():\n"
            "    global acc\n"
            "    acc = tf.Variable(tf.zeros([3]), trainable=False)\n"
            "    return acc.assign_add(g)\n"
            "step = opt.apply_gradients([(acc, w)])\n"
            "class Model:\n"
            "    fed = tf.placeholder(tf.float32)\n"
            "    def step(self):\n"
            "        return opt.apply_gradients([(fed, w)])\n",
            {(6, "TFA001")},
        ),
        # Each class's self.grads is its own.
        (
            "class Sums:\n"
            "    def __init__(self):\n"
            "        self.grads = [tf.Variable(tf.zeros_like(v), trainable=False) for v in tvs]\n"
            "        gs = tf.gradients(l, tvs)\n"
            "        self.add = [a.assign_add(g) for a, g in zip(self.grads, gs)]\n"
            "        self.op = opt.apply_gradients(zip(self.grads, tvs))\n"
            "class Means:\n"
            "    def __init__(self):\n"
            "        self.grads = [g / 2 for g in tf.gradients(l, tvs)]\n"
            "        self.op = opt.apply_gradients(zip(self.grads, tvs))\n",
            {(6, "TFA001")},
        ),
        # A comprehension in a class body reads its first iterable there, and
        # the module's names (not the class's) everywhere else, as Python 3 does.
        (
            "grads = tf.gradients(loss, tvs)\n"
            "class Trainer:\n"
            "    fed = tf.placeholder(tf.float32)\n"
            "    acc = [tf.Variable(tf.zeros_like(v), trainable=False) for v in tvs]\n"
            "    ops = [a.assign_add(g) for a, g in zip(acc, grads)]\n"
            "    step = opt.apply_gradients([(a, v) for a, v in zip(acc, tvs)])\n"
            "    late = opt.apply_gradients([(fed, v) for v in tvs])\n",
            {(6, "TFA001")},
        ),
    ],
    ids=[
        "counter-mean",
        "comprehensions",
        "parameter",
        "enclosing",
        "global-and-class",
        "classes",
        "class-comprehension",
    ],
)
def test_names_are_resolved_scope_by_scope(source, expected):
    assert {(f.line, f.rule) for f in _lint.check_source(source)} == expected


_WINDOW = (
    "total = tf.Variable(0.0, trainable=False)\n"
    "fed = tf.placeholder(tf.float32, shape=[])\n"
    "add = tf.assign_add(total, fed)\n"
    "half = add / 2.0\n"
    "reset = total.assign(0.0)\n"
    "with tf.control_dependencies([add]):\n"
    "    read = tf.identity(total)\n"
    "for value in values:\n"
)


@pytest.mark.parametrize(
    "clean, refetched",
    [
        # The accumulator itself, divided after the fetch or in the graph.
        (
            "    sess.run(add, {fed: value})\nprint(sess.run(total) / 2, sess.run(total / 2.0))\n",
            "    sess.run(add, {fed: value})\nprint(sess.run(half, {fed: value}))\n",
        ),
        # The zero op first: the fetch adds a new window's first micro-batch.
        (
            "    sess.run(add, {fed: value})\nsess.run(reset)\nsess.run(half, {fed: 1.0})\n",
            "    sess.run(add, {fed: value})\nsess.run(total)\nsess.run(half, {fed: 1.0})\n",
        ),
        # A read ordered after the add, fetched with each micro-batch.
        (
            "    now = sess.run(read, {fed: value})\nprint(now / 2)\n",
            "    now = sess.run(read, {fed: value})\nprint(sess.run(half, {fed: value}))\n",
        ),
        # Accumulate, or accumulate and divide: one add per run, in a tf.cond.
        (
            "    out = sess.run(tf.cond(last, lambda: tf.assign_add(total, fed) / 2.0,\n"
            "                           lambda: tf.assign_add(total, fed)), {fed: value})\n",
            "    out = sess.run(tf.cond(last, lambda: tf.assign_add(total, fed) / 2.0,\n"
            "                           lambda: tf.assign_add(total, fed)), {fed: value})\n"
            "out = sess.run(half, {fed: value})\n",
        ),
        # A loop of N - 1 adds, then the run that adds the last one and divides.
        (
            "    pass\nfor _ in range(n - 1):\n    sess.run(add, {fed: 1.0})\n"
            "sess.run(half, {fed: 1.0})\n",
            "    pass\nfor _ in range(n):\n    sess.run(add, {fed: 1.0})\n"
            "sess.run(half, {fed: 1.0})\n",
        ),
    ],
    ids=["accumulator", "after-zero-op", "identity-read", "cond", "short-loop"],
)
def test_a_fetch_that_adds_again_is_found_and_its_near_misses_are_not(clean, refetched):
    assert _lint.check_source(_WINDOW + clean) == []
    found = [(f.line, f.rule) for f in _lint.check_source(_WINDOW + refetched)]
    assert found == [(len((_WINDOW + refetched).splitlines()), "TFA009")]


_PARENT = """import tensorflow as tf


class PolicyBase(object):
    def __init__(self, objective, rate):
        self.optimizer = tf.train.AdamOptimizer(rate)
        self.weights = tf.trainable_variables()
        self.gradients = tf.gradients(objective, self.weights)
"""

_CHILD = """import numpy as np
import tensorflow as tf

from agents.policy_base import PolicyBase


class Learner(PolicyBase):
    def __init__(self, objective, rate):
        PolicyBase.__init__(self, objective, rate)
        self.fed = [tf.placeholder(tf.float32, w.shape) for w in self.weights]
        self.apply = self.optimizer.apply_gradients(zip(self.fed, self.weights))

    def update(self, sess, feeds):
        total = [np.zeros(w.shape) for w in self.weights]
        for feed in feeds:
            for i, g in enumerate(sess.run(self.gradients, feed_dict=feed)):
                total[i] += g
        sess.run(self.apply, feed_dict=dict(zip(self.fed, total)))
"""


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_parent_class_in_another_given_file_is_followed(tmp_path, jobs):
    # The parent computes the gradients; the child feeds them back: TFA004 is
    # in the child, and found only when the parent's file is checked with it.
    (tmp_path / "policy_base.py").write_text(_PARENT, encoding="utf-8")
    child = tmp_path / "learner.py"
    child.write_text(_CHILD, encoding="utf-8")
    for index in range(4):  # enough files for --jobs 2 to use its workers
        (tmp_path / f"layers_{index}.py").write_text("x = tf.cond(p, f, g)\n")
    assert _lint.check_paths([str(child)]) == []
    expected = [(str(child), 11, 53, "TFA004")]
    found = _run("--jobs", jobs, "--format", "json", tmp_path)
    assert found.returncode == 1, found.stderr
    assert [
        (r["path"], r["line"], r["col"], r["code"]) for r in json.loads(found.stdout)
    ] == expected
    both = _lint.check_paths([str(child), str(tmp_path / "policy_base.py")])
    assert [(f.path, f.line, f.col, f.rule) for f in both] == expected


def test_a_parent_class_elsewhere_is_found_by_its_module_and_name_only(tmp_path):
    # Another module's class of the same name, or the same module's other
    # class, is not the parent; a parent whose own parent is in a third file
    # brings that one too.
    base = tmp_path / "policy_base.py"
    base.write_text(_PARENT.replace("PolicyBase", "OtherBase"), encoding="utf-8")
    (tmp_path / "other_base.py").write_text(_PARENT, encoding="utf-8")
    child = tmp_path / "learner.py"
    child.write_text(_CHILD, encoding="utf-8")
    assert _lint.check_paths([str(tmp_path)]) == []
    base.write_text(
        "from root import Root\n\nclass PolicyBase(Root):\n    pass\n", encoding="utf-8"
    )
    (tmp_path / "root.py").write_text(_PARENT.replace("PolicyBase", "Root"), encoding="utf-8")
    found = [(f.path, f.line, f.rule) for f in _lint.check_paths([str(tmp_path)])]
    assert found == [(str(child), 11, "TFA004")]


def test_async_and_await_as_names_are_read_as_python_before_3_7():
    source = (
        "if FLAGS.async:\n"
        "    print 'replicas', FLAGS.async\n"
        "async = await = None\n"
        "def await(x, async=False): return x\n"
        "async def read(stream):\n"
        "    async for line in stream:\n"
        "        await line.flush()\n"
    )
    _, converted = _source.parse(source)
    assert converted.splitlines() == [
        "if FLAGS.ASYNC:",
        "    print( 'replicas', FLAGS.ASYNC)",
        "ASYNC = AWAIT = None",
        "def AWAIT(x, ASYNC=False): return x",
        "async def read(stream):",
        "    async for line in stream:",
        "        await line.flush()",
    ]


def test_a_python2_list_comprehension_over_a_tuple_gets_its_parentheses():
    source = (
        'print "building"\n'
        "xs = [v for v in a, b if v in c]\n"
        "ys = [v in a, b]\n"
        "pairs = [(x, y) for x in a, b for y in 0, 1]\n"
    )
    _, converted = _source.parse(source)
    assert converted.splitlines() == [
        'print( "building")',
        "xs = [v for v in (a, b) if v in c]",
        "ys = [v in a, b]",  # a list, not a comprehension
        "pairs = [(x, y) for x in (a, b) for y in (0, 1)]",
    ]


def test_an_ignore_comment_silences_the_rules_it_names_on_its_line():
    source = (
        "acc = [tf.Variable(tf.zeros_like(v), trainable=False) for v in tvs]\n"
        "ops = [a.assign_add(g) for a, (g, _) in zip(acc, gvs)]\n"
        "one = opt.apply_gradients(zip(ops, tvs))  # tf1_accum.check: ignore TFA003\n"
        "two = opt.apply_gradients(zip(ops, tvs))  # tf1_accum.check: ignore TFA001, TFA003\n"
        "three = opt.apply_gradients(zip(ops, tvs))  # tf1_accum.check: ignore TFA004\n"
    )
    found = {(f.line, f.rule) for f in _lint.check_source(source)}
    assert found == {(3, "TFA001"), (5, "TFA001"), (5, "TFA003")}
    bare = "w = tf.Variable(v.initialized_value())  # tf1_accum.check: ignore\n"
    assert _lint.check_source(bare) == []
    whole = "# tf1_accum.check: ignore-file\n" + source
    assert _lint.check_source(whole) == []


def test_unparsable_file_is_a_finding_and_unreadable_file_exit_status_2(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import tensorflow as tf\n\ndef broken(:\n    pass\n", encoding="utf-8")
    result = _run(bad)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stdout.startswith(f"{bad}:3:12: TFA000 cannot parse this file (")
    binary = tmp_path / "binary.py"
    binary.write_bytes(b"\xff\xfe\x00")
    assert [(f.line, f.rule) for f in _lint.check_paths([str(binary)])] == [(1, "TFA000")]
    assert not _lint.check_file(str(binary)).readable
    unreadable = _run(bad, binary)
    assert unreadable.returncode == 2
    assert f"{binary}:1:1: TFA000 cannot read this file (it holds null bytes" in unreadable.stdout
    assert [(f.line, f.rule) for f in _lint.check_source("x = 1\0\n")] == [(1, "TFA000")]


@pytest.mark.parametrize(
    "source, reason",
    [
        ("x = " + "not " * 100_000 + "1\n", "too deeply for Python's parser: MemoryError"),
        ("x = " + "lambda: " * 10_000 + "1\n", "too deeply for Python's parser: MemoryError"),
        ("x = 1" + " + 1" * 200_000 + "\n", "too deeply for Python's parser: RecursionError"),
        # The reason is the parser's: Python 3.9's new parser counts parentheses.
        (
            "x = " + "(" * 300 + "1" + ")" * 300 + "\n",
            "too many nested parentheses"
            if sys.version_info >= (3, 9)
            else "too deeply for Python's parser: MemoryError",
        ),
        ("def f(:\n    pass\n", "invalid syntax"),
    ],
    ids=["not-chain", "lambda-chain", "sum-chain", "parentheses", "syntax"],
)
def test_a_file_that_does_not_parse_is_reported_with_its_reason(source, reason):
    [finding] = _lint.check_source(source, "deep.py")
    assert finding.rule == "TFA000"
    stated = re.fullmatch(r"cannot parse this file \((.+)\); .+", finding.message).group(1)
    assert stated.endswith(reason), finding.message


def test_a_parse_error_is_kept_whatever_select_names(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("acc = tf.Variable(v.initialized_value())\ndef broken(:\n", encoding="utf-8")
    selected = _run("--select", "TFA001", bad)
    assert selected.returncode == 1
    assert re.findall(r": (TFA\d{3}) ", selected.stdout) == ["TFA000"]
    ignored = _run("--select", "TFA001", "--ignore", "TFA000", bad)
    assert (ignored.returncode, ignored.stdout) == (0, "")
    # A bare ignore comment on the line of the error silences it too (every
    # rule, TFA000 included); one that names other rules does not.
    named = tmp_path / "named.py"
    named.write_text("def broken(:  # tf1_accum.check: ignore TFA001\n", encoding="utf-8")
    bare = tmp_path / "bare.py"
    bare.write_text("def broken(:  # tf1_accum.check: ignore\n", encoding="utf-8")
    commented = _run("--select", "TFA001", named, bare)
    assert commented.returncode == 1
    assert commented.stdout.splitlines() == [
        f"{named}:1:12: TFA000 cannot parse this file (invalid syntax); fix the syntax, "
        "then check it again"
    ]


def test_an_unreadable_file_is_reported_whatever_select_names_and_fails_even_ignored(tmp_path):
    binary = tmp_path / "binary.py"
    binary.write_bytes(b"x = 1\0\n")
    selected = _run("--select", "TFA001", binary)
    assert selected.returncode == 2
    assert selected.stdout.startswith(f"{binary}:1:1: TFA000 cannot read this file (")
    ignored = _run("--select", "TFA001", "--ignore", "TFA000", binary)
    assert (ignored.returncode, ignored.stdout) == (2, "")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this system")
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_fifo_is_reported_unread_never_waited_on(tmp_path, jobs):
    # Named *.py, given directly and met in the walk (with enough files for
    # --jobs 2 to use its worker processes): nothing opens it for writing.
    for index in range(4):
        (tmp_path / f"model_{index}.py").write_text("w = v.initialized_value()\n")
    fifo = tmp_path / "pipe.py"
    os.mkfifo(fifo)
    for paths in ([fifo], [tmp_path]):
        result = _run("--jobs", jobs, *paths)
        assert result.returncode == 2, result.stderr
        assert (
            f"{fifo}:1:1: TFA000 cannot read this file (it is a named pipe (FIFO), not a "
            "regular file: skipped unread); check it by hand"
        ) in result.stdout.splitlines()
    assert result.stdout.count(": TFA007 ") == 4  # the regular files around it were checked


def test_a_directory_the_walk_cannot_list_is_reported_with_exit_status_2(
    tmp_path, monkeypatch, capsys
):
    from tf1_accum import check

    (tmp_path / "train.py").write_text("w = v.initialized_value()\n")
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "hidden.py").write_text("w = v.initialized_value()\n")
    locked.chmod(0)
    if os.geteuid() == 0:  # root lists anything: refuse the listing as the system would
        scandir = os.scandir

        def refusing(path="."):
            if os.fspath(path) == str(locked):
                raise PermissionError(13, "Permission denied", str(locked))
            return scandir(path)

        monkeypatch.setattr(os, "scandir", refusing)
    try:
        status = check.main(["--jobs", "1", "--format", "json", str(tmp_path)])
    finally:
        locked.chmod(0o755)
    assert status == 2
    records = json.loads(capsys.readouterr().out)
    assert [(r["path"], r["code"]) for r in records] == [
        (str(tmp_path / "train.py"), "TFA007"),
        (str(locked), "TFA000"),
    ]
    assert records[1]["message"] == (
        f"cannot read this directory ([Errno 13] Permission denied: '{locked}'); check it by hand"
    )


def test_code_the_compiler_rejects_after_parsing_is_still_checked():
    # symtable refuses a name used before its global declaration; ast does not.
    source = "def f():\n    acc = 1\n    global acc\nw = tf.Variable(v.initialized_value())\n"
    assert [(f.line, f.rule) for f in _lint.check_source(source)] == [(4, "TFA007")]


def test_a_chain_too_deep_to_follow_is_reported_not_raised():
    depth = 3 * sys.getrecursionlimit()
    chain = "".join(f"a{i + 1} = a{i} + 1\n" for i in range(depth))
    source = "a0 = tf.placeholder(tf.float32)\n" + chain + f"opt.apply_gradients(a{depth})\n"
    findings = _lint.check_source(source, "deep.py")
    assert [(f.line, f.rule) for f in findings] == [(1, "TFA000")]
    assert "chained too deeply" in findings[0].message


def test_exit_status_and_output_format(tmp_path):
    found = _run(MIGRATION)
    assert found.returncode == 1, found.stderr
    lines = found.stdout.splitlines()
    assert len(lines) == sum(len(_marked(before)) for before in BEFORES)
    for line in lines:
        assert re.fullmatch(r"\S+\.py:\d+:\d+: TFA00[1-8] [^;]+; .*tf1_accum\..+", line), line
    selected = _run("--select", "TFA001,TFA007", MIGRATION)
    assert selected.returncode == 1
    assert sorted(re.findall(r": (TFA\d{3}) ", selected.stdout)) == ["TFA001", "TFA007"]
    ignored = _run("--ignore=TFA001, TFA002,TFA003,TFA004,TFA005,TFA006,TFA007", MIGRATION)
    assert (ignored.returncode, ignored.stdout) == (0, "")
    as_json = _run("--format", "json", MIGRATION / "a_sum_not_mean_before.py")
    assert as_json.returncode == 1
    records = json.loads(as_json.stdout)
    assert [(r["line"], r["col"], r["code"]) for r in records] == [
        (27, 39, "TFA007"),
        (34, 13, "TFA001"),
    ]
    assert records[0]["path"].endswith("a_sum_not_mean_before.py")
    assert records[1]["message"] == _catalogue.message("TFA001")
    unknown = _run("--select", "TFA011,TFA099", MIGRATION)
    assert unknown.returncode == 2
    assert (
        "unknown rule code(s) TFA011, TFA099: expected some of TFA000, TFA001, TFA002, TFA003, "
        "TFA004, TFA005, TFA006, TFA007, TFA008, TFA009, TFA010, TFA013, TFA014 "
        "(TFA011: found by tf1_accum.check_graph only)"
    ) in unknown.stderr
    clean = _run(MIGRATION / "a_sum_not_mean_after.py", ROOT / "tf1_accum")
    assert (clean.returncode, clean.stdout) == (0, "")
    no_path = _run()
    assert no_path.returncode == 2 and "PATH" in no_path.stderr
    missing = _run(tmp_path / "nowhere.py")
    assert missing.returncode == 2
    assert f"no such file or directory: {tmp_path / 'nowhere.py'}" in missing.stderr
    assert _run("--help").returncode == 0


@pytest.mark.parametrize("output", ["text", "json"])
def test_a_reader_that_stops_early_gets_no_traceback(output):
    # `tf1-accum-check ... | head`: the pipe is closed before the checker writes.
    read, write = os.pipe()
    with subprocess.Popen(
        [sys.executable, "-m", "tf1_accum.check", "--format", output, str(MIGRATION)],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=write,
        stderr=subprocess.PIPE,
        text=True,
    ) as checker:
        os.close(write)
        os.close(read)
        _, stderr = checker.communicate(timeout=120)
    assert (checker.returncode, stderr) == (1, "")


@pytest.mark.parametrize("option", ["--version", "-V"])
def test_version_is_the_package_version(option):
    found = _run(option)
    assert (found.returncode, found.stderr) == (0, "")
    assert found.stdout == f"tf1-accum-check {tf1_accum.__version__}\n"


def test_a_directory_with_no_python_file_is_a_usage_error_saying_so(tmp_path):
    """A mistyped or empty directory would otherwise pass, checked and silent."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes" / "deeper").mkdir(parents=True)
    (tmp_path / "notes" / "deeper" / "readme.txt").write_text("tf.Variable\n")
    for folder in ("empty", "notes"):
        found = _run(tmp_path / folder)
        assert (found.returncode, found.stdout) == (2, "")
        assert (
            found.stderr == f"tf1-accum-check: error: no Python files under {tmp_path / folder}\n"
        )
    both = _run(MIGRATION / "a_sum_not_mean_after.py", tmp_path / "empty")
    assert both.returncode == 2 and "no Python files under" in both.stderr


def test_the_checker_does_not_import_tensorflow():
    # Runs the command as python -m does, then lists what got imported; a
    # second run makes TensorFlow unimportable, as if it were not installed.
    script = (
        "import json, runpy, sys\n"
        "if sys.argv[1] == 'blocked':\n"
        "    sys.modules['tensorflow'] = None\n"
        "sys.argv = ['tf1_accum.check', sys.argv[2]]\n"
        "try:\n"
        "    runpy.run_module('tf1_accum.check', run_name='__main__', alter_sys=True)\n"
        "except SystemExit as exit:\n"
        "    status = exit.code\n"
        "loaded = [m for m, v in sys.modules.items() if m.split('.')[0] == 'tensorflow' and v]\n"
        "print(json.dumps({'status': status, 'tensorflow': loaded}))\n"
    )
    for mode in ("installed", "blocked"):
        result = subprocess.run(
            [sys.executable, "-c", script, mode, str(MIGRATION / "c_last_batch_twice_before.py")],
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        *findings, summary = result.stdout.splitlines()
        assert json.loads(summary) == {"status": 1, "tensorflow": []}, mode
        assert len(findings) == 1 and ": TFA003 " in findings[0]


def test_the_checker_and_the_library_do_not_import_each_other():
    graph = package_imports()
    checker = {name for name in graph if name.startswith("tf1_accum.check")}
    assert {"tf1_accum.check._lint", "tf1_accum.check._flow", "tf1_accum.check._tags"} <= checker
    assert "tf1_accum.check" in checker
    for name in checker:
        assert graph[name] <= checker, name
    for name in set(graph) - checker:  # the library reads the checker's catalogue only
        assert graph[name] & checker <= {"tf1_accum.check", "tf1_accum.check._catalogue"}, name
    assert tf1_accum.check.__all__ == ("main",)
    assert tf1_accum.check.main is _cli.main


def test_console_script_and_pre_commit_hook_run_the_checker():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^tf1-accum-check = "tf1_accum.check:main"$', pyproject, re.M)
    hooks = (ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8")
    assert re.search(r"^- id: tf1-accum-check$", hooks, re.M)
    assert re.search(r"^  entry: tf1-accum-check$", hooks, re.M)
    assert re.search(r"^  language: python$", hooks, re.M)
    assert re.search(r"^  types: \[python\]$", hooks, re.M)


def test_the_migration_guide_quotes_the_checker_as_it_is():
    guide = (ROOT / "docs" / "migration.rst").read_text(encoding="utf-8")
    quoted = re.findall(
        r"^   (examples/migration/\S+_before\.py:\d+:\d+: TFA\d{3} .*)$", guide, re.M
    )
    actual = [
        str(finding._replace(path=str(pathlib.Path(finding.path).relative_to(ROOT))))
        for finding in _lint.check_paths([str(path) for path in BEFORES])
    ]
    assert quoted == actual


def test_the_speed_benchmark_runs_and_prints_its_table():
    # Timings come from the script alone, run on a quiet machine; this only
    # keeps it from rotting.
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "check_speed.py"),
            "--files",
            "20",
            "--repetitions",
            "1",
            "--jobs",
            "1",
        ],  # fmt: skip
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    rows = result.stdout.splitlines()[3:]
    assert [row.split("  ")[0] for row in rows] == [
        "one training module",
        "repository, mixed, 20 files",
        "repository, mixed, 20 files",
        "repository, worst case, 20 files",
        "repository, worst case, 20 files",
    ]
    for row in rows:
        assert re.search(r"  \d[\d,]*  +\d+\.\d+  +[\d,]+  +< [\d.]+ s  +(yes|no)$", row), row
