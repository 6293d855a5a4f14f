"""``specformer inspect``: the four files, what they hold, the token choice, user errors, and the page in
headless Chromium (skipped, with the reason, where Chromium is not installed)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch

import specformer
from specformer.cli.main import main
from specformer_eval import capture, figure_layout, logit_lens
from specformer_eval.figures import BY_LAYER
from specformer_eval.inspection import choose_token, inspect_prompt, token_label
from specformer_eval.page import write_page

from .support import BYTES, byte_model, save_with_tokenizer

REPO = Path(__file__).resolve().parents[3]
ARTIFACTS = REPO / "artifacts" / "inspect"
PROMPT = "def add(a, b): return a + b"


def _docs_browser():
    """tests/docs/docs_browser.py, the project's dependency-free Chromium driver."""
    if "docs_browser" in sys.modules:
        return sys.modules["docs_browser"]
    spec = importlib.util.spec_from_file_location("docs_browser", REPO / "tests" / "docs" / "docs_browser.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_browser"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_with_tokenizer(byte_model(), tmp_path_factory.mktemp("ckpt") / "model.safetensors")


@pytest.fixture(scope="module")
def written(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("inspect") / "out"
    code = main(["inspect", str(checkpoint), "--prompt", PROMPT, "--token", "b", "--out", str(out), "--top-k", "3"])
    assert code == 0
    return out


def test_writes_the_four_files(written):
    names = sorted(p.name for p in written.iterdir())
    assert names == ["attention-b.png", "attention.png", "index.html", "logit-lens.png"]
    from matplotlib.image import imread

    for name in ("attention.png", "attention-b.png", "logit-lens.png"):
        image = imread(written / name)
        assert image.ndim == 3 and min(image.shape[:2]) > 200, name
        assert image[..., :3].std() > 0.05, f"{name} is blank"


def test_the_page_is_self_contained_and_holds_the_numbers(written, checkpoint):
    page = (written / "index.html").read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "the page must not load anything"
    assert "<link" not in page and page.count("data:image/png;base64,") == 3
    data = json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S).group(1))
    model = specformer.load(checkpoint)
    ids = torch.tensor([BYTES.encode(PROMPT)])
    with torch.no_grad(), capture(model, attention=True) as cap:
        model(ids)
    attention = np.array(data["attention"])  # (L, H, T, T)
    assert attention.shape == (2, 4, len(PROMPT), len(PROMPT))
    assert np.allclose(attention, torch.stack([a[0] for a in cap.attention]).numpy(), atol=1e-4)
    lens = logit_lens(model, cap, k=3)
    assert np.allclose(np.array(data["lens"]["probs"]), lens.probs[:, 0].numpy(), atol=1e-4)
    assert data["lens"]["labels"][-1][0][0] == BYTES.decode([int(lens.ids[-1, 0, 0, 0])]).replace(" ", "·")
    assert data["tokens"][3] == "·" and data["position"] == PROMPT.rindex("b")


def test_the_token_is_a_position_or_a_text():
    model = byte_model()
    inspection = inspect_prompt(model, BYTES, "ab ab")
    assert choose_token(inspection, None) == 4
    assert choose_token(inspection, "a") == 3 and choose_token(inspection, "1") == 1
    assert choose_token(inspection, "-2") == 3 and choose_token(inspection, " ") == 2
    assert np.allclose(inspection.attention.sum(-1), 1.0, atol=1e-5)
    assert inspection.lens_probs.shape == (3, 5, 5) and (np.diff(inspection.lens_probs, axis=-1) <= 0).all()


@pytest.mark.parametrize("changes,message", [
    ({"--token": "zz"}, "--token 'zz' is not one of the prompt's tokens"),
    ({"--token": "99"}, "--token 99: the prompt has 27 tokens"),
    ({"--prompt": ""}, "--prompt is empty"),
    ({"--prompt": "x" * 40}, "--prompt is 40 tokens long, more than the model's context of 32"),
    ({"--top-k": "0"}, "--top-k must be at least 1"),
])
def test_user_errors(capsys, checkpoint, tmp_path, changes, message):
    options = {"--prompt": PROMPT, "--out": str(tmp_path / "o"), **changes}
    code = main(["inspect", str(checkpoint), *(item for pair in options.items() for item in pair)])
    _, err = capsys.readouterr()
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "o" / "index.html").exists()


