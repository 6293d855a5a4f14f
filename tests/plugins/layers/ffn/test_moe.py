"""Mixture of experts against a dense per-token reference and transformers' Mixtral and Qwen2-MoE blocks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import specformer
from specformer_layers.ffn.moe import MoE, load_balancing_loss
from specformer_layers.ffn.params import MoEParams

from ..support import tiny_spec_over_vocab


def dense_reference(moe: MoE, x: torch.Tensor, *, normalize: bool = True) -> torch.Tensor:
    """Every token, one at a time, through each of its top-k experts, weighted and summed.

    Routing is the default softmax router's, written out (the routers have their own
    formula tests in tests/plugins/layers/routers); ``normalize`` is its ``normalize_topk``.
    """
    act = moe.activation  # the activations themselves are checked by formula in test_activations
    tokens = x.reshape(-1, x.shape[-1])
    out = torch.zeros_like(tokens)
    for n, token in enumerate(tokens):
        logits = moe.router.weight.double() @ token.double()
        weights, chosen = torch.softmax(logits, dim=-1).topk(moe.top_k)
        if normalize:
            weights = weights / weights.sum()
        for w, e in zip(weights.tolist(), chosen.tolist()):
            h = moe.experts_in[e] @ token
            if moe.experts_in_bias is not None:
                h = h + moe.experts_in_bias[e]
            if moe.gated:
                gate, up = h.split(moe.hidden)
                if moe.swiglu_limit is not None:  # gpt-oss: min(gate, L) * sigmoid(alpha * .) * (clip(up, -L, L) + 1)
                    g = torch.minimum(gate, torch.tensor(moe.swiglu_limit, dtype=gate.dtype))
                    u = torch.maximum(torch.minimum(up, torch.tensor(moe.swiglu_limit, dtype=up.dtype)),
                                      torch.tensor(-moe.swiglu_limit, dtype=up.dtype))
                    h = g / (1 + torch.exp(-moe.swiglu_alpha * g)) * (u + 1)
                else:
                    h = act(gate) * up
            else:
                h = act(h)
            y = moe.experts_out[e] @ h
            if moe.experts_out_bias is not None:
                y = y + moe.experts_out_bias[e]
            if moe.expert_norm_names:  # expert e's own RMSNorm written out: y / sqrt(mean(y^2) + eps) * w_e
                y = y / torch.sqrt(y.pow(2).mean() + moe._expert_norm[0].eps) * moe.expert_norm_weight[e]
            out[n] += w * y
        if moe.shared is not None:
            shared = moe.shared(token)
            if moe.shared_norm is not None:  # the shared experts' own RMSNorm, before any gate
                shared = shared / torch.sqrt(shared.pow(2).mean() + moe.shared_norm.eps) * moe.shared_norm.weight
            if moe.shared_gate is not None:
                shared = shared * torch.sigmoid(moe.shared_gate.weight[0] @ token)
            if moe.shared_combine == "average":  # (routed + shared) / 2
                out[n] = (out[n] + shared) / 2
            else:
                out[n] += shared
        if moe.output_bias is not None:  # one bias for the whole mixture (JetMoE)
            out[n] += moe.output_bias
        if moe.output_norm is not None:  # an RMSNorm written out: y / sqrt(mean(y^2) + eps) * w
            norm = moe.output_norm
            out[n] = out[n] / torch.sqrt(out[n].pow(2).mean() + norm.eps) * norm.weight
    return out.view(x.shape)


def _random_moe(**kwargs: object) -> MoE:
    moe = MoE(MoEParams(**{"n_experts": 6, "top_k": 2, "hidden": 20, **kwargs}), d_model=16).double()
    for p in moe.parameters():
        p.data.normal_(0, 0.3)
    return moe


CONFIGS = [
    {},
    {"top_k": 1},
    {"top_k": 3, "normalize_topk": False},
    {"routing": "topk_then_softmax"},
    {"gated": False, "activation": "gelu"},
    {"activation": "relu2", "n_shared_experts": 1, "shared_hidden": 24},
    {"n_shared_experts": 1, "shared_hidden": 12, "shared_gate": True, "normalize_topk": False},
    {"n_shared_experts": 2, "shared_combine": "average"},
    {"n_shared_experts": 1, "output_norm": {"kind": "rmsnorm", "eps": 1e-3}},
    {"output_norm": "rmsnorm", "top_k": 3},
    {"output_bias": True, "routing": "topk_then_softmax"},
    {"output_bias": True, "output_norm": "rmsnorm", "n_shared_experts": 1},
    {"n_shared_experts": 1, "shared_hidden": 12, "shared_gate": True, "shared_combine": "average"},
    {"n_experts": 2, "top_k": 2},
    {"expert_bias": True},
    {"expert_bias": True, "swiglu_limit": 0.5, "swiglu_alpha": 1.702, "top_k": 3},
    {"swiglu_limit": 7.0, "swiglu_alpha": 2.5},
    {"expert_norm": {"kind": "rmsnorm", "eps": 1e-3}, "top_k": 3},
    {"expert_norm": "rmsnorm", "gated": False, "activation": "relu2", "n_shared_experts": 1, "shared_hidden": 24},
    {"expert_norm": "rmsnorm", "n_shared_experts": 1, "shared_gate": True, "expert_bias": True},
]


@pytest.mark.parametrize("config", CONFIGS)
def test_matches_dense_reference(config: dict) -> None:
    moe = _random_moe(**config)
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    torch.testing.assert_close(moe(x), dense_reference(moe, x, normalize=config.get("normalize_topk", True)))


@pytest.mark.parametrize("selection", ["softmax", "sigmoid"])
def test_matches_transformers_cohere2_moe_block_with_averaged_shared_experts(selection: str) -> None:
    from transformers import Cohere2MoeConfig
    from transformers.models.cohere2_moe.modeling_cohere2_moe import Cohere2MoeSparseMoeBlock

    config = Cohere2MoeConfig(hidden_size=16, intermediate_size=12, num_experts=5, num_experts_per_tok=2,
                              num_shared_experts=2, expert_selection_fn=selection, num_attention_heads=2,
                              num_hidden_layers=1)
    theirs = Cohere2MoeSparseMoeBlock(config).eval()
    for p in theirs.parameters():
        p.data.normal_(0, 0.3)
    router = "softmax_topk" if selection == "softmax" else {"kind": "sigmoid_topk", "normalize": True}
    ours = MoE(MoEParams(n_experts=5, top_k=2, hidden=12, router=router, n_shared_experts=2, shared_combine="average"),
               d_model=16)
    ours.router.weight.data.copy_(theirs.gate.weight)
    ours.experts_in.data.copy_(theirs.experts.gate_up_proj)
    ours.experts_out.data.copy_(theirs.experts.down_proj)
    shared = theirs.shared_experts
    ours.shared.gate_up.weight.data.copy_(torch.cat((shared.gate_proj.weight, shared.up_proj.weight)))
    ours.shared.down.weight.data.copy_(shared.down_proj.weight)
    x = torch.randn(2, 9, 16)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)


def test_matches_transformers_axk1_block_with_its_output_norm() -> None:
    from transformers import AXK1Config
    from transformers.models.axk1.modeling_axk1 import AXK1MoE

    config = AXK1Config(hidden_size=16, moe_intermediate_size=12, n_routed_experts=8, num_experts_per_tok=3, n_group=4,
                        topk_group=2, n_shared_experts=1, routed_scaling_factor=2.5, rms_norm_eps=1e-5,
                        num_attention_heads=2, num_hidden_layers=2)
    theirs = AXK1MoE(config).eval()
    for p in theirs.parameters():
        p.data.normal_(0, 0.3)
    theirs.gate.e_score_correction_bias.normal_(0, 0.1)
    ours = MoE(MoEParams(n_experts=8, top_k=3, hidden=12, n_shared_experts=1, aux_loss_coef=0.0,
                         router={"kind": "sigmoid_topk", "n_group": 4, "topk_group": 2, "scaling_factor": 2.5},
                         output_norm={"kind": "rmsnorm", "eps": 1e-5}), d_model=16)
    ours.router.weight.data.copy_(theirs.gate.weight)
    ours.router.selection_bias.copy_(theirs.gate.e_score_correction_bias)
    ours.experts_in.data.copy_(theirs.experts.gate_up_proj)
    ours.experts_out.data.copy_(theirs.experts.down_proj)
    shared = theirs.shared_experts
    ours.shared.gate_up.weight.data.copy_(torch.cat((shared.gate_proj.weight, shared.up_proj.weight)))
    ours.shared.down.weight.data.copy_(shared.down_proj.weight)
    ours.output_norm.weight.data.copy_(theirs.post_mlp_layernorm.weight)
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)


def test_clamp_is_active_in_the_clamped_swiglu_case() -> None:
    """The 0.5 limit must actually cut values, or the clamped test above would test nothing."""
    moe = _random_moe(expert_bias=True, swiglu_limit=0.5)
    h = torch.einsum("ehd,nd->neh", moe.experts_in, torch.randn(20, 16, dtype=torch.float64))
    assert (h.abs() > 0.5).float().mean() > 0.3


def test_dropless_when_every_token_picks_the_same_experts() -> None:
    moe = _random_moe()
    moe.router.weight.data.zero_()
    moe.router.weight.data[4] = 5.0
    moe.router.weight.data[1] = 4.0
    x = torch.rand(2, 50, 16, dtype=torch.float64) + 0.5  # positive: experts 4 then 1 win for every token
    _, experts, _ = moe.route(x.reshape(-1, 16))
    assert (experts[:, 0] == 4).all() and (experts[:, 1] == 1).all()
    torch.testing.assert_close(moe(x), dense_reference(moe, x))


def test_matches_transformers_mixtral_block() -> None:
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    config = MixtralConfig(hidden_size=16, intermediate_size=24, num_local_experts=4, num_experts_per_tok=2,
                           num_attention_heads=2, num_key_value_heads=2)
    theirs = MixtralSparseMoeBlock(config).eval()
    for p in theirs.parameters():
        p.data.normal_(0, 0.3)
    ours = MoE(MoEParams(n_experts=4, top_k=2, hidden=24, activation="silu"), d_model=16)
    ours.router.weight.data.copy_(theirs.gate.weight)
    ours.experts_in.data.copy_(theirs.experts.gate_up_proj)
    ours.experts_out.data.copy_(theirs.experts.down_proj)
    x = torch.randn(2, 9, 16)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)


def test_matches_transformers_qwen2_moe_block_with_shared_expert() -> None:
    from transformers import Qwen2MoeConfig
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    config = Qwen2MoeConfig(hidden_size=16, moe_intermediate_size=12, shared_expert_intermediate_size=20,
                            num_experts=6, num_experts_per_tok=3, norm_topk_prob=False,
                            num_attention_heads=2, num_key_value_heads=2)
    theirs = Qwen2MoeSparseMoeBlock(config).eval()
    for p in theirs.parameters():
        p.data.normal_(0, 0.3)
    ours = MoE(MoEParams(n_experts=6, top_k=3, hidden=12, normalize_topk=False, n_shared_experts=1, shared_hidden=20,
                         shared_gate=True), d_model=16)
    ours.router.weight.data.copy_(theirs.gate.weight)
    ours.experts_in.data.copy_(theirs.experts.gate_up_proj)
    ours.experts_out.data.copy_(theirs.experts.down_proj)
    shared = theirs.shared_expert
    ours.shared.gate_up.weight.data.copy_(torch.cat((shared.gate_proj.weight, shared.up_proj.weight)))
    ours.shared.down.weight.data.copy_(shared.down_proj.weight)
    ours.shared_gate.weight.data.copy_(theirs.shared_expert_gate.weight)
    x = torch.randn(2, 9, 16)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_aux_loss_matches_transformers(top_k: int) -> None:
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    moe = _random_moe(top_k=top_k, aux_loss_coef=0.02).float()
    x = torch.randn(4, 8, 16)
    moe(x)
    logits = moe.router.logits(x.reshape(-1, 16))
    expected = load_balancing_loss_func((logits,), num_experts=6, top_k=top_k)
    torch.testing.assert_close(moe.aux_loss, 0.02 * expected, rtol=1e-5, atol=1e-7)


def test_aux_loss_formula_and_gradient() -> None:
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.6, 0.3, 0.1]], requires_grad=True)
    experts = torch.tensor([[0, 1], [0, 2]])
    # f = (2/2, 1/2, 1/2), P = (0.65, 0.25, 0.1): 3 * (0.65 + 0.125 + 0.05)
    loss = load_balancing_loss(probs, experts, 3)
    assert loss.item() == pytest.approx(3 * (0.65 + 0.125 + 0.05))
    loss.backward()
    assert probs.grad is not None and probs.grad.abs().sum() > 0
    uniform = load_balancing_loss(torch.full((4, 4), 0.25), torch.tensor([[0, 1], [2, 3], [0, 1], [2, 3]]), 4)
    assert uniform.item() == pytest.approx(2.0)  # top_k when perfectly balanced


def test_decoder_collects_aux_loss_of_every_layer() -> None:
    spec = tiny_spec_over_vocab(n_layers=3)
    spec["model"]["block"]["ffn"] = {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 16, "aux_loss_coef": 0.1}
    model = specformer.build(spec, seed=0)
    assert model.auxiliary_loss() is None
    model(torch.randint(0, 61, (2, 10)))
    per_layer = [b.ffn.aux_loss for b in model.blocks]
    torch.testing.assert_close(model.auxiliary_loss(), torch.stack(per_layer).sum())
    assert all(0.1 * 2 * 0.99 < v.item() < 0.1 * 4 for v in per_layer)  # between balanced and fully collapsed


def test_zero_coefficient_gives_no_loss() -> None:
    moe = _random_moe(aux_loss_coef=0.0)
    moe(torch.randn(1, 4, 16, dtype=torch.float64))
    assert moe.aux_loss is None
    spec = tiny_spec_over_vocab()
    spec["model"]["block"]["ffn"] = {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 16, "aux_loss_coef": 0.0}
    model = specformer.build(spec, seed=0)
    model(torch.randint(0, 61, (1, 5)))
    assert model.auxiliary_loss() is None  # nothing for the trainer to add


def test_topk_then_softmax_equals_normalised_softmax_then_topk() -> None:
    a = _random_moe(routing="topk_then_softmax")
    b = _random_moe()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(a(x), b(x))


def test_bfloat16_and_empty_experts() -> None:
    moe = MoE(MoEParams(n_experts=8, top_k=1, hidden=8), d_model=16).bfloat16()
    x = torch.randn(1, 2, 16).bfloat16()  # 2 tokens, 8 experts: most get nothing
    y = moe(x)
    assert y.dtype == torch.bfloat16 and torch.isfinite(y.float()).all()
    reference = dense_reference(moe.double(), x.double())
    torch.testing.assert_close(y.double(), reference, rtol=3e-2, atol=3e-2)


def test_defaults_and_parameter_count() -> None:
    spec = tiny_spec_over_vocab()
    spec["model"]["block"]["ffn"] = {"kind": "moe", "n_shared_experts": 2}
    moe = specformer.build(spec).blocks[0].ffn
    assert (moe.n_experts, moe.top_k, moe.hidden, moe.gated) == (8, 2, 128, True)
    assert moe.shared.hidden == 256  # 2 shared experts of width 128
    experts = 8 * 3 * 32 * 128
    router = 8 * 32
    shared = 3 * 32 * 256
    assert sum(p.numel() for p in moe.parameters()) == experts + router + shared
    assert moe.active_parameters() == experts * 2 // 8 + router + shared  # top-2 of 8 experts


def test_mixtral_active_parameters() -> None:
    """Mixtral 8x7B is published as about 12.9B active parameters per token."""
    spec = Path(__file__).resolve().parents[4] / "specs" / "mixtral-8x7b.yaml"
    model = specformer.build(spec, device="meta")
    moe_total = sum(b.ffn.active_parameters() for b in model.blocks)
    moe_all = sum(p.numel() for b in model.blocks for p in b.ffn.parameters())
    active = model.num_parameters() - moe_all + moe_total
    assert 12.8e9 < active < 13.0e9


@pytest.mark.parametrize(("params", "message"), [
    ({"n_experts": 4, "top_k": 5}, "top_k \\(5\\) cannot exceed n_experts \\(4\\)"),
    ({"shared_hidden": 8}, "need n_shared_experts >= 1"),
    ({"shared_combine": "average"}, "need n_shared_experts >= 1"),
    ({"routing": "topk_then_softmax", "normalize_topk": False}, "normalize_topk: false needs softmax_then_topk"),
    ({"routing": "sigmoid"}, "routing"),
    ({"router": "sigmoid_topk", "normalize_topk": False}, "with router given, set them in the router"),
    ({"swiglu_limit": 7.0, "gated": False}, "swiglu_limit .* needs gated: true and activation: silu"),
    ({"swiglu_limit": 7.0, "activation": "gelu"}, "swiglu_limit .* needs gated: true and activation: silu"),
    ({"swiglu_alpha": 1.5}, "swiglu_alpha is used only with swiglu_limit"),
    ({"router": "sinkhorn"}, "unknown router 'sinkhorn'"),
    ({"router": {"kind": "softmax_topk", "n_group": 2, "topk_group": 3}}, "topk_group \\(3\\) cannot exceed n_group \\(2\\)"),
])
def test_bad_params(params: dict, message: str) -> None:
    spec = tiny_spec_over_vocab()
    spec["model"]["block"]["ffn"] = {"kind": "moe", **params}
    with pytest.raises(specformer.SpecError, match=message):
        specformer.load_spec(spec)


def test_dense_first_layers_and_active_parameters_of_a_deepseek_shaped_spec() -> None:
    """first_k_dense_replace as a layers: override; summary's active count written out by hand."""
    d, experts, top_k, hidden, dense_hidden = 32, 8, 2, 16, 64
    spec = tiny_spec_over_vocab(n_layers=4)
    spec["model"]["block"]["ffn"] = {
        "kind": "moe", "n_experts": experts, "top_k": top_k, "hidden": hidden, "n_shared_experts": 1,
        "aux_loss_coef": 0.0,
        "router": {"kind": "sigmoid_topk", "n_group": 4, "topk_group": 2, "scaling_factor": 2.5},
    }
    spec["model"]["layers"] = [{"select": "0:1", "ffn": {"kind": "swiglu", "hidden": dense_hidden}}]
    model = specformer.build(spec, seed=0)
    assert [type(b.ffn).__name__ for b in model.blocks] == ["GatedMLP", "MoE", "MoE", "MoE"]
    summary = specformer.summarize(spec)
    assert summary.total == model.num_parameters()
    per_expert = 3 * d * hidden
    router = experts * d  # the selection bias is a buffer, not a parameter
    shared = 3 * d * hidden
    unused = (experts - top_k) * per_expert  # per MoE layer, per token
    assert summary.total - summary.active == 3 * unused
    moe_active = sum(b.ffn.active_parameters() for b in model.blocks[1:])
    assert moe_active == 3 * (router + top_k * per_expert + shared)


