"""The session helper: runs one accumulation window over feed dicts."""

from __future__ import annotations

import typing

import collections.abc
import contextlib
import threading
import weakref

import tensorflow as tf

from tf1_accum import _accumulation
from tf1_accum import _checks
from tf1_accum import _stats


def run_accumulation(
    sess: tf.compat.v1.Session,
    accumulation: _accumulation.Accumulation,
    feed_dicts: typing.Iterable[dict | None],
    fetches: typing.Any = None,
    *,
    fused: bool | None = None,
    apply_feed_dict: dict | None = None,
) -> list:
    """Runs one window: accumulates each micro-batch, then applies once.

    Each feed dict is run with ``accumulation.accum_op``, and ``fetches`` (a
    loss, a metric, any structure ``Session.run`` accepts) is evaluated in that
    same ``session.run``, so nothing is computed twice. The apply then runs
    with no micro-batch fed: the last micro-batch cannot be counted twice. N
    micro-batches take exactly N + 1 ``session.run`` calls.

    When the accumulation was built with ``fused=True`` (and unless this call
    says ``fused=False``), the last micro-batch runs ``accum_apply_op`` instead:
    its accumulation, then the apply, in one ``session.run`` fed that
    micro-batch, so a window takes exactly N calls, with the same result. The
    helper looks one feed dict ahead to know which one is last. Fetches that
    read variables outside the gradient path (a metric computed from the
    weights, say) may then see the updated weights in that last run; the loss
    and anything the gradients depend on are computed before the update.

    A window that a previous call or a checkpoint left partly accumulated is
    continued: the apply averages over ``accumulation.counter``.

    If micro-batch k fails (a bad feed, an op error, an exception raised by a
    feed-dict generator, a ``KeyboardInterrupt``: Ctrl-C follows the same
    rule), the window is discarded, including micro-batches
    accumulated before this call: the accumulators and the counter are reset,
    no update is applied, and the error is raised again, of the same type
    where possible, with a message naming k. (With ``fused=True``, a failure
    in the last run that comes after the update says so instead.) If the
    apply fails, the message says whether the update happened.

    Several threads may call it on one accumulation and one session (a
    queue-runner style pool of feeding threads): each call runs its window
    whole, its micro-batches and its apply never interleaved with another
    call's, while the other calls wait; the error messages above stay true.
    Windows of different accumulations run side by side. Running ``accum_op``
    or ``apply_op`` from another thread while a call runs its window is not
    excluded: the ops themselves lose and double nothing (each holds the
    window's mutex while it runs), but such a micro-batch joins this window.

    When the accumulation was built with ``statistics=True``, the apply (or
    the fused last run) also fetches the window's noise scale, and the helper
    logs it with `recommend_micro_batches` of its moving average
    (``tf.compat.v1.logging.info``, one line per window).

    Example:

    >>> import numpy as np
    >>> with tf.Graph().as_default():
    ...     x = tf.compat.v1.placeholder(tf.float32, [None])
    ...     w = tf.compat.v1.get_variable("w", initializer=1.0)
    ...     loss = tf.reduce_mean((w * x - 2.0 * x) ** 2)
    ...     acc = tf1_accum.build_accumulation(
    ...         loss, tf.compat.v1.train.GradientDescentOptimizer(0.1))
    ...     with tf.compat.v1.Session() as sess:
    ...         sess.run(tf.compat.v1.global_variables_initializer())
    ...         feeds = ({x: np.array(b)} for b in ([1.0, 2.0], [3.0, 4.0]))
    ...         losses = tf1_accum.run_accumulation(sess, acc, feeds, fetches=loss)
    ...         print([float(l) for l in losses], round(float(sess.run(w)), 4))
    [2.5, 12.5] 2.5

    Args:
        sess: A ``tf.compat.v1.Session`` (or anything with its ``run``, such as
            a ``MonitoredSession``) on the graph of ``accumulation``.
        accumulation: An `Accumulation` from `build_accumulation`.
        feed_dicts: An iterable of feed dicts, one per micro-batch: a list, a
            generator, any iterable. ``None`` entries run a micro-batch with no
            feed (for input pipelines inside the graph).
        fetches: Optional fetches to evaluate with each micro-batch.
        fused: Run the last micro-batch and the apply in one ``session.run``;
            None (the default) does so when ``accumulation.accum_apply_op``
            was built.
        apply_feed_dict: Optional feed for the apply run alone: a placeholder
            the optimizer reads (a learning rate), or what a
            ``MonitoredSession`` hook fetches in every run. Never a micro-batch:
            the apply reads only the accumulators.

    Returns:
        A list with one entry per micro-batch: the fetched values, or ``None``
        where ``fetches`` is None.

    Raises:
        TypeError: If ``accumulation`` is not an `Accumulation`,
            ``feed_dicts`` is a single dict or not iterable, a feed dict is not
            a dict, or ``apply_feed_dict`` is not a dict.
        ValueError: If ``feed_dicts`` holds no micro-batch, ``fused=True``
            for an accumulation built without ``fused=True``, or ``fetches``
            holds one of the accumulation's ops (``zero_op``, ``accum_op``,
            ``apply_op``, ``accum_apply_op``) or what an apply computes
            (``statistics``, ``accum_apply_statistics``, ``global_norm``):
            fetches are evaluated with each micro-batch's run.
        RuntimeError: If this thread is already running a window of
            ``accumulation`` (a feed-dict generator or a hook that calls
            ``run_accumulation`` again): windows of one accumulation run one
            at a time, so this call would wait forever.
        Exception: Whatever micro-batch k or the apply raised, its message
            saying which and what became of the window.
    """
    if not isinstance(accumulation, _accumulation.Accumulation):
        raise TypeError(
            "accumulation must be a tf1_accum.Accumulation from "
            f"build_accumulation, got {_checks.describe(accumulation)}."
        )
    if isinstance(feed_dicts, collections.abc.Mapping):
        raise TypeError(
            "feed_dicts must be an iterable of feed dicts, one per micro-batch, "
            "got a single dict. Wrap it in a list for a window of one micro-batch."
        )
    if not isinstance(feed_dicts, collections.abc.Iterable):
        raise TypeError(
            "feed_dicts must be an iterable of feed dicts, one per micro-batch, "
            f"got {_checks.describe(feed_dicts)}."
        )
    _checks.check_feed_dict("apply_feed_dict", apply_feed_dict)
    if fused is None:
        fused = accumulation.accum_apply_op is not None
    _checks.check_bool("fused", fused)
    if fused and accumulation.accum_apply_op is None:
        raise ValueError(
            "fused=True needs accum_apply_op, which build_accumulation makes only "
            "when called with fused=True."
        )
    _check_fetches(accumulation, fetches)
    if isinstance(feed_dicts, collections.abc.Sequence):
        # Known up front: reject bad input before anything runs.
        if not feed_dicts:
            raise ValueError(_EMPTY_WINDOW)
        for index, feed in enumerate(feed_dicts):
            _checks.check_feed_dict(f"feed_dicts[{index}]", feed)

    with _one_window_at_a_time(accumulation):
        return _run_window(sess, accumulation, feed_dicts, fetches, fused, apply_feed_dict)


