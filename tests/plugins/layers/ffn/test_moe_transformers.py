"""The moe ffn with its routers against transformers' own MoE blocks, weights mapped by hand.

Qwen3-MoE (softmax, renormalised), DeepSeek-V2 (softmax, group-limited, scaled, shared
experts), DeepSeek-V3 (sigmoid with the selection bias, node-limited groups, scaled,
shared experts) and gpt-oss (router bias, expert biases, clamped SwiGLU). Tiny random
configs with several experts per token; the Mixtral and Qwen2-MoE blocks are in test_moe.
"""

from __future__ import annotations

import torch
from torch import nn

from specformer_layers.ffn.moe import MoE
from specformer_layers.ffn.params import MoEParams

D = 16


def _randomise(module: nn.Module, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    for p in module.parameters():
        p.data.normal_(0, 0.3)
    return module.eval()


def _copy_shared(ours: MoE, theirs: nn.Module) -> None:
    ours.shared.gate_up.weight.data.copy_(torch.cat((theirs.gate_proj.weight, theirs.up_proj.weight)))
    ours.shared.down.weight.data.copy_(theirs.down_proj.weight)


def _inputs() -> torch.Tensor:
    return torch.randn(2, 11, D, generator=torch.Generator().manual_seed(1))


def test_qwen3_moe_block() -> None:
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    config = Qwen3MoeConfig(hidden_size=D, moe_intermediate_size=12, num_experts=6, num_experts_per_tok=3,
                            norm_topk_prob=True, num_attention_heads=2, num_key_value_heads=2)
    theirs = _randomise(Qwen3MoeSparseMoeBlock(config))
    ours = MoE(MoEParams(n_experts=6, top_k=3, hidden=12, router={"kind": "softmax_topk", "normalize": True}), d_model=D)
    ours.router.weight.data.copy_(theirs.gate.weight)
    ours.experts_in.data.copy_(theirs.experts.gate_up_proj)
    ours.experts_out.data.copy_(theirs.experts.down_proj)
    x = _inputs()
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-4, atol=1e-4)


def test_deepseek_v2_moe_group_limited_greedy() -> None:
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Moe

    config = DeepseekV2Config(hidden_size=D, moe_intermediate_size=12, n_routed_experts=8, num_experts_per_tok=3,
                              n_group=4, topk_group=2, topk_method="group_limited_greedy", routed_scaling_factor=2.5,
                              n_shared_experts=2, num_attention_heads=2, num_key_value_heads=2)
    theirs = _randomise(DeepseekV2Moe(config))
    router = {"kind": "softmax_topk", "normalize": False, "scaling_factor": 2.5, "n_group": 4, "topk_group": 2}
    ours = MoE(MoEParams(n_experts=8, top_k=3, hidden=12, router=router, n_shared_experts=2), d_model=D)
    ours.router.weight.data.copy_(theirs.gate.weight)
    ours.experts_in.data.copy_(theirs.experts.gate_up_proj)
    ours.experts_out.data.copy_(theirs.experts.down_proj)
    _copy_shared(ours, theirs.shared_experts)
    x = _inputs()
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-4, atol=1e-4)


def test_deepseek_v3_moe_with_selection_bias_and_groups() -> None:
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    config = DeepseekV3Config(hidden_size=D, moe_intermediate_size=12, n_routed_experts=8, num_experts_per_tok=3,
                              n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
                              n_shared_experts=2, num_attention_heads=2, num_key_value_heads=2)
    theirs = _randomise(DeepseekV3MoE(config))
    # A bias large enough to change choices (sigmoid scores differ by about 0.1 here).
    theirs.gate.e_score_correction_bias.copy_(torch.randn(8, generator=torch.Generator().manual_seed(2)) * 0.2)
    router = {"kind": "sigmoid_topk", "normalize": True, "scaling_factor": 2.5, "n_group": 4, "topk_group": 2}
    ours = MoE(MoEParams(n_experts=8, top_k=3, hidden=12, router=router, n_shared_experts=2), d_model=D)
    ours.router.weight.data.copy_(theirs.gate.weight)
    ours.router.selection_bias.copy_(theirs.gate.e_score_correction_bias)
    ours.experts_in.data.copy_(theirs.experts.gate_up_proj)
    ours.experts_out.data.copy_(theirs.experts.down_proj)
    _copy_shared(ours, theirs.shared_experts)
    x = _inputs()
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-4, atol=1e-4)
    # Without the bias some tokens choose other experts: the bias took part above.
    unbiased = ours.router(x.reshape(-1, D)).experts.sort().values
    ours.router.selection_bias.zero_()
    assert not torch.equal(unbiased, ours.router(x.reshape(-1, D)).experts.sort().values)


def test_gpt_oss_mlp() -> None:
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    # A low limit so that the clamps act on these small random weights (gpt-oss itself uses 7.0).
    config = GptOssConfig(hidden_size=D, intermediate_size=12, num_local_experts=6, num_experts_per_tok=2,
                          swiglu_limit=0.8, num_attention_heads=2, num_key_value_heads=2)
    theirs = _randomise(GptOssMLP(config))
    router = {"kind": "softmax_topk", "normalize": True, "bias": True}
    ours = MoE(MoEParams(n_experts=6, top_k=2, hidden=12, router=router, expert_bias=True, swiglu_limit=0.8,
                         swiglu_alpha=config.swiglu_alpha), d_model=D)
    ours.router.weight.data.copy_(theirs.router.weight)
    ours.router.bias.data.copy_(theirs.router.bias)
    experts = theirs.experts
    # transformers stores (E, D, 2H) with gate and up interleaved column by column; ours is
    # (E, 2H, D) with the gate rows first, as nn.Linear would.
    gate_up = experts.gate_up_proj.transpose(1, 2)  # (E, 2H, D), rows g0, u0, g1, u1, ...
    ours.experts_in.data.copy_(torch.cat((gate_up[:, 0::2], gate_up[:, 1::2]), dim=1))
    ours.experts_in_bias.data.copy_(torch.cat((experts.gate_up_proj_bias[:, 0::2], experts.gate_up_proj_bias[:, 1::2]), dim=1))
    ours.experts_out.data.copy_(experts.down_proj.transpose(1, 2))
    ours.experts_out_bias.data.copy_(experts.down_proj_bias)
    x = _inputs()
    expected, _ = theirs(x)
    torch.testing.assert_close(ours(x), expected, rtol=1e-4, atol=1e-4)
