"""The page served at ``GET /``: a prompt box, sampler settings, streamed output and tokens/s.

Self-contained (inline CSS and JavaScript, no external asset, no build step). It calls
this server's own ``/v1/completions`` or ``/v1/chat/completions`` with ``stream: true`` and
reads the server-sent events with ``fetch``; the API key, when the server has one, is
typed into the page and sent as a bearer token.

:func:`page` fills in the served model's id, which the operator chose and which may hold
anything: it goes into the page's script as JSON whose ``<``, ``>`` and ``&`` are written
as ``\\u003c``, ``\\u003e`` and ``\\u0026`` (so no ``</script>`` or ``<!--`` can end or
change the script element), and into the page's text HTML-escaped.
"""

import html
import json
import re

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>specformer playground: {{MODEL_TEXT}}</title>
<style>
  body { font-family: system-ui, sans-serif; margin: 0; background: #f6f7f9; color: #1d2330; }
  header { background: #243b6b; color: white; padding: 12px 24px; }
  header h1 { font-size: 18px; margin: 0; }
  header span { opacity: .8; font-size: 13px; }
  main { display: grid; grid-template-columns: 1fr 280px; gap: 20px; padding: 20px 24px; max-width: 1200px; }
  textarea { width: 100%; box-sizing: border-box; height: 140px; font: 14px ui-monospace, monospace; padding: 8px; }
  #output { white-space: pre-wrap; background: white; border: 1px solid #cdd3de; min-height: 200px; padding: 10px;
            font: 14px ui-monospace, monospace; margin-top: 12px; }
  #output .prompt { color: #6b7385; }
  fieldset { border: 1px solid #cdd3de; background: white; padding: 10px 12px; }
  label { display: block; font-size: 13px; margin: 8px 0 2px; }
  input, select { width: 100%; box-sizing: border-box; padding: 4px; }
  button { margin-top: 10px; padding: 8px 18px; font-size: 14px; background: #243b6b; color: white; border: 0;
           border-radius: 3px; cursor: pointer; }
  button:disabled { background: #8892a6; }
  #stats { font-size: 13px; color: #47506a; margin-top: 8px; min-height: 1em; }
  #error { color: #a4161a; font-size: 13px; margin-top: 8px; white-space: pre-wrap; }
</style>
</head>
<body>
<header><h1>specformer playground</h1><span id="model">{{MODEL_TEXT}}</span></header>
<main>
  <section>
    <textarea id="prompt" placeholder="Write a prompt, then Generate (Ctrl+Enter)"></textarea>
    <button id="send">Generate</button> <button id="stop" disabled>Stop</button>
    <div id="stats"></div>
    <div id="error"></div>
    <div id="output"></div>
  </section>
  <fieldset>
    <legend>Settings</legend>
    <label for="mode">Endpoint</label>
    <select id="mode"><option value="completions">completion</option><option value="chat">chat (one user turn)</option></select>
    <label for="max_tokens">max_tokens</label><input id="max_tokens" type="number" min="1" value="64">
    <label for="temperature">temperature</label><input id="temperature" type="number" min="0" max="2" step="0.05" value="0.8">
    <label for="top_p">top_p</label><input id="top_p" type="number" min="0.01" max="1" step="0.01" value="1">
    <label for="seed">seed (empty: random)</label><input id="seed" type="number" value="">
    <label for="stop_text">stop (empty: none)</label><input id="stop_text" type="text" value="">
    <label for="api_key">API key (if the server has one)</label><input id="api_key" type="password" value="">
  </fieldset>
</main>
<script>
"use strict";
const MODEL = {{MODEL_ID}};
const $ = (id) => document.getElementById(id);
$("model").textContent = MODEL;
let controller = null;

function body() {
  const mode = $("mode").value;
  const b = { model: MODEL, stream: true, stream_options: { include_usage: true },
              max_tokens: parseInt($("max_tokens").value, 10),
              temperature: parseFloat($("temperature").value), top_p: parseFloat($("top_p").value) };
  if ($("seed").value !== "") b.seed = parseInt($("seed").value, 10);
  if ($("stop_text").value !== "") b.stop = $("stop_text").value;
  if (mode === "chat") b.messages = [{ role: "user", content: $("prompt").value }];
  else b.prompt = $("prompt").value;
  return [mode === "chat" ? "/v1/chat/completions" : "/v1/completions", b];
}

async function generate() {
  const [url, b] = body();
  const out = $("output");
  out.textContent = "";
  if (!b.messages) { const p = document.createElement("span"); p.className = "prompt"; p.textContent = b.prompt; out.append(p); }
  const text = document.createTextNode(""); out.append(text);
  $("error").textContent = ""; $("stats").textContent = "waiting for the first token...";
  $("send").disabled = true; $("stop").disabled = false;
  controller = new AbortController();
  const headers = { "Content-Type": "application/json" };
  if ($("api_key").value) headers["Authorization"] = "Bearer " + $("api_key").value;
  const start = performance.now();
  let first = null, chunks = 0, usage = null;
  try {
    const response = await fetch(url, { method: "POST", headers, body: JSON.stringify(b), signal: controller.signal });
    if (!response.ok) {
      const err = await response.json().catch(() => ({}));
      throw new Error(response.status + ": " + ((err.error && err.error.message) || response.statusText));
    }
    const reader = response.body.getReader(), decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\\n\\n")) >= 0) {
        const line = buffer.slice(0, cut); buffer = buffer.slice(cut + 2);
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") continue;
        const event = JSON.parse(data);
        if (event.error) throw new Error(event.error.message);
        if (event.usage) usage = event.usage;
        for (const c of event.choices || []) {
          const piece = c.text !== undefined ? c.text : (c.delta && c.delta.content) || "";
          if (!piece) continue;
          if (first === null) first = performance.now();
          chunks += 1; text.data += piece;
          const seconds = (performance.now() - first) / 1000;
          $("stats").textContent = chunks + " chunks, " + (seconds > 0 ? (chunks / seconds).toFixed(1) : "-") + " chunks/s";
        }
      }
    }
    const seconds = (performance.now() - start) / 1000;
    const tokens = usage ? usage.completion_tokens : chunks;
    const ttft = first === null ? "-" : ((first - start) / 1000).toFixed(3) + " s";
    $("stats").textContent = tokens + " tokens in " + seconds.toFixed(2) + " s (" + (tokens / seconds).toFixed(1) +
                             " tokens/s, first token after " + ttft + ")";
  } catch (e) {
    if (e.name !== "AbortError") $("error").textContent = String(e.message || e);
    else $("stats").textContent += " (stopped)";
  } finally {
    $("send").disabled = false; $("stop").disabled = true; controller = null;
  }
}

$("send").addEventListener("click", generate);
$("stop").addEventListener("click", () => controller && controller.abort());
$("prompt").addEventListener("keydown", (e) => { if (e.key === "Enter" && e.ctrlKey) generate(); });
</script>
</body>
</html>
"""


def script_json(value: object) -> str:
    """``value`` as JSON that cannot end or alter the <script> element it is written into."""
    text = json.dumps(value, ensure_ascii=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def page(*, model_id: str) -> str:
    """The playground's HTML for a server serving ``model_id``."""
    filled = {"{{MODEL_ID}}": script_json(model_id), "{{MODEL_TEXT}}": html.escape(model_id)}
    # One pass, so a model id that itself holds a placeholder is not filled in again.
    return re.sub(r"\{\{MODEL_(?:ID|TEXT)\}\}", lambda match: filled[match.group(0)], PAGE)
