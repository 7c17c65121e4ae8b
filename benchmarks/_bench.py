"""Timing, memory and table helpers shared by the benchmark scripts.

Every benchmark measures its variants side by side in one process: each
repetition runs every variant once, in an order rotated from one repetition to
the next, so that a slow spell of a shared machine hits every variant alike.
Results are medians over the repetitions.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def graph_mode_argument(parser):
    parser.add_argument(
        "--graph-mode",
        choices=("v1", "resource"),
        default="v1",
        help="v1: disable_v2_behavior() (reference variables, the default); "
        "resource: disable_eager_execution() only (resource variables)",
    )


def enter_graph_mode(mode):
    """Puts TensorFlow in TF1 graph mode, the way legacy code does."""
    import tensorflow as tf

    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    if mode == "v1":
        tf.compat.v1.disable_v2_behavior()
    else:
        tf.compat.v1.disable_eager_execution()
    return tf


def session_config():
    """The one session configuration every variant runs with."""
    import tensorflow as tf

    return tf.compat.v1.ConfigProto()


def interleaved_medians(variants, repetitions, warmup=2, inner=1):
    """Times each variant; returns {name: median seconds per call}.

    Args:
        variants: {name: zero-argument callable}, e.g. one window each.
        repetitions: samples per variant.
        warmup: untimed calls of each variant first.
        inner: calls per sample (for variants too quick for the timer).
    """
    names = list(variants)
    for name in names:
        for _ in range(warmup):
            variants[name]()
    samples = {name: [] for name in names}
    for rep in range(repetitions):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            call = variants[name]
            start = time.perf_counter()
            for _ in range(inner):
                call()
            samples[name].append((time.perf_counter() - start) / inner)
    return {name: statistics.median(values) for name, values in samples.items()}


def save_figure(fig, path, **savefig):
    """Writes a matplotlib figure to the PNG ``path``, saying how small its text is.

    The PNG's text "Smallest text" holds its smallest font size, in points:
    scripts/check_docs_layout.py reads it to tell how large the figure's text
    shows on each screen.
    """
    import matplotlib.text

    texts = fig.findobj(matplotlib.text.Text)
    sizes = [text.get_fontsize() for text in texts if text.get_visible() and text.get_text()]
    fig.savefig(path, metadata={"Smallest text": f"{min(sizes):g} pt"}, **savefig)


def reset_peak_rss():
    """Lowers VmHWM to the current resident size (Linux); False if it cannot.

    Called once the graph is built and its variables initialized, it keeps
    the initializers' temporaries (a table-sized random tensor, say) out of
    the peak of training.
    """
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes():
    """This process's peak resident set size (VmHWM), in bytes."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def format_table(headers, rows):
    """Formats rows (lists of str / numbers) as an aligned text table."""

    def cell(value):
        if isinstance(value, float):
            return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
        return str(value)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = "  ".join("-" * w for w in widths)
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)), line]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(out)


def parser(description):
    return argparse.ArgumentParser(description=description)
