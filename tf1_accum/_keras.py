"""Keras optimizers in a TF1 graph: the legacy ones through an adapter, the rest refused.

`KerasOptimizerAdapter` gives a tf_keras legacy ``OptimizerV2`` the
``tf.compat.v1.train.Optimizer`` interface. Classes are recognized by name
along their MRO, so neither tf_keras nor Keras is imported here.
"""

from __future__ import annotations

import sys
import typing

from tf1_accum._compat import keras_clip, keras_inner_optimizer, keras_names
from tf1_accum._compat import keras_optimizer_name, tf

# Keras optimizer class name -> the tf.compat.v1.train optimizer doing the same job.
_KERAS_TO_V1 = {
    "SGD": "tf.compat.v1.train.GradientDescentOptimizer (or MomentumOptimizer)",
    "Adam": "tf.compat.v1.train.AdamOptimizer",
    "RMSprop": "tf.compat.v1.train.RMSPropOptimizer",
    "Adagrad": "tf.compat.v1.train.AdagradOptimizer",
    "Adadelta": "tf.compat.v1.train.AdadeltaOptimizer",
    "Ftrl": "tf.compat.v1.train.FtrlOptimizer",
}

#: tf_keras's loss-scale optimizers (and their subclasses): they scale no loss in a TF1 graph.
_LOSS_SCALE_CLASSES = ("LossScaleOptimizer", "BaseLossScaleOptimizer")


def _has_class(optimizer: object, names: tuple[str, ...], module: str) -> bool:
    """Whether a class along ``optimizer``'s MRO is one of ``names``, of a ``*module*`` module."""
    return any(
        cls.__name__ in names and module in cls.__module__ for cls in type(optimizer).__mro__
    )


def is_legacy_keras_optimizer(optimizer: object) -> bool:
    """Whether ``optimizer`` is a Keras 2 ``OptimizerV2`` (tf_keras.optimizers.legacy.*)."""
    return _has_class(optimizer, ("OptimizerV2",), "optimizer_v2")


def _is_keras_3(optimizer: object) -> bool:
    if type(optimizer).__module__.split(".")[0] != "keras":
        return False
    major = getattr(sys.modules.get("keras"), "__version__", "0").split(".")[0]
    return major.isdigit() and int(major) >= 3


def refusal_hint(optimizer: object) -> str:
    """What to use instead of a Keras optimizer that builds no graph-mode ops; "" if not Keras."""
    name = type(optimizer).__name__
    if "keras" not in type(optimizer).__module__:
        return ""
    v1 = _KERAS_TO_V1.get(name, "the matching tf.compat.v1.train optimizer")
    legacy = "its tf_keras.optimizers.legacy counterpart"
    legacy = f"tf_keras.optimizers.legacy.{name}" if name in _KERAS_TO_V1 else legacy
    what = "Keras optimizers other than the legacy ones"
    what = "Keras 3 optimizers" if _is_keras_3(optimizer) else what
    return keras_names(
        f" {what} do not build TF1 graph-mode ops for a Session. Use {legacy} (tf_keras "
        f"package; tf.keras.optimizers.legacy.{name} with TF_USE_LEGACY_KERAS=1) or {v1} instead."
    )


def adapt(optimizer: object) -> tf.compat.v1.train.Optimizer | None:
    """Returns ``optimizer`` as a ``tf.compat.v1.train.Optimizer``, or None if it cannot be."""
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        return optimizer
    if is_legacy_keras_optimizer(optimizer):
        if _has_class(optimizer, _LOSS_SCALE_CLASSES, "mixed_precision"):
            inner = keras_inner_optimizer(optimizer)
            inner = type(inner).__name__ if inner is not None else "the optimizer"
            raise TypeError(
                keras_names(
                    f"tf1_accum does not support a Keras {type(optimizer).__name__} (tf_keras."
                    "mixed_precision): use tf.compat.v1.mixed_precision.MixedPrecisionLossScale"
                    f"Optimizer(tf.compat.v1.train.<Optimizer>(...), 'dynamic') for {inner}."
                )
            )
        return KerasOptimizerAdapter(optimizer)
    return None


def given(optimizer: object) -> typing.Any:  # a tf.compat.v1 or a Keras optimizer
    """The optimizer the user passed: the Keras optimizer behind an adapter."""
    return getattr(optimizer, "keras_optimizer", optimizer)


def check_variables(
    optimizer: tf.compat.v1.train.Optimizer, var_list: typing.Iterable[tf.Variable]
) -> None:
    """Checks that a Keras optimizer is asked to train resource variables only.

    Raises:
        TypeError: If a variable is a reference variable.
    """
    if not isinstance(optimizer, KerasOptimizerAdapter):
        return
    for var in var_list:
        if var.dtype != var.dtype.base_dtype:
            raise TypeError(
                f"Keras' {type(optimizer.keras_optimizer).__name__} updates resource variables "
                f"only, but {var.op.name} is a reference variable: create it with "
                "use_resource=True, or use the matching tf.compat.v1.train optimizer."
            )


class KerasOptimizerAdapter(tf.compat.v1.train.Optimizer):
    """A tf_keras legacy optimizer with the ``tf.compat.v1.train.Optimizer`` interface.

    ``compute_gradients`` is TF1's, so Keras' clipping (in its apply; on 1.15,
    `_compat.keras_clip`) clips the window's gradient; ``apply_gradients`` also
    advances ``global_step`` once, unless it is the Keras ``iterations``.
    """

    def __init__(self, keras_optimizer: typing.Any) -> None:
        super().__init__(use_locking=False, name=keras_optimizer_name(keras_optimizer))
        self.keras_optimizer = keras_optimizer

    def compute_gradients(
        self, *args: typing.Any, **kwargs: typing.Any
    ) -> list[tuple[tf.Tensor | tf.IndexedSlices | None, tf.Variable]]:
        pairs = super().compute_gradients(*args, **kwargs)
        check_variables(self, [v for _, v in pairs])
        return pairs

    def apply_gradients(
        self,
        grads_and_vars: typing.Iterable[tuple[tf.Tensor | tf.IndexedSlices | None, tf.Variable]],
        global_step: tf.Variable | None = None,
        name: str | None = None,
    ) -> tf.Operation:
        grads_and_vars = [(g, v) for g, v in grads_and_vars if g is not None]
        grads_and_vars = keras_clip(self.keras_optimizer, grads_and_vars)
        update = self.keras_optimizer.apply_gradients(grads_and_vars, name=name)
        if global_step is None or global_step is self.keras_optimizer.iterations:
            return update
        with tf.control_dependencies([update]):
            return tf.group(global_step.assign_add(1, read_value=False), name=name)

    def get_slot(self, var: tf.Variable, name: str) -> tf.Variable | None:
        try:
            return self.keras_optimizer.get_slot(var, name)
        except KeyError:  # Keras raises where TF1 returns None
            return None

    def get_slot_names(self) -> list[str]:
        return self.keras_optimizer.get_slot_names()

    def variables(self) -> list[tf.Variable]:
        graph = tf.compat.v1.get_default_graph()
        return [v for v in self.keras_optimizer.variables() if v.graph is graph]
