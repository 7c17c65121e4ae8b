"""The ways into a window, behind one protocol, so an option test is written once.

A test parametrized over `WAYS` builds its model through `WayIn.build` and
runs each window through `WayIn.run_window`; it never asks which way it was
given. The model is a function of the micro-batch's tensors, so the same
code serves the ways that feed placeholders and the dataset loop, which
draws micro-batches inside the graph. Where a way cannot do what a test
needs, the way says so in its ``cannot`` table, and the test skips with
`WayIn.require`, giving that reason.

The ways:

* ``ops``: ``build_accumulation``, ``accum_op`` run once per micro-batch,
  then ``apply_op``, by hand.
* ``helper``: ``build_accumulation`` and ``run_accumulation``.
* ``fused``: ``build_accumulation(..., fused=True)`` and ``run_accumulation``
  (the last micro-batch runs ``accum_apply_op``).
* ``optimizer``: ``AccumulationOptimizer``, its train op run once per
  micro-batch (and its ``flush_op`` after a window shorter than ``steps``).
* ``dataset``: ``build_dataset_accumulation``, one run of its train op per
  window, the micro-batches drawn in the graph.

And one way beside `WAYS`, for the tests of a framework's loop:

* ``hook``: as ``helper``, in the ``MonitoredTrainingSession`` of `WayIn.session`,
  whose hooks initialize the variables and (given ``cross_replica``)
  broadcast them through the engine's ``broadcast_hook``.

A way across workers is built with ``cross_replica=`` among its window
options, and `WayIn.session` makes the session that starts every worker from
worker 0's variables.
"""

import contextlib
import typing

import numpy as np
import tensorflow as tf

import tf1_accum

v1 = tf.compat.v1


class Built(typing.NamedTuple):
    """One way in, built in the default graph.

    Attributes:
        inputs: the placeholders a micro-batch's arrays are fed to, in order,
            or None (the dataset loop feeds nothing).
        window: what the way built: an ``Accumulation``, the
            ``AccumulationOptimizer`` or a ``DatasetAccumulation``.
        train_op: the op a run of the way runs: the wrapper's train op, the
            dataset loop's window op, or None (``accum_op`` and ``apply_op``
            of ``window``).
        steps: micro-batches per window, as the way was given them.
        counter: the micro-batches accumulated in the open window.
        skipped_windows: the windows skipped (a non-finite gradient).
        global_norm: the window's gradient norm, read in its apply run.
        statistics: the ``GradientStatistics`` (``statistics=True``), or None.
        window_loss: the mean loss of a window, computed by the window's own
            run (the dataset loop's), or None.
    """

    inputs: typing.Optional[tuple]
    window: typing.Any
    train_op: typing.Optional[tf.Operation]
    steps: int
    counter: tf.Variable
    skipped_windows: tf.Variable
    global_norm: tf.Tensor
    statistics: typing.Any
    window_loss: typing.Optional[tf.Tensor]

    def feed(self, batch):
        """The feed dict of one micro-batch (a tuple of arrays)."""
        return dict(zip(self.inputs, batch))


def placeholders_for(batch):
    """Placeholders taking micro-batches shaped like ``batch``, any number of rows."""
    return tuple(
        v1.placeholder(
            tf.as_dtype(np.asarray(a).dtype), [None, *np.shape(a)[1:]] if np.ndim(a) else []
        )
        for a in batch
    )


def dataset_of(batches):
    """A dataset whose elements are ``batches`` (tuples of arrays), in order.

    Micro-batches of one shape are stacked and sliced; micro-batches of
    different sizes are joined one element at a time.
    """
    batches = [tuple(np.asarray(a) for a in b) for b in batches]
    if len({tuple(a.shape for a in b) for b in batches}) == 1:
        return tf.data.Dataset.from_tensor_slices(tuple(np.stack(part) for part in zip(*batches)))
    dataset = tf.data.Dataset.from_tensors(batches[0])
    for batch in batches[1:]:
        dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))
    return dataset


class WindowOps(typing.NamedTuple):
    """The ops a window runs, where a program runs them itself (by name, after a restore).

    Each micro-batch but the last runs ``accumulate`` fed, the last runs
    ``last`` fed, then ``apply`` runs unfed, unless it is None.
    """

    accumulate: tf.Operation
    last: tf.Operation
    apply: typing.Optional[tf.Operation]