def test_the_page_in_headless_chromium(written):
    browser_module = _docs_browser()
    if not browser_module.CHROMIUM.exists():
        pytest.skip(f"{browser_module.CHROMIUM} is not installed (Debian: apt-get install chromium); "
                    "the browser check of the inspect page needs it")
    browser = browser_module.Browser(width=1400, height=1000)
    try:
        with browser_module.serve(written) as url:
            browser.goto(f"{url}index.html")
            browser.wait_for("document.body.dataset.ready === '1'")
            rows = browser.evaluate("document.querySelectorAll('#lens tr').length")
            cells = browser.evaluate("document.querySelectorAll('#heat td').length")
            assert rows == 1 + 3 and cells == len(PROMPT) ** 2
            # Hover one logit-lens cell: the tooltip shows its exact top-3 probabilities.
            box = browser.evaluate("(() => { const r = document.querySelector('#lens tr:nth-child(4) td:nth-of-type(5)')"
                                   ".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()")
            browser.call("Input.dispatchMouseEvent", session=True, type="mouseMoved", x=box[0], y=box[1])
            tip = browser.wait_for("document.getElementById('tip').style.display === 'block' && "
                                   "document.getElementById('tip').textContent")
            data = json.loads(browser.evaluate("document.getElementById('data').textContent"))
            expected = f"{data['lens']['probs'][2][4][0]:.4f}"
            assert "after layer 1, after token 4" in tip and expected in tip, tip
            # Hover a token: earlier tokens are shaded by the attention it pays them.
            box = browser.evaluate("(() => { const r = document.querySelector('#tokens span:nth-child(10)')"
                                   ".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()")
            browser.call("Input.dispatchMouseEvent", session=True, type="mouseMoved", x=box[0], y=box[1])
            shaded = browser.evaluate("[...document.querySelectorAll('#tokens span')].map(s => s.style.background)")
            assert all(s.startswith("rgba") for s in shaded[:10]) and all(s in ("", "transparent") for s in shaded[10:])
            shot = browser.screenshot(ARTIFACTS / "index.png", full_page=True)
            assert shot.stat().st_size > 20_000
    finally:
        browser.close()


class _PayloadTokenizer:
    """Each token is a whole piece of markup, matched longest first: what a real vocabulary may hold."""

    VOCAB = ["<!--<script>", "</script>", "<img src=x onerror=alert(1)>", "&amp;", "]]>", "-->", "x"]

    def encode(self, text: str) -> list[int]:
        ids = []
        while text:
            piece = max((t for t in self.VOCAB if text.startswith(t)), key=len)
            ids.append(self.VOCAB.index(piece))
            text = text[len(piece):]
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(self.VOCAB[i] for i in ids)

    def to_json(self) -> str:
        return json.dumps({"vocab": self.VOCAB})


