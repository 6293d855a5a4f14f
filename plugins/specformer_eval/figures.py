"""The pictures of ``specformer inspect``, drawn with matplotlib's object API on the Agg canvas
(no pyplot, no display, no global state changed).

* :func:`attention_grid`: one heatmap per layer and head, queries down, keys across;
* :func:`attention_lines`: one query token's attention over the tokens up to it, as lines
  whose intensity is the weight, one panel per layer (the classic figure of Vaswani et al.);
* :func:`lens_grid`: the logit lens, layers down and positions across, each cell the top
  token and its probability, with the share of positions predicting the current versus
  the next input token per layer.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from specformer_eval.inspection import Inspection

#: Square-root colour scale: attention is mostly small weights, and they should still show.
GAMMA = 0.5


def attention_grid(inspection: Inspection, path: Path) -> Path:
    """``attention.png``: layers as rows, heads as columns, with token labels on both axes when they fit."""
    from matplotlib.colors import PowerNorm

    layers, heads, tokens = inspection.n_layers, inspection.n_heads, len(inspection.ids)
    labelled = tokens <= 64 and layers * heads <= 64
    cell = min(max(0.16 * tokens, 2.2), 7.0) if labelled else 1.4
    fig = _figure(width=cell * heads + 1.2, height=cell * layers + 0.8)
    axes = fig.subplots(layers, heads, squeeze=False)
    norm = PowerNorm(gamma=GAMMA, vmin=0.0, vmax=1.0)
    image = None
    for layer in range(layers):
        for head in range(heads):
            ax = axes[layer][head]
            image = ax.imshow(inspection.attention[layer, head], cmap="magma", norm=norm, interpolation="nearest")
            ax.set_title(f"layer {layer}, head {head}", fontsize=8)
            if labelled:
                size = max(3.0, min(7.0, 180.0 / tokens))
                ax.set_xticks(range(tokens), inspection.labels, rotation=90, fontsize=size)
                ax.set_yticks(range(tokens), inspection.labels, fontsize=size)
            else:
                ax.set_xticks([])
                ax.set_yticks([])
    fig.supxlabel("key (attended to)", fontsize=9)
    fig.supylabel("query (attending)", fontsize=9)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.6, label="attention probability")
    return _save(fig, path)


def attention_lines(inspection: Inspection, position: int, path: Path) -> Path:
    """``attention-<token>.png``: where the token at ``position`` looks, per layer (mean over heads)."""
    tokens = position + 1
    layers = inspection.n_layers
    per_row = min(layers, 6)
    rows = -(-layers // per_row)
    height = max(2.5, 0.24 * tokens + 1.0)
    fig = _figure(width=2.6 * per_row, height=height * rows)
    axes = fig.subplots(rows, per_row, squeeze=False)
    ys = -np.arange(tokens, dtype=float)
    for index in range(rows * per_row):
        ax = axes[index // per_row][index % per_row]
        ax.set_axis_off()
        if index >= layers:
            continue
        weights = inspection.attention[index, :, position, :tokens].mean(axis=0)  # (tokens,)
        strongest = float(weights.max()) or 1.0
        for key in range(tokens):
            intensity = float(weights[key]) / strongest
            ax.plot([0.0, 1.0], [ys[position], ys[key]], color="tab:blue", alpha=intensity,
                    linewidth=0.5 + 2.5 * intensity, solid_capstyle="round")
        for key in range(tokens):
            ax.text(-0.04, ys[key], inspection.labels[key], ha="right", va="center", fontsize=7,
                    fontweight="bold" if key == position else "normal",
                    color="black" if key == position else "0.55")
            ax.text(1.04, ys[key], inspection.labels[key], ha="left", va="center", fontsize=7,
                    alpha=0.35 + 0.65 * float(weights[key]) / strongest)
        ax.set_xlim(-0.6, 1.6)
        ax.set_ylim(ys[-1] - 0.8, 0.8)
        ax.set_title(f"layer {index}\n(mean of {inspection.n_heads} heads, max {strongest:.2f})", fontsize=8)
    fig.suptitle(f"attention of token {position} {inspection.labels[position]!r} over the tokens up to it", fontsize=10)
    return _save(fig, path)


def lens_grid(inspection: Inspection, path: Path) -> Path:
    """``logit-lens.png``: top token and probability per layer and position, and the current/next shares."""
    rows, tokens = inspection.lens_probs.shape[0], len(inspection.ids)
    fig = _figure(width=max(6.0, 0.62 * tokens + 2.0), height=0.5 * rows + 3.4)
    grid = fig.add_gridspec(2, 1, height_ratios=[0.5 * rows + 1.0, 2.0], hspace=0.3)
    ax = fig.add_subplot(grid[0])
    top = inspection.lens_probs[:, :, 0]  # (rows, T)
    image = ax.imshow(top, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    for row in range(rows):
        for col in range(tokens):
            p = float(top[row, col])
            ax.text(col, row, f"{_short(inspection.lens_labels[row][col][0])}\n{p:.2f}", ha="center", va="center",
                    fontsize=5.5, color="black" if p > 0.6 else "white")
    names = layer_names(rows)
    ax.set_yticks(range(rows), names, fontsize=7)
    ax.set_xticks(range(tokens), inspection.labels, fontsize=7, rotation=90)
    ax.xaxis.tick_top()
    ax.set_title("logit lens: each layer's residual stream through the final norm and LM head "
                 "(top token, its probability; the prediction for the position after each input token)", fontsize=8)
    fig.colorbar(image, ax=ax, shrink=0.8, label="top-1 probability")
    shares = fig.add_subplot(grid[1])
    shares.plot(range(rows), inspection.current_share, marker="o", label="top token = current input token")
    shares.plot(range(rows), inspection.next_share, marker="s", label="top token = next input token")
    shares.set_xticks(range(rows), names, fontsize=7, rotation=30)
    shares.set_ylim(-0.05, 1.05)
    shares.set_ylabel("share of positions", fontsize=8)
    shares.legend(fontsize=7, loc="best")
    shares.grid(alpha=0.3)
    return _save(fig, path)


def layer_names(rows: int) -> list[str]:
    """Row names of the lens: the embeddings, then the stream after each layer."""
    return ["embeddings"] + [f"after layer {i}" for i in range(rows - 1)]


def _short(label: str, width: int = 7) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def _figure(*, width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    # Big enough to read, small enough to embed: capped at about 4000 pixels a side.
    scale = min(1.0, 40.0 / max(width, height))
    return Figure(figsize=(width * scale, height * scale), dpi=100, layout="constrained")


def _save(fig: Any, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with warnings.catch_warnings():
        # A token in a script the default font lacks draws as a box; say nothing about each one.
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        warnings.filterwarnings("ignore", message=".*constrained_layout not applied.*")
        fig.savefig(tmp, format="png")
    tmp.replace(path)
    return path
