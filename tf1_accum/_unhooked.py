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
# Sessions whose first run CheckpointSaverHook has seen.
_started: weakref.WeakSet[tf.compat.v1.Session] = weakref.WeakSet()

_FIX = (
    "Add opt.make_session_run_hook() to the session's hooks (an Estimator's: EstimatorSpec's "
    "training_hooks): it saves a partial window at the end, or applies it (flush_at_end=True)."
)


def keep_windows(session: tf.compat.v1.Session, counters: typing.Iterable[tf.Variable]) -> None:
    """Records that an accumulation hook of ``session`` keeps the windows of ``counters``."""
    _kept.setdefault(session, set()).update(c.name for c in counters)


def watch_checkpoint_saver_hook() -> None:
    """Makes ``CheckpointSaverHook`` warn of a session without the accumulation hook (once).

    Before the session's first run (every hook's ``after_create_session`` has
    run, so the accumulation hook has said which windows it keeps), and at its
    end when a window is partial.
    """
    saver_hook = tf.compat.v1.train.CheckpointSaverHook
    patch(saver_hook, "before_run", "self run_context", _checking(_warn_if_unhooked, first=True))
    patch(saver_hook, "end", "self session", _checking(_warn_if_left_out, first=True))


def _checking(check: typing.Callable[..., None], first: bool = False) -> typing.Any:
    """What `patch` makes a method with: the original, then ``check`` (``first``: before it).

    ``check`` takes the method's arguments.
    """

    def make(original: typing.Callable[..., typing.Any]) -> typing.Callable[..., typing.Any]:
        def method(self: typing.Any, *args: typing.Any, **kwargs: typing.Any) -> typing.Any:
            if first:
                check(self, *args, **kwargs)
            result = original(self, *args, **kwargs)
            if not first:
                check(self, *args, **kwargs)
            return result

        return method

    return make


def _warn_if_unhooked(saver_hook: typing.Any, run_context: typing.Any) -> None:
    """Warns, at the first run of a session, of the windows no accumulation hook keeps."""
    session = run_context.session
    if session not in _started:
        _started.add(session)
        counters = session.graph.get_collection(TRAIN_OP_COUNTERS)
        unkept = [c.name for c in counters if c.name not in _kept.get(session, ())]
        if unkept:
            warnings.warn(
                "tf1_accum: this session runs an AccumulationOptimizer's train op (window "
                f"counter {', '.join(unkept)}) without the accumulation hook: if it ends "
                "mid-window, that window's micro-batches may be in no checkpoint. " + _FIX,
                stacklevel=_validate._caller_stacklevel(),
            )


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
        message = (
            f"tf1_accum: the session ends with {pending} micro-batches accumulated since the last "
            f"update, and CheckpointSaverHook writes no final checkpoint (global_step {step}, as "
            "at its last save): a resumed run starts this window over without them. "
        )
    else:
        # Without numbers, so that Python shows it once, not at every session.
        message = (
            "tf1_accum: the session ends in the middle of an accumulation window without "
            "the accumulation hook. Its final checkpoint holds the window this time (global_step "
            "moved since CheckpointSaverHook's last save), not always. "
        )
    warnings.warn(message + _FIX, stacklevel=2)


def watch_keras_fit() -> None:
    """Makes Keras's ``fit`` warn of epochs that end mid-window: at its start, and at its end."""
    callback_list = keras_callback_list()
    if callback_list is not None:
        patch(callback_list, "on_epoch_begin", "self epoch logs", _checking(_warn_at_begin))
        patch(callback_list, "on_epoch_end", "self epoch logs", _checking(_read_epoch))
        patch(callback_list, "on_train_end", "self logs", _checking(_warn_at_end))


def _accumulating(callbacks: typing.Any) -> typing.Any:
    """The fit model's optimizer if it accumulates (a TF1 one is behind ``.optimizer``), or None."""
    optimizer = getattr(getattr(callbacks, "model", None), "optimizer", None)
    for candidate in (optimizer, getattr(optimizer, "optimizer", None)):
        if getattr(candidate, "_built_windows", None) is not None:
            return candidate
    return None


