"""The mistakes of hand-written accumulation, one entry each, for both detectors
(plain Python: the source checker imports no TensorFlow).
"""

from __future__ import annotations

import typing


class Mistake(typing.NamedTuple):
    """One mistake: ``why`` says what goes wrong, ``fix`` the tf1_accum replacement."""

    code: str
    title: str
    why: str
    fix: str
    doc: str  # the page and section that explain it
    source: bool  # the source checker finds it
    kind: str = ""  # check_graph's name for it ("": check_graph does not find it)


_BUILD = "use tf1_accum.build_accumulation"
CATALOGUE = {m.code: m for m in (
    Mistake("TFA001", "sums applied, not means",
        "the optimizer gets the sum of the micro-batch gradients, not their mean: N times too big",
        f"{_BUILD}(loss, optimizer), whose apply_op applies the mean",
        "migration.html#a-sums-applied-instead-of-means", True, "sum_not_mean"),
    Mistake("TFA002", "divided by a counter variable",
        "a counter variable as divisor weighs every micro-batch alike whatever its size (NaN at 0)",
        f"{_BUILD}(loss, optimizer, weight=<examples in the micro-batch>)",
        "migration.html#b-dividing-by-a-counter-variable", True),
    Mistake("TFA003", "the apply runs the accumulation again",
        "the apply runs the accumulate ops again with its feed: the last micro-batch counts twice",
        f"{_BUILD}, whose apply_op needs no feed",
        "migration.html#c-the-apply-fed-the-last-micro-batch", True, "apply_accumulates"),
    Mistake("TFA004", "gradients through placeholders",
        "the applied gradients come through placeholders: a round trip to Python per micro-batch",
        f"{_BUILD} and tf1_accum.run_accumulation, which keep the gradients in the graph",
        "migration.html#d-gradients-through-numpy-and-placeholders", True, "apply_needs_feed"),
    Mistake("TFA005", "running average keyed on the global step",
        "a running average over the global step, which never resets, averages all of training",
        f"{_BUILD}(loss, optimizer, global_step=global_step), which averages each window alone",
        "migration.html#e-a-running-average-keyed-on-the-global-step", True),
    Mistake("TFA006", "tf.cond that accumulates or applies",
        "the applying run skips its micro-batch, and optimizer slots are built inside the tf.cond",
        "use tf1_accum.AccumulationOptimizer(optimizer, steps=N), which applies every N-th run",
        "migration.html#f-a-tf-cond-that-accumulates-or-applies", True),
    Mistake("TFA007", "initialized_value()",
        "Variable.initialized_value() raises NotImplementedError on TF 2's resource variables",
        f"{_BUILD}, which creates its accumulators for both kinds of variable",
        "migration.html#a-sums-applied-instead-of-means", True),
    Mistake("TFA008", "N - 1 micro-batches accumulated, then applied",
        "this run applies after N - 1 adds, without the last micro-batch: its gradient is lost",
        "use tf1_accum.run_accumulation(session, accumulation, feed_dicts), which adds all N first",
        "migration.html#g-n-1-micro-batches-accumulated-then-applied", True),
    Mistake("TFA009", "a fetch after the loop runs the accumulation again",
        "this fetch reruns the loop's adds with its feed: the last micro-batch counts twice",
        f"fetch the accumulator variables themselves, or {_BUILD}, whose apply_op needs no feed",
        "migration.html#c-the-apply-fed-the-last-micro-batch", True),
    Mistake("TFA010", "two ops of one window fetched in one run",
        "ops that change one window, fetched in one session.run, run in no fixed order",
        "run each in a session.run of its own, or build with fused=True and run accum_apply_op "
        "with the last micro-batch's feed (as tf1_accum.run_accumulation does)",
        "migration.html#which-tool-finds-which-bug", True, "ops_in_one_run"),
    Mistake("TFA011", "accumulator or counter never reset",
        "only its initializer assigns it: it sums (or counts) over all of training, not a window",
        f"{_BUILD}, whose apply_op resets its accumulators and counter after each update",
        "migration.html#which-tool-finds-which-bug", False, "never_reset"),
    Mistake("TFA012", "global step incremented per micro-batch",
        "it then counts micro-batches (or updates twice): schedules, hooks, checkpoints run ahead",
        "pass global_step to the accumulation and delete the hand-written increment, or run it "
        "only in tf.cond(opt.window.applied, ...)",
        "migration.html#after-migrating-schedules-and-checkpoints", False, "step_not_per_update"),
    Mistake("TFA013", "schedule step counts in micro-batches",
        "a schedule's step count worked out from the micro-batch size is N times too large",
        "divide every step count by N: num_train_steps = int(examples / (batch_size * N) * epochs)",
        "real_programs.html#real-programs-schedules", True, "schedule_in_micro_batches"),
    Mistake("TFA014", "mean over a data-dependent count",
        "a mean over a count the data decides weighs a micro-batch of few tokens like one of many",
        "pass that count of each micro-batch as weight=, e.g. weight=tf.reduce_sum(mask)",
        "real_programs.html#real-programs-token-mean", True, "mean_over_data_count"),
)}  # fmt: skip

#: check_graph's kinds to their entries.
KINDS = {m.kind: m for m in CATALOGUE.values() if m.kind}
#: The source checker's rule codes.
RULES = tuple(code for code, m in CATALOGUE.items() if m.source)


def message(code: str, where: str = "") -> str:
    """The text a finding of ``code`` reports (``where``: what the graph shows, first)."""
    mistake = CATALOGUE[code]
    return f"{where + ': ' if where else ''}{mistake.why}; {mistake.fix}"


def refusal(code: str, what: str, fix: str | None = None) -> str:
    """The text of the error that refuses to run ``code``'s mistake (``what``: this case).

    ``fix``: what to do in this case, if not the mistake's usual fix.
    """
    mistake = CATALOGUE[code]
    return (
        f"tf1_accum: {what} ({code}, {mistake.title}): {mistake.why}. Nothing was run. "
        f"Instead, {fix or mistake.fix} (see {mistake.doc})."
    )
