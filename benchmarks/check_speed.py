"""Speed of the migration checker (``tf1-accum-check``) on generated training code.

Writes, into a temporary directory, a 1,000-line training module and two
repositories of 3,000 modules (100 to 300 lines each, one in ten in Python 2).
The training code is made of the shapes the checker follows: classes that keep
accumulators on ``self``, helpers that apply them, session loops, ``tf.cond``
branches. In the "mixed" repository one module in ten is such training code
and the others are model and input code (layers, datasets), as in a project;
in the "worst case" one every module is training code. Times ``check_file``
on the big module (median of the repetitions) and one walk of each repository
(reading, parsing and checking every file), in one process and with
``--jobs`` processes, and prints a table with the targets: the module well
under a second, a repository under a minute.

Run:  python benchmarks/check_speed.py [--files 3000] [--repetitions 7] [--jobs 2]
"""

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from tf1_accum.check import _lint

_HEADER = '''"""Generated training code."""
import numpy as np
import tensorflow as tf
'''

_BLOCK = """

class Trainer{i}(object):
    def __init__(self, loss, opt, steps):
        self.opt = opt
        self.steps = steps
        self.tvars = tf.trainable_variables()
        self.sums = [tf.Variable(tf.zeros_like(v), trainable=False) for v in self.tvars]
        self.count = tf.Variable(0.0, trainable=False)
        self.grads = tf.gradients(loss / steps, self.tvars)

    def accumulate(self):
        ops = [s.assign_add(g) for s, g in zip(self.sums, self.grads)]
        ops.append(self.count.assign_add(1.0))
        with tf.control_dependencies(ops):
            return tf.no_op()

    def apply(self):
        pairs = [(s / self.steps, v) for s, v in zip(self.sums, self.tvars)]
        update = self.opt.apply_gradients(pairs)
        with tf.control_dependencies([update]):
            return tf.group([s.assign(tf.zeros_like(s)) for s in self.sums])


def helper_{i}(opt, buffers, variables, scale=2.0):
    scaled = [b / scale for b in buffers]
    return opt.apply_gradients(list(zip(scaled, variables)))


def loop_{i}(sess, trainer, batches):
    add, step = trainer.accumulate(), trainer.apply()
    for window in batches:
        for feed in window:
            sess.run(add, feed_dict=feed)
        sess.run(step)
    return tf.cond(tf.equal(trainer.count, 0.0), lambda: step, lambda: tf.no_op())
"""

_MODEL_BLOCK = """

def layer_{i}(inputs, units, training):
    with tf.variable_scope("layer_{i}"):
        hidden = tf.layers.dense(inputs, units, activation=tf.nn.relu)
        hidden = tf.layers.dropout(hidden, rate=0.1, training=training)
        norm = tf.layers.batch_normalization(hidden, training=training)
        return tf.concat([norm, inputs], axis=-1)


def dataset_{i}(files, batch_size):
    data = tf.data.TFRecordDataset(files)
    data = data.map(lambda record: tf.parse_single_example(record, FEATURES))
    data = data.shuffle(1000).batch(batch_size).prefetch(2)
    return data.make_one_shot_iterator().get_next()


class Encoder{i}(object):
    def __init__(self, units):
        self.units = units
        self.kernels = [tf.get_variable("k%d" % n, [units, units]) for n in range(4)]

    def __call__(self, inputs):
        outputs = inputs
        for kernel in self.kernels:
            outputs = tf.nn.tanh(tf.matmul(outputs, kernel))
        return outputs
"""

_PYTHON2_BLOCK = """

def report_{i}(values):
    for name, value in values:
        print "%s: %s" % (name, `value`)
    try:
        return 0777
    except ValueError, error:
        print >>sys.stderr, error
"""


def module(lines, python2=False, training=True):
    """A module of about ``lines`` lines built from the blocks above."""
    parts, count, i = [_HEADER], _HEADER.count("\n"), 0
    code = _BLOCK if training else _MODEL_BLOCK
    while count < lines:
        block = (_PYTHON2_BLOCK if python2 and i % 3 == 2 else code).format(i=i)
        parts.append(block)
        count += block.count("\n")
        i += 1
    return "".join(parts)


def _repository(root, files, training_every):
    lines = 0
    for index in range(files):
        package = root / f"package_{index // 100}"
        package.mkdir(parents=True, exist_ok=True)
        text = module(
            100 + (index * 37) % 201, python2=index % 10 == 0, training=index % training_every == 0
        )
        lines += text.count("\n")
        (package / f"module_{index}.py").write_text(text, encoding="utf-8")
    return lines


def _walk(root, jobs):
    start = time.perf_counter()
    findings = _lint.check_paths([str(root)], jobs=jobs)
    seconds = time.perf_counter() - start
    assert findings == [], findings[:3]
    return seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=3000, help="modules in each repository")
    parser.add_argument("--repetitions", type=int, default=7, help="runs on the big module")
    parser.add_argument("--jobs", type=int, default=2, help="processes for the parallel walks")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        root = pathlib.Path(folder)
        big = root / "big_train.py"
        big.write_text(module(1000), encoding="utf-8")
        big_lines = big.read_text(encoding="utf-8").count("\n")
        times = []
        for _ in range(args.repetitions + 1):
            start = time.perf_counter()
            result = _lint.check_file(str(big))
            times.append(time.perf_counter() - start)
        assert result.readable and result.findings == [], result.findings
        seconds = statistics.median(times[1:])  # the first run warms the caches
        rows.append(("one training module", 1, big_lines, seconds, 1.0))
        for name, every in (("mixed", 10), ("worst case", 1)):
            lines = _repository(root / name, args.files, every)
            for jobs in (1, args.jobs):
                seconds = _walk(root / name, jobs)
                label = f"repository, {name}, {args.files:,} files"
                rows.append((label, jobs, lines, seconds, 60.0 * args.files / 3000))

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = ", load average %.1f" % os.getloadavg()[0] if hasattr(os, "getloadavg") else ""
    print(
        f"# tf1_accum.check on generated code, {cpus} CPU(s) visible{load}, "
        f"Python {sys.version.split()[0]}; one module: median of {args.repetitions} runs"
    )
    table = [("input", "jobs", "lines", "seconds", "lines/s", "target", "met")]
    for label, jobs, lines, seconds, target in rows:
        table.append(
            (
                label,
                str(jobs),
                f"{lines:,}",
                f"{seconds:.3f}" if seconds < 10 else f"{seconds:.1f}",
                f"{lines / seconds:,.0f}",
                f"< {target:g} s",
                "yes" if seconds < target else "no",
            )
        )
    widths = [max(len(row[c]) for row in table) for c in range(len(table[0]))]
    for number, row in enumerate(table):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
        if number == 0:
            print("  ".join("-" * width for width in widths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