class WayIn:
    """The protocol: how a way is built with window options and runs a window.

    Attributes:
        name: the test id of the way.
        cannot: {capability: why this way lacks it}. Capabilities a test may
            need: ``"fetch_at_apply"`` (``run_window(fetch=...)`` evaluates a
            tensor in the apply run), ``"observe_micro_batches"``
            (``run_window(between=...)`` is called between the micro-batches
            of a window), ``"report_window_loss"`` (``Built.window_loss``),
            ``"feed_window_ops"`` (`window_ops`: a program can run the
            window's ops itself, fed one micro-batch each),
            ``"unfed_apply"`` (the apply is a run of its own, fed nothing,
            after the runs of the window's micro-batches).
        keeps_window_on_error: a micro-batch run that fails leaves the window
            open, holding the micro-batches before it (False: the way
            discards the whole window, as ``run_accumulation`` does).
    """

    name = ""
    cannot: typing.Dict[str, str] = {}
    keeps_window_on_error = True

    def __repr__(self):
        return self.name

    def error_pattern(self, index, message):
        """The pattern of the error a failure of micro-batch ``index`` raises."""
        return message

    def left_open_after_error(self, accumulated):
        """The counter after a micro-batch fails, ``accumulated`` micro-batches in."""
        return accumulated if self.keeps_window_on_error else 0

    def require(self, capability):
        """Skips the test, saying why, if this way lacks ``capability``."""
        if capability in self.cannot:
            import pytest  # only here: worker processes import this module without pytest

            pytest.skip(f"{self.name}: {self.cannot[capability]}")

    def make_input(self, data):
        """What `build` makes of ``data`` for the model: placeholders shaped like a micro-batch."""
        return placeholders_for(data[0])

    def build(self, model_fn, optimizer, data, steps, *, weight=None, global_step=None, **options):
        """Builds the way on the model that ``model_fn`` makes.

        Args:
            model_fn: ``model_fn(inputs)`` builds the model on one
                micro-batch's tensors (a tuple aligned with a micro-batch's
                arrays) and returns its loss.
            optimizer: the ``tf.compat.v1.train.Optimizer`` to accumulate for.
            data: every micro-batch the test will run, in order (tuples of
                arrays): the shapes of the placeholders, the dataset loop's
                data.
            steps: micro-batches per window (for the ways that count them).
            weight: ``weight(inputs)``, the micro-batch's weight from its
                tensors, or None.
            global_step: passed to the way.
            **options: window options (``average``, ``clip_norm``,
                ``skip_nonfinite``, ``update_ops``, ``statistics``,
                ``micro_batch_size``...), passed as they are.

        Returns:
            A `Built`.
        """
        raise NotImplementedError

    def window_ops(self, built):
        """The `WindowOps` a program runs for a window (needs ``"feed_window_ops"``)."""
        raise NotImplementedError

    def run_ops(self, built):
        """Every op `run_window` may run, in this order, for a count of what each depends on.

        An ``Accumulation``'s ``(apply_op, accum_op, accum_apply_op)``, the
        wrapper's ``(train_op, flush_op)``, the dataset loop's ``(train_op,)``.
        """
        raise NotImplementedError

    @contextlib.contextmanager
    def session(self, cross_replica=None, config=None):
        """A session for the built graph, its variables initialized, as a context manager.

        The global and local variables are initialized, as
        ``MonitoredTrainingSession`` does.

        Args:
            cross_replica: the engine the way was built with, or None. Given,
                every worker starts from worker 0's variables: the session
                runs ``tf1_accum.broadcast_variables(cross_replica)`` after the
                initializer.
            config: the session's ``ConfigProto``, or None.
        """
        sync = None if cross_replica is None else tf1_accum.broadcast_variables(cross_replica)
        with v1.Session(config=config) as sess:
            sess.run((v1.global_variables_initializer(), v1.local_variables_initializer()))
            if sync is not None:
                sess.run(sync)
            yield sess

    def run_window(self, sess, built, window, *, fetch=None, between=None):
        """Runs one window of micro-batches; returns ``fetch`` as read in its apply run.

        Args:
            sess: the session.
            built: what `build` returned.
            window: the window's micro-batches (tuples of arrays). The
                dataset loop draws them from its data, and asserts that it
                drew as many.
            fetch: anything ``Session.run`` takes, evaluated with the apply
                (needs ``"fetch_at_apply"``), or None.
            between: called with no argument after each micro-batch but the
                last, where the way runs micro-batches one by one (needs
                ``"observe_micro_batches"`` to be called at all).
        """
        raise NotImplementedError


def _run(sess, op, fetch, feed_dict=None):
    """Runs ``op`` and returns ``fetch`` (None fetches nothing) read in that run."""
    if fetch is None:
        sess.run(op, feed_dict)
        return None
    return sess.run((op, fetch), feed_dict)[1]


class _Built(WayIn):
    """The ways built by ``build_accumulation``."""

    fused = False

    def build(self, model_fn, optimizer, data, steps, *, weight=None, global_step=None, **options):
        inputs = self.make_input(data)
        loss = model_fn(inputs)
        acc = tf1_accum.build_accumulation(
            loss,
            optimizer,
            global_step=global_step,
            weight=None if weight is None else weight(inputs),
            fused=self.fused,
            **options,
        )
        return Built(
            inputs,
            acc,
            None,
            steps,
            acc.counter,
            acc.skipped_windows,
            acc.global_norm,
            acc.statistics,
            None,
        )

    def run_ops(self, built):
        return (built.window.apply_op, built.window.accum_op, built.window.accum_apply_op)


