"""The residual stream as a kind: the core's contract, the builder's checks, and one clear line for a bad spec."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import specformer
from fixtures.tiny import tiny_spec
from specformer.cli.main import main
from specformer.errors import SpecError
from specformer.model.residual import ResidualConnection, ResidualStream
from specformer.registry.discovery import build_registry, get_plugin_manager
from specformer_layers.layouts.params import PreNormBlockParams


def test_the_default_connection_adds_each_output_in_turn() -> None:
    x, a, b = (torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
    conn = ResidualConnection()
    read, mix = conn.read(x)
    assert read is x and mix is None
    assert torch.equal(conn.write(x, a, b, mix=mix), (x + a) + b)  # the parallel layout's x + attention + ffn
    stream = ResidualStream()
    assert stream.expand(x) is x and stream.collapse(x) is x and stream.describe() is None


class OwnBlock(nn.Module):
    """A third-party layout that adds to the stream itself (it names no make_residual)."""

    Params = PreNormBlockParams

    def __init__(self, params: Any = None, *, mixer: nn.Module, ffn: nn.Module, make_norm: Any) -> None:
        super().__init__()
        self.mixer, self.ffn, self.norm = mixer, ffn, make_norm()

    def forward(self, x: Tensor, ctx: Any) -> Tensor:
        return x + self.ffn(self.norm(x + self.mixer(self.norm(x), ctx)))


@pytest.fixture
def registry() -> Any:
    fresh = build_registry(get_plugin_manager())
    fresh.register("layout", "own", factory=OwnBlock, params=PreNormBlockParams, plugin="tests")
    return fresh


def test_a_layout_without_connections_runs_on_one_stream_and_is_refused_with_several(registry: Any) -> None:
    model = specformer.build(tiny_spec(block={"layout": "own"}), registry=registry, seed=0)
    assert model(torch.randint(0, 97, (1, 5))).shape == (1, 5, 97)
    with pytest.raises(SpecError) as caught:
        specformer.build(tiny_spec(block={"layout": "own", "residual": "mhc"}), registry=registry)
    assert str(caught.value).splitlines()[1].strip() == (
        "model.block.layout: layout 'own' takes no make_residual, so it adds to a single residual stream; it cannot "
        "run with the 4 streams of model.block.residual (use residual: single)")


#: (the spec's changes, the one problem validate prints)
BAD: dict[str, tuple[dict[str, Any], str]] = {
    "one stream": ({"block": {"residual": {"kind": "mhc", "n_streams": 1}}},
                   "model.block.residual.n_streams: one stream is the plain residual (mixing one stream with itself is "
                   "the identity): use residual: single, or n_streams 2 or more (got 1)"),
    "no Sinkhorn step": ({"block": {"residual": {"kind": "mhc", "sinkhorn_iterations": 0}}},
                         "model.block.residual.sinkhorn_iterations: Input should be greater than or equal to 1"),
    "misspelt": ({"block": {"residual": "mhcc"}}, "model.block.residual.kind: unknown residual 'mhcc'; did you mean 'mhc'?"),
    "post-norm on streams": ({"block": {"layout": "postnorm", "residual": "mhc"}},
                             "model.block.layout: postnorm normalises the residual stream itself, which needs one stream"),
    "per layer": ({"layers": [{"select": 0, "residual": "mhc"}]},
                  "model.layers[0].residual: unknown field; accepted: select, layout"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_residual_is_one_problem(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    changes, problem = BAD[case]
    path = tmp_path / "spec.json"
    block = changes.get("block", {})
    path.write_text(json.dumps(tiny_spec(block=block, **{k: v for k, v in changes.items() if k != "block"})))
    assert main(["validate", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == f"{path}: 1 problem in the spec:", lines
    # The last line may name the checks these problems held back; it is not a problem.
    problems = [line for line in lines[1:] if not line.strip().startswith("(checked once these are fixed")]
    assert len(problems) == 1 and problems[0].strip().startswith(problem), lines
