"""The large batch, split for `run_accumulation`: `plan_window` checks, `run_window` runs.

See :doc:`feed_the_batch`; unequal micro-batches need ``weight=``.
"""

from __future__ import annotations

import collections
import collections.abc
import contextlib
import itertools
import typing

import numpy as np
from tf1_accum._compat import tf

from tf1_accum import _validate
from tf1_accum._accumulation import Accumulation

# The session helper's window runner: (micro-batch feeds, retry out of memory) -> results.
_Results = typing.TypeVar("_Results")
Runner = typing.Callable[[typing.List[dict], bool], _Results]


class SizeChange(typing.NamedTuple):
    """One change of the micro-batch size a `MemoryFit` uses.

    Attributes:
        window: The window it happened in, counted from 0 by the `MemoryFit`.
        old: Rows per micro-batch before, None for the first window.
        new: Rows per micro-batch after.
        reason: ``"first window"``, ``"out of memory"`` (the window ran
            again with ``new``) or ``"probe"`` (``new`` is tried).
    """

    window: int
    old: typing.Optional[int]
    new: int
    reason: str


class MemoryFit:
    """Finds the micro-batch size that fits in memory, and remembers it across windows.

    Pass the same one to every `run_accumulation` as ``memory_fit=``: a window
    out of memory runs again with smaller micro-batches (:doc:`feed_the_batch`).

    Example (5 rows in micro-batches of 2, 2 and 1: one update, the large
    batch's):

    >>> import numpy as np
    >>> with tf.Graph().as_default():
    ...     x = tf.compat.v1.placeholder(tf.float32, [None])
    ...     w = tf.compat.v1.get_variable("w", initializer=1.0)
    ...     loss = tf.reduce_mean((w * x - 2.0 * x) ** 2)
    ...     acc = tf1_accum.build_accumulation(
    ...         loss, tf.compat.v1.train.GradientDescentOptimizer(0.1), weight=tf.shape(x)[0])
    ...     fit = tf1_accum.MemoryFit(probe_every=50)
    ...     with tf.compat.v1.Session() as sess:
    ...         sess.run(tf.compat.v1.global_variables_initializer())
    ...         batch = {x: np.arange(1.0, 6.0, dtype=np.float32)}
    ...         _ = tf1_accum.run_accumulation(
    ...             sess, acc, batch, micro_batch_size=2, memory_fit=fit)
    ...         print(fit.micro_batch_size, fit.changes, round(float(sess.run(w)), 4))
    2 (SizeChange(window=0, old=None, new=2, reason='first window'),) 3.2

    Args:
        probe_every: Windows to run at a size before trying a larger one: a
            positive integer, or None never to probe.

    Raises:
        TypeError: If ``probe_every`` is not an integer or None.
        ValueError: If ``probe_every`` is not positive.
    """

    def __init__(self, *, probe_every: int | None = 100) -> None:
        if probe_every is not None:
            _validate.check_int("probe_every", probe_every, " (windows)")
        self._probe_every = probe_every
        self._size: int | None = None  # rows per micro-batch the next window starts with
        self._fits: int | None = None  # the size in use before a probe: known to fit
        self._fails: int | None = None  # the smallest size that ran out of memory
        self._since = 0  # windows completed at the size in use
        self._windows = 0
        self._changes: list[SizeChange] = []

    @property
    def micro_batch_size(self) -> int | None:
        """Rows per micro-batch in use (the next window starts with it); None before a window."""
        return self._size

    @property
    def changes(self) -> tuple[SizeChange, ...]:
        """Every change of the size, in order, as `SizeChange` tuples."""
        return tuple(self._changes)

    @property
    def windows(self) -> int:
        """Windows this object completed."""
        return self._windows

    @property
    def probe_every(self) -> int | None:
        """Windows run at a size before a larger one is tried (None: never)."""
        return self._probe_every

    def __repr__(self) -> str:
        return (
            f"MemoryFit(micro_batch_size={self._size}, windows={self._windows}, "
            f"changes={len(self._changes)}, probe_every={self._probe_every})"
        )

    def _start(self, largest: int) -> int:
        """Rows per micro-batch for a window whose largest allowed size is ``largest``."""
        if self._size is None:
            self._change(largest, "first window")
            return largest
        # At the largest allowed, target is no larger than the size in use: no probe.
        if self._probe_every is not None and self._since >= self._probe_every:
            larger = 2 * self._size if self._fails is None else (self._size + self._fails) // 2
            target = min(larger, largest)
            if target > self._size:
                self._fits = self._size
                self._change(target, "probe")
        return self._size

    def _out_of_memory(self, tried: int, error: BaseException) -> int | None:
        """Takes a size that ran out of memory; returns the next, or None if ``tried`` is 1."""
        self._fails = tried if self._fails is None else min(self._fails, tried)
        if tried <= 1:
            return None
        if self._fits is not None and self._fits < tried:
            smaller = self._fits  # a probe that failed: back to the size that fit
        else:
            smaller = (tried + 1) // 2
        self._fits = None
        self._change(smaller, "out of memory")
        tf.compat.v1.logging.warning(
            f"tf1_accum: a micro-batch of {tried} rows ran out of memory "
            f"({_first_line(error)}); the window was discarded and runs again with "
            f"micro-batches of {smaller} rows (window {self._windows})."
        )
        return smaller

    def _completed(self) -> None:
        self._fits = None
        self._since += 1
        self._windows += 1

    def _change(self, new: int, reason: str) -> None:
        old, windows_at_old = self._size, self._since
        self._changes.append(SizeChange(self._windows, old, new, reason))
        self._size, self._since = new, 0
        if reason != "out of memory":  # which _out_of_memory logs, with the error
            why = f"a probe: {old} rows fit for {windows_at_old} windows"
            tf.compat.v1.logging.info(
                f"tf1_accum: micro-batches of {new} rows from window {self._windows} "
                f"({'the largest allowed' if old is None else why})."
            )