class Ops(_Built):
    name = "ops"
    cannot = {"report_window_loss": "its loss is a micro-batch's"}

    def window_ops(self, built):
        return WindowOps(built.window.accum_op, built.window.accum_op, built.window.apply_op)

    def run_window(self, sess, built, window, *, fetch=None, between=None):
        for i, batch in enumerate(window):
            if i and between is not None:
                between()
            sess.run(built.window.accum_op, built.feed(batch))
        return _run(sess, built.window.apply_op, fetch)


class Helper(_Built):
    """``run_accumulation``; a window of no micro-batch (a worker that has none
    of a window across workers) runs the apply alone, which that helper refuses.
    """

    name = "helper"
    cannot = {
        "fetch_at_apply": "run_accumulation runs the apply itself",
        "observe_micro_batches": "run_accumulation runs the window whole",
        "report_window_loss": "its loss is a micro-batch's",
    }
    keeps_window_on_error = False

    def error_pattern(self, index, message):
        return f"(?s)micro-batch {index} .*{message}"

    def run_window(self, sess, built, window, *, fetch=None, between=None):
        assert fetch is None, self.cannot["fetch_at_apply"]
        if not window:
            sess.run(built.window.apply_op)
            return
        tf1_accum.run_accumulation(sess, built.window, [built.feed(b) for b in window])

    def window_ops(self, built):  # what run_accumulation runs
        return Ops.window_ops(self, built)


class Fused(Helper):
    name = "fused"
    fused = True
    cannot = {**Helper.cannot, "unfed_apply": "the last micro-batch's run applies"}

    def window_ops(self, built):
        return WindowOps(built.window.accum_op, built.window.accum_apply_op, None)


class Optimizer(WayIn):
    name = "optimizer"
    cannot = {
        "report_window_loss": "its loss is a micro-batch's",
        "unfed_apply": "the run of the window's last micro-batch applies",
    }

    def build(self, model_fn, optimizer, data, steps, *, weight=None, global_step=None, **options):
        inputs = self.make_input(data)
        loss = model_fn(inputs)
        wrapper = tf1_accum.AccumulationOptimizer(
            optimizer, steps, weight=None if weight is None else weight(inputs), **options
        )
        train_op = wrapper.minimize(loss, global_step=global_step)
        return Built(
            inputs,
            wrapper,
            train_op,
            steps,
            wrapper.window.counter,
            wrapper.window.skipped_windows,
            wrapper.window.global_norm,
            wrapper.window.statistics,
            None,
        )

    def window_ops(self, built):
        return WindowOps(built.train_op, built.train_op, None)

    def run_ops(self, built):
        return (built.train_op, built.window.flush_op)

    def run_window(self, sess, built, window, *, fetch=None, between=None):
        for i, batch in enumerate(window):
            if i and between is not None:
                between()
            fetched = _run(sess, built.train_op, fetch, built.feed(batch))
        if len(window) < built.steps:
            fetched = _run(sess, built.window.flush_op, fetch)
        return fetched


class Dataset(WayIn):
    name = "dataset"
    cannot = {
        "observe_micro_batches": "one run draws and applies the whole window",
        "feed_window_ops": "its window is one run, fed nothing",
        "unfed_apply": "one run draws and applies the whole window",
    }

    def make_input(self, data):
        return dataset_of(data)

    def build(self, model_fn, optimizer, data, steps, *, weight=None, global_step=None, **options):
        acc = tf1_accum.build_dataset_accumulation(
            model_fn,
            optimizer,
            self.make_input(data),
            steps,
            global_step=global_step,
            weight=weight,
            **options,
        )
        return Built(
            None,
            acc,
            acc.train_op,
            steps,
            acc.counter,
            acc.skipped_windows,
            acc.global_norm,
            acc.statistics,
            acc.loss,
        )

    def run_window(self, sess, built, window, *, fetch=None, between=None):
        fetches = (built.train_op, built.window.micro_batches, () if fetch is None else fetch)
        _, drawn, fetched = sess.run(fetches)
        fetched = None if fetch is None else fetched
        assert drawn == len(window), f"the dataset loop drew {drawn} of {len(window)}"
        return fetched

    def run_ops(self, built):
        return (built.train_op,)


class Hooked(Helper):
    """``run_accumulation`` in a ``MonitoredTrainingSession`` that hooks start."""

    name = "hook"

    @contextlib.contextmanager
    def session(self, cross_replica=None, config=None):
        hooks = [] if cross_replica is None else [cross_replica.broadcast_hook()]
        with v1.train.MonitoredTrainingSession(
            hooks=hooks,
            config=config,
            save_checkpoint_secs=None,
            save_summaries_steps=None,
            log_step_count_steps=None,
        ) as sess:
            yield sess


# Every way in, once: tests parametrize over this, with ids from the names.
WAYS = (Ops(), Helper(), Fused(), Optimizer(), Dataset())
# The way through a framework's loop, for the tests that need it by name.
HOOK = Hooked()
BY_NAME = {way.name: way for way in (*WAYS, HOOK)}
