"""The session hook for loops a framework owns: no micro-batch is lost at exit."""

from __future__ import annotations

import logging
import re
import typing
import warnings
import weakref

from tf1_accum._compat import session_closed, tf

from tf1_accum import _unhooked


class _UnmovedStepFilter(logging.Filter):
    """Drops StepCounterHook's unmoved-step warning while its session is open (no ``end()``)."""

    def __init__(self, session: tf.compat.v1.Session) -> None:
        super().__init__()
        self._session = weakref.ref(session)

    def active(self) -> bool:
        session = self._session()
        return session is not None and not session_closed(session)

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.active() and str(record.msg).startswith("It seems that global step"))


class AccumulationHook(tf.compat.v1.train.SessionRunHook):
    """Made by `AccumulationOptimizer.make_session_run_hook`, which documents it."""

    def __init__(
        self,
        built_windows: typing.Callable[[tf.Graph], list[tuple[tf.Variable, tf.Operation]]],
        flush_at_end: bool,
    ) -> None:
        self._built_windows = built_windows  # graph -> [(counter, flush op)]
        self._flush_at_end = flush_at_end
        self._counters: list[tf.Variable] | None = None
        self._flushes: list[tf.Operation] | None = None
        self._global_step: tf.Variable | None = None
        self._filter: _UnmovedStepFilter | None = None

    def begin(self) -> None:
        graph = tf.compat.v1.get_default_graph()
        built = self._built_windows(graph)
        if not built:
            raise ValueError(
                "The AccumulationOptimizer of this hook has no train op in the graph of the "
                "session: call its minimize() before the MonitoredTrainingSession is created."
            )
        self._counters = [counter for counter, _ in built]
        self._flushes = [flush for _, flush in built]
        self._global_step = tf.compat.v1.train.get_global_step(graph)

    def after_create_session(
        self, session: tf.compat.v1.Session, coord: tf.train.Coordinator
    ) -> None:
        if self._counters is None:
            raise RuntimeError(
                "AccumulationHook.after_create_session() ran before begin(): call begin() first."
            )
        logger = tf.get_logger()
        for old in [f for f in logger.filters if isinstance(f, _UnmovedStepFilter)]:
            if not old.active():  # a session closed without end()
                logger.removeFilter(old)
        self._filter = _UnmovedStepFilter(session)
        logger.addFilter(self._filter)
        # The CheckpointSaverHook of the session need not warn of these windows.
        _unhooked.keep_windows(session, self._counters)

    def end(self, session: tf.compat.v1.Session) -> None:
        tf.get_logger().removeFilter(self._filter)  # None, or this session's: removed once
        self._filter = None
        pending = sum(int(count) for count in session.run(self._counters))
        if not pending:
            return
        if self._flush_at_end:
            session.run(self._flushes)
        # A kept window is saved with the graph's one saver, as its last checkpoint was.
        savers = session.graph.get_collection(tf.compat.v1.GraphKeys.SAVERS)
        last = savers[0].last_checkpoints if len(savers) == 1 else []
        if not last or self._global_step is None:
            # Flushed, the window is applied: only a kept one is lost here.
            if not self._flush_at_end:
                warnings.warn(
                    f"tf1_accum: {pending} micro-batches since the last update are in no "
                    "checkpoint: no saver in tf.compat.v1.GraphKeys.SAVERS wrote one in this "
                    "session, or there is no global step.",
                    stacklevel=1,  # the warning points at end(), as it did from the save
                )
            return
        # The path of the saver's checkpoints, without the step suffix it adds.
        prefix = re.sub(r"-\d+$", "", last[-1])
        step = int(session.run(self._global_step))
        savers[0].save(session, prefix, global_step=step)