def test_expert_norm_without_autograd_writes_the_same_normed_blocks() -> None:
    # The in-place path (no autograd) normalises each expert's block where it was written.
    moe = _random_moe(expert_norm="rmsnorm", n_shared_experts=1, top_k=3)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(moe(x), dense_reference(moe, x))


def test_expert_norm_stacks_split_with_the_experts_and_count_in_the_size_check() -> None:
    moe = MoE(MoEParams(n_experts=6, top_k=2, hidden=20, expert_norm="rmsnorm", n_shared_experts=1), d_model=16)
    assert moe.expert_norm_weight.shape == (6, 16)
    assert "expert_norm_weight" in moe.parallel_plan()
    assert dict(moe.named_parameters())["shared_norm.weight"].shape == (16,)
    params = MoEParams(n_experts=6, top_k=2, hidden=20, expert_norm="rmsnorm", n_shared_experts=1)
    assert params.sized(d_model=16).parameters == sum(p.numel() for p in moe.parameters())


def test_matches_transformers_ergo_block_with_its_per_expert_norms() -> None:
    from transformers import ErgoConfig
    from transformers.models.ergo.modeling_ergo import ErgoMoE

    config = ErgoConfig(hidden_size=16, moe_intermediate_size=12, shared_intermediate_size=20, num_experts=6,
                        num_experts_per_tok=3, moe_routed_scaling_factor=1.7, rms_norm_eps=1e-5,
                        num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=2)
    theirs = ErgoMoE(config).eval()
    for p in theirs.parameters():
        p.data.normal_(0, 0.3)
    theirs.gate.e_score_correction_bias.normal_(0, 0.1)
    router = {"kind": "sigmoid_topk", "normalize": True, "scaling_factor": 1.7}
    ours = MoE(MoEParams(n_experts=6, top_k=3, hidden=12, gated=False, activation="relu2", router=router,
                         n_shared_experts=1, shared_hidden=20, expert_norm={"kind": "rmsnorm", "eps": 1e-5}),
               d_model=16)
    ours.router.weight.data.copy_(theirs.gate.linear.weight)
    ours.router.selection_bias.copy_(theirs.gate.e_score_correction_bias)
    ours.experts_in.data.copy_(theirs.experts.up_proj.transpose(1, 2))  # theirs (E, D, H): x @ up[e]
    ours.experts_out.data.copy_(theirs.experts.down_proj.transpose(1, 2))
    ours.expert_norm_weight.data.copy_(theirs.experts.post_expert_norm.weight)
    ours.shared.fc_in.weight.data.copy_(theirs.shared_experts.up_proj.weight)
    ours.shared.fc_out.weight.data.copy_(theirs.shared_experts.down_proj.weight)
    ours.shared_norm.weight.data.copy_(theirs.shared_experts.norm.weight)
    x = torch.randn(2, 9, 16)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
