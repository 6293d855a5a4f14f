"""The pictures of ``specformer inspect`` stay readable as tokens and layers grow: the rule of
:mod:`specformer_eval.figure_layout`, checked with matplotlib's own renderer on the drawn figures.

Every text is at least 8 pt, its lines at least 10.5 px tall at 100 dpi; no two texts overlap;
no label covers a plot (a logit-lens cell text stays inside its own cell); nothing runs off the
canvas; and the PNG written is the figure's size. Checked at the limits the rule promises
(64 tokens, 32 layers) and past them (labels left out, and said so).
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

import specformer
from specformer_eval import figure_layout
from specformer_eval.figure_layout import LABEL_POINTS
from specformer_eval.figures import BY_LAYER, _save, attention_figures, lens_figure, lines_figure
from specformer_eval.inspection import inspect_prompt
from fixtures.tiny import tiny_spec

from .support import BYTES

TEXT = ("def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n") * 3
MIN_LINE_PX = 10.5  # an 8-pt line at 100 dpi is 11.1 px


def deep_model(layers: int, *, heads: int = 4) -> object:
    """A random model of ``layers`` layers, small everywhere else (its pictures are what is tested)."""
    return specformer.build(tiny_spec(
        vocab_size=259, d_model=16, n_layers=layers, context_length=256,
        block={"mixer": {"kind": "attention", "n_heads": heads}, "ffn": {"kind": "swiglu", "hidden": 32}},
    ), seed=0).eval()


@pytest.fixture(scope="module")
def deep():
    """64 tokens through 32 layers: the largest case whose labels the rule promises."""
    return inspect_prompt(deep_model(32), BYTES, TEXT[:64])


@pytest.fixture(scope="module")
def shallow():
    return inspect_prompt(deep_model(4), BYTES, TEXT[:64])


def _texts(figure) -> list:
    """Every text the figure draws: its own, and each axes' texts, titles, tick labels, axis labels, legend."""
    found = list(figure.texts)
    for ax in figure.axes:
        found += ax.texts + [ax.title, ax._left_title, ax._right_title]
        if ax.axison:  # an axes drawn without its axis draws none of their labels
            found += [ax.xaxis.label, ax.yaxis.label] + ax.get_xticklabels() + ax.get_yticklabels()
        legend = ax.get_legend()
        if legend is not None:
            found += legend.get_texts()
    return [t for t in found if t.get_visible() and t.get_text().strip()]


def _boxes(texts, renderer) -> np.ndarray:
    return np.array([[b.x0, b.y0, b.x1, b.y1] for b in (t.get_window_extent(renderer) for t in texts)])


def _overlaps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairs (i, j) where box a[i] and box b[j] share area (touching edges do not count)."""
    hit = ((a[:, None, 0] < b[None, :, 2]) & (b[None, :, 0] < a[:, None, 2])
           & (a[:, None, 1] < b[None, :, 3]) & (b[None, :, 1] < a[:, None, 3]))
    return np.argwhere(hit)


def check_readable(figure) -> list:
    """Assert the rule (module doc) on ``figure``; its texts, for the caller's counts."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(figure).get_renderer()
    with figure_layout.quiet():
        figure.draw(renderer)
        texts = _texts(figure)
        boxes = _boxes(texts, renderer)
    for text, box in zip(texts, boxes):
        lines = text.get_text().count("\n") + 1
        across = box[2] - box[0] if text.get_rotation() % 180 == 90 else box[3] - box[1]
        assert text.get_fontsize() >= LABEL_POINTS, (text.get_text(), text.get_fontsize())
        assert across >= MIN_LINE_PX * lines, (text.get_text(), across)
    width, height = figure.bbox.width, figure.bbox.height
    outside = (boxes[:, :2] < -0.5).any(axis=1) | (boxes[:, 2] > width + 0.5) | (boxes[:, 3] > height + 0.5)
    assert not outside.any(), [t.get_text() for t, out in zip(texts, outside) if out]
    pairs = [(i, j) for i, j in _overlaps(boxes, boxes) if i < j]
    assert not pairs, [(texts[i].get_text(), texts[j].get_text()) for i, j in pairs[:5]]
    # No text covers a plot, except a cell text over its own axes (checked against its cell in the lens test).
    plots = list(figure.axes)
    plot_boxes = np.array([[b.x0, b.y0, b.x1, b.y1] for b in (ax.get_window_extent(renderer) for ax in plots)])
    for i, k in _overlaps(boxes, plot_boxes):
        text, ax = texts[i], plots[k]
        assert text in ax.texts and text.get_transform() == ax.transData, (text.get_text(), "covers a plot")
    return texts


def check_png(figure, tmp_path, name: str) -> tuple[int, int]:
    """Write ``figure`` and check the PNG has the figure's size in pixels; that size."""
    path = _save(figure, tmp_path / name)
    width, height = struct.unpack(">II", path.read_bytes()[16:24])  # the IHDR chunk of a PNG
    assert (width, height) == (round(figure.bbox.width), round(figure.bbox.height))
    return width, height