def _pending(optimizer: typing.Any) -> int:
    """The micro-batches in ``optimizer``'s windows in Keras's session."""
    session = tf.compat.v1.keras.backend.get_session()
    counters = [counter for counter, _ in optimizer._built_windows(session.graph)]
    return sum(int(count) for count in session.run(counters))


def _warn_of_fit(what: str, last: int = 0) -> None:
    """Warns of fit's epochs that end mid-window, and says how to flush them.

    Args:
        what: What fit does, or did.
        last: The micro-batches the last epoch leaves in its window (0: none).
    """
    missed = f", and the last {last} miss their update" if last else ""
    message = (
        f"tf1_accum: {what}, and no callback runs the optimizer's flush_op: an epoch's last "
        "micro-batches go into the next epoch's first window (fit with batches steps times "
        f"larger applies a short last batch){missed}. Run flush_op at each epoch's end: "
        "callbacks=[tf_keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: "
        "tf.compat.v1.keras.backend.get_session().run(opt.flush_op))]."
    )
    warnings.warn(keras_names(message), stacklevel=_validate._caller_stacklevel())


def _warn_at_begin(callbacks: typing.Any, epoch: int, logs: typing.Any = None) -> None:
    """Warns if fit's epochs will end mid-window: at its first epoch's begin, before any run.

    That epoch's index is fit's initial_epoch, which a resumed fit skips.
    """
    if callbacks.__dict__.get("_tf1_accum_begun"):
        return
    callbacks.__dict__["_tf1_accum_begun"] = True
    optimizer = _accumulating(callbacks)
    params = getattr(callbacks, "params", None) or {}
    steps, samples, size = (params.get(k) for k in ("steps", "samples", "batch_size"))
    steps = steps or (samples and size and -(-samples // size))
    # Keras's own callbacks run no flush_op; the program's own (a LambdaCallback) may.
    own = [c for c in callbacks.callbacks if type(c).__module__ != type(callbacks).__module__]
    lambdas = [c for c in callbacks.callbacks if type(c).__name__ == "LambdaCallback"]
    if optimizer is None or not steps or own or lambdas:
        return
    pending, n = _pending(optimizer), optimizer.steps
    epochs = range(1, int(params.get("epochs") or epoch + 1) - epoch + 1)
    ends = [(pending + e * steps) % n for e in epochs]
    if any(ends):
        callbacks.__dict__["_tf1_accum_warned"] = True
        _warn_of_fit(
            f"fit runs {steps} micro-batches an epoch in windows of {n}, so "
            f"{sum(1 for e in ends if e)} of its {len(ends)} epochs end in the middle of an "
            "accumulation window",
            ends[-1],
        )


def _read_epoch(callbacks: typing.Any, epoch: int, logs: typing.Any = None) -> None:
    """At an epoch's end: records its micro-batches left in a window, warns of the first."""
    optimizer = _accumulating(callbacks)
    if optimizer is None:
        return
    pending = _pending(optimizer)
    callbacks.__dict__.setdefault("_tf1_accum_epochs", []).append(pending)
    epochs = (getattr(callbacks, "params", None) or {}).get("epochs") or 0
    # Not known at the start (a callback might flush): warn before the next epoch's updates.
    if pending and epoch + 1 < epochs and not callbacks.__dict__.get("_tf1_accum_warned"):
        callbacks.__dict__["_tf1_accum_warned"] = True
        _warn_of_fit(
            f"fit's epoch {epoch + 1} ended with {pending} micro-batches in an accumulation window"
        )


def _warn_at_end(callbacks: typing.Any, logs: typing.Any = None) -> None:
    """At fit's end: warns of the epochs that ended mid-window, and forgets fit's records."""
    pending = callbacks.__dict__.pop("_tf1_accum_epochs", [])
    callbacks.__dict__.pop("_tf1_accum_warned", None)
    callbacks.__dict__.pop("_tf1_accum_begun", None)
    mid_window = [count for count in pending if count]
    if mid_window:
        _warn_of_fit(
            f"fit ended {len(mid_window)} of its {len(pending)} epochs in the middle of an "
            "accumulation window",
            pending[-1],
        )
