"""Accumulation across Horovod workers: one ``hvd.allreduce`` per window.

Packed as `CollectiveAllReduce` packs it; Horovod is imported only when a
`HorovodAllReduce` is made.
"""

from __future__ import annotations

import itertools
import typing

from tf1_accum._compat import tf

from tf1_accum import _validate, _distributed

_NO_HOROVOD = (
    "HorovodAllReduce needs Horovod built with TensorFlow support; 'import horovod.tensorflow' "
    "failed ({error}). Build it: HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 pip install "
    "--no-build-isolation horovod (docs: distributed), or use tf1_accum.CollectiveAllReduce."
)

# Each object made in this process takes the next default name, as on every worker.
_made = itertools.count()


class HorovodAllReduce(_distributed.Engine):
    """Sums the windows of Horovod's workers in one ``hvd.allreduce`` per window.

    Pass one as ``cross_replica=`` to any way in, in a program started by
    ``horovodrun`` (after ``hvd.init()``); every worker applies the update of
    large-batch training on every worker's micro-batches. Horovod matches ops
    by name, so every worker builds the accumulations and
    `broadcast_variables` in the same order; run `broadcast_variables` (or
    add `broadcast_hook`) after initialization; no session config. See
    :doc:`distributed`.

    Args:
        name: Prefix of the names of the Horovod ops this object builds, the
            same on every worker; by default ``"tf1_accum<i>"``, i counting
            the objects made in this process.

    Raises:
        ImportError: If Horovod's TensorFlow ops cannot be imported (Horovod
            is not installed, or was built without TensorFlow).
        TypeError: If ``name`` is not a string.
        ValueError: If ``name`` is empty or holds a character other than
            letters, digits and ``_``, or ``hvd.init()`` has not run.
    """

    _kind = "Horovod"

    def __init__(self, *, name: str | None = None) -> None:
        if name is not None:
            if not isinstance(name, str):
                raise _validate.type_error("name", name, "a string or None")
            if not name or not all(c.isascii() and (c.isalnum() or c == "_") for c in name):
                raise ValueError(
                    f"name must be a non-empty string of letters, digits and '_', got {name!r}."
                )
        try:
            import horovod.tensorflow as hvd
        except ImportError as error:
            raise ImportError(_NO_HOROVOD.format(error=error)) from error
        if not hvd.is_initialized():
            raise ValueError("Horovod is not initialized: call hvd.init() first.")
        self._hvd = hvd
        self.name = f"tf1_accum{next(_made)}" if name is None else name

    # Horovod's broadcast sends these (and more that no variable holds).
    _broadcast_dtypes = tuple(
        map(tf.as_dtype, "bool uint8 int8 uint16 int16 int32 int64 float16 float32 float64".split())
    )

    @property
    def num_workers(self) -> int:
        """W, Horovod's ``size()``: the number of workers."""
        return self._hvd.size()

    @property
    def task_index(self) -> int:
        """This worker's Horovod ``rank()``; rank 0 is the source of `broadcast_variables`."""
        return self._hvd.rank()

    def broadcast_hook(
        self, var_list: typing.Sequence[tf.Variable] | None = None
    ) -> tf.compat.v1.train.SessionRunHook:
        """A hook running `broadcast_variables` (of ``var_list``) once each session is created.

        It replaces ``hvd.BroadcastGlobalVariablesHook``, which TensorFlow after 2.15 lacks.
        """
        return _BroadcastHook(lambda: _distributed.broadcast_variables(self, var_list))

    def _all_reduce(self, flat: tf.Tensor, key: int) -> tf.Tensor:
        # A scope of its own: the op's name stays the Horovod name beside a second op of this key.
        with tf.compat.v1.name_scope(None, "horovod"):
            return self._hvd.allreduce(
                flat, op=self._hvd.Sum, name=f"{self.name}_window_{key}", ignore_name_scope=True
            )

    def _broadcast(self, flat: tf.Tensor, key: int) -> tf.Tensor:
        with tf.compat.v1.name_scope(None, "horovod"):
            return self._hvd.broadcast(
                flat, 0, name=f"{self.name}_broadcast_{key}", ignore_name_scope=True
            )


class _BroadcastHook(tf.compat.v1.train.SessionRunHook):
    """Made by `HorovodAllReduce.broadcast_hook`, which documents it."""

    def __init__(self, build: typing.Callable[[], tf.Operation]) -> None:
        self._build = build  # the broadcast, in the graph being built
        self._op = None

    def begin(self) -> None:
        if self._op is None or self._op.graph is not tf.compat.v1.get_default_graph():
            self._op = self._build()

    def after_create_session(
        self, session: tf.compat.v1.Session, coord: tf.compat.v1.train.Coordinator
    ) -> None:
        session.run(self._op)
