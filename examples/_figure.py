r"""Writes the examples' plots as PNG files that say how small their text is.

The documentation shows some of these plots (``docs/_static``), each drawn
twice: for a desktop's column and, as NAME_narrow.png, for a phone's
(3.6 inches wide, 12-point text, shown about 358 px wide). The PNG's text
"Smallest text" holds the plot's smallest font size, in points:
``scripts/check_docs_layout.py`` reads it to tell how large the text shows on
each screen. The docs' figures are drawn with

    python examples/quickstart.py --plot docs/_static/quickstart.png \
        --narrow-plot docs/_static/quickstart_narrow.png
    python examples/gradient_noise.py --logdir /tmp/gradient_noise \
        --plot docs/_static/gradient_noise.png \
        --narrow-plot docs/_static/gradient_noise_narrow.png

and ``benchmarks/memory.py --sweep`` (both of its figures).
"""

# A phone's figure: shown 358 px wide, its 12-point text shows at the size
# of the page's (16 px).
NARROW_INCHES = 3.6
NARROW_POINTS = 12


def save(fig, path, **savefig):
    """Writes ``fig`` to the PNG ``path`` with its smallest font size."""
    import matplotlib.text

    texts = fig.findobj(matplotlib.text.Text)
    sizes = [text.get_fontsize() for text in texts if text.get_visible() and text.get_text()]
    fig.savefig(path, metadata={"Smallest text": f"{min(sizes):g} pt"}, **savefig)


def legend_below(fig):
    """Puts the figure's legend under its plots, and lays the plots out above it.

    With tight_layout, which matplotlib 3.5 (the last for Python 3.7) has too:
    its legends have no "outside" locations.
    """
    legend = fig.legend(loc="lower center", frameon=False)
    fig.canvas.draw()
    fig.tight_layout(rect=(0, legend.get_window_extent().height / fig.bbox.height, 1, 1))
