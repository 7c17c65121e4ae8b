"""The session helper: runs one accumulation window over feed dicts."""

from __future__ import annotations

import collections.abc
import contextlib
import functools
import threading
import typing
import weakref

import numpy as np
from tf1_accum._compat import tf

from tf1_accum import _accumulation, _validate, _migration, _split, _stats
from tf1_accum._fed import _PLACEHOLDERS
from tf1_accum._locking import ancestors
from tf1_accum._split import DISCARDED


class WindowFetches(list):
    """What `run_accumulation` returns: a list of the fetched values, one per micro-batch.

    Attributes:
        weights: Each micro-batch's weight (floats, in order), fetched with
            ``fetches`` from an accumulation built with ``weight=``; None
            otherwise.
    """

    def __init__(self, values: typing.Iterable = (), weights: list[float] | None = None) -> None:
        super().__init__(values)
        self.weights = weights

    def window_mean(self) -> typing.Any:
        """The window's mean of the fetched values: with ``fetches=loss``, the window's loss.

        In float64, weighted as the update is (by ``weights``, else equally;
        a window of total weight 0 has mean 0).

        Raises:
            ValueError: If nothing was fetched (``fetches=None``).
        """
        if any(value is None for value in self):
            raise ValueError(
                "window_mean() needs fetched values, and this window fetched none: pass "
                "fetches= (the loss, say) to run_accumulation."
            )
        weights = np.ones(len(self)) if self.weights is None else np.asarray(self.weights)
        total = weights.sum()

        def mean(*values: typing.Any) -> np.ndarray:
            stacked = np.asarray(values, np.float64)
            w = weights.reshape((-1,) + (1,) * (stacked.ndim - 1))
            terms = np.where(w == 0, 0.0, stacked * w)
            return terms.sum(axis=0) / total if total else np.zeros_like(terms[0])

        return tf.nest.map_structure(mean, *self)


