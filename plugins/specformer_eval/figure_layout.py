"""The readability rule of the ``specformer inspect`` pictures, and the pixel geometry that keeps it.

The rule: every token label, layer name and cell text is drawn at :data:`LABEL_POINTS`
(8 pt, about 11 px tall at the pictures' :data:`DPI` of 100), never smaller, and each
gets a slot along its axis at least as long as its text is tall (:data:`PITCH`, 14 px a
token), so neighbours never touch. The font never shrinks with more tokens or layers:
the figure grows instead. This holds up to :data:`MAX_LABELLED_TOKENS` tokens; past that
the pictures leave the token labels out (the page says so, and its tables keep them).
A picture that would pass :data:`MAX_PIXELS` is split rather than shrunk.

Figures are therefore laid out in pixels, not left to a layout engine: a :class:`Canvas`
is a figure of a known pixel size on which axes and texts are placed at pixel positions
measured from the top left, and :func:`text_size` measures text with the same renderer
that will draw it.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

#: Dots per inch of every picture: one point is 100/72 px.
DPI = 100
#: Size of every label and cell text, in points.
LABEL_POINTS = 8.0
#: Size of titles, in points.
TITLE_POINTS = 9.0
#: Pixels per token (or layer) along an axis that carries labels: an 8-pt line (11 px) and a gap.
PITCH = 14
#: Past this many tokens the token labels are left out of the pictures.
MAX_LABELLED_TOKENS = 64
#: Most pixels of one picture, and its longest side. Past about 25 megapixels (5000 px a side) a PNG is slow
#: to open in a browser or viewer, and index.html carries each one inline; a strip longer than 10000 px is
#: awkward to scroll. A grid that would be bigger is split into one picture per layer instead of
#: shrinking its labels.
MAX_PIXELS = 25_000_000
MAX_SIDE = 10_000
#: Tick marks and their gap to the label, in points (matplotlib's default, 3.5 + 3.5, wastes room).
TICK_LENGTH = 2.0
TICK_PAD = 2.0


def labelled(tokens: int) -> bool:
    """Whether pictures of ``tokens`` tokens carry token labels (see the module doc)."""
    return tokens <= MAX_LABELLED_TOKENS


def fits(width: float, height: float) -> bool:
    """Whether a picture of ``width`` × ``height`` px is within :data:`MAX_PIXELS` and :data:`MAX_SIDE`."""
    return width * height <= MAX_PIXELS and max(width, height) <= MAX_SIDE


def tick_space() -> int:
    """Pixels between an axis and its tick labels."""
    return math.ceil((TICK_LENGTH + TICK_PAD) * DPI / 72)


def text_size(texts: Iterable[str], *, points: float = LABEL_POINTS, weight: str = "normal") -> tuple[int, int]:
    """The widest and the tallest of ``texts`` drawn horizontally at ``points``, in whole pixels (0, 0 for none)."""
    figure, renderer = _scratch()
    width = height = 0.0
    with quiet():
        for text in set(texts):
            artist = figure.text(0, 0, text, fontsize=points, fontweight=weight, parse_math=False)
            box = artist.get_window_extent(renderer)
            artist.remove()
            width, height = max(width, box.width), max(height, box.height)
    return math.ceil(width), math.ceil(height)


@functools.cache
def _scratch() -> tuple[Any, Any]:
    """A figure and renderer at :data:`DPI` that measure text and draw nothing."""
    # late: matplotlib takes about half a second to import, and only drawing a figure needs it
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(dpi=DPI)
    return figure, FigureCanvasAgg(figure).get_renderer()


def wrap(text: str, *, width: int, points: float = TITLE_POINTS) -> str:
    """``text`` broken into lines at spaces so that each is at most ``width`` px wide where it can be."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and text_size([f"{lines[-1]} {word}"], points=points)[0] <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return "\n".join(lines)


def short(label: str, width: int) -> str:
    """``label`` cut to ``width`` characters, an ellipsis marking the cut."""
    return label if len(label) <= width else label[: width - 1] + "…"


class Canvas:
    """A figure ``width`` × ``height`` px on which things are placed in pixels from the top left."""

    def __init__(self, *, width: float, height: float) -> None:
        # late: matplotlib takes about half a second to import, and only drawing a figure needs it
        from matplotlib.figure import Figure

        self.width, self.height = math.ceil(width), math.ceil(height)
        self.figure = Figure(figsize=(self.width / DPI, self.height / DPI), dpi=DPI)

    def axes(self, *, x: float, y: float, w: float, h: float) -> Any:
        """New axes whose box is ``w`` × ``h`` px with its top left corner at (``x``, ``y``)."""
        return self.figure.add_axes((x / self.width, 1 - (y + h) / self.height, w / self.width, h / self.height))

    def text(self, *, x: float, y: float, text: str, **style: Any) -> Any:
        """A text anchored at (``x``, ``y``) px from the top left (``ha``/``va`` say which point of it)."""
        return self.figure.text(x / self.width, 1 - y / self.height, text, parse_math=False, **style)


def style_ticks(ax: Any) -> None:
    """Short ticks close to their labels, at the label size."""
    ax.tick_params(length=TICK_LENGTH, pad=TICK_PAD, labelsize=LABEL_POINTS)


@contextmanager
def quiet() -> Iterator[None]:
    """Silence matplotlib's word for each glyph the default font lacks (such a token draws as a box)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        yield
