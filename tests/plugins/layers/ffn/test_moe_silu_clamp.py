"""DeepSeek-V4's clamped SwiGLU in ``moe`` (``swiglu_style: silu``): routed and shared experts against transformers.

Per expert: ``down(silu(min(gate, L)) * clamp(up, -L, L))``, L = swiglu_limit; the shared
expert is clamped the same way (transformers' DeepseekV4Experts and DeepseekV4MLP).
"""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from specformer_layers.ffn.moe import MoE
from specformer_layers.ffn.params import MoEParams

D, HIDDEN, E, K, LIMIT = 16, 12, 4, 2, 0.5


@torch.no_grad()
def test_routed_and_shared_experts_match_transformers_deepseek_v4() -> None:
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Experts, DeepseekV4MLP

    config = DeepseekV4Config(hidden_size=D, moe_intermediate_size=HIDDEN, n_routed_experts=E, num_experts_per_tok=K,
                              swiglu_limit=LIMIT, num_hidden_layers=1, vocab_size=8)
    torch.manual_seed(0)
    experts, shared = DeepseekV4Experts(config).double(), DeepseekV4MLP(config).double()
    for p in [*experts.parameters(), *shared.parameters()]:
        p.normal_(0, 0.5)  # wide enough that the clamps bite
    ours = MoE(MoEParams(n_experts=E, top_k=K, hidden=HIDDEN, swiglu_limit=LIMIT, swiglu_style="silu",
                         n_shared_experts=1), d_model=D).double()
    ours.experts_in.copy_(experts.gate_up_proj)
    ours.experts_out.copy_(experts.down_proj)
    ours.shared.gate_up.weight.copy_(torch.cat((shared.gate_proj.weight, shared.up_proj.weight)))
    ours.shared.down.weight.copy_(shared.down_proj.weight)
    tokens = torch.randn(9, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3
    chosen = torch.randint(0, E, (9, K), generator=torch.Generator().manual_seed(2))
    chosen[:, 1] = (chosen[:, 0] + 1) % E  # two different experts per token
    weights = torch.rand(9, K, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(ours.run_experts(tokens, chosen, weights), experts(tokens, chosen, weights))
    torch.testing.assert_close(ours.run_shared(tokens), shared(tokens))
    assert (experts.gate_up_proj[0] @ tokens.T).abs().max() > 3 * LIMIT  # the clamps were reached


def test_silu_style_needs_a_limit_and_no_alpha() -> None:
    with pytest.raises(ValidationError, match="needs swiglu_limit"):
        MoEParams(swiglu_style="silu")
    with pytest.raises(ValidationError, match="takes no swiglu_alpha"):
        MoEParams(swiglu_style="silu", swiglu_limit=7.0, swiglu_alpha=1.0)