@pytest.mark.slow  # 6-10 s each: rendering and reading back 64-token pictures
def test_the_logit_lens_of_64_tokens_and_32_layers(deep, tmp_path):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    figure = lens_figure(deep)
    texts = check_readable(figure)
    heat = figure.axes[0]
    cells = list(heat.texts)
    assert len(cells) == 33 * 64
    assert [t.get_text() for t in heat.get_xticklabels()] == deep.labels
    assert len(heat.get_yticklabels()) == 33 and len(texts) > 33 * 64 + 64 + 33
    renderer = FigureCanvasAgg(figure).get_renderer()
    for text in cells:
        col, row = text.get_position()
        (x0, y0), (x1, y1) = heat.transData.transform([(col - 0.5, row + 0.5), (col + 0.5, row - 0.5)])
        box = text.get_window_extent(renderer)
        assert x0 - 0.5 <= box.x0 and box.x1 <= x1 + 0.5 and y0 - 0.5 <= box.y0 and box.y1 <= y1 + 0.5, text.get_text()
    width, height = check_png(figure, tmp_path, "logit-lens.png")
    assert width >= 64 * figure_layout.PITCH and height >= 33 * 2 * MIN_LINE_PX


@pytest.mark.slow  # 6-10 s each: rendering and reading back 64-token pictures
def test_the_attention_of_64_tokens_and_32_layers_is_one_labelled_picture_per_layer(deep, tmp_path):
    pictures = attention_figures(deep)
    name, overview = next(pictures)
    assert name == "attention.png"
    texts = check_readable(overview)
    assert len(overview.axes) == 32 * 4 + 1  # every panel, and the colour bar
    assert not set(deep.labels) & {t.get_text() for t in texts}, "the overview has no room for token labels"
    assert any(f"{BY_LAYER}/layer-NN.png" in t.get_text() for t in overview.texts), "the overview says where they are"
    check_png(overview, tmp_path, name)
    name, first = next(pictures)
    assert name == f"{BY_LAYER}/layer-00.png"
    texts = check_readable(first)
    for ax in first.axes[:4]:
        assert [t.get_text() for t in ax.texts] == [label for label in deep.labels for _ in range(2)]  # left, below
    check_png(first, tmp_path, "layer-00.png")


@pytest.mark.slow
def test_every_picture_of_64_tokens_and_32_layers(deep, tmp_path):
    names = []
    for name, figure in attention_figures(deep):
        names.append(name)
        check_readable(figure)
        check_png(figure, tmp_path, name.replace("/", "-"))
    assert names == ["attention.png"] + [f"{BY_LAYER}/layer-{layer:02d}.png" for layer in range(32)]
    figure = lines_figure(deep, 63)
    texts = check_readable(figure)
    assert sum(len(ax.texts) for ax in figure.axes) == 32 * 2 * 64
    assert len(texts) == 32 * 2 * 64 + 32 + 1  # the labels, a title per layer, the heading
    check_png(figure, tmp_path, "attention-63.png")


@pytest.mark.slow  # 6-10 s each: rendering and reading back 64-token pictures
def test_the_attention_of_64_tokens_and_4_layers_is_one_labelled_picture(shallow, tmp_path):
    (name, figure), = list(attention_figures(shallow))
    assert name == "attention.png"
    check_readable(figure)
    panels = figure.axes[:16]
    assert all(len(ax.texts) == 2 * 64 for ax in panels)
    width, height = check_png(figure, tmp_path, name)
    assert figure_layout.fits(width, height) and min(width, height) >= 4 * 64 * figure_layout.PITCH


def test_where_a_token_looks_with_64_tokens(shallow, tmp_path):
    figure = lines_figure(shallow, 63)
    texts = check_readable(figure)
    assert sum(len(ax.texts) for ax in figure.axes) == 4 * 2 * 64
    assert len(texts) == 4 * 2 * 64 + 4 + 1  # the labels, a title per layer, the heading
    check_png(figure, tmp_path, "attention-63.png")


def test_where_a_token_looks_in_full_rows_about_as_wide_as_tall(shallow):
    for position, columns_rows in ((63, (4, 1)), (7, (2, 2))):  # 4 layers: 2 + 2, never 3 + 1
        figure = lines_figure(shallow, position)
        corners = [ax.get_position() for ax in figure.axes]
        assert (len({round(c.x0, 4) for c in corners}), len({round(c.y0, 4) for c in corners})) == columns_rows
        assert 0.5 <= figure.bbox.width / figure.bbox.height <= 2


def test_few_tokens_and_layers_keep_the_rule(tmp_path):
    inspection = inspect_prompt(deep_model(1, heads=2), BYTES, "ab")
    for make in (lambda: lens_figure(inspection), lambda: lines_figure(inspection, 1),
                 lambda: next(attention_figures(inspection))[1]):
        figure = make()
        check_readable(figure)
        check_png(figure, tmp_path, "small.png")


def test_past_64_tokens_the_labels_are_left_out_and_the_pictures_say_so(tmp_path):
    inspection = inspect_prompt(deep_model(2), BYTES, TEXT[:200])
    note = "token labels left out: 200 tokens, more than 64"
    lens = lens_figure(inspection)
    check_readable(lens)
    assert not lens.axes[0].texts and not lens.axes[0].get_xticklabels()
    assert note in lens.texts[0].get_text().replace("\n", " ")
    (name, grid), = list(attention_figures(inspection))
    check_readable(grid)
    assert not any(ax.texts for ax in grid.axes) and note in grid.texts[0].get_text().replace("\n", " ")
    lines = lines_figure(inspection, 199)
    check_readable(lines)
    assert sum(len(ax.texts) for ax in lines.axes) == 2 * 2  # only the query token, each side of each panel
    for figure in (lens, grid, lines):
        width, height = check_png(figure, tmp_path, "past.png")
        assert figure_layout.fits(width, height)
