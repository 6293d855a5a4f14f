"""The plugin tutorial's package (examples/specformer-tutorial) installs, passes its tests, and does what the page says.

The package is never installed into this environment (its components would then show up in
the user's catalogue): the ``tutorial_staged`` fixture lays it out in a temporary folder with
its entry points, and everything that must see it through its entry point runs in a fresh
interpreter with that folder on its ``PYTHONPATH``, as an installed package would be found.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from docs_site import HOOKS, REPO
from specformer.errors import RegistryError
from specformer.registry.discovery import get_registry
from specformer.registry.components import Registry

TUTORIAL = REPO / "examples" / "specformer-tutorial"
PAGE = REPO / "docs" / "writing-a-plugin.md"


def run(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def own_tests(tutorial_staged):
    """The tutorial's own suite, run in the background while the test waits (slow suite only)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(TUTORIAL / "tests")],
        cwd=TUTORIAL, env=tutorial_staged.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


# One fresh interpreter (entry points are read at start-up) runs every check that needs the
# plugin installed and reports back as JSON: starting Python with torch costs seconds.
PROBE = """
import contextlib, io, json, sys
import specformer_tutorial.plugin  # what specformer imports to list the plugin's components
registering = sorted(m for m in sys.modules if m.startswith("specformer_tutorial"))
sys.path.insert(0, HOOKS)
from specformer.cli.main import main
from specformer.registry.discovery import get_registry
from docsgen.plugin_scope import load_plugins

# The site documents the built-in plugins only, unless mkdocs.yml / SPECFORMER_DOCS_PLUGINS asks for all.
builtin_norms = (load_plugins("builtin"), get_registry().names("norm"))
load_plugins("installed")
from docsgen.pages import generate

def cli(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return {"code": code, "out": out.getvalue(), "err": err.getvalue()}

report = {
    "plugins": cli("plugins"),
    "norms": cli("components", "norm"),
    "swap": cli("dyt-swap", "specs/gpt2-124m.yaml", "-o", OUT),
    "original": cli("summary", "--json", "specs/gpt2-124m.yaml"),
    "swapped": cli("summary", "--json", OUT),
}

from docsgen.snippets import check_block, code_blocks
page = open(PAGE, encoding="utf-8").read()
report["snippets"] = [
    [block.language, check_block(block, get_registry()), block.code.lstrip().startswith("# needs plugin:")]
    for block in code_blocks(page, page="writing-a-plugin.md")
]

generated = generate()
report["snippet_errors"] = generated.snippet_errors()
report["norm_page"] = generated.pages["catalogue/norm.md"]
report["sampler_page"] = generated.pages["catalogue/sampler.md"]
report["builtin"] = builtin_norms
report["registering"] = registering
from specformer_tutorial import DyT, EtaSampling
spec_norm, python_norm = get_registry().resolve("norm", {"kind": "dyt"}).make(dim=4), DyT(dim=4)
report["dyt_defaults"] = [[repr(m), m.alpha_init, m.bias is None] for m in (spec_norm, python_norm)]
report["factories"] = [get_registry().get("norm", "dyt").factory is DyT,
                       get_registry().get("sampler", "eta").factory is EtaSampling]
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def probe(tutorial_staged, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("tutorial") / "gpt2-dyt.yaml"
    header = f"HOOKS, PAGE, OUT = {str(HOOKS)!r}, {str(PAGE)!r}, {str(out)!r}\n"
    result = run("-c", header + PROBE, env=tutorial_staged.env())
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_cli_lists_the_plugin_and_its_components(probe):
    plugins, norms = probe["plugins"], probe["norms"]
    assert plugins["code"] == 0 and norms["code"] == 0, plugins["err"] + norms["err"]
    assert re.search(r"^tutorial\s+specformer-tutorial 0\.1\.0\s+module specformer_tutorial\.plugin\s+\(2 components\)",
                     plugins["out"], re.M), plugins["out"]
    assert re.search(r"^\s+dyt\s+\[tutorial\] Squash each channel", norms["out"], re.M), norms["out"]


def test_the_plugin_command_rewrites_a_spec_that_then_validates(probe):
    assert probe["swap"]["code"] == 0, probe["swap"]["err"]
    assert probe["swapped"]["code"] == 0, probe["swapped"]["err"]
    original, swapped = (json.loads(probe[k]["out"]) for k in ("original", "swapped"))
    # DyT has LayerNorm's weight and bias plus one alpha: one extra parameter per norm (2 per block + final).
    assert swapped["total_params"] - original["total_params"] == 2 * 12 + 1


def test_the_tutorial_snippets_validate_with_the_plugin_installed(probe):
    validated = [kind for _, kind, needs_plugin in probe["snippets"] if needs_plugin]
    assert validated == ["spec"], probe["snippets"]  # checked for real, not skipped as "needs-plugin"


def test_a_site_built_with_the_plugin_lists_its_components(probe):
    documented, norms = probe["builtin"]  # by default the site documents the built-in plugins only
    assert "tutorial" not in documented and "layers" in documented
    assert "dyt" not in norms and "rmsnorm" in norms
    assert probe["snippet_errors"] == []
    assert "## dyt { #dyt }" in probe["norm_page"] and "arXiv:2503.10622" in probe["norm_page"]
    assert "## eta { #eta }" in probe["sampler_page"] and "epsilon: 0.0009" in probe["sampler_page"]


def test_the_plugin_follows_the_component_convention(probe):
    """Registering imports only the torch-free Params; the classes are the factories; one default each."""
    assert "specformer_tutorial.params" in probe["registering"]
    assert not {"specformer_tutorial.dyt", "specformer_tutorial.eta"} & set(probe["registering"]), probe["registering"]
    assert probe["factories"] == [True, True]
    spec_built, python_built = probe["dyt_defaults"]
    assert spec_built == python_built


@pytest.mark.slow  # a subprocess run of many seconds; CI runs it in the slow suite
def test_its_own_tests_pass(own_tests):
    output, _ = own_tests.communicate(timeout=600)
    assert own_tests.returncode == 0, output
    assert " passed" in output and "failed" not in output
    if importlib.util.find_spec("transformers") and importlib.util.find_spec("specformer_generate"):
        assert "skipped" not in output, output  # the reference comparisons really ran


def test_the_page_includes_every_file_of_the_package():
    page = PAGE.read_text(encoding="utf-8")
    files = [p for p in TUTORIAL.rglob("*") if p.is_file() and ".egg-info" not in str(p) and "__pycache__" not in p.parts
             and p.name != "README.md"]
    assert len(files) >= 9
    for path in files:
        include = f"<!-- specformer-include: {path.relative_to(REPO)} -->"
        assert include in page, f"{path.relative_to(REPO)} is not shown on the tutorial page"


def test_the_registry_errors_quoted_on_the_page_are_what_the_registry_says():
    sys.path.insert(0, str(TUTORIAL / "src"))
    try:
        from specformer_tutorial.params import DyTParams
    finally:
        sys.path.remove(str(TUTORIAL / "src"))
    page = " ".join(PAGE.read_text(encoding="utf-8").split())

    def message(register) -> str:
        with pytest.raises(RegistryError) as info:
            register()
        return " ".join(str(info.value).split())

    class Params(__import__("pydantic").BaseModel):
        alpha_init: float = 0.5

    view = Registry().for_plugin("tutorial")
    expected = [
        message(lambda: view.register("norm", "dyt", factory="specformer_tutorial.dyt.DyT", params=DyTParams)),
        message(lambda: view.register("norm", "dyt", factory="specformer_tutorial.dyt:DyT", params=Params)),
        message(lambda: get_registry().for_plugin("tutorial").register("norm", "rmsnorm",
                                                                        factory="specformer_tutorial.dyt:DyT",
                                                                        params=DyTParams)),
    ]
    for text in expected:
        assert text in page, f"the tutorial should quote:\n{text}"
