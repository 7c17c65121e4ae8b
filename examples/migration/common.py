"""What the migration examples share: made-up data, a small model, the reference.

Every example trains the same two-layer network from the same seeded start on
the same micro-batches, made here from a fixed seed (nothing is downloaded).
`large_batch_training` is what accumulation must reproduce: one plain
``minimize`` step per window, on the window's micro-batches joined together.
"""

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1

FEATURES = 3
HIDDEN = 4
STEPS = 4  # micro-batches per update (N)
MICRO_BATCH = 5  # examples per micro-batch (B)
WINDOWS = 3  # updates
LEARNING_RATE = 0.1


def make_windows(sizes=None, windows=WINDOWS, seed=1):
    """Returns ``windows`` lists of micro-batches ``(x, y)``.

    ``sizes`` lists the number of examples of each micro-batch of a window;
    by default ``STEPS`` micro-batches of ``MICRO_BATCH``.
    """
    rng = np.random.RandomState(seed)
    sizes = sizes or [MICRO_BATCH] * STEPS
    result = []
    for _ in range(windows):
        window = []
        for size in sizes:
            x = rng.randn(size, FEATURES).astype(np.float32)
            y = (np.sin(x.sum(axis=1, keepdims=True)) + 0.1 * rng.randn(size, 1)).astype(np.float32)
            window.append((x, y))
        result.append(window)
    return result


def initial_params(seed=0):
    """The starting point of every run: {variable name: value}."""
    rng = np.random.RandomState(seed)
    return {
        "w1": rng.randn(FEATURES, HIDDEN).astype(np.float32),
        "b1": (0.1 * rng.randn(HIDDEN)).astype(np.float32),
        "w2": rng.randn(HIDDEN, 1).astype(np.float32),
    }


def build_model(params=None):
    """Placeholders, variables and the mean squared error of one batch.

    Returns ``(x, y, loss)``; the variables start at ``params`` (by default
    `initial_params`).
    """
    params = params or initial_params()
    x = v1.placeholder(tf.float32, [None, FEATURES], name="x")
    y = v1.placeholder(tf.float32, [None, 1], name="y")
    w1, b1, w2 = (v1.get_variable(name, initializer=params[name]) for name in ("w1", "b1", "w2"))
    prediction = tf.matmul(tf.tanh(tf.matmul(x, w1) + b1), w2)
    return x, y, tf.reduce_mean((prediction - y) ** 2)


def read_params(sess):
    """{variable name: value} of the model's trainable variables."""
    variables = v1.trainable_variables()
    return dict(zip([v.op.name for v in variables], sess.run(variables)))


def join(batches):
    """The micro-batches of a window as one large batch."""
    return tuple(np.concatenate(part) for part in zip(*batches))


def large_batch_training(make_optimizer, windows):
    """Plain training, one ``minimize`` step per window on the joined batch.

    Returns the parameters at the start and after each update.
    """
    with tf.Graph().as_default():
        x, y, loss = build_model()
        train_op = make_optimizer().minimize(loss)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            params = [read_params(sess)]
            for window in windows:
                inputs, labels = join(window)
                sess.run(train_op, {x: inputs, y: labels})
                params.append(read_params(sess))
    return params


def gradient(params, batch):
    """The gradient of the mean loss over ``batch`` at ``params``: {name: value}."""
    with tf.Graph().as_default():
        x, y, loss = build_model(params)
        variables = v1.trainable_variables()
        grads = tf.gradients(loss, variables)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            values = sess.run(grads, {x: batch[0], y: batch[1]})
    return dict(zip([v.op.name for v in variables], values))


def report(title, params):
    """Prints the size of each update, for a run from the command line."""
    print(title)
    for k in range(1, len(params)):
        step = np.sqrt(sum(np.sum((params[k][n] - params[k - 1][n]) ** 2) for n in params[k]))
        print(f"  update {k}: size of the parameter change {step:.6f}")
