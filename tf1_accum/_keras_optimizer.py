"""A Keras 2 optimizer accumulating with `AccumulationOptimizer`'s window.

Keras 2 is the tf_keras package on TensorFlow 2, and ``tf.keras`` on 1.15
(`_compat.keras`); its ``OptimizerV2`` classes are ``tf_keras.optimizers.legacy``
there, ``tf.keras.optimizers`` on 1.15.
"""

from __future__ import annotations

import copy
import typing

import numpy as np
from tf1_accum import _compat
from tf1_accum._compat import keras_names, tf

from tf1_accum import _validate, _keras
from tf1_accum._optimizer import AccumulationOptimizer, TrainOpWindow, missing_attribute

try:
    keras = _compat.keras()
except ImportError as error:
    raise ImportError(
        "tf1_accum.KerasAccumulationOptimizer needs the tf_keras package: pip install tf_keras."
    ) from error

if typing.TYPE_CHECKING:
    # tf_keras ships no type information: to mypy, its optimizer is of unknown base.
    class _LegacyOptimizer(typing.Any): ...

else:
    _LegacyOptimizer = _compat.keras_optimizers().Optimizer

# The `WindowOptions` this optimizer takes, kept in its config.
_OPTIONS = ("average", "clip_norm", "skip_nonfinite")


def _check_wrapped(optimizer: typing.Any) -> None:
    """Checks that ``optimizer`` is a tf_keras legacy optimizer this class can wrap."""
    _validate.check_instance(optimizer)
    if getattr(type(optimizer), "_tf1_accum_accumulates", False):
        raise TypeError(
            f"KerasAccumulationOptimizer cannot wrap a KerasAccumulationOptimizer (steps="
            f"{optimizer.steps}): wrap the optimizer itself, with the product of the steps."
        )
    refused = f"optimizer must be a tf_keras legacy optimizer, got {_validate.describe(optimizer)}"
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise TypeError(
            keras_names(
                f"{refused}. A tf.compat.v1.train optimizer goes in tf1_accum.Accumulation"
                "Optimizer instead (or use its tf_keras.optimizers.legacy counterpart here)."
            )
        )
    _keras.adapt(optimizer)  # refuses tf_keras's LossScaleOptimizer, with what to use
    if isinstance(optimizer, _LegacyOptimizer):
        return
    if _keras.is_legacy_keras_optimizer(optimizer):
        raise TypeError(
            keras_names(
                f"{refused}, a Keras 2 optimizer of another package. Use tf_keras.optimizers."
                f"legacy.{type(optimizer).__name__}, or wrap it in tf1_accum.AccumulationOptimizer."
            )
        )
    raise TypeError(keras_names(refused + ".") + _keras.refusal_hint(optimizer))


def _wrapped(name: str, doc: str) -> property:
    """A property read from, and set on, the wrapped optimizer."""
    return property(
        lambda self: getattr(self._optimizer, name),
        lambda self, value: setattr(self._optimizer, name, value),
        doc=doc,
    )


