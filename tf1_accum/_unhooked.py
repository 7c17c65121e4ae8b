"""Warnings for loops a framework owns that end mid-window: sessions it saves, tf_keras ``fit``.

Each wraps the framework's class once per process; why a window is lost
there is in the concepts page, "Design notes".
"""

from __future__ import annotations

import typing
import warnings
import weakref

from tf1_accum._compat import keras_callback_list, keras_names, patch, saver_hook_state, tf

from tf1_accum import _validate

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

    def watching(original: typing.Callable[..., None]) -> typing.Callable[..., None]:
        def end(self: typing.Any, session: tf.compat.v1.Session) -> None:
            _warn_if_left_out(self, session)
            return original(self, session)

        return end

    patch(tf.compat.v1.train.CheckpointSaverHook, "end", "self session", watching)


def _warn_if_left_out(
    saver_hook: tf.compat.v1.train.CheckpointSaverHook, session: tf.compat.v1.Session
) -> None:
    """Warns when ``session`` ends mid-window and no accumulation hook keeps the window."""
    kept = _kept.get(session, ())
    counters = [c for c in session.graph.get_collection(TRAIN_OP_COUNTERS) if c.name not in kept]
    step_tensor, last_save = saver_hook_state(saver_hook)
    if not counters or step_tensor is None:
        return
    pending = sum(int(count) for count in session.run(counters))
    if not pending:
        return
    step = int(session.run(step_tensor))
    if last_save == step:
        warnings.warn(
            f"tf1_accum: the session ends with {pending} micro-batches accumulated since "
            f"the last update (global_step {step}), and CheckpointSaverHook writes no "
            "final checkpoint: it saves at the end only if global_step moved since its "
            f"last save, which was at step {step}. The micro-batches accumulated after "
            "that checkpoint are in none, so a run resumed from it does not resume this "
            "window: it starts the window over without them. " + _FIX,
            stacklevel=2,
        )
    else:
        # Without numbers, so that Python shows it once, not at every session.
        warnings.warn(
            "tf1_accum: the session ends in the middle of an accumulation window without "
            "the accumulation hook. Its final checkpoint holds the window this time, "
            "because global_step moved since CheckpointSaverHook's last save; when it did "
            "not, the window is in no checkpoint. " + _FIX,
            stacklevel=2,
        )


def watch_keras_fit() -> None:
    """Makes Keras's ``fit`` warn of epochs that ended mid-window (one read an epoch)."""
    callback_list = keras_callback_list()
    if callback_list is not None:
        patch(callback_list, "on_epoch_end", "self epoch logs", _reading_epochs)
        patch(callback_list, "on_train_end", "self logs", _warning_at_end)


def _reading_epochs(epoch_end: typing.Callable[..., None]) -> typing.Callable[..., None]:
    def on_epoch_end(self: typing.Any, epoch: int, logs: typing.Any = None) -> None:
        epoch_end(self, epoch, logs)
        # The model's optimizer if it accumulates (a TF1 one is behind ``.optimizer``).
        optimizer = getattr(getattr(self, "model", None), "optimizer", None)
        for candidate in (optimizer, getattr(optimizer, "optimizer", None)):
            built_windows = getattr(candidate, "_built_windows", None)
            if built_windows is not None:
                session = tf.compat.v1.keras.backend.get_session()
                counters = [counter for counter, _ in built_windows(session.graph)]
                pending = sum(int(count) for count in session.run(counters))
                self.__dict__.setdefault("_tf1_accum_epochs", []).append(pending)
                break

    return on_epoch_end


def _warning_at_end(train_end: typing.Callable[..., None]) -> typing.Callable[..., None]:
    def on_train_end(self: typing.Any, logs: typing.Any = None) -> None:
        train_end(self, logs)
        pending = self.__dict__.pop("_tf1_accum_epochs", [])
        mid_window = [count for count in pending if count]
        if not mid_window:
            return
        warnings.warn(
            keras_names(
                f"tf1_accum: fit ended {len(mid_window)} of its {len(pending)} epochs in the "
                "middle of an accumulation window, and no callback ran the optimizer's flush_op: "
                "each such epoch's last micro-batches went into the next epoch's first window, "
                "where fit with batches steps times larger applies a short last batch"
                + (f", and the last {pending[-1]} were not applied at all" if pending[-1] else "")
                + ". Run flush_op at each epoch's end: callbacks=[tf_keras.callbacks."
                "LambdaCallback(on_epoch_end=lambda epoch, logs: "
                "tf.compat.v1.keras.backend.get_session().run(opt.flush_op))]."
            ),
            stacklevel=_validate._caller_stacklevel(),
        )

    return on_train_end