def _first_line(error: BaseException) -> str:
    """The line of an error message that says what ran out (the allocator's "OOM when ...")."""
    text = error.message if isinstance(error, tf.errors.OpError) else str(error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if "OOM" in line or "MemoryError" in line or "out of memory" in line.lower():
            return line
    plain = [line for line in lines if not line.endswith(":") and not line.startswith("Hint")]
    return plain[0] if plain else type(error).__name__


class WindowDiscarded(Exception):
    """``(error, k)``: micro-batch k ran out of memory (``error``); the window was discarded."""


# What became of a window whose micro-batch failed, once zero_op ran.
DISCARDED = "so the window was discarded (accumulators and counter reset, no update applied)"


class _Batch(typing.NamedTuple):
    """One large feed dict, its number of rows and which of its keys are split."""

    feed: dict
    rows: int
    split: frozenset  # keys whose values are cut into micro-batches
    fixed: dict  # batch data fed through a placeholder of fixed batch dimension: key -> shape


class Plan(typing.NamedTuple):
    """A checked large batch and how to split it, from `plan_window`."""

    batches: typing.List[_Batch]
    micro_batch_size: typing.Optional[int]
    micro_batches: typing.Optional[int]
    memory_fit: typing.Optional[MemoryFit]


def plan_window(
    accumulation: Accumulation,
    feed_dicts: typing.Iterable,
    micro_batch_size: int | None,
    micro_batches: int | None,
    memory_fit: MemoryFit | None,
    unbatched_feeds: typing.Iterable[typing.Any] | None = None,
) -> Plan:
    """Checks a large batch and the split asked for; nothing runs. Returns a `Plan`."""
    for name, value in (("micro_batch_size", micro_batch_size), ("micro_batches", micro_batches)):
        if value is not None:
            _validate.check_int(name, value)
    if micro_batch_size is not None and micro_batches is not None:
        raise ValueError(
            f"Pass micro_batch_size= or micro_batches=, not both (got {micro_batch_size} "
            f"and {micro_batches})."
        )
    if memory_fit is not None and not isinstance(memory_fit, MemoryFit):
        raise _validate.type_error("memory_fit", memory_fit, "a tf1_accum.MemoryFit or None")
    feeds = [feed_dicts] if isinstance(feed_dicts, collections.abc.Mapping) else list(feed_dicts)
    if not feeds:
        raise ValueError(
            "feed_dicts holds no batch: pass the large batch as one feed dict (or a list of them)."
        )
    graph = accumulation.counter.graph
    whole = _unbatched(graph, unbatched_feeds, feeds)
    batches = []
    for index, feed in enumerate(feeds):
        label = "feed_dicts" if feed is feed_dicts else f"feed_dicts[{index}]"
        if not isinstance(feed, collections.abc.Mapping):
            raise _validate.type_error(label, feed, "a feed dict holding a large batch to split")
        batches.append(_batch(graph, dict(feed), label, whole))
    weighted = accumulation.options is not None and accumulation.options.weighted
    if memory_fit is not None and not weighted:
        raise ValueError(
            "memory_fit needs an accumulation built with weight= (weight=tf.shape(x)[0]): the "
            "sizes it picks need not be equal. Nothing was run."
        )
    plan = Plan(batches, micro_batch_size, micro_batches, memory_fit)
    sizes: list[int] = []  # the rows of each micro-batch (memory_fit: at first)
    for batch in batches:
        cuts = _sizes(plan, batch, _largest(plan, batch))
        sizes += cuts
        # Batch data through a placeholder fixed at the batch's rows (split) or another size.
        for key, shape in batch.fixed.items():
            if memory_fit is None and min(cuts) >= batch.rows and shape[0] == batch.rows:
                continue  # fed whole, as the graph was built for
            cut = (
                f"{_split_asked(plan)} cuts the batch into micro-batches of "
                f"{_sizes_text(cuts)} rows"
                if memory_fit is None
                else "memory_fit cuts the batch into smaller micro-batches"
            )
            raise ValueError(
                f"{_key_name(key)} is a placeholder of shape {shape}: its batch dimension is "
                f"fixed at {shape[0]} rows, and {cut} (the batch fed to it has {batch.rows} "
                f"rows). Build the graph with None as its first dimension ({[None, *shape[1:]]}) "
                "and -1 in reshapes; or, if it is not batch data, name it in "
                f"unbatched_feeds=[{_key_name(key)!r}] to feed it whole. Nothing was run."
            )
    if not weighted and len(set(sizes)) > 1:  # never with memory_fit (weighted)
        rows = [b.rows for b in batches]
        raise ValueError(
            f"The batch ({' and '.join(map(str, rows))} rows) does not split into equal "
            f"micro-batches ({_split_asked(plan)} gives {_sizes_text(sizes)} rows), which an "
            "accumulation built without weight= needs: build it with weight=tf.shape(x)[0], or "
            "split into equal micro-batches. Nothing was run."
        )
    statistics = accumulation.statistics
    fixed = statistics and tf.get_static_value(statistics.micro_batch_size)
    if fixed is not None and any(s != fixed for s in sizes):
        raise ValueError(
            f"This accumulation's statistics were built with micro_batch_size={float(fixed):g}, "
            f"but {_split_asked(plan)} gives micro-batches of {_sizes_text(sizes)} rows: split "
            "into that size, or build with weight=. Nothing was run."
        )
    return plan


def run_window(
    plan: Plan, run: Runner[_Results], read_counter: typing.Callable[[], int | None]
) -> _Results:
    """Runs one window of ``plan``; returns the fetched values, one per micro-batch.

    ``run(feeds, retry)`` is the session helper's window runner (feeds: a
    list of feed dicts; retry: raise `WindowDiscarded` out of memory);
    ``read_counter()`` reads the window's counter (None if it cannot).
    """
    fit = plan.memory_fit
    try:
        if fit is None:
            return run(_micro_batches(plan, None), False)
        # A discarded window must hold nothing but this batch's micro-batches.
        held = read_counter()
        if held:
            raise ValueError(
                f"The window already holds {held} micro-batch{'es' if held > 1 else ''}, which "
                "memory_fit could not run again: run apply_op or zero_op first. Nothing was run."
            )
        largest = max(_largest(plan, b) for b in plan.batches)
        size = min(fit._start(largest), largest)
        while True:
            tried = min(size, max(b.rows for b in plan.batches))
            try:
                results = run(_micro_batches(plan, size), True)
            except WindowDiscarded as discarded:
                error, failed = discarded.args
                smaller = fit._out_of_memory(tried, error)
                if smaller is None:
                    message = (
                        f"micro-batch {failed} of the window failed {DISCARDED}: a micro-batch of "
                        f"one row does not fit in memory: {error.message}"
                    )
                    raise type(error)(error.node_def, error.op, message) from error
                size = smaller
            else:
                fit._completed()
                return results
    except tf.errors.InvalidArgumentError as error:
        whole = plan.memory_fit is None and all(_largest(plan, b) >= b.rows for b in plan.batches)
        if whole or "reshape" not in error.message.lower():
            raise
        # A graph that reshapes to the batch size it was built for.
        rows = max(b.rows for b in plan.batches)
        hint = (
            f"\nThe large batch has {rows} rows: a graph built for one batch size (a reshape "
            f"to a fixed batch, such as tf.reshape(x, [{rows}, -1])) cannot take smaller "
            "micro-batches: reshape with -1 as the batch dimension (tf.reshape(x, [-1, 784]))."
        )
        raise type(error)(error.node_def, error.op, error.message + hint) from error


def _largest(plan: Plan, batch: _Batch) -> int:
    """The largest micro-batch allowed for ``batch``: what was asked, or the whole batch."""
    if plan.micro_batch_size is not None:
        return min(int(plan.micro_batch_size), batch.rows)
    if plan.micro_batches is not None:
        return -(-batch.rows // int(plan.micro_batches))
    return batch.rows


def _sizes(plan: Plan, batch: _Batch, size: int) -> list[int]:
    """Rows of each micro-batch of ``batch``: ``size`` each, a shorter last one.

    Without a fit, ``micro_batches=N`` makes N sizes that differ by one at most.
    """
    rows = batch.rows
    if plan.memory_fit is None and plan.micro_batches is not None:
        count = min(int(plan.micro_batches), rows)
        return [rows // count + (1 if i < rows % count else 0) for i in range(count)]
    size = min(size, rows)
    return [size] * (rows // size) + ([rows % size] if rows % size else [])


def _micro_batches(plan: Plan, size: int | None) -> list[dict]:
    """The feed dicts of the window's micro-batches, in order (slices: no copies)."""
    feeds = []
    for batch in plan.batches:
        sizes = _sizes(plan, batch, size if size is not None else _largest(plan, batch))
        stops = list(itertools.accumulate(sizes))
        for start, stop in zip([0, *stops], stops):
            cut = {key: batch.feed[key][start:stop] for key in batch.split}
            feeds.append({**batch.feed, **cut})
    return feeds


def _split_asked(plan: Plan) -> str:
    if plan.micro_batch_size is not None:
        return f"micro_batch_size={plan.micro_batch_size}"
    return f"micro_batches={plan.micro_batches}"


def _sizes_text(sizes: typing.Iterable[int]) -> str:
    counted = collections.Counter(sizes)
    return ", ".join(
        f"{n} x {size}" if n > 1 else str(size) for size, n in sorted(counted.items(), reverse=True)
    )


def _unbatched(graph: tf.Graph, keys: object, feeds: list) -> set:
    """``unbatched_feeds``, checked: the tensors it names, each a key of a feed dict."""
    if keys is None:
        return set()
    if not _validate.is_list(keys, tf.Tensor):
        expected = "a list of feed dict keys (placeholders or their names) fed whole"
        raise _validate.type_error("unbatched_feeds", keys, expected + " to every micro-batch")
    fed = set()
    for key in (key for feed in feeds for key in feed):
        with contextlib.suppress(ValueError):  # a bad key: refused with its feed dict's label
            fed.add(_feed_tensor(graph, key, "feed_dicts"))
    tensors = set()
    for key in keys:
        tensor = _feed_tensor(graph, key, "unbatched_feeds")
        if tensor not in fed:
            raise ValueError(
                f"unbatched_feeds names {_key_name(key)}, which no feed dict of the batch feeds: "
                "name keys of feed_dicts. Nothing was run."
            )
        tensors.add(tensor)
    return tensors


def _feed_tensor(graph: tf.Graph, key: object, label: str) -> typing.Any:
    """The tensor a feed dict key names (a name, looked up in ``graph``)."""
    if not isinstance(key, str):
        return key
    try:
        return graph.as_graph_element(key)
    except (KeyError, ValueError, TypeError) as error:
        raise ValueError(f"{label} has a key {key!r} that names no tensor: {error}") from None


def _batch(graph: tf.Graph, feed: dict, label: str, whole: set) -> _Batch:
    """Finds which values of one large feed dict are split, and its rows; returns a `_Batch`.

    Split: a value of the batch's rows (the leading size most candidates
    share) whose key leaves the leading dimension unknown and is not in
    ``whole`` (``unbatched_feeds``); the rest go whole.
    """
    values = {}
    candidates = {}  # key -> leading size
    sized: dict[typing.Any, tuple] = {}  # key -> (leading size, shape): fixed leading size
    for key, value in feed.items():
        tensor = _feed_tensor(graph, key, label)
        if tensor in whole:
            values[key] = value
            continue
        if isinstance(tensor, tf.SparseTensor):
            raise TypeError(
                f"{label} feeds a SparseTensor ({tensor.indices.name.rsplit('/', 1)[0]}), which "
                "run_accumulation does not split: pass one feed dict per micro-batch, unsplit."
            )
        value = values[key] = np.asanyarray(value)
        shape: typing.Any = getattr(tensor, "shape", None)  # a TensorShape, or None
        dims = None if shape is None or shape.ndims is None else shape.as_list()
        if value.ndim and dims and dims[0] is not None:
            # A placeholder of fixed leading size: fed whole (plan_window refuses a cut of it).
            sized[key] = (value.shape[0], dims)
        elif value.ndim and dims != []:  # a scalar, or fed to one, goes whole
            candidates[key] = value.shape[0]
    sizes = collections.Counter(size for size, _ in sized.values()).most_common(2)
    if not candidates and (len(sizes) == 1 or (sizes and sizes[0][1] > sizes[1][1])):
        # A graph built for one batch size: its rows are the values'.
        candidates = {key: size for key, (size, _) in sized.items()}
    if not candidates:
        raise ValueError(
            f"{label} holds nothing to split: feed the batch to placeholders whose first "
            "dimension is None ([None, 4]). Nothing was run."
        )
    counted = collections.Counter(candidates.values()).most_common()
    if len(counted) > 1 and counted[0][1] == counted[1][1]:
        keys = ", ".join(f"{_key_name(k)}: {n} rows" for k, n in candidates.items())
        raise ValueError(
            f"{label} has no one batch dimension: as many arrays have {counted[0][0]} rows as "
            f"{counted[1][0]} ({keys}). Name those that are not batch data in "
            "unbatched_feeds=[...]. Nothing was run."
        )
    rows = counted[0][0]
    if rows == 0:
        raise ValueError(f"{label} holds a batch of 0 rows: feed at least one row.")
    # A key of fixed leading size is never split: plan_window refuses a split that would cut
    # its value, whatever that size.
    split = frozenset(key for key, size in candidates.items() if size == rows and key not in sized)
    batch_shaped = {key: shape for key, (size, shape) in sized.items() if size == rows}
    return _Batch(values, rows, split, batch_shaped)


def _key_name(key: object) -> str:
    return key if isinstance(key, str) else getattr(key, "name", repr(key))