def _run_window(sess, accumulation, feed_dicts, fetches, fused, apply_feed_dict):
    """`run_accumulation` once its arguments are checked and the window is its own."""
    results = []
    last_feed = None
    iterator = iter(feed_dicts)
    failing = 0  # the micro-batch being fetched from feed_dicts or run
    last_run = False  # whether the failing run is the fused accumulate-and-apply
    try:
        feed = next(iterator, _END)
        while feed is not _END:
            index = failing
            if feed is not None and type(feed) is not dict:  # a dict needs no check
                _checks.check_feed_dict(f"feed_dicts[{index}]", feed)
            failing = index + 1
            following = next(iterator, _END) if fused else None
            failing = index
            last_run = fused and following is _END
            op = accumulation.accum_apply_op if last_run else accumulation.accum_op
            noise = _noise(accumulation.accum_apply_statistics) if last_run else None
            if fetches is None and noise is None:
                # The op alone: a structure of fetches costs each run time.
                sess.run(op, feed_dict=feed)
                results.append(None)
            else:
                # Session.run fetches no None: leave out what is not asked for.
                asked = [f for f in (fetches, noise) if f is not None]
                got = sess.run((op, *asked), feed_dict=feed)[1:]
                results.append(got[0] if fetches is not None else None)
                if noise is not None:
                    _stats.log_recommendation(*got[-1])
            failing = index + 1
            last_feed = feed
            feed = following if fused else next(iterator, _END)
    except (Exception, KeyboardInterrupt) as error:  # one rule for Ctrl-C and errors
        if last_run and failing > 0 and _counter(sess, accumulation, feed) == 0:
            # The counter held the earlier micro-batches; only the apply resets it.
            what = (
                "after the window's apply ran (the window is done: the variables were "
                "updated, unless it was skipped as non-finite)"
            )
        else:
            what = _discard_window(sess, accumulation)
        _reraise(error, f"micro-batch {failing} of the window failed {what}")
    if not results:
        raise ValueError(_EMPTY_WINDOW)
    if not fused:
        statistics = accumulation.statistics
        try:
            if statistics is None:
                sess.run(accumulation.apply_op, feed_dict=apply_feed_dict)
            else:
                _, noise = sess.run(
                    (accumulation.apply_op, _noise(statistics)), feed_dict=apply_feed_dict
                )
        except (Exception, KeyboardInterrupt) as error:
            count = _counter(sess, accumulation, apply_feed_dict or last_feed)
            if count == 0:
                what = (
                    "after the update: the window was applied (or skipped as non-finite) "
                    "and reset; do not apply it again"
                )
            elif count is None:
                what = "and the window's state could not be read"
            else:
                what = (
                    f"before the update: the {count} micro-batches stay accumulated; "
                    "run apply_op (with the feed it needs) or zero_op"
                )
            _reraise(error, f"the apply of the window failed {what}")
        if statistics is not None:
            _stats.log_recommendation(*noise)
    return results


