"""``index.html`` of ``specformer inspect``: one self-contained page (no network: styles, script, data
and pictures are all inside it).

It shows the prompt's tokens; hovering one shows where it looks in the chosen layer and
head (each earlier token shaded by its weight). Below: the attention of the chosen layer
and head as a heatmap, the logit lens as a table (cell colour = top-1 probability), the
share of positions predicting the current versus the next token per layer, and the
three PNG figures (for a model whose attention is split into one picture per layer, also
the chosen layer's). Every cell shows its exact numbers on hover. A table wider than the
window scrolls sideways inside its own box, its row names staying in view.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from specformer_eval.figure_layout import MAX_LABELLED_TOKENS, labelled
from specformer_eval.figures import layer_names
from specformer_eval.inspection import Inspection


def write_page(inspection: Inspection, *, path: Path, title: str, position: int, images: dict[str, Path],
               layer_images: Sequence[Path] = ()) -> Path:
    """Write the page (see the module doc) to ``path``; ``images`` maps a caption to a PNG to embed,
    ``layer_images`` are one attention picture per layer (shown for the layer chosen on the page)."""
    data = {
        "tokens": inspection.labels,
        "ids": inspection.ids,
        "attention": _rounded(inspection.attention),  # [layer][head][query][key]
        "lens": {"labels": inspection.lens_labels, "probs": _rounded(inspection.lens_probs),
                 "layers": layer_names(inspection.lens_probs.shape[0])},
        "current": _shares(inspection.current_share),
        "next": _shares(inspection.next_share),
        "position": position,
    }
    figures = [_figure(caption, png) for caption, png in images.items()]
    figures += [_figure(f"attention of layer {layer}, every head (the layer chosen above)", png, layer=layer)
                for layer, png in enumerate(layer_images)]
    tokens = len(inspection.ids)
    note = "" if labelled(tokens) else (
        f'<p class="hint" id="unlabelled">The pictures leave out the token labels: the prompt has {tokens} tokens, '
        f"more than {MAX_LABELLED_TOKENS}. The tables above have every token.</p>\n")
    page = TEMPLATE.replace("{{title}}", html.escape(title)).replace("{{figures}}", note + "\n".join(figures))
    page = page.replace("{{data}}", script_json(data))
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(path)
    return path


def _figure(caption: str, png: Path, *, layer: int | None = None) -> str:
    """A figure element holding ``png`` inline; one of a layer is shown only while that layer is chosen."""
    data = base64.b64encode(Path(png).read_bytes()).decode()
    tag = "<figure>" if layer is None else f'<figure data-layer="{layer}" hidden>'
    return (f'{tag}<img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def script_json(value: object) -> str:
    """``value`` as JSON that can sit inside a ``<script>`` element whatever its strings hold.

    The HTML parser reads a script element's text before any JSON parser does: ``</script>``
    would end it early, and ``<!--`` followed by ``<script>`` switches the parser into a state
    where the next ``</script>`` no longer ends it. Token strings are text from the tokenizer, so
    ``<``, ``>`` and ``&`` are written as JSON escapes (``\\u003c``, ``\\u003e``, ``\\u0026``), which
    decode to the same strings and leave the parser nothing to act on.
    """
    text = json.dumps(value, ensure_ascii=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _rounded(array: np.ndarray) -> list:
    return np.round(array.astype(np.float64), 4).tolist()


def _shares(values: np.ndarray) -> list[float | None]:
    # A one-token prompt has no next token: NaN, which JSON cannot hold, becomes null.
    return [None if np.isnan(v) else round(float(v), 4) for v in values]


TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{title}}</title>
<style>
  body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #1d1d1f; background: #fff; }
  h1 { font-size: 1.3rem; } h2 { font-size: 1.1rem; margin-top: 2rem; }
  .hint { color: #666; font-size: .9rem; }
  #tokens { display: flex; flex-wrap: wrap; gap: 2px; font-family: ui-monospace, monospace; margin: .5rem 0; }
  #tokens span { padding: 2px 4px; border: 1px solid #ddd; border-radius: 3px; cursor: pointer; white-space: pre; }
  #tokens span.query { outline: 2px solid #d62728; }
  table { border-collapse: collapse; font-family: ui-monospace, monospace; font-size: 11px; }
  /* A long prompt makes the tables wider than the window: they scroll inside their box, the page does not,
     and the row names stay in view while the cells scroll under them. */
  .scroll { overflow-x: auto; max-width: 100%; }
  #heat tr > th:first-child, #lens tr > th:first-child { position: sticky; left: 0; z-index: 1; background: #fff;
                                                         text-align: right; }
  #heat td { width: 12px; height: 12px; padding: 0; }
  #heat th, #lens th { font-weight: normal; color: #555; padding: 0 3px; white-space: pre; }
  #lens td { min-width: 3.2em; height: 2.2em; text-align: center; padding: 0 2px; white-space: pre; }
  #shares td, #shares th { padding: 2px 8px; text-align: right; }
  .bar { display: inline-block; height: 8px; background: #4c72b0; vertical-align: middle; }
  .bar.next { background: #dd8452; }
  #tip { position: fixed; pointer-events: none; background: #222; color: #fff; padding: 4px 8px; border-radius: 4px;
         font: 12px ui-monospace, monospace; white-space: pre; display: none; z-index: 10; }
  figure { margin: 1rem 0; } figure img { max-width: 100%; border: 1px solid #eee; }
  select { margin-right: 1rem; }
</style>
</head>
<body>
<h1>{{title}}</h1>
<p class="hint">Hover over anything for its exact numbers. Hover a token to see where it looks; click it to keep it.</p>
<div>
  <label>layer <select id="layer"></select></label>
  <label>head <select id="head"></select></label>
</div>
<div id="tokens"></div>
<h2>Attention of the chosen layer and head</h2>
<p class="hint">Rows are queries (the token attending), columns keys (the token attended to).</p>
<div class="scroll"><table id="heat"></table></div>
<h2>Logit lens</h2>
<p class="hint">Each layer's residual stream read through the final norm and LM head: the top token predicted after
each input token, shaded by its probability.</p>
<div class="scroll"><table id="lens"></table></div>
<h2>What each layer predicts</h2>
<table id="shares"><thead><tr><th>layer</th><th>top token = current token</th><th>top token = next token</th></tr>
</thead><tbody></tbody></table>
<h2>Figures</h2>
{{figures}}
<div id="tip"></div>
<script id="data" type="application/json">{{data}}</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const T = D.tokens.length, L = D.attention.length, H = D.attention[0].length;
const tip = document.getElementById("tip");
const layerSel = document.getElementById("layer"), headSel = document.getElementById("head");
let query = D.position, pinned = D.position;

for (let l = 0; l < L; l++) layerSel.add(new Option(String(l), String(l)));
headSel.add(new Option("mean", "mean"));
for (let h = 0; h < H; h++) headSel.add(new Option(String(h), String(h)));

function weights(layer, head, q) {
  if (head !== "mean") return D.attention[layer][Number(head)][q];
  const out = new Array(T).fill(0);
  for (let h = 0; h < H; h++) for (let k = 0; k < T; k++) out[k] += D.attention[layer][h][q][k] / H;
  return out;
}
function shade(p, rgb) { return `rgba(${rgb},${Math.max(0, Math.min(1, Math.sqrt(p))).toFixed(3)})`; }
function fmt(p) { return Number(p).toFixed(4); }
function label(i) { return JSON.stringify(D.tokens[i]); }

function showTip(event, text) {
  tip.textContent = text; tip.style.display = "block";
  tip.style.left = (event.clientX + 14) + "px"; tip.style.top = (event.clientY + 14) + "px";
}
document.addEventListener("mouseout", () => { tip.style.display = "none"; });

const tokenRow = document.getElementById("tokens");
D.tokens.forEach((t, i) => {
  const s = document.createElement("span"); s.textContent = t; s.dataset.i = i; tokenRow.appendChild(s);
});
function drawTokens() {
  const w = weights(Number(layerSel.value), headSel.value, query);
  [...tokenRow.children].forEach((s, i) => {
    s.style.background = i <= query ? shade(w[i], "214,39,40") : "transparent";
    s.classList.toggle("query", i === query);
    s.dataset.tip = `token ${i} ${label(i)} (id ${D.ids[i]})\\nattention from token ${query} ${label(query)}: ${fmt(w[i])}`;
  });
}
tokenRow.addEventListener("mouseover", e => {
  const s = e.target.closest("span"); if (!s) return;
  query = Number(s.dataset.i); drawTokens(); showTip(e, s.dataset.tip);
});
tokenRow.addEventListener("mouseleave", () => { query = pinned; drawTokens(); });
tokenRow.addEventListener("click", e => {
  const s = e.target.closest("span"); if (s) { pinned = Number(s.dataset.i); query = pinned; drawTokens(); }
});

const heat = document.getElementById("heat");
function drawHeat() {
  const layer = Number(layerSel.value), head = headSel.value;
  heat.innerHTML = "";
  const header = heat.insertRow(); header.appendChild(document.createElement("th"));
  for (let k = 0; k < T; k++) { const th = document.createElement("th"); th.textContent = D.tokens[k].slice(0, 1); header.appendChild(th); }
  for (let q = 0; q < T; q++) {
    const row = heat.insertRow(); const th = document.createElement("th"); th.textContent = D.tokens[q]; row.appendChild(th);
    const w = weights(layer, head, q);
    for (let k = 0; k < T; k++) {
      const td = row.insertCell(); td.style.background = shade(w[k], "68,1,84");
      td.dataset.tip = `layer ${layer}, head ${head}\\nquery ${q} ${label(q)} -> key ${k} ${label(k)}\\np = ${fmt(w[k])}`;
    }
  }
}
heat.addEventListener("mouseover", e => { const td = e.target.closest("td"); if (td) showTip(e, td.dataset.tip); });

const lens = document.getElementById("lens");
(function drawLens() {
  const header = lens.insertRow(); header.appendChild(document.createElement("th"));
  D.tokens.forEach(t => { const th = document.createElement("th"); th.textContent = t; header.appendChild(th); });
  D.lens.probs.forEach((layer, r) => {
    const row = lens.insertRow(); const th = document.createElement("th"); th.textContent = D.lens.layers[r]; row.appendChild(th);
    layer.forEach((probs, pos) => {
      const td = row.insertCell(); const labels = D.lens.labels[r][pos];
      td.textContent = labels[0]; td.style.background = shade(probs[0], "31,119,180");
      td.style.color = probs[0] > 0.5 ? "#fff" : "#000";
      const next = pos + 1 < T ? label(pos + 1) : "(end)";
      td.dataset.tip = `${D.lens.layers[r]}, after token ${pos} ${label(pos)} (next input: ${next})\\n` +
        labels.map((t, i) => `${i + 1}. ${JSON.stringify(t)}  ${fmt(probs[i])}`).join("\\n");
    });
  });
})();
lens.addEventListener("mouseover", e => { const td = e.target.closest("td"); if (td) showTip(e, td.dataset.tip); });

(function drawShares() {
  const body = document.querySelector("#shares tbody");
  D.current.forEach((c, r) => {
    const row = body.insertRow(); const n = D.next[r];
    row.insertCell().textContent = D.lens.layers[r];
    row.insertCell().innerHTML = `${fmt(c)} <span class="bar" style="width:${Math.round(c * 120)}px"></span>`;
    row.insertCell().innerHTML = n === null ? "n/a" : `${fmt(n)} <span class="bar next" style="width:${Math.round(n * 120)}px"></span>`;
  });
})();

function showLayerFigure() {
  document.querySelectorAll("figure[data-layer]").forEach(f => { f.hidden = f.dataset.layer !== layerSel.value; });
}
layerSel.addEventListener("change", () => { drawTokens(); drawHeat(); showLayerFigure(); });
headSel.addEventListener("change", () => { drawTokens(); drawHeat(); });
drawTokens(); drawHeat(); showLayerFigure();
document.body.dataset.ready = "1";
</script>
</body>
</html>
"""
