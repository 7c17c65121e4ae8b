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
        "the optimizer gets the sum of the micro-batch gradients where it expects their "
        "mean: with SGD or momentum the update is N times the large-batch update",
        f"{_BUILD}(loss, optimizer), whose apply_op applies the mean",
        "migration.html#a-sums-applied-instead-of-means", True, "sum_not_mean"),
    Mistake("TFA002", "divided by a counter variable",
        "accumulators divided by a counter variable: every micro-batch weighs the same "
        "whatever its size, and an apply with the counter at 0 turns every weight into NaN",
        f"{_BUILD}(loss, optimizer, weight=<examples in the micro-batch>), whose apply_op "
        "refuses an empty window",
        "migration.html#b-dividing-by-a-counter-variable", True),
    Mistake("TFA003", "the apply runs the accumulation again",
        "the apply runs the accumulate ops again with its feed: fed the last micro-batch, "
        "it adds it again, so it counts twice",
        f"{_BUILD}: its apply_op reads the accumulators and needs no feed (fused=True adds "
        "the last micro-batch and applies in one run)",
        "migration.html#c-the-apply-fed-the-last-micro-batch", True, "apply_accumulates"),
    Mistake("TFA004", "gradients through placeholders",
        "the applied gradients come through placeholders, so every micro-batch copies "
        "them to Python and back, or every apply runs the forward and backward pass again on "
        "what is fed, instead of applying what was accumulated",
        f"{_BUILD} with tf1_accum.run_accumulation, which keep the gradients in the graph "
        "(apply_op runs with no feed_dict)",
        "migration.html#d-gradients-through-numpy-and-placeholders", True, "apply_needs_feed"),
    Mistake("TFA005", "running average keyed on the global step",
        "running average of gradients divided by the global step, which never resets: each "
        "update applies the mean of every gradient since training began",
        f"{_BUILD}(loss, optimizer, global_step=global_step), which averages each window "
        "alone and counts updates",
        "migration.html#e-a-running-average-keyed-on-the-global-step", True),
    Mistake("TFA006", "tf.cond that accumulates or applies",
        "tf.cond that accumulates or applies: the run that applies does not accumulate its "
        "micro-batch, and the optimizer's slots are built inside the conditional",
        "use tf1_accum.AccumulationOptimizer(optimizer, steps=N), whose train op "
        "accumulates every micro-batch and applies every N-th",
        "migration.html#f-a-tf-cond-that-accumulates-or-applies", True),
    Mistake("TFA007", "initialized_value()",
        "Variable.initialized_value() raises NotImplementedError on resource variables "
        "(TensorFlow 2 graph mode without disable_v2_behavior())",
        f"{_BUILD}, which creates its accumulators for both kinds of variable",
        "migration.html#a-sums-applied-instead-of-means", True),
    Mistake("TFA008", "N - 1 micro-batches accumulated, then applied",
        "the loop accumulates N - 1 micro-batches and this run applies without accumulating "
        "the last one: its gradient is lost, and the update is the sum of N - 1",
        "use tf1_accum.run_accumulation(session, accumulation, feed_dicts), which "
        "accumulates every micro-batch before it applies",
        "migration.html#g-n-1-micro-batches-accumulated-then-applied", True),
    Mistake("TFA009", "a fetch after the loop runs the accumulation again",
        "this run fetches a value computed from the assign_add ops after the loop that ran "
        "them, so it runs the adds again with its feed: the last micro-batch is added twice",
        f"fetch the accumulator variables themselves, or {_BUILD}, whose apply_op reads "
        "the accumulators and needs no feed",
        "migration.html#c-the-apply-fed-the-last-micro-batch", True),
    Mistake("TFA010", "two ops of one window fetched in one run",
        "ops that change one window, fetched in one session.run, run in no fixed order: "
        "the update then silently depends on which one runs first",
        "run each in a session.run of its own, the apply with no feed, or build with "
        "tf1_accum.build_accumulation(..., fused=True) and run accum_apply_op with the last "
        "micro-batch's feed; tf1_accum.run_accumulation runs a window either way",
        "migration.html#which-tool-finds-which-bug", True, "ops_in_one_run"),
    Mistake("TFA011", "accumulator or counter never reset",
        "nothing in the graph assigns it anything but its initializer, so after the first "
        "update it sums (or counts) over all of training, not over one window",
        "tf1_accum.build_accumulation's apply_op resets its accumulators and counter after "
        "each update (zero_op discards a partial window)",
        "migration.html#which-tool-finds-which-bug", False, "never_reset"),
    Mistake("TFA012", "global step incremented per micro-batch",
        "the global step then counts micro-batches, or each update more than once, so "
        "learning-rate schedules, StopAtStepHook and checkpoints keyed on it run ahead",
        "increment it once per update: pass global_step to the accumulation "
        "(build_accumulation, AccumulationOptimizer) and delete the hand-written increment, "
        "or run it only when an update is applied (tf.cond(opt.window.applied, ...)) as "
        "global_step.assign_add(1): assign(global_step + 1) loses counts between "
        "asynchronous workers",
        "migration.html#after-migrating-schedules-and-checkpoints", False, "step_not_per_update"),
    Mistake("TFA013", "schedule step counts in micro-batches",
        "a schedule's step count worked out from the micro-batch size comes N times later "
        "than in the original program (a decay N times too slow, a warm-up N times too long)",
        "divide every step count by N: decay_steps, num_train_steps and num_warmup_steps, "
        "boundaries, and Estimator.train's max_steps "
        "(num_train_steps = int(examples / (batch_size * N) * epochs))",
        "real_programs.html#real-programs-schedules", True, "schedule_in_micro_batches"),
    Mistake("TFA014", "mean over a data-dependent count",
        "the loss is a mean over a count the fed data decides (tokens, valid positions), so "
        "each micro-batch's mean is over another count, and their plain mean weighs a "
        "micro-batch of few tokens as much as one of many: the update is not the large batch's",
        "pass that count as weight=, a scalar tensor computed from each micro-batch "
        "(tf1_accum.build_accumulation(loss, optimizer, weight=tf.reduce_sum(mask)); "
        "AccumulationOptimizer and KerasAccumulationOptimizer also take a callable returning "
        "it, build_dataset_accumulation a callable of the element)",
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