class _Elements(HTMLParser):
    """Every element the HTML parser opens, with its attributes, and each script element's text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self.comments: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._in_script = True
            self.scripts.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts[-1] += data

    def handle_comment(self, data: str) -> None:
        self.comments.append(data)


def test_markup_in_the_tokens_stays_inside_the_data_script(tmp_path):
    # "<!--<script>" inside a script element makes an HTML5 parser ignore the next "</script>";
    # "</script>" would end the element; the others would be markup or a reference outside it.
    tokenizer = _PayloadTokenizer()
    prompt = "x<!--<script>x</script><img src=x onerror=alert(1)>&amp;]]>-->x"
    model = byte_model(vocab_size=len(tokenizer.VOCAB))
    inspection = inspect_prompt(model, tokenizer, prompt, k=len(tokenizer.VOCAB))
    assert "<!--<script>" in inspection.labels and "</script>" in inspection.labels
    page = write_page(inspection, path=tmp_path / "index.html", title="payloads", position=1, images={}).read_text(
        encoding="utf-8")

    elements = _Elements()
    elements.feed(page)
    elements.close()
    scripts = [attrs for tag, attrs in elements.tags if tag == "script"]
    assert scripts == [{"id": "data", "type": "application/json"}, {}]
    assert not [tag for tag, _ in elements.tags if tag in ("img", "figure")] and not elements.comments
    # Neither parser state nor entity can start in the data: no "<", ">" or "&" reaches the HTML parser.
    assert sorted(set("<>&") & set(elements.scripts[0])) == []
    data = json.loads(elements.scripts[0])
    assert data["tokens"] == inspection.labels == [token_label(tokenizer, i) for i in tokenizer.encode(prompt)]
    assert data["lens"]["labels"] == inspection.lens_labels
    # Every token of the vocabulary is somewhere in the lens (its top-k is the whole vocabulary).
    assert {label for layer in data["lens"]["labels"] for position in layer for label in position} == {
        token_label(tokenizer, i) for i in range(len(tokenizer.VOCAB))}
    assert "const D = JSON.parse" in elements.scripts[1]


class _Nesting(HTMLParser):
    """For each element with an id, the elements it sits in (outermost first); and the style sheet."""

    VOID = {"meta", "img", "br", "input", "link", "hr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[tuple[str, dict[str, str | None]]] = []
        self.around: dict[str, list[tuple[str, dict[str, str | None]]]] = {}
        self.style = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if named.get("id"):
            self.around[named["id"]] = list(self.open)
        if tag not in self.VOID:
            self.open.append((tag, named))

    def handle_endtag(self, tag: str) -> None:
        while self.open and self.open.pop()[0] != tag:
            pass

    def handle_data(self, data: str) -> None:
        if self.open and self.open[-1][0] == "style":
            self.style += data


def _rule(style: str, selector: str) -> dict[str, str]:
    """The declarations of the CSS rule whose selector list is exactly ``selector``."""
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", re.sub(r"/\*.*?\*/", "", style, flags=re.S)):
        if " ".join(selectors.split()) == selector:
            return dict((k.strip(), v.strip()) for k, v in (d.split(":", 1) for d in body.split(";") if ":" in d))
    raise AssertionError(f"no CSS rule {selector!r}")


def test_the_tables_scroll_sideways_inside_their_own_box(written):
    page = _Nesting()
    page.feed((written / "index.html").read_text(encoding="utf-8"))
    for table in ("lens", "heat"):
        tag, attrs = page.around[table][-1]
        assert tag == "div" and "scroll" in attrs["class"].split(), (table, page.around[table][-1])
    assert _rule(page.style, ".scroll")["overflow-x"] == "auto"
    sticky = _rule(page.style, "#heat tr > th:first-child, #lens tr > th:first-child")
    assert sticky["position"] == "sticky" and sticky["left"] == "0" and sticky["background"] == "#fff"
    assert "unlabelled" not in page.around, "27 tokens are labelled in the pictures"


def test_past_64_tokens_the_page_says_the_pictures_have_no_labels(tmp_path):
    inspection = inspect_prompt(byte_model(context_length=128), BYTES, "ab " * 30)
    assert len(inspection.ids) == 90
    page = write_page(inspection, path=tmp_path / "index.html", title="long", position=0, images={})
    note = re.search(r'<p class="hint" id="unlabelled">(.*?)</p>', page.read_text(encoding="utf-8")).group(1)
    assert "the prompt has 90 tokens, more than 64" in note


def test_a_grid_too_big_for_one_picture_is_one_picture_per_layer(checkpoint, tmp_path, monkeypatch, capsys):
    # The 2-layer model's labelled grid is about 1.7 megapixels: over a limit of 1, it is split.
    monkeypatch.setattr(figure_layout, "MAX_PIXELS", 1_000_000)
    out = tmp_path / "out"
    assert main(["inspect", str(checkpoint), "--prompt", PROMPT, "--token", "b", "--out", str(out)]) == 0
    per_layer = [out / BY_LAYER / f"layer-{layer:02d}.png" for layer in range(2)]
    expected = [out / "attention.png", *per_layer, out / "attention-b.png", out / "logit-lens.png", out / "index.html"]
    assert capsys.readouterr().out.split() == [str(path) for path in expected]
    assert all(path.is_file() for path in expected)
    from matplotlib.image import imread

    assert all(imread(path).shape[0] * imread(path).shape[1] <= 1_000_000 for path in per_layer)
    text = (out / "index.html").read_text(encoding="utf-8")
    figures = re.findall(r"<figure([^>]*)><img[^>]*><figcaption>([^<]*)</figcaption>", text)
    assert [attrs for attrs, _ in figures] == ["", "", "", ' data-layer="0" hidden', ' data-layer="1" hidden']
    assert figures[3][1] == "attention of layer 0, every head (the layer chosen above)"
    assert "f.hidden = f.dataset.layer !== layerSel.value" in text


def test_a_model_with_recurrent_layers_is_refused_in_one_line_naming_them():
    from fixtures.tiny import tiny_spec
    from specformer.errors import UserError
    from specformer.tokenizers.tokenizer import ByteTokenizer
    from specformer_eval.inspection import inspect_prompt

    spec = tiny_spec(vocab_size=259, n_layers=4, block={"mixer": {"kind": "gated_deltanet", "n_heads": 4}},
                     layers=[{"select": 3, "mixer": {"kind": "attention", "n_heads": 4}}])
    model = specformer.build(spec, seed=0)
    with pytest.raises(UserError, match=r"^specformer inspect draws every layer's attention, but layers 0-2 "
                                        r"\(GatedDeltaNet\) have no attention probabilities"):
        inspect_prompt(model, ByteTokenizer(), "abc")