def _check_fetches(accumulation, fetches):
    """Refuses fetches that only the helper may run, or that belong to another run.

    ``fetches`` are evaluated with every micro-batch's run: a window op
    among them would reset, add or apply in the middle of the window, and
    the apply's statistics (or ``global_norm``) would read the window
    without its apply, or run a fused apply with an ``accum_op``.

    Raises:
        ValueError: Naming the field of the `Accumulation` found.
    """
    if fetches is None:
        return
    owned = {}
    for field in ("zero_op", "accum_op", "apply_op", "accum_apply_op"):
        op = getattr(accumulation, field)
        if op is not None:
            owned[op.name] = f"the accumulation's {field}"
    for field, run in (
        ("statistics", "apply_op"),
        ("accum_apply_statistics", "accum_apply_op"),
        ("global_norm", "apply_op"),
    ):
        for item in tf.nest.flatten(getattr(accumulation, field)):
            if isinstance(item, (tf.Tensor, tf.Operation)):
                owned.setdefault(item.name, f"the apply's {field}, evaluated with {run}'s run")
    for item in tf.nest.flatten(fetches):
        name = item if isinstance(item, str) else getattr(item, "name", None)
        if not isinstance(name, str) or name not in owned:
            continue
        raise ValueError(
            f"fetches holds {owned[name]} ({name}): run_accumulation evaluates fetches "
            "with each micro-batch's run, and runs the window's ops itself (zero_op in "
            "fetches would reset the window mid-way, apply_op apply it). Fetch losses "
            "and metrics only. The statistics of the window are logged by "
            "run_accumulation; to read them, run the ops yourself and fetch statistics "
            "with apply_op, or accum_apply_statistics with accum_apply_op. Nothing was run."
        )


def _noise(statistics):
    """What `_stats.log_recommendation` needs from a `GradientStatistics`, or None."""
    if statistics is None:
        return None
    return (statistics.noise_scale, statistics.noise_scale_ema, statistics.micro_batch_size)


_END = object()

# Per graph, per accumulation (its counter's name): the lock of its windows.
_WINDOW_LOCKS = weakref.WeakKeyDictionary()
_WINDOW_LOCKS_GUARD = threading.Lock()


class _WindowLock:
    """A lock that knows its holder, to refuse a nested window in the same thread."""

    def __init__(self):
        self.lock = threading.Lock()
        self.holder = None


@contextlib.contextmanager
def _one_window_at_a_time(accumulation):
    """Holds the accumulation's window lock: concurrent calls run their windows in turn.

    Each op is atomic in the graph (the window's mutex), but a window is N + 1
    runs: without this, another thread's micro-batches would join this
    window, its apply would take them, and the error messages would speak of
    micro-batches that are no longer there.
    """
    counter = accumulation.counter
    with _WINDOW_LOCKS_GUARD:
        locks = _WINDOW_LOCKS.setdefault(counter.graph, {})
        window_lock = locks.setdefault(counter.op.name, _WindowLock())
    me = threading.get_ident()
    if window_lock.holder == me:
        raise RuntimeError(
            "run_accumulation was called for an accumulation whose window this same "
            "thread is running (from its feed_dicts or a hook): windows of one "
            "accumulation run one at a time, so this call would wait forever. Run the "
            "second window after the first returns."
        )
    with window_lock.lock:
        window_lock.holder = me
        try:
            yield
        finally:
            window_lock.holder = None


_EMPTY_WINDOW = (
    "feed_dicts holds no micro-batch: a window needs at least one feed dict "
    "(or None, for a micro-batch that needs no feed). Nothing was run."
)


def _counter(sess, accumulation, feed):
    """Returns the window's counter, or None if it cannot be read.

    ``feed`` is a micro-batch's: the counter needs none, but the hooks of a
    ``MonitoredSession`` add their fetches to every run.
    """
    try:
        return int(sess.run(accumulation.counter, feed_dict=feed))
    except Exception:
        return None


def _discard_window(sess, accumulation):
    """Resets the window; returns what became of it, for the error message."""
    try:
        sess.run(accumulation.zero_op)
    except Exception as zero_error:
        return (
            "and resetting the window failed too, so its accumulators are in an "
            f"unknown state (run zero_op before the next window): {zero_error}"
        )
    return "so the window was discarded (accumulators and counter reset, no update applied)"


def _reraise(error, context):
    """Raises ``error`` again, of the same type where possible, with ``context``."""
    message = f"{context}: {error.message if isinstance(error, tf.errors.OpError) else error}"
    if isinstance(error, tf.errors.OpError):
        if type(error) is tf.errors.OpError:
            named = tf.errors.OpError(error.node_def, error.op, message, error.error_code)
        else:
            named = type(error)(error.node_def, error.op, message)
    else:
        try:
            named = type(error)(message)
        except Exception:
            raise error from None
    raise named from error