def run_accumulation(
    sess: tf.compat.v1.Session,
    accumulation: _accumulation.Accumulation,
    feed_dicts: typing.Mapping | typing.Iterable[typing.Mapping | None],
    fetches: typing.Any = None,
    *,
    fused: bool | None = None,
    apply_feed_dict: dict | None = None,
    micro_batch_size: int | None = None,
    micro_batches: int | None = None,
    memory_fit: _split.MemoryFit | None = None,
    unbatched_feeds: typing.Iterable[typing.Any] | None = None,
) -> WindowFetches:
    """Runs one window: accumulates each micro-batch, then applies once.

    Each micro-batch runs ``accum_op`` with ``fetches``; then ``apply_op``
    runs, fed ``apply_feed_dict`` and what the micro-batches fed the
    placeholders it reads (a learning rate). A partial window is continued; a
    failure before the update discards the window ("Errors" in
    :doc:`concepts`); concurrent calls run their windows in turn
    (:ref:`ways-in-threads`).

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
    ...         print([float(l) for l in losses], float(losses.window_mean()))
    ...         print(round(float(sess.run(w)), 4))
    [2.5, 12.5] 7.5
    2.5

    Args:
        sess: A ``tf.compat.v1.Session`` (or ``MonitoredSession``) on the graph
            of ``accumulation``.
        accumulation: An `Accumulation` from `build_accumulation`.
        feed_dicts: An iterable of feed dicts, one per micro-batch (``None``
            runs one with no feed); or the large batch, to split
            (:doc:`feed_the_batch`).
        fetches: Optional fetches to evaluate with each micro-batch (the loss).
        fused: Run the last micro-batch and the apply in one ``session.run``
            (``accum_apply_op``: a fetch reading variables outside the gradient
            path may see them updated); None (the default): when it was built.
        apply_feed_dict: Optional feed for the apply run alone (a learning
            rate, what a ``MonitoredSession`` hook fetches); never a
            micro-batch.
        micro_batch_size: Rows per micro-batch of the large batch (with
            ``memory_fit``, the most allowed).
        micro_batches: Micro-batches to split the large batch into, instead.
        memory_fit: A `MemoryFit`: find micro-batches that fit in memory,
            retrying a window that runs out of it. The same one every window.
        unbatched_feeds: Keys of the large batch's feed dict (placeholders or
            their names) that are not batch data, fed whole to every
            micro-batch (a codebook, a table) however many rows they have.
            Only with a split.

    Returns:
        A list (``WindowFetches``) of the fetched values per micro-batch (``None``
        without ``fetches``); ``window_mean()`` is the large batch's loss.

    Raises:
        TypeError: If an argument has the wrong type, or ``feed_dicts`` is a
            single dict and no split is asked for.
        ValueError: If ``sess`` runs another graph than ``accumulation``'s,
            ``feed_dicts`` holds no micro-batch, ``fused=True``
            without ``accum_apply_op``, micro-batches feed the apply different
            values (a learning rate; fused or not, split or not), ``fetches``
            holds the accumulation's ops or statistics, or a split
            :doc:`feed_the_batch` refuses.
        ResourceExhaustedError: With ``memory_fit``, if a micro-batch of one
            row runs out of memory; the window was discarded.
        RuntimeError: If this thread is already running a window of
            ``accumulation`` (a generator or hook calling it again).
        Exception: Whatever micro-batch k or the apply raised, saying which
            and what became of the window. Bad input raises before anything
            runs, except a bad feed dict from a generator (as micro-batch k).
    """
    if not isinstance(accumulation, _accumulation.Accumulation):
        expected = "a tf1_accum.Accumulation from build_accumulation"
        raise _validate.type_error("accumulation", accumulation, expected)
    _validate.check_session_graph(sess, accumulation.apply_op.graph, "accumulation")
    _validate.check_feed_dict("apply_feed_dict", apply_feed_dict)
    if fused is None:
        fused = accumulation.accum_apply_op is not None
    _validate.check_bool("fused", fused)
    if fused and accumulation.accum_apply_op is None:
        raise ValueError("fused=True needs accum_apply_op: build_accumulation(..., fused=True).")
    _check_fetches(accumulation, fetches)
    if not isinstance(feed_dicts, collections.abc.Iterable):
        expected = "an iterable of feed dicts, or a batch to split: a feed dict or a list of them"
        raise _validate.type_error("feed_dicts", feed_dicts, expected)
    if any(v is not None for v in (micro_batch_size, micro_batches, memory_fit)):
        # The large batch, split here: see _split.
        split = _split.plan_window(
            accumulation, feed_dicts, micro_batch_size, micro_batches, memory_fit, unbatched_feeds
        )
        run = functools.partial(_run_window, sess, accumulation, fetches, fused, apply_feed_dict)
        with _one_window_at_a_time(accumulation):
            return _split.run_window(split, run, lambda: _counter(sess, accumulation.counter, None))
    if unbatched_feeds is not None:
        raise ValueError(
            "unbatched_feeds needs a split of the large batch, and none is asked for: pass "
            "micro_batch_size=, micro_batches= or memory_fit=, or leave it out. Nothing was run."
        )
    if isinstance(feed_dicts, collections.abc.Mapping):
        raise TypeError(
            "feed_dicts must be an iterable of feed dicts, got a single dict: wrap it in a list "
            "(one micro-batch) or pass micro_batch_size= (or micro_batches=) to split it."
        )
    if isinstance(feed_dicts, collections.abc.Sequence):
        # Known up front: reject bad input before anything runs.
        if not feed_dicts:
            raise ValueError(_EMPTY_WINDOW)
        for index, feed in enumerate(feed_dicts):
            _validate.check_feed_dict(f"feed_dicts[{index}]", feed)

    with _one_window_at_a_time(accumulation):
        return _run_window(sess, accumulation, fetches, fused, apply_feed_dict, feed_dicts)


