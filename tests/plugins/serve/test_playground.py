"""The playground page at ``/`` in headless Chromium: a prompt is submitted and the streamed text appears.

Uses Debian's ``chromium`` over the DevTools protocol (the docs tests' driver,
tests/docs/docs_browser.py); the screenshot goes to ``artifacts/serve/`` (git-ignored).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import httpx
import pytest

from .conftest import MODEL_ID, make_server

REPO = Path(__file__).resolve().parents[3]
ARTIFACTS = REPO / "artifacts" / "serve"


def _driver():
    spec = importlib.util.spec_from_file_location("serve_docs_browser", REPO / "tests" / "docs" / "docs_browser.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


driver = _driver()
pytestmark = pytest.mark.skipif(not driver.CHROMIUM.exists(),
                                reason=f"{driver.CHROMIUM} is not installed (Debian: apt-get install chromium)")


def test_the_page_is_self_contained(server) -> None:
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page.text), "the page loads an external asset"
    assert json.dumps(MODEL_ID) in page.text


def test_a_prompt_submitted_in_the_page_streams_its_text(model) -> None:
    with make_server(model, api_key="page-key") as server:
        expected = httpx.post(f"{server.url}/v1/completions", headers={"Authorization": "Bearer page-key"}, json={
            "model": MODEL_ID, "prompt": "Hello, playground", "max_tokens": 40, "temperature": 0}).json()
        browser = driver.Browser(width=1200, height=800)
        try:
            browser.goto(server.url + "/")
            assert browser.evaluate("document.getElementById('model').textContent") == MODEL_ID
            browser.evaluate("""(() => {
                document.getElementById('prompt').value = 'Hello, playground';
                document.getElementById('temperature').value = '0';
                document.getElementById('max_tokens').value = '40';
                document.getElementById('api_key').value = 'page-key';
                document.getElementById('send').click();
            })()""")
            stats = browser.wait_for("(() => { const s = document.getElementById('stats').textContent;"
                                     " return s.includes('tokens/s') ? s : ''; })()")
            assert browser.evaluate("document.getElementById('error').textContent") == ""
            shown = browser.evaluate("document.getElementById('output').textContent")
            assert shown == "Hello, playground" + expected["choices"][0]["text"]
            assert stats.startswith(f"{expected['usage']['completion_tokens']} tokens in "), stats
            shot = browser.screenshot(ARTIFACTS / "playground.png")
            assert shot.stat().st_size > 5_000
            # A wrong key shows the server's error in the page instead of text.
            browser.evaluate("document.getElementById('api_key').value = 'wrong'; document.getElementById('send').click()")
            error = browser.wait_for("document.getElementById('error').textContent")
            assert error.startswith("401: missing or wrong API key")
        finally:
            browser.close()
