"""The pictures of ``specformer inspect``, drawn with matplotlib's object API on the Agg canvas
(no pyplot, no display, no global state changed).

* :func:`attention_figures`: one heatmap per layer and head, queries down, keys across
  (``attention.png``; one picture per layer as well when the whole grid would be too big);
* :func:`lines_figure`: one query token's attention over the tokens up to it, as lines
  whose intensity is the weight, one panel per layer (the classic figure of Vaswani et al.);
* :func:`lens_figure`: the logit lens, layers down and positions across, each cell the top
  token and its probability, with the share of positions predicting the current versus
  the next input token per layer.

Each is sized to its tokens and layers under the readability rule of
:mod:`specformer_eval.figure_layout`: labels stay 8 pt and the figure grows.
:func:`attention_grid`, :func:`attention_lines` and :func:`lens_grid` write them as PNG files.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specformer_eval.figure_layout import (
    DPI, LABEL_POINTS, MAX_LABELLED_TOKENS, MAX_PIXELS, MAX_SIDE, PITCH, TITLE_POINTS, Canvas, fits, labelled, quiet,
    short, style_ticks, text_size, tick_space, wrap,
)
from specformer_eval.inspection import Inspection

#: Square-root colour scale: attention is mostly small weights, and they should still show.
GAMMA = 0.5
#: Pixels between neighbouring panels, and around the figure's edge.
GAP = 14
MARGIN = 10
#: Pixels right of a grid for its colour bar, its tick labels and its label.
COLORBAR = 110
#: Folder (inside ``--out``) of the one-picture-per-layer attention, when the whole grid is too big.
BY_LAYER = "attention-by-layer"
#: Characters of a token kept in a tick label, and in a logit-lens cell.
TICK_CHARS, CELL_CHARS = 12, 7


def attention_grid(inspection: Inspection, out: Path) -> list[Path]:
    """Write :func:`attention_figures` into the folder ``out``; their paths, ``attention.png`` first."""
    return [_save(figure, Path(out) / name) for name, figure in attention_figures(inspection)]


def attention_lines(inspection: Inspection, position: int, path: Path) -> Path:
    """Write :func:`lines_figure` to ``path`` (``attention-<token>.png``)."""
    return _save(lines_figure(inspection, position), path)


def lens_grid(inspection: Inspection, path: Path) -> Path:
    """Write :func:`lens_figure` to ``path`` (``logit-lens.png``)."""
    return _save(lens_figure(inspection), path)


def attention_figures(inspection: Inspection) -> Iterator[tuple[str, Any]]:
    """``(file name, figure)`` pairs, drawn one at a time: ``attention.png``, every layer (rows) and
    head (columns) with token labels on every panel; or, when that grid would be bigger than
    :func:`~specformer_eval.figure_layout.fits` allows, ``attention.png`` as an overview without
    labels and ``attention-by-layer/layer-NN.png`` per layer, its heads with labels. Past
    :data:`~specformer_eval.figure_layout.MAX_LABELLED_TOKENS` tokens there are no labels and
    only ``attention.png``."""
    layers, heads, tokens = inspection.n_layers, inspection.n_heads, len(inspection.ids)
    every = [(layer, head) for layer in range(layers) for head in range(heads)]
    about = "attention of every layer and head: queries (the token attending) down, keys (attended to) across"
    if not labelled(tokens):
        note = f"token labels left out: {tokens} tokens, more than {MAX_LABELLED_TOKENS}"
        overview = _overview(inspection, every, cols=heads, title=f"{about}; {note}")
        yield "attention.png", _draw_sheet(inspection, overview)
        return
    whole = _labelled_sheet(inspection, every, cols=heads, title=about)
    if fits(*whole.size):
        yield "attention.png", _draw_sheet(inspection, whole)
        return
    width = max(2, len(str(layers - 1)))
    note = f"overview; the token labels are in {BY_LAYER}/layer-{'N' * width}.png, one picture per layer"
    yield "attention.png", _draw_sheet(inspection, _overview(inspection, every, cols=heads, title=f"{about}; {note}"))
    for layer in range(layers):
        sheet = _labelled_sheet(inspection, [(layer, head) for head in range(heads)], cols=math.ceil(math.sqrt(heads)),
                                title=f"layer {layer}: attention of each head, queries down, keys across")
        yield f"{BY_LAYER}/layer-{layer:0{width}d}.png", _draw_sheet(inspection, sheet)


@dataclass(frozen=True)
class _Sheet:
    """One attention picture: ``panels`` (layer, head) in rows of ``cols``, each ``panel`` px a side,
    ``label`` px left of and below each for its token labels (0: none), under ``title``."""

    panels: list[tuple[int, int]]
    cols: int
    panel: int
    label: int
    title: str

    #: Above each panel: its title (an 8-pt line and matplotlib's pad).
    PANEL_TITLE = 20
    #: Left of the grid and below it: "query (attending)", "key (attended to)".
    SIDE_LABEL = 26

    @property
    def rows(self) -> int:
        return math.ceil(len(self.panels) / self.cols)

    @property
    def cell(self) -> tuple[int, int]:
        return self.label + self.panel + GAP, self.PANEL_TITLE + self.panel + self.label + GAP

    @functools.cached_property
    def heading(self) -> str:
        return wrap(self.title, width=self.cols * self.cell[0] + COLORBAR - 2 * MARGIN)

    @property
    def top(self) -> int:
        return MARGIN + 16 * (self.heading.count("\n") + 1)

    @property
    def size(self) -> tuple[int, int]:
        return (MARGIN + self.SIDE_LABEL + self.cols * self.cell[0] + COLORBAR,
                self.top + self.rows * self.cell[1] + self.SIDE_LABEL + MARGIN)


def _panel_titles(panels: list[tuple[int, int]]) -> int:
    """Width in px of the widest panel title, with room to spare (digits are all as wide: the longest is widest)."""
    return text_size([max((f"layer {layer}, head {head}" for layer, head in panels), key=len)])[0] + 8


def _labelled_sheet(inspection: Inspection, panels: list[tuple[int, int]], *, cols: int, title: str) -> _Sheet:
    tokens = len(inspection.ids)
    label = text_size([short(t, TICK_CHARS) for t in inspection.labels])[0] + tick_space() + 4
    return _Sheet(panels=panels, cols=cols, panel=max(tokens * PITCH, _panel_titles(panels)), label=label, title=title)


def _overview(inspection: Inspection, panels: list[tuple[int, int]], *, cols: int, title: str) -> _Sheet:
    # Panels of about 192 px (2 px a token past 96 tokens), smaller where that keeps the grid within
    # two thirds of MAX_PIXELS and within MAX_SIDE; never narrower than their titles.
    rows = math.ceil(len(panels) / cols)
    room = min(math.isqrt(2 * MAX_PIXELS // 3 // (rows * cols)), (MAX_SIDE - 200) // max(rows, cols))
    panel = max(_panel_titles(panels), min(room - _Sheet.PANEL_TITLE - GAP, max(192, 2 * len(inspection.ids))))
    return _Sheet(panels=panels, cols=cols, panel=panel, label=0, title=title)


def _draw_sheet(inspection: Inspection, sheet: _Sheet) -> Any:
    # late: matplotlib takes about half a second to import, and only drawing a figure needs it
    from matplotlib.colors import PowerNorm

    width, height = sheet.size
    canvas = Canvas(width=width, height=height)
    canvas.text(x=MARGIN, y=MARGIN, text=sheet.heading, ha="left", va="top", fontsize=TITLE_POINTS)
    norm = PowerNorm(gamma=GAMMA, vmin=0.0, vmax=1.0)
    labels = [short(t, TICK_CHARS) for t in inspection.labels]
    left = MARGIN + sheet.SIDE_LABEL
    image = None
    for index, (layer, head) in enumerate(sheet.panels):
        row, col = divmod(index, sheet.cols)
        ax = canvas.axes(x=left + col * sheet.cell[0] + sheet.label,
                         y=sheet.top + row * sheet.cell[1] + sheet.PANEL_TITLE, w=sheet.panel, h=sheet.panel)
        image = ax.imshow(inspection.attention[layer, head], cmap="magma", norm=norm, interpolation="nearest",
                          aspect="auto")
        ax.set_title(f"layer {layer}, head {head}", fontsize=LABEL_POINTS, pad=4)
        ax.set_xticks([])
        ax.set_yticks([])
        if sheet.label:
            _token_labels(ax, labels, figure=canvas.figure)
    grid_w, grid_h = sheet.cols * sheet.cell[0], sheet.rows * sheet.cell[1]
    canvas.text(x=left + grid_w / 2, y=height - MARGIN, text="key (attended to)", ha="center", va="bottom",
                fontsize=TITLE_POINTS)
    canvas.text(x=MARGIN, y=sheet.top + grid_h / 2, text="query (attending)", ha="left", va="center", rotation=90,
                fontsize=TITLE_POINTS)
    if image is not None:
        bar = canvas.axes(x=left + grid_w + 10, y=sheet.top + sheet.PANEL_TITLE, w=16,
                          h=max(120, min(400, grid_h - sheet.PANEL_TITLE - GAP)))
        canvas.figure.colorbar(image, cax=bar).set_label("attention probability", fontsize=LABEL_POINTS)
        style_ticks(bar)
    return canvas.figure


def _token_labels(ax: Any, labels: list[str], *, figure: Any) -> None:
    """Each token's label left of its row and below its column of the heatmap ``ax``.

    Plain texts rather than tick labels: a tick is five artists, and tick labels made a
    picture of 64 tokens three times slower to draw.
    """
    # late: matplotlib takes about half a second to import, and only drawing a figure needs it
    from matplotlib.transforms import offset_copy

    left = offset_copy(ax.get_yaxis_transform(), fig=figure, x=-tick_space(), y=0, units="dots")
    below = offset_copy(ax.get_xaxis_transform(), fig=figure, x=0, y=-tick_space(), units="dots")
    for index, label in enumerate(labels):
        ax.text(0.0, index, label, transform=left, ha="right", va="center", fontsize=LABEL_POINTS, parse_math=False)
        ax.text(index, 0.0, label, transform=below, ha="center", va="top", rotation=90, fontsize=LABEL_POINTS,
                parse_math=False)


def lines_figure(inspection: Inspection, position: int) -> Any:
    """Where the token at ``position`` looks, per layer (mean over heads): from it on the left, a line
    to each token up to it on the right, more opaque for more weight. Past
    :data:`~specformer_eval.figure_layout.MAX_LABELLED_TOKENS` tokens only the query token is labelled."""
    tokens, layers = position + 1, inspection.n_layers
    with_labels = labelled(tokens)
    pitch = PITCH + 2 if with_labels else max(2, 1000 // tokens)
    labels = [short(t, TICK_CHARS) for t in inspection.labels[:tokens]]
    shown = labels if with_labels else [labels[position]]
    label_w = text_size(shown, weight="bold")[0] + 8
    weights = inspection.attention[:, :, position, :tokens].mean(axis=1)  # (layers, tokens)
    strongest = [float(w.max()) or 1.0 for w in weights]
    heads = inspection.n_heads
    titles = [f"layer {layer}\nmean of {heads} heads, max {most:.2f}" for layer, most in enumerate(strongest)]
    title_w, title_h = text_size(titles)
    area = 120  # px of the lines themselves
    panel_w = max(2 * label_w + area, title_w + 8)
    cell_w, cell_h = panel_w + GAP, title_h + 8 + tokens * pitch + GAP
    # Full rows (4 layers as 2 + 2, never 3 + 1), as many as make the picture closest to square,
    # so that many layers neither make a strip nor shrink anything.
    per_row = min({math.ceil(layers / rows) for rows in range(1, layers + 1)},
                  key=lambda n: abs(math.log(n * cell_w / (math.ceil(layers / n) * cell_h))))
    rows = math.ceil(layers / per_row)
    heading = f"attention of token {position} {inspection.labels[position]!r} over the tokens up to it"
    if not with_labels:
        heading += f" (token labels left out: {tokens} tokens, more than {MAX_LABELLED_TOKENS})"
    heading = wrap(heading, width=per_row * cell_w - GAP)
    top = MARGIN + 16 * (heading.count("\n") + 1) + 6
    canvas = Canvas(width=2 * MARGIN + per_row * cell_w, height=top + rows * cell_h + MARGIN)
    canvas.text(x=MARGIN, y=MARGIN, text=heading, ha="left", va="top", fontsize=TITLE_POINTS)
    ys = -np.arange(tokens, dtype=float)
    widest = min(3.0, 0.3 * pitch * 72 / DPI)  # points: the lines of neighbouring tokens stay apart at their end
    for layer in range(layers):
        row, col = divmod(layer, per_row)
        x, y = MARGIN + col * cell_w, top + row * cell_h
        canvas.text(x=x + panel_w / 2, y=y, text=titles[layer], ha="center", va="top", fontsize=LABEL_POINTS)
        ax = canvas.axes(x=x + label_w, y=y + title_h + 8, w=area, h=tokens * pitch)
        ax.set_axis_off()
        ax.set_xlim(0.0, 1.0)
        ax.set_ylim(-(tokens - 0.5), 0.5)
        for key in range(tokens):
            intensity = float(weights[layer, key]) / strongest[layer]
            ax.plot([0.0, 1.0], [ys[position], ys[key]], color="tab:blue", alpha=intensity,
                    linewidth=widest * (0.2 + 0.8 * intensity), solid_capstyle="round")
        for key in range(tokens):
            if not with_labels and key != position:
                continue
            query = key == position
            ax.annotate(labels[key], xy=(0.0, ys[key]), xycoords=("axes fraction", "data"), xytext=(-6, 0),
                        textcoords="offset pixels", ha="right", va="center", fontsize=LABEL_POINTS,
                        fontweight="bold" if query else "normal", color="black" if query else "0.45",
                        annotation_clip=False, parse_math=False)
            ax.annotate(labels[key], xy=(1.0, ys[key]), xycoords=("axes fraction", "data"), xytext=(6, 0),
                        textcoords="offset pixels", ha="left", va="center", fontsize=LABEL_POINTS,
                        alpha=0.35 + 0.65 * float(weights[layer, key]) / strongest[layer], annotation_clip=False,
                        parse_math=False)
    return canvas.figure


def lens_figure(inspection: Inspection) -> Any:
    """Top token and probability per layer and position, and the current/next shares per layer.
    Past :data:`~specformer_eval.figure_layout.MAX_LABELLED_TOKENS` tokens the cells are colour
    only and the tokens unlabelled."""
    rows, tokens = inspection.lens_probs.shape[0], len(inspection.ids)
    with_labels = labelled(tokens)
    names = layer_names(rows)
    name_text = text_size(names)[0]
    name_w = name_text + tick_space() + 4
    top = inspection.lens_probs[:, :, 0]  # (rows, T)
    if with_labels:
        tops = [short(inspection.lens_labels[row][col][0], CELL_CHARS) for row in range(rows) for col in range(tokens)]
        col_w = max(max(text_size(tops)[0], text_size(["0.00"])[0]) + 8, PITCH)
        row_h = max(text_size(["Ag\n0.00"])[1] + 6, PITCH)
        tick_h = text_size([short(t, TICK_CHARS) for t in inspection.labels])[0] + tick_space() + 4
    else:
        col_w, row_h, tick_h = max(2, min(PITCH, 1600 // tokens)), PITCH, 0
    heat_w, heat_h = tokens * col_w, rows * row_h
    share_w, share_h = max(heat_w, rows * PITCH, 360), 200
    left = MARGIN + max(name_w, 70)  # also the shares' tick labels and "share of positions"
    # The colour bar is as tall as the lens; its label stands beside it where it fits, else lies flat after it.
    bar_h = min(300, heat_h)
    bar_label = "top-1 probability"
    upright = bar_h >= text_size([bar_label])[0] + 8
    width = left + max(heat_w, share_w) + (COLORBAR if upright else COLORBAR + text_size([bar_label])[0])
    heading = ("logit lens: each layer's residual stream through the final norm and LM head (top token, its "
               "probability; the prediction for the position after each input token)")
    if not with_labels:
        heading += f"; token labels left out: {tokens} tokens, more than {MAX_LABELLED_TOKENS}"
    heading = wrap(heading, width=width - 2 * MARGIN)
    heading_h = 16 * (heading.count("\n") + 1) + 6
    legend_h = 28
    # Below the shares, layer names lie flat where each has room along the axis, and stand up where they do not.
    flat = share_w / rows >= name_text + 8
    names_h = PITCH + tick_space() + 4 if flat else name_w
    height = MARGIN + heading_h + tick_h + heat_h + GAP + legend_h + share_h + names_h + MARGIN
    canvas = Canvas(width=width, height=height)
    canvas.text(x=MARGIN, y=MARGIN, text=heading, ha="left", va="top", fontsize=TITLE_POINTS)

    ax = canvas.axes(x=left, y=MARGIN + heading_h + tick_h, w=heat_w, h=heat_h)
    image = ax.imshow(top, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    if with_labels:
        for row in range(rows):
            for col in range(tokens):
                p = float(top[row, col])
                ax.text(col, row, f"{tops[row * tokens + col]}\n{p:.2f}", ha="center", va="center",
                        fontsize=LABEL_POINTS, color="black" if p > 0.6 else "white", parse_math=False)
        ax.set_xticks(range(tokens), [short(t, TICK_CHARS) for t in inspection.labels], rotation=90, parse_math=False)
    else:
        ax.set_xticks([])
    ax.set_yticks(range(rows), names)
    ax.xaxis.tick_top()
    style_ticks(ax)
    bar = canvas.axes(x=left + heat_w + 10, y=MARGIN + heading_h + tick_h, w=16, h=bar_h)
    canvas.figure.colorbar(image, cax=bar, ticks=np.linspace(0.0, 1.0, 6 if bar_h >= 120 else 3 if bar_h >= 45 else 2))
    if upright:
        bar.set_ylabel(bar_label, fontsize=LABEL_POINTS)
    else:
        bar.set_ylabel(bar_label, fontsize=LABEL_POINTS, rotation=0, ha="left", va="center")
    style_ticks(bar)

    shares = canvas.axes(x=left, y=height - MARGIN - names_h - share_h, w=share_w, h=share_h)
    shares.plot(range(rows), inspection.current_share, marker="o", label="top token = current input token")
    shares.plot(range(rows), inspection.next_share, marker="s", label="top token = next input token")
    shares.set_xticks(range(rows), names, rotation=0 if flat else 90)
    shares.set_xlim(-0.5, rows - 0.5)
    shares.set_ylim(-0.05, 1.05)
    shares.set_ylabel("share of positions", fontsize=LABEL_POINTS)
    shares.legend(fontsize=LABEL_POINTS, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=2, frameon=False,
                  borderaxespad=0.0)
    shares.grid(alpha=0.3)
    style_ticks(shares)
    return canvas.figure


def layer_names(rows: int) -> list[str]:
    """Row names of the lens: the embeddings, then the stream after each layer."""
    return ["embeddings"] + [f"after layer {i}" for i in range(rows - 1)]


def _save(figure: Any, path: Path) -> Path:
    # late: matplotlib takes about half a second to import, and only drawing a figure needs it
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with quiet():
        figure.savefig(tmp, format="png")
    tmp.replace(path)
    return path
