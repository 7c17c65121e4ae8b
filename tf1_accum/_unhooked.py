"""A warning for sessions a framework saves that end mid-window without the accumulation hook.

``CheckpointSaverHook.end()`` saves only if ``global_step`` moved since its
last save, and ``global_step`` counts updates: a session that ends in the
middle of a window keeps the window in its final checkpoint only by luck.
`watch_checkpoint_saver_hook` wraps ``CheckpointSaverHook.end`` (once per
process) to warn then; see the concepts page, "Design notes".
"""

from __future__ import annotations

import functools
import typing
import warnings
import weakref

import tensorflow as tf

#: Graph collection of the counter of each `AccumulationOptimizer` train op:
#: the windows that `make_session_run_hook`'s hook keeps at the end of a session.
TRAIN_OP_COUNTERS = "tf1_accum_train_op_counters"

# session -> names of the counters that an accumulation hook of the session keeps.
_kept: weakref.WeakKeyDictionary[tf.compat.v1.Session, set[str]] = weakref.WeakKeyDictionary()

_FIX = (
    "Add opt.make_session_run_hook() to the session's hooks (in an Estimator, to the "
    "EstimatorSpec's training_hooks): at the end it saves the partial window, or "
    "applies it with flush_at_end=True."
)


def keep_windows(session: tf.compat.v1.Session, counters: typing.Iterable[tf.Variable]) -> None:
    """Records that an accumulation hook of ``session`` keeps the windows of ``counters``."""
    _kept.setdefault(session, set()).update(c.name for c in counters)


def watch_checkpoint_saver_hook() -> None:
    """Makes ``CheckpointSaverHook.end`` warn of a partial window it would leave out (once)."""
    hook_class = tf.compat.v1.train.CheckpointSaverHook
    if getattr(hook_class.end, "_tf1_accum_watched", False):
        return
    original = hook_class.end

    @functools.wraps(original)
    def end(self: tf.compat.v1.train.CheckpointSaverHook, session: tf.compat.v1.Session) -> None:
        _warn_if_left_out(self, session)
        return original(self, session)

    end.__dict__["_tf1_accum_watched"] = True
    hook_class.end = end


def _warn_if_left_out(
    saver_hook: tf.compat.v1.train.CheckpointSaverHook, session: tf.compat.v1.Session
) -> None:
    """Warns when ``session`` ends mid-window and no accumulation hook keeps the window.

    Worded after what ``saver_hook.end`` does next: it saves the window when
    ``global_step`` moved since its last save (this time, then, the window is
    kept), and saves nothing otherwise (the micro-batches accumulated after
    the last checkpoint are lost to a resumed run).
    """
    kept = _kept.get(session, ())
    counters = [c for c in session.graph.get_collection(TRAIN_OP_COUNTERS) if c.name not in kept]
    timer = getattr(saver_hook, "_timer", None)
    step_tensor = getattr(saver_hook, "_global_step_tensor", None)
    if not counters or step_tensor is None or timer is None:
        return
    if not hasattr(timer, "last_triggered_step"):
        return
    pending = sum(int(count) for count in session.run(counters))
    if not pending:
        return
    step = int(session.run(step_tensor))
    if timer.last_triggered_step() == step:
        warnings.warn(
            f"tf1_accum: the session ends with {pending} micro-batches accumulated since "
            f"the last update (global_step {step}), and CheckpointSaverHook writes no "
            "final checkpoint: it saves at the end only if global_step moved since its "
            f"last save, which was at step {step}. The micro-batches accumulated after "
            "that checkpoint are in none, so a run resumed from it does not resume this "
            "window: it starts the window over without them. " + _FIX,
            UserWarning,
            stacklevel=2,
        )
    else:
        # Without numbers, so that Python shows it once, not at every session.
        warnings.warn(
            "tf1_accum: the session ends in the middle of an accumulation window without "
            "the accumulation hook. Its final checkpoint holds the window this time, "
            "because global_step moved since CheckpointSaverHook's last save; when the "
            "last save falls on the last update of a session that ends mid-window, "
            "CheckpointSaverHook saves nothing at the end, and the micro-batches "
            "accumulated since are in no checkpoint: a resumed run starts that window "
            "over without them. " + _FIX,
            UserWarning,
            stacklevel=2,
        )
