"""The window options (`WindowOptions`): one typed value, checked when made."""

from __future__ import annotations

import dataclasses
import typing

from tf1_accum._compat import control_flow_context, tf

from tf1_accum import _validate

#: A gradient: dense, or sparse rows.
Gradient = typing.Union[tf.Tensor, tf.IndexedSlices]
#: ``(gradient, variable)`` pairs, as ``compute_gradients`` returns them.
Pairs = typing.Sequence[typing.Tuple[Gradient, tf.Variable]]


class WindowMean(typing.NamedTuple):
    """What a gradient transform knows of the window it transforms.

    Attributes:
        global_norm: ``float64`` scalar: the global norm of the window's mean
            (or sum) over every variable, before any transform.
        micro_batches: ``int64`` scalar: the window's micro-batches (of every
            worker, with ``cross_replica``).
    """

    global_norm: tf.Tensor
    micro_batches: tf.Tensor


#: ``transform(gradient, variable, window)`` returns the gradient to apply
#: for ``variable``: see `clip_by_global_norm`. A sparse ``gradient`` holds
#: each row the window touched once, summed over its lookups.
GradientTransform = typing.Callable[[Gradient, tf.Variable, WindowMean], Gradient]


def clip_by_global_norm(clip_norm: float) -> GradientTransform:
    """A gradient transform that clips the window's mean to a global norm.

    ``clip_norm=c`` is this transform, run before ``transform=``: each
    gradient times ``c / max(global_norm, c)``, as ``tf.clip_by_global_norm``.

    >>> with tf.Graph().as_default():
    ...     v = tf.compat.v1.Variable([0.0, 0.0])
    ...     window = tf1_accum.WindowMean(
    ...         tf.constant(4.0, tf.float64), tf.constant(2, tf.int64))
    ...     clip = tf1_accum.clip_by_global_norm(1.0)
    ...     clipped = clip(tf.constant([2.0, 0.0]), v, window)
    ...     print(tf.compat.v1.Session().run(clipped).tolist())
    [0.5, 0.0]

    Args:
        clip_norm: A positive, finite number (``clip_norm=None`` in a way in
            does not clip).

    Returns:
        A gradient transform, as ``transform=`` takes.

    Raises:
        TypeError, ValueError: If ``clip_norm`` is not a positive, finite
            number.
    """
    _validate.check_clip_norm(clip_norm)

    def clip(gradient: Gradient, variable: tf.Variable, window: WindowMean) -> Gradient:
        del variable
        factor = clip_norm / tf.maximum(window.global_norm, clip_norm)
        if isinstance(gradient, tf.IndexedSlices):
            values = gradient.values * tf.cast(factor, gradient.values.dtype)
            return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
        return gradient * tf.cast(factor, gradient.dtype)

    clip.__qualname__ = f"clip_by_global_norm({clip_norm})"
    return clip


@dataclasses.dataclass(frozen=True)
class WindowOptions:
    """The window options, the same in every way in, checked when made.

    Every way in takes them as keywords and makes one `WindowOptions`
    (`Accumulation.options`, ``options`` of a `TrainOpWindow`); :ref:`window-options`
    explains them (and ``weight``, ``cross_replica`` and ``fused``, which are
    not kept here) and :ref:`api-options` says which way in takes which. The
    options cannot change; a deep copy is the options themselves.

    Raises:
        TypeError: If ``average``, ``skip_nonfinite`` or ``statistics`` is not
            a bool, ``clip_norm`` or ``micro_batch_size`` not a number,
            ``transform`` not a callable or list of them, or ``update_ops``
            not None or a list of ops or tensors.
        ValueError: If ``clip_norm`` or ``micro_batch_size`` is not positive
            and finite, or options do not go together: ``statistics=True``
            without ``micro_batch_size`` or ``weight``; ``micro_batch_size``
            without ``statistics=True``, or with ``weight``.
    """

    #: Apply the window's mean (True) or its sum.
    average: bool = True
    #: Whether each micro-batch has a ``weight``.
    weighted: bool = False
    #: Clip the window's gradient to this global norm before the apply (None: no clipping).
    clip_norm: typing.Optional[float] = None
    #: Gradient transforms run in order on each variable's mean, after ``clip_norm``'s.
    #: A sparse gradient arrives as one row per row the window touched, each
    #: once: the sum of its lookups over the window, divided as a dense mean is
    #: (not a row per lookup, as TensorFlow's own slices hold: see
    #: :ref:`sparse-transforms`).
    transform: typing.Union[GradientTransform, typing.Sequence[GradientTransform], None] = None
    #: Skip, and count, a window whose gradient holds a NaN or an Inf.
    skip_nonfinite: bool = True
    #: Ops run with each micro-batch (a tuple); None: the graph's ``UPDATE_OPS``.
    #: With ``weight=``, the update ops wait for the weight's check, so running
    #: them alone needs the weight fed (an op two weighted windows share waits
    #: for neither's, and is not held back on a refused micro-batch).
    update_ops: typing.Optional[typing.Sequence[typing.Any]] = None
    #: Also build the window's `GradientStatistics` (:doc:`statistics`).
    statistics: bool = False
    #: Examples per micro-batch, for ``statistics``; needed unless ``weight`` is given.
    micro_batch_size: typing.Optional[float] = None

    def __post_init__(self) -> None:
        _validate.check_bool("average", self.average)
        # clip_norm= is its transform, run first; clip_by_global_norm checks it.
        clip = () if self.clip_norm is None else (clip_by_global_norm(self.clip_norm),)
        _check_transform(self.transform)
        given: tuple[GradientTransform, ...] = ()
        if self.transform is not None:
            given = (self.transform,) if callable(self.transform) else tuple(self.transform)
            object.__setattr__(self, "transform", given)
        object.__setattr__(self, "_transforms", clip + given)
        _validate.check_bool("skip_nonfinite", self.skip_nonfinite)
        _validate.check_statistics_options(self.statistics, self.micro_batch_size, self.weighted)
        update_ops = _validate.check_update_ops(self.update_ops)
        object.__setattr__(self, "update_ops", None if update_ops is None else tuple(update_ops))

    def __deepcopy__(self, _memo: dict) -> WindowOptions:
        return self