def _run_window(
    sess: tf.compat.v1.Session,
    accumulation: _accumulation.Accumulation,
    fetches: typing.Any,
    fused: bool,
    apply_feed_dict: typing.Mapping | None,
    feed_dicts: typing.Iterable[typing.Mapping | None],
    retry: bool = False,
) -> WindowFetches:
    """`run_accumulation` once its arguments are checked and the window is its own.

    With ``retry``, running out of memory raises `_split.WindowDiscarded`.
    """
    results: list = []
    weight = accumulation.weight if fetches is not None else None
    weights: list[float] = []
    # What the micro-batches feed that the apply reads (a learning rate), by name:
    # one value per window, fused or not (fused, the last micro-batch's is applied).
    reads = _apply_reads(accumulation, None if fused else apply_feed_dict)
    carried: dict[str, tuple[typing.Any, typing.Any, int]] = {}
    if reads and isinstance(feed_dicts, collections.abc.Sequence):
        for index, feed in enumerate(feed_dicts):  # refused before anything runs
            _carry(reads, carried, feed, index, fused)
        reads = frozenset()
    last_feed = None
    iterator = iter(feed_dicts)
    failing = 0  # the micro-batch being fetched from feed_dicts or run
    last_run = False  # whether the failing run is the fused accumulate-and-apply
    try:
        feed = next(iterator, _END)
        while feed is not _END:
            index = failing
            if feed is not None and type(feed) is not dict:  # a dict needs no check
                _validate.check_feed_dict(f"feed_dicts[{index}]", feed)
            if reads:
                _carry(reads, carried, feed, index, fused)
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
                asked = [f for f in (fetches, weight, noise) if f is not None]
                got = sess.run((op, *asked), feed_dict=feed)[1:]
                results.append(got[0] if fetches is not None else None)
                if weight is not None:
                    weights.append(float(got[1]))
                if noise is not None:
                    _stats.log_recommendation(*got[-1])
            failing = index + 1
            last_feed = feed
            feed = following if fused else next(iterator, _END)
    except (Exception, KeyboardInterrupt) as error:  # one rule for Ctrl-C and errors
        if last_run and failing > 0 and _counter(sess, accumulation.counter, feed) == 0:
            # The counter held the earlier micro-batches; only the apply resets it.
            what = _APPLIED
        else:
            what = _discard_window(sess, accumulation)
            if retry and what == DISCARDED and isinstance(error, tf.errors.ResourceExhaustedError):
                raise _split.WindowDiscarded(error, failing) from error
        hint = _migration.uninitialized_hint(error, accumulation.counter.graph)
        _reraise(error, f"{hint}micro-batch {failing} of the window failed {what}")
    if not results:
        raise ValueError(_EMPTY_WINDOW)
    if not fused:
        fed = {key: value for key, value, _ in carried.values()}
        apply_feed = {**fed, **(apply_feed_dict or {})} or None
        noise = _noise(accumulation.statistics)
        try:
            fetch = (accumulation.apply_op, noise) if noise else accumulation.apply_op
            got = sess.run(fetch, feed_dict=apply_feed)
        except (Exception, KeyboardInterrupt) as error:
            count = _counter(sess, accumulation.counter, apply_feed or last_feed)
            if count == 0:
                what = _APPLIED
            elif count is None:
                what = "and the window's state could not be read"
            else:
                # As a failed micro-batch: the next call starts a clean window.
                what = "before the update " + _discard_window(sess, accumulation)
            _reraise(error, f"the apply of the window failed {what}")
        if noise:
            _stats.log_recommendation(*got[1])
    return WindowFetches(results, weights if weight is not None else None)


def _apply_reads(
    accumulation: _accumulation.Accumulation, apply_feed_dict: typing.Mapping | None
) -> frozenset[str]:
    """Names of the placeholders ``apply_op`` reads, less those ``apply_feed_dict`` feeds."""
    apply_op = accumulation.apply_op
    with _WINDOW_LOCKS_GUARD:
        known = _APPLY_READS.setdefault(apply_op.graph, {})
    names = known.get(apply_op.name)
    if names is None:  # found once per accumulation: a walk of the apply's graph
        reached = ancestors([apply_op]).values()
        found = {op.outputs[0].name for op in reached if op.type in _PLACEHOLDERS}
        names = known[apply_op.name] = frozenset(found)
    return names - {getattr(key, "name", key) for key in apply_feed_dict or ()}


def _carry(
    reads: frozenset[str],
    carried: dict[str, tuple[typing.Any, typing.Any, int]],
    feed: typing.Mapping | None,
    index: int,
    fused: bool,
) -> None:
    """Keeps what ``feed`` gives a placeholder of ``reads``, for the apply; refuses a change."""
    for key, value in (feed or {}).items():
        name = getattr(key, "name", key)
        if name not in reads:
            continue
        if name in carried:
            _, earlier, at = carried[name]
            if value is not earlier and not np.array_equal(value, earlier):
                # An array's values, as fed (the split feeds arrays).
                shown = [v.tolist() if isinstance(v, np.ndarray) else v for v in (value, earlier)]
                raise ValueError(
                    f"micro-batch {index} feeds {name} {shown[0]!r}, and micro-batch {at} fed it "
                    f"{shown[1]!r}: the apply reads it, and runs once per window, with one value. "
                    "Feed every micro-batch the same, or the apply's alone as apply_feed_dict="
                    "{placeholder: value}" + (" with fused=False." if fused else ".")
                )
        carried[name] = (key, value, index)


