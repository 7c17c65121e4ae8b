"""The session helper: runs one accumulation window over feed dicts."""

import collections.abc

import tensorflow as tf

from tf1_accum import _accumulation
from tf1_accum import _checks


def run_accumulation(sess, accumulation, feed_dicts, fetches=None):
    """Runs one window: accumulates each micro-batch, then applies once.

    Each feed dict is run with ``accumulation.accum_op``, and ``fetches`` (a
    loss, a metric, any structure ``Session.run`` accepts) is evaluated in that
    same ``session.run``, so nothing is computed twice. The apply then runs
    with no feed at all: the last micro-batch is never fed again, so it cannot
    be counted twice. N micro-batches take exactly N + 1 ``session.run`` calls.

    A window that a previous call or a checkpoint left partly accumulated is
    continued, not discarded: the apply averages over ``accumulation.counter``.

    If micro-batch k fails (a bad feed, an op error, an exception raised by a
    feed-dict generator), the window is discarded: the accumulators and the
    counter are reset, no update is applied, and the error is raised again, of
    the same type where possible, with a message naming k.

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

    Returns:
        A list with one entry per micro-batch: the fetched values, or ``None``
        where ``fetches`` is None.

    Raises:
        TypeError: If ``accumulation`` is not an `Accumulation`,
            ``feed_dicts`` is a single dict or not iterable, or a feed dict is
            not a dict.
        ValueError: If ``feed_dicts`` holds no micro-batch.
        Exception: Whatever micro-batch k raised, its message prefixed with
            the micro-batch's index; the window is discarded.
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
    if isinstance(feed_dicts, collections.abc.Sequence):
        # Known up front: reject bad input before anything runs.
        if not feed_dicts:
            raise ValueError(_empty_window_message())
        for index, feed in enumerate(feed_dicts):
            _checks.check_feed_dict(index, feed)

    results = []
    try:
        for feed in feed_dicts:
            _checks.check_feed_dict(len(results), feed)
            if fetches is None:
                sess.run(accumulation.accum_op, feed_dict=feed)
                results.append(None)
            else:
                _, value = sess.run((accumulation.accum_op, fetches), feed_dict=feed)
                results.append(value)
    except Exception as error:  # noqa: BLE001 - re-raised below, typed.
        _discard_window(sess, accumulation, error)
        named = _name_micro_batch(error, len(results))
        if named is None:
            raise
        raise named from error
    if not results:
        raise ValueError(_empty_window_message())
    sess.run(accumulation.apply_op)
    return results


def _empty_window_message():
    return (
        "feed_dicts holds no micro-batch: a window needs at least one feed dict "
        "(or None, for a micro-batch that needs no feed). Nothing was run."
    )


def _discard_window(sess, accumulation, error):
    try:
        sess.run(accumulation.zero_op)
    except Exception as zero_error:  # noqa: BLE001 - the first error matters.
        error.args = error.args + (f"(resetting the window also failed: {zero_error})",)


def _name_micro_batch(error, index):
    """Returns a copy of ``error`` naming ``index``, or None if none can be made."""
    message = (
        f"micro-batch {index} of the window failed, so the window was discarded "
        f"(accumulators and counter reset, no update applied): {error}"
    )
    if isinstance(error, tf.errors.OpError):
        if type(error) is tf.errors.OpError:
            return tf.errors.OpError(error.node_def, error.op, message, error.error_code)
        return type(error)(error.node_def, error.op, message)
    try:
        return type(error)(message)
    except Exception:  # noqa: BLE001 - a type that takes other arguments.
        return None
