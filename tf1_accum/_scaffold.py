"""A Scaffold for loops a framework owns: start from a plain checkpoint, or resume a full one."""

from __future__ import annotations

import typing

from tf1_accum._compat import tf

from tf1_accum._saver import Saver
from tf1_accum._state import STATE_COLLECTION, plain_variables


class _PlainOrFullSaver(Saver):
    """Saves every global variable; restores a checkpoint with or without tf1_accum's state."""

    def __init__(self, max_to_keep: int) -> None:
        # Both savers write (and read) the same layout of checkpoint.
        layout: dict = dict(sharded=True, allow_empty=True, save_relative_paths=True)
        super().__init__(max_to_keep=max_to_keep, **layout)
        graph = tf.compat.v1.get_default_graph()
        saved = {id(v) for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
        self._state = [v for v in graph.get_collection(STATE_COLLECTION) if id(v) in saved]
        self._plain = tf.compat.v1.train.Saver(plain_variables(graph), **layout)
        self._initialize_state = tf.compat.v1.variables_initializer(
            self._state, name="initialize_accumulation_state"
        )

    def restore(self, sess: tf.compat.v1.Session, save_path: str) -> None:
        """Restores ``save_path``; without tf1_accum's state, initializes that state instead.

        Raises:
            ValueError: If the checkpoint holds some of tf1_accum's state but not all.
        """
        held = tf.train.load_checkpoint(save_path).get_variable_to_shape_map()
        missing = [v.op.name for v in self._state if v.op.name not in held]
        if not missing:
            return super().restore(sess, save_path)
        if len(missing) < len(self._state):
            raise ValueError(
                f"Checkpoint {save_path} holds part of tf1_accum's state but not "
                f"{', '.join(missing)}: another accumulation wrote it. Restore it with "
                "tf.compat.v1.train.Saver(tf1_accum.plain_variables()) and initialize the rest."
            )
        self._plain.restore(sess, save_path)
        sess.run(self._initialize_state)


def make_scaffold(
    max_to_keep: int, scaffold_kwargs: dict[str, typing.Any]
) -> tf.compat.v1.train.Scaffold:
    """Returns a ``Scaffold`` whose saver is a `_PlainOrFullSaver`, also in ``SAVERS``.

    Raises:
        TypeError: If ``scaffold_kwargs`` holds ``saver``, or ``max_to_keep``
            is not an int.
        ValueError: If the graph already has a saver in ``SAVERS``.
    """
    if "saver" in scaffold_kwargs:
        raise TypeError(
            "make_scaffold makes the Scaffold's saver (it restores plain and accumulating "
            "checkpoints): pass the other Scaffold arguments only, not saver="
        )
    if isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int):
        raise TypeError(f"max_to_keep must be an int, got {max_to_keep!r}.")
    graph = tf.compat.v1.get_default_graph()
    savers = graph.get_collection(tf.compat.v1.GraphKeys.SAVERS)
    if savers:
        raise ValueError(
            f"The graph already has {len(savers)} saver(s) in tf.compat.v1.GraphKeys.SAVERS: "
            "make the scaffold before any saver is added there, and add none."
        )
    saver = _PlainOrFullSaver(max_to_keep)
    # The saver CheckpointSaverHook, Estimator and the accumulation hook find.
    graph.add_to_collection(tf.compat.v1.GraphKeys.SAVERS, saver)
    return tf.compat.v1.train.Scaffold(saver=saver, **scaffold_kwargs)
