"""A router from a third-party plugin: registered, validated, built into moe and balanced like a built-in one."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

import specformer
from fixtures.isolated_plugin import stage
from specformer_train.router_balance import balance_routers

from ..support import tiny_spec_over_vocab

PYPROJECT = """
[project]
name = "specformer-cosine-router"
version = "0.1.0"
dependencies = ["specformer"]

[project.entry-points.specformer]
cosine_router = "specformer_cosine_router.plugin"

[tool.setuptools]
packages = ["specformer_cosine_router"]
"""

# Cosine routing (Chi et al. 2022, X-MoE): tokens and expert embeddings compared on the unit
# sphere, divided by a temperature; written only against the public API.
PLUGIN = '''
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from specformer import Params, hookimpl


class CosineTopK(nn.Module):
    """Softmax of cosine similarities between the token and each expert's embedding, over a temperature."""

    class Params(Params):
        temperature: float = Field(default=0.1, gt=0, description="Divides the cosine similarities.")
        bias_update_rate: float = Field(default=0.0, ge=0, description="Balance by bias at this rate.")

    def __init__(self, *, d_model, n_experts, top_k, temperature=0.1, bias_update_rate=0.0):
        super().__init__()
        self.top_k, self.temperature, self.bias_update_rate = top_k, temperature, bias_update_rate
        self.weight = nn.Parameter(torch.randn(n_experts, d_model) * 0.02)
        self.register_buffer("selection_bias", torch.zeros(n_experts))
        self.observed_load = None

    @classmethod
    def from_params(cls, params, *, d_model, n_experts, top_k):
        return cls(d_model=d_model, n_experts=n_experts, top_k=top_k, **params.model_dump())

    def forward(self, tokens):
        scores = F.normalize(tokens, dim=-1) @ F.normalize(self.weight, dim=-1).T / self.temperature
        probs = scores.float().softmax(dim=-1)
        experts = (probs + self.selection_bias).topk(self.top_k, dim=-1).indices
        if self.training and self.bias_update_rate:
            load = torch.bincount(experts.flatten(), minlength=probs.shape[-1]).float()
            self.observed_load = load if self.observed_load is None else self.observed_load + load
        weights = probs.gather(1, experts)
        return weights / weights.sum(dim=-1, keepdim=True), experts, probs


@hookimpl
def specformer_register_components(registry):
    registry.register("router", "cosine_topk", factory=CosineTopK.from_params, params=CosineTopK.Params,
                      paper="https://arxiv.org/abs/2204.09179")
'''


@pytest.fixture(scope="module")
def cosine_router(tmp_path_factory: pytest.TempPathFactory):
    project = tmp_path_factory.mktemp("cosine_router_project")
    (project / "pyproject.toml").write_text(textwrap.dedent(PYPROJECT), encoding="utf-8")
    package = project / "specformer_cosine_router"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "plugin.py").write_text(textwrap.dedent(PLUGIN), encoding="utf-8")
    with stage(project, tmp_path_factory.mktemp("cosine_router_site")).active() as staged:
        yield staged


def _spec(router: object) -> dict:
    spec = tiny_spec_over_vocab()
    spec["model"]["block"]["ffn"] = {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 16, "router": router}
    return spec


def test_a_plugin_router_is_registered_built_and_routes(cosine_router: object) -> None:
    component = specformer.get_registry().get("router", "cosine_topk")
    assert component.plugin == "cosine_router"
    model = specformer.build(_spec({"kind": "cosine_topk", "temperature": 0.05}), seed=0).eval()
    moe = model.blocks[0].ffn
    assert type(moe.router).__name__ == "CosineTopK" and moe.router.temperature == 0.05
    x = torch.randn(2, 5, 32)
    tokens = x.reshape(-1, 32)
    # The moe mixes the experts the plugin's router chose, with its weights (formula written here).
    cos = torch.nn.functional.cosine_similarity(tokens[:, None], moe.router.weight[None], dim=-1) / 0.05
    weights, experts = cos.softmax(-1).topk(2, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    expected = torch.zeros_like(tokens)
    for n in range(len(tokens)):
        for w, e in zip(weights[n], experts[n]):
            h = moe.experts_in[e] @ tokens[n]
            gate, up = h.split(moe.hidden)
            expected[n] += w * (moe.experts_out[e] @ (torch.nn.functional.silu(gate) * up))
    torch.testing.assert_close(moe(x), expected.view_as(x), rtol=1e-5, atol=1e-6)
    logits = model(torch.randint(0, 61, (2, 7)))
    assert logits.shape == (2, 7, 61) and torch.isfinite(logits).all()


def test_a_plugin_router_is_validated_like_a_builtin(cosine_router: object) -> None:
    with pytest.raises(specformer.SpecError, match=r"model.block.ffn.router.temperature"):
        specformer.load_spec(_spec({"kind": "cosine_topk", "temperature": -1}))
    with pytest.raises(specformer.SpecError, match="did you mean 'cosine_topk'"):
        specformer.load_spec(_spec({"kind": "cosine_topc"}))


def test_a_plugin_router_is_balanced_by_the_train_plugin(cosine_router: object) -> None:
    model = specformer.build(_spec({"kind": "cosine_topk", "bias_update_rate": 0.5}), seed=0).train()
    model(torch.randint(0, 61, (2, 9)))
    load = model.blocks[0].ffn.router.observed_load.clone()
    assert balance_routers(model) == 2  # both layers' routers
    expected = 0.5 * torch.sign(load.mean() - load)
    torch.testing.assert_close(model.blocks[0].ffn.router.selection_bias, expected)