def _check_fetches(accumulation: _accumulation.Accumulation, fetches: typing.Any) -> None:
    """Refuses the window's ops (they would act mid-window) and what an apply computes."""
    if fetches is None:
        return
    owned: dict[str, str] = {}
    for field in accumulation._fields:
        if field.endswith(("_op", "statistics")) or field == "global_norm":
            owner = "accumulation" if field.endswith("_op") else "apply"
            for item in tf.nest.flatten(getattr(accumulation, field)):
                if isinstance(item, (tf.Tensor, tf.Operation)):
                    owned.setdefault(item.name, f"the {owner}'s {field}")
    for item in tf.nest.flatten(fetches):
        name = item if isinstance(item, str) else getattr(item, "name", None)
        if isinstance(name, str) and name in owned:
            raise ValueError(
                f"fetches holds {owned[name]} ({name}): fetch losses and metrics only; for the "
                "statistics, run the ops yourself and fetch statistics with apply_op, or "
                "accum_apply_statistics with accum_apply_op. Nothing was run."
            )


def _noise(statistics: _stats.GradientStatistics | None) -> tuple | None:
    """What `_stats.log_recommendation` needs from a `GradientStatistics`, or None."""
    if statistics is None:
        return None
    return (statistics.noise_scale, statistics.noise_scale_ema, statistics.micro_batch_size)


# The end of feed_dicts (typed Any: a feed compared with it is not narrowed).
_END: typing.Any = object()

# Per graph, per accumulation (its counter's name): the lock (threading.Lock) of its windows.
_WINDOW_LOCKS: weakref.WeakKeyDictionary[tf.Graph, dict] = weakref.WeakKeyDictionary()
_WINDOW_LOCKS_GUARD = threading.Lock()
_HELD = threading.local()  # .locks: the window locks this thread holds
# Per graph, per apply_op's name: the placeholders it reads (a frozenset of names).
_APPLY_READS: weakref.WeakKeyDictionary[tf.Graph, dict] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def _one_window_at_a_time(accumulation: _accumulation.Accumulation) -> typing.Iterator[None]:
    """Holds the accumulation's window lock: a window's runs admit no other thread's."""
    with _WINDOW_LOCKS_GUARD:
        locks = _WINDOW_LOCKS.setdefault(accumulation.counter.graph, {})
        lock = locks.setdefault(accumulation.counter.op.name, threading.Lock())
    held = _HELD.__dict__.setdefault("locks", set())
    if lock in held:
        raise RuntimeError(
            "run_accumulation called from a window of the same accumulation (its feed_dicts or "
            "a hook) would wait forever: run the second window after the first returns."
        )
    with lock:
        held.add(lock)
        try:
            yield
        finally:
            held.discard(lock)


_EMPTY_WINDOW = "feed_dicts holds no micro-batch: give at least one feed dict (None: no feed)."
# What became of a window whose run failed after its apply.
_APPLIED = "after the update: the window was applied (or skipped as non-finite); do not apply again"


def _counter(sess: tf.compat.v1.Session, counter: tf.Variable, feed: typing.Any) -> int | None:
    """Returns the window's counter, or None if it cannot be read (``feed``: for hooks' fetches)."""
    try:
        return int(sess.run(counter, feed_dict=feed))
    except Exception:
        return None


def _discard_window(sess: tf.compat.v1.Session, accumulation: _accumulation.Accumulation) -> str:
    """Resets the window; returns what became of it, for the error message."""
    try:
        sess.run(accumulation.zero_op)
    except Exception as zero_error:
        return f"and its reset failed (state unknown: run zero_op before the next): {zero_error}"
    return DISCARDED


def _reraise(error: BaseException, context: str) -> typing.NoReturn:
    """Raises ``error`` again, of the same type where possible, with ``context``."""
    if isinstance(error, tf.errors.OpError):
        # OpError itself takes the error code; its subclasses set their own.
        code = (error.error_code,) if type(error) is tf.errors.OpError else ()
        named = type(error)(error.node_def, error.op, f"{context}: {error.message}", *code)
    else:
        try:
            named = type(error)(f"{context}: {error}")
        except Exception:
            raise error from None
    raise named from error