def transforms_of(options: WindowOptions) -> tuple[GradientTransform, ...]:
    """The gradient transforms in the order they run: ``clip_norm``'s, then ``transform``."""
    return typing.cast(tuple, options._transforms)  # type: ignore[attr-defined]


def update_ops_in(options: WindowOptions, graph: tf.Graph) -> list[tf.Operation]:
    """The ops to run with each micro-batch: ``update_ops`` (of ``graph``), or ``UPDATE_OPS``."""
    if options.update_ops is None:
        return list(graph.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS))
    return typing.cast(list, _validate.check_update_ops(options.update_ops, graph))


def _check_transform(transform: typing.Any) -> None:
    """Checks that ``transform`` is None, a callable or a sequence of callables."""
    if transform is None or callable(transform):
        return
    listed = isinstance(transform, (list, tuple))
    for i, item in enumerate(transform if listed else [transform]):
        if not callable(item):
            name = f"transform[{i}]" if listed else "transform (or each item of a list)"
            raise TypeError(
                f"{name} must be a callable (gradient, variable, window) -> gradient, got "
                f"{_validate.describe(item)}."
            )


def transformed(
    gradient: Gradient,
    variable: tf.Variable,
    window: WindowMean,
    transforms: typing.Sequence[GradientTransform],
) -> Gradient:
    """``gradient`` after each of ``transforms``, each checked to return the gradient's kind."""
    for transform in transforms:
        with tf.variable_creator_scope(_created_outside):
            result = transform(gradient, variable, window)
        name = getattr(transform, "__qualname__", repr(transform))
        sparse = isinstance(gradient, tf.IndexedSlices)
        what = "tf.IndexedSlices for the sparse gradient" if sparse else "a tensor for the gradient"
        if not isinstance(result, tf.IndexedSlices if sparse else tf.Tensor):
            raise TypeError(
                f"transform {name} must return {what} of {variable.op.name}, got "
                f"{_validate.describe(result)}."
            )
        values, got = (gradient.values, result.values) if sparse else (gradient, result)
        dtype = values.dtype.base_dtype
        if got.dtype.base_dtype != dtype:
            raise TypeError(
                f"transform {name} must return the gradient's dtype {dtype.name} for "
                f"{variable.op.name}, got {got.dtype.base_dtype.name}: cast its result."
            )
        if not got.shape.is_compatible_with(values.shape):
            shape = got.shape.as_list() if got.shape.rank is not None else got.shape
            raise ValueError(
                f"transform {name} must return the gradient's shape {values.shape.as_list()} for "
                f"{variable.op.name}, got {shape}."
            )
        gradient = result
    return gradient


def _created_outside(
    next_creator: typing.Callable[..., tf.Variable], **kwargs: typing.Any
) -> tf.Variable:
    """Creates a transform's variable in ``init_scope``, clear of the apply's conditional."""
    value = kwargs.get("initial_value")
    if isinstance(value, tf.Tensor):
        with tf.init_scope():
            outer = tf.compat.v1.get_default_graph()
        if value.graph is not outer or control_flow_context(value.op) is not None:
            raise ValueError(
                "A gradient transform creates a variable from a tensor computed where the "
                f"apply is built ({value.name}), a conditional: initialize it from a callable."
            )
    with tf.init_scope():
        return next_creator(**kwargs)