@_compat.keras_serializable
class KerasAccumulationOptimizer(_LegacyOptimizer):
    """A tf_keras legacy optimizer that accumulates ``steps`` micro-batches per update.

    ``fit(batch_size=B)`` updates as ``fit(batch_size=steps * B)`` with
    ``optimizer`` alone; ``model.save('model.h5')`` keeps the window
    (:ref:`real-programs-keras-save`); ``iterations`` counts updates. On
    TensorFlow 1.15, whose ``tf.keras`` is Keras 2, it is a ``tf.keras``
    optimizer and wraps one (``tf.keras.optimizers.Adam``, ...).

    Example:

    >>> import numpy as np
    >>> import tf_keras
    >>> with tf.Graph().as_default(), tf.compat.v1.Session():
    ...     model = tf_keras.Sequential([tf_keras.layers.Dense(1, input_shape=(2,))])
    ...     opt = tf1_accum.KerasAccumulationOptimizer(
    ...         tf_keras.optimizers.legacy.Adam(0.01), steps=2)
    ...     model.compile(optimizer=opt, loss="mse")
    ...     _ = model.fit(np.ones((6, 2)), np.ones((6, 1)), batch_size=1, verbose=0)
    ...     print(tf_keras.backend.get_value(model.optimizer.iterations))
    3

    Args:
        optimizer: The tf_keras legacy optimizer that applies the updates
            (``tf_keras.optimizers.legacy.Adam``, ...); its ``clipnorm`` and
            ``global_clipnorm`` clip the window's mean.
        steps: Micro-batches per update, an int of at least 1.
        weight: Optional: a micro-batch's scalar weight, as a callable with
            no argument that returns it when ``fit`` builds the train op,
            computed from the model's inputs or targets (``lambda:
            tf.reduce_sum(tf.cast(tf.not_equal(model.targets[0], 0),
            tf.float32))`` for a loss averaged over the non-padding tokens);
            or a tensor. It is not saved with the model: give it again to the
            optimizer of a loaded one. See :ref:`real-programs-token-mean`.
        average, clip_norm, skip_nonfinite: See `WindowOptions` (:ref:`window-options`).
        name: Name of the optimizer and of the accumulation's name scope.

    Raises:
        TypeError: If ``optimizer`` is not a tf_keras legacy optimizer, or a
            Keras option (``clipnorm``, ...) is given here instead of to it.
        TypeError, ValueError: ``steps`` that is not an int of at least 1, or
            an option that `WindowOptions` refuses.
    """

    _tf1_accum_accumulates = True  # recognized by the other ways in, which refuse it

    def __init__(
        self,
        optimizer: typing.Any,
        steps: int,
        *,
        weight: tf.Tensor | typing.Callable[[], tf.Tensor] | None = None,
        average: bool = True,
        clip_norm: float | None = None,
        skip_nonfinite: bool = True,
        name: str = "KerasAccumulation",
        **kwargs: typing.Any,
    ) -> None:
        _check_wrapped(optimizer)
        _validate.check_steps(steps)
        super().__init__(name)
        self._optimizer = optimizer
        # What builds the train op (one per graph, in the name scope of this optimizer's name)
        # checks the weight and the options. Keras runs the model's updates itself: update_ops=[].
        options: dict = dict(average=average, clip_norm=clip_norm, skip_nonfinite=skip_nonfinite)
        self._accumulation = AccumulationOptimizer(
            optimizer, steps, weight=weight, update_ops=[], name=self._name, **options
        )
        if kwargs:
            raise TypeError(
                f"KerasAccumulationOptimizer takes no Keras option, got {sorted(kwargs)}: "
                "give clipnorm and the like to the wrapped optimizer."
            )
        self._accumulation._with_weight = (
            "KerasAccumulationOptimizer(optimizer, steps, weight=lambda: {})"
        )
        # Weights set before the window existed (load_model).
        self._pending: list[np.ndarray] | None = None

    optimizer = property(lambda self: self._optimizer, doc="The wrapped tf_keras legacy optimizer.")
    steps = property(lambda self: self._accumulation.steps, doc="Micro-batches per update.")
    iterations = _wrapped("iterations", "The wrapped optimizer's: the number of updates applied.")
    learning_rate = _wrapped("learning_rate", "The wrapped optimizer's (for Keras callbacks).")
    lr = learning_rate

    def _built(self, what: str) -> AccumulationOptimizer:
        """The `AccumulationOptimizer`, once it built the train op in the default graph."""
        if not self._accumulation._builds.of():
            raise ValueError(
                f"{what} exists once the train op is built in this graph (model.fit() builds it)."
            )
        return self._accumulation

    #: (counter, flush op) of the train op built in a graph, as `AccumulationOptimizer`'s.
    _built_windows = property(lambda self: self._accumulation._built_windows)

    def _state(self) -> list[tf.Variable]:
        """The window's variables in the default graph, in saved order."""
        return [v for build in self._accumulation._builds.of() for v in build.window._state()]

    @property
    def window(self) -> TrainOpWindow:
        """The `TrainOpWindow` of the train op built in the default graph.

        Raises:
            ValueError: If ``fit`` (or ``apply_gradients``) built none in this graph yet.
        """
        return self._built("window").window

    # A removed property's AttributeError names its `window` field (one release).
    __getattr__ = missing_attribute

    @property
    def flush_op(self) -> tf.Operation:
        """Applies the micro-batches of a partial window, as `AccumulationOptimizer`'s."""
        return self._built("flush_op").flush_op

    def apply_gradients(
        self,
        grads_and_vars: typing.Iterable[tuple[tf.Tensor | None, tf.Variable]],
        name: str | None = None,
        experimental_aggregate_gradients: bool = True,
    ) -> tf.Operation:
        """Builds the accumulating train op that ``model.fit`` runs for each micro-batch.

        Raises:
            RuntimeError: If eager execution is active.
            ValueError: If it built a train op in the graph already, or weights
                set before (by ``load_model``) do not match the window.
        """
        _validate.check_graph_mode("KerasAccumulationOptimizer.apply_gradients")
        if self._accumulation._builds.of():
            raise ValueError(
                "KerasAccumulationOptimizer builds one train op per graph, and it built one "
                "already: compile each model with its own KerasAccumulationOptimizer."
            )
        train_op = self._accumulation.apply_gradients(grads_and_vars, name=name)
        for variable in self._state():  # Keras initializes them in its session
            _compat.keras_track_variable(variable)
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self.set_weights(pending)
        return train_op

    def _create_all_weights(self, var_list: typing.Sequence[tf.Variable]) -> None:
        _compat.keras_create_all_weights(self._optimizer, var_list)

    def variables(self) -> list[tf.Variable]:
        """The wrapped optimizer's weights, then the window's (in this graph)."""
        return list(self._optimizer.weights) + self._state()

    @property
    def weights(self) -> list:  # of tf.Variable (an alias in a generic reads badly in the docs)
        """As `variables`: what ``model.save()`` writes and ``load_model`` sets."""
        return self.variables()

    def set_weights(self, weights: typing.Sequence[typing.Any]) -> None:
        """Sets the optimizer's state, as ``get_weights`` returns it (the window's once built).

        Raises:
            ValueError: If the number of values is not the number of weights.
        """
        # Values read now: load_model hands over HDF5 datasets of a file it then closes.
        weights = [np.asarray(w) for w in weights]
        wrapped = list(self._optimizer.weights)
        if self._accumulation._builds.of():
            params = self.weights
            if len(weights) != len(params):
                raise ValueError(
                    f"KerasAccumulationOptimizer {self._name} has {len(params)} weights "
                    f"({len(wrapped)} of {type(self._optimizer).__name__}, "
                    f"{len(params) - len(wrapped)} of the window), but {len(weights)} "
                    "values were given: they come from another optimizer or model."
                )
            keras.backend.batch_set_value(list(zip(params, weights)))
            return
        if len(weights) < len(wrapped):
            raise ValueError(
                f"KerasAccumulationOptimizer {self._name}: {len(weights)} values were given, "
                f"fewer than the {len(wrapped)} weights of {type(self._optimizer).__name__} alone."
            )
        keras.backend.batch_set_value(list(zip(wrapped, weights)))
        self._pending = weights

    def get_config(self) -> dict[str, typing.Any]:
        """The wrapped optimizer's config and the options.

        Raises:
            ValueError: If asked for by ``model.save()`` in the SavedModel format,
                or before ``fit`` built the train op of a model ``load_model`` returned.
        """
        if _compat.in_keras_saved_model_save():
            raise ValueError(
                "model.save() in the SavedModel format would drop the state of "
                "KerasAccumulationOptimizer (slots, iterations, window). Save the model in the "
                "HDF5 format, model.save('model.h5'), or pass include_optimizer=False."
            )
        if self._pending is not None:
            raise ValueError(
                "KerasAccumulationOptimizer holds the window load_model read until fit builds "
                "the train op. Train (model.fit) before saving, or use include_optimizer=False."
            )
        return {
            "name": self._name,
            "optimizer": keras.optimizers.serialize(self._optimizer),
            "steps": self.steps,
            **{key: getattr(self._accumulation._options, key) for key in _OPTIONS},
        }

    @classmethod
    def from_config(
        cls, config: dict[str, typing.Any], custom_objects: dict[str, typing.Any] | None = None
    ) -> KerasAccumulationOptimizer:
        config = copy.deepcopy(config)  # tf_keras's deserialize edits the dict it is given
        optimizer = _compat.keras_deserialize_optimizer(config.pop("optimizer"), custom_objects)
        return cls(optimizer, **config)
