"""A Saver whose checkpoints never catch a window in the middle of an op (see concepts.rst)."""

from __future__ import annotations

import typing

from tf1_accum._compat import add_control_inputs, set_input, tf
from tf1_accum._locking import ancestors, on_device

from tf1_accum._state import MUTEX_COLLECTION, STATE_COLLECTION


class Saver(tf.compat.v1.train.Saver):
    """A ``tf.compat.v1.train.Saver`` that saves and restores whole windows.

    Its save and restore hold the mutex of every window built in its graph
    before it, so a checkpoint written while other threads train holds each
    window whole; "Checkpoints" in :doc:`concepts` says where to pass it.

    Example:

    >>> import tempfile
    >>> import numpy as np
    >>> with tf.Graph().as_default():
    ...     x = tf.compat.v1.placeholder(tf.float32, [None])
    ...     w = tf.compat.v1.get_variable("w", initializer=1.0)
    ...     loss = tf.reduce_mean((w * x - 2.0 * x) ** 2)
    ...     acc = tf1_accum.build_accumulation(
    ...         loss, tf.compat.v1.train.GradientDescentOptimizer(0.1))
    ...     saver = tf1_accum.Saver()
    ...     with tf.compat.v1.Session() as sess:
    ...         sess.run(tf.compat.v1.global_variables_initializer())
    ...         _ = sess.run(acc.accum_op, {x: np.array([1.0, 2.0])})
    ...         path = saver.save(sess, tempfile.mkdtemp() + "/ckpt")
    ...         sess.run(acc.zero_op)
    ...         saver.restore(sess, path)
    ...         print(sess.run(acc.counter))
    1

    Raises:
        ValueError, TypeError: As ``tf.compat.v1.train.Saver``.
        NotFoundError: From ``restore``, as ``tf.compat.v1.train.Saver``'s; a
            checkpoint lacking a window's variable (another layout of the
            window: an earlier tf1_accum, other options) is refused whole,
            saying what to do.
    """

    def restore(self, sess: typing.Any, save_path: typing.Any) -> None:
        """As ``Saver.restore``; a checkpoint of another window layout is refused, saying why."""
        try:
            super().restore(sess, save_path)
        except tf.errors.NotFoundError as error:
            # RestoreV2 reads every key before any assign: nothing was restored by its
            # one restore op (a sharded saver runs one a device, some may have assigned).
            saved = {name for name, _ in tf.train.list_variables(save_path)}
            state = sess.graph.get_collection(STATE_COLLECTION)
            missing = [v.op.name for v in state if v.op.name not in saved]
            if not missing:
                raise
            message = (
                f"tf1_accum: the checkpoint {save_path} holds no {', '.join(missing)}: its window "
                "has another layout (another tf1_accum, or other weight=, statistics=). Nothing "
                "was restored (by a sharded Saver, perhaps another device's: restore or initialize "
                "them again). Restore it with the tf1_accum and options that saved it, finish the "
                "window (apply_op or flush_op) and save again; or drop the partial window: "
                "initialize every variable, then "
                "tf.compat.v1.train.Saver(tf1_accum.plain_variables()).restore(sess, path)."
            )
            raise type(error)(error.node_def, error.op, message) from error

    def build(self) -> None:
        """As ``Saver.build``: the save and restore ops, each holding every window's mutex."""
        graph = tf.compat.v1.get_default_graph()
        before = {op.name for op in graph.get_operations()}
        super().build()
        # A Scaffold builds its saver again: a second lock of one mutex would deadlock.
        if tf.executing_eagerly() or self.saver_def is None or getattr(self, "_locked", False):
            return
        self._locked = True
        mutexes = sorted(graph.get_collection(MUTEX_COLLECTION), key=lambda m: m.name)
        if not mutexes:
            return
        created = {op.name: op for op in graph.get_operations() if op.name not in before}
        save = graph.as_graph_element(self.saver_def.save_tensor_name).op
        restore = graph.as_graph_element(self.saver_def.restore_op_name)
        with tf.compat.v1.name_scope(save.name.rsplit("/", 1)[0] + "/"):
            _locked(save, created, mutexes, "save")
            _locked(restore, created, mutexes, "restore")


def _locked(last: tf.Operation, created: dict, mutexes: list[tf.Tensor], name: str) -> None:
    """Makes the ops ``last`` runs among ``created`` (by name) run holding every mutex, in order."""
    section = [op for op in ancestors([last], created).values() if op is not last]

    with tf.control_dependencies(None):
        locks: list[tf.Tensor] = []
        for mutex in mutexes:
            with on_device(mutex.device), tf.control_dependencies(locks[-1:]):
                locks.append(tf.raw_ops.MutexLock(mutex=mutex, name=f"{name}_lock"))
        lock = locks[-1].op
        for op in section:
            for index, tensor in enumerate(list(op.inputs)):
                if tensor.op.name in created:
                    continue
                if tensor.op.type == "ReadVariableOp":
                    # A variable's cached read, made with it: read it again, locked.
                    handle = tensor.op.inputs[0]
                    with tf.device(tensor.op.device), tf.control_dependencies([lock]):
                        again = tf.raw_ops.ReadVariableOp(
                            resource=handle, dtype=tensor.dtype, name=f"{name}_read"
                        )
                    set_input(op, index, again)
                elif lock not in op.control_inputs:
                    add_control_inputs(op, [lock])
        finished = [t.op for t in last.inputs] + list(last.control_inputs)
        releases = []
        for lock, mutex in zip(locks, mutexes):
            with on_device(mutex.device), tf.control_dependencies(finished):
                releases.append(tf.raw_ops.ConsumeMutexLock(mutex_lock=lock, name=f"{name}_unlock"))
    add_control_inputs(last, releases)
