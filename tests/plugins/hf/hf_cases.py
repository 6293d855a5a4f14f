"""Tiny random Hugging Face configurations, one or more per family, built locally (nothing is downloaded).

Sizes are tiny (hidden 64, 2-3 layers, vocabulary 128) but every feature a family maps
is switched on somewhere: grouped-query attention, biases, sliding windows shorter than
the test inputs, partial rotary, soft-capping, each rope scaling, mixture of experts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Every input and generation in the tests stays within this many positions.
CONTEXT = 64
#: Sliding windows are shorter than the inputs (and the generations) so that they matter.
WINDOW = 8
SEQ_LEN = 40

BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=CONTEXT, bos_token_id=None, eos_token_id=None, pad_token_id=None)


@dataclass(frozen=True)
class Case:
    """A transformers config class name, its keyword arguments and the causal-LM class it builds."""

    name: str
    config: str
    model: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: Why greedy generation is not compared for this case (None: it is compared).
    no_generate: str | None = None

    def build(self, *, seed: int = 0) -> Any:
        import torch
        import transformers

        config = getattr(transformers, self.config)(**self.kwargs)
        torch.manual_seed(seed)
        model = getattr(transformers, self.model)(config)
        with torch.no_grad():
            # Norm weights start at 1 (or 0), biases at 0: shake every tensor so that a weight
            # mapped to the wrong place, or an offset applied twice, changes the logits.
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        return model.eval()


def _llama_like(**kw: Any) -> dict[str, Any]:
    return {**BASE, "num_key_value_heads": 2, **kw}


def _rope(rope_type: str, **kw: Any) -> dict[str, Any]:
    return {"rope_type": rope_type, "rope_theta": 10000.0, **kw}


CASES = [
    Case("gpt2", "GPT2Config", "GPT2LMHeadModel",
         dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=CONTEXT, bos_token_id=None, eos_token_id=None)),
    Case("gpt2-untied-layer-scaled", "GPT2Config", "GPT2LMHeadModel",
         dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=CONTEXT, n_inner=80, activation_function="relu",
              scale_attn_by_inverse_layer_idx=True, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None)),
    Case("gpt_neox", "GPTNeoXConfig", "GPTNeoXForCausalLM",
         {**BASE, "rope_parameters": _rope("default", partial_rotary_factor=0.5)}),
    Case("gpt_neox-sequential", "GPTNeoXConfig", "GPTNeoXForCausalLM",
         {**BASE, "use_parallel_residual": False, "attention_bias": False, "tie_word_embeddings": True}),
    Case("llama", "LlamaConfig", "LlamaForCausalLM", _llama_like(attention_bias=True, mlp_bias=True)),
    Case("llama-tied-head_dim", "LlamaConfig", "LlamaForCausalLM", _llama_like(head_dim=32, tie_word_embeddings=True)),
    Case("llama-rope-linear", "LlamaConfig", "LlamaForCausalLM", _llama_like(rope_parameters=_rope("linear", factor=2.0))),
    Case("llama-rope-dynamic", "LlamaConfig", "LlamaForCausalLM",
         _llama_like(max_position_embeddings=16, rope_parameters=_rope("dynamic", factor=2.0))),  # generates past 16
    Case("llama-rope-yarn", "LlamaConfig", "LlamaForCausalLM",
         _llama_like(rope_parameters=_rope("yarn", factor=4.0, original_max_position_embeddings=16, beta_fast=16.0,
                                           beta_slow=2.0, mscale=0.8, mscale_all_dim=0.5, truncate=False))),
    Case("llama-rope-llama3", "LlamaConfig", "LlamaForCausalLM",
         _llama_like(rope_parameters=_rope("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                           original_max_position_embeddings=16))),
    Case("llama-rope-longrope", "LlamaConfig", "LlamaForCausalLM",
         _llama_like(rope_parameters=_rope("longrope", short_factor=[1.0 + 0.1 * i for i in range(8)],
                                           long_factor=[2.0 + 0.3 * i for i in range(8)],
                                           original_max_position_embeddings=16))),
    Case("mistral", "MistralConfig", "MistralForCausalLM", _llama_like(sliding_window=WINDOW)),
    Case("mixtral", "MixtralConfig", "MixtralForCausalLM",
         _llama_like(num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW)),
    Case("qwen2", "Qwen2Config", "Qwen2ForCausalLM",
         _llama_like(num_hidden_layers=3, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
    Case("qwen3", "Qwen3Config", "Qwen3ForCausalLM",
         _llama_like(head_dim=16, attention_bias=True, tie_word_embeddings=True)),
    Case("gemma", "GemmaConfig", "GemmaForCausalLM", _llama_like(num_key_value_heads=1, head_dim=32)),
    Case("gemma2", "Gemma2Config", "Gemma2ForCausalLM",
         _llama_like(num_hidden_layers=3, head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=24,
                     attn_logit_softcapping=5.0, final_logit_softcapping=3.0)),
    Case("phi3", "Phi3Config", "Phi3ForCausalLM", _llama_like(sliding_window=WINDOW)),
    Case("phi3-longrope-partial", "Phi3Config", "Phi3ForCausalLM",
         _llama_like(original_max_position_embeddings=16,
                     rope_parameters=_rope("longrope", partial_rotary_factor=0.5,
                                           short_factor=[1.0 + 0.1 * i for i in range(4)],
                                           long_factor=[2.0 + 0.3 * i for i in range(4)]))),
    Case("olmo2", "Olmo2Config", "Olmo2ForCausalLM", _llama_like()),
    # StableLM 2: LayerNorm with biases, a quarter of each head rotated, q/k/v biases; and the parallel variant.
    Case("stablelm", "StableLmConfig", "StableLmForCausalLM", _llama_like(use_qkv_bias=True)),
    Case("stablelm-parallel", "StableLmConfig", "StableLmForCausalLM",
         _llama_like(num_key_value_heads=4, use_parallel_residual=True, tie_word_embeddings=True,
                     rope_parameters=_rope("default", partial_rotary_factor=0.5))),
    # StableLM 2 12B's per-head q/k LayerNorms (a separate weight for each of 4 query and 2 key heads), parallel.
    Case("stablelm-qk_layernorm", "StableLmConfig", "StableLmForCausalLM",
         _llama_like(qk_layernorm=True, use_parallel_residual=True, layer_norm_eps=1e-4)),
    # Routed experts (several per token) with a gated shared expert, and a dense first layer (mlp_only_layers).
    Case("qwen2_moe", "Qwen2MoeConfig", "Qwen2MoeForCausalLM",
         _llama_like(num_hidden_layers=3, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=40,
                     shared_expert_intermediate_size=56, mlp_only_layers=[0])),
    Case("qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
         _llama_like(num_hidden_layers=3, head_dim=24, num_experts=5, num_experts_per_tok=2, moe_intermediate_size=48,
                     norm_topk_prob=True, decoder_sparse_step=2, attention_bias=True)),
    # Sliding windows (transformers 5 decides per family which layers slide): Qwen2-MoE the even layers below
    # max_window_layers (0 and 2 of 4), Qwen3-MoE every layer, SmolLM3 its NoPE layers (1 and 3).
    Case("qwen2_moe-sliding", "Qwen2MoeConfig", "Qwen2MoeForCausalLM",
         _llama_like(num_hidden_layers=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=40,
                     shared_expert_intermediate_size=56, use_sliding_window=True, sliding_window=WINDOW,
                     max_window_layers=3)),
    Case("qwen3_moe-sliding", "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
         _llama_like(num_hidden_layers=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                     use_sliding_window=True, sliding_window=WINDOW)),
    # NoPE every second layer (no_rope_layer_interval) and a hand-picked pattern.
    Case("smollm3", "SmolLM3Config", "SmolLM3ForCausalLM",
         _llama_like(num_hidden_layers=4, no_rope_layer_interval=2, tie_word_embeddings=False, attention_bias=True)),
    Case("smollm3-no_rope_layers", "SmolLM3Config", "SmolLM3ForCausalLM",
         _llama_like(num_hidden_layers=3, head_dim=24, no_rope_layers=[0, 1, 1], mlp_bias=True)),
    Case("smollm3-sliding", "SmolLM3Config", "SmolLM3ForCausalLM",
         _llama_like(num_hidden_layers=4, no_rope_layer_interval=2, use_sliding_window=True, sliding_window=WINDOW)),
    # Local layers (window, theta 10k) and global ones (theta 1M, linear scaling 8), q/k (1 + w) norms, untied.
    Case("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM",
         _llama_like(num_hidden_layers=4, head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=24,
                     layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
                     tie_word_embeddings=False,
                     rope_parameters={"sliding_attention": _rope("default"),
                                      "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}})),
    Case("gemma3-pattern-softcapped", "Gemma3TextConfig", "Gemma3ForCausalLM",
         _llama_like(num_hidden_layers=3, num_key_value_heads=1, head_dim=32, sliding_window=WINDOW,
                     sliding_window_pattern=2, final_logit_softcapping=3.0)),
    # Sinks, biases everywhere, alternating windows, YaRN, 5 experts with 2 per token, a tight SwiGLU clamp.
    Case("gpt_oss", "GptOssConfig", "GptOssForCausalLM",
         _llama_like(num_hidden_layers=3, head_dim=24, sliding_window=WINDOW, num_local_experts=5, num_experts_per_tok=2,
                     swiglu_limit=0.5,
                     rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0,
                                      "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 16})),
    # Latent attention with a query bottleneck, 8 experts in 4 groups (2 groups kept), 3 per token, a shared
    # expert, one dense first layer; and a variant without the query bottleneck, YaRN scaling the scores.
    Case("deepseek_v3", "DeepseekV3Config", "DeepseekV3ForCausalLM",
         _llama_like(num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=20, qk_rope_head_dim=8,
                     qk_nope_head_dim=12, v_head_dim=10, n_routed_experts=8, num_experts_per_tok=3, n_group=4,
                     topk_group=2, n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1,
                     routed_scaling_factor=2.5)),
    Case("deepseek_v3-no-q-lora-yarn", "DeepseekV3Config", "DeepseekV3ForCausalLM",
         _llama_like(num_hidden_layers=2, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8,
                     qk_nope_head_dim=8, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                     topk_group=1, n_shared_experts=2, moe_intermediate_size=24, first_k_dense_replace=0,
                     norm_topk_prob=False, routed_scaling_factor=1.0, attention_bias=True,
                     rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                      "original_max_position_embeddings": 16, "mscale": 1.0, "mscale_all_dim": 1.0,
                                      "beta_fast": 32.0, "beta_slow": 1.0})),
    # Three sliding layers with interleaved rope, then a global layer without positions; scaled logits, untied.
    Case("cohere2", "Cohere2Config", "Cohere2ForCausalLM",
         _llama_like(num_hidden_layers=4, sliding_window=WINDOW, logit_scale=0.5, tie_word_embeddings=False)),
    Case("cohere2-pattern", "Cohere2Config", "Cohere2ForCausalLM",
         _llama_like(num_hidden_layers=3, num_key_value_heads=1, sliding_window=WINDOW, sliding_window_pattern=2,
                     attention_bias=True, logit_scale=4.0)),
    # --- hybrid: Qwen3-Next, Qwen3.5, OLMo Hybrid ---
    # Gated DeltaNet layers among attention layers: value heads twice the key heads, key head dim != value head dim,
    # kernels 3 and 4, the default every-4th pattern, every-2nd and irregular layer_types, experts with a gated
    # shared expert on some layers, gated attention with biases. OLMo Hybrid's key and value widths are equal
    # because transformers saves its q/k/v convolutions as three equal parts (test_hybrid_families.py covers
    # unequal ones).
    Case("qwen3_next", "Qwen3NextConfig", "Qwen3NextForCausalLM",
         _llama_like(num_hidden_layers=4, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                     linear_key_head_dim=8, linear_value_head_dim=12, linear_conv_kernel_dim=4, num_experts=4,
                     num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=40,
                     mlp_only_layers=[1])),
    Case("qwen3_next-irregular", "Qwen3NextConfig", "Qwen3NextForCausalLM",
         _llama_like(num_hidden_layers=5, head_dim=16, num_key_value_heads=1, attention_bias=True,
                     layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention",
                                  "linear_attention"],
                     linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=12, linear_value_head_dim=8,
                     linear_conv_kernel_dim=3, num_experts=5, num_experts_per_tok=3, moe_intermediate_size=24,
                     shared_expert_intermediate_size=32, decoder_sparse_step=2, norm_topk_prob=False,
                     tie_word_embeddings=True, rope_parameters=_rope("default", partial_rotary_factor=0.5))),
    Case("qwen3_5", "Qwen3_5TextConfig", "Qwen3_5ForCausalLM",
         _llama_like(num_hidden_layers=4, head_dim=16,
                     layer_types=["linear_attention", "full_attention"] * 2, linear_num_key_heads=2,
                     linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12, linear_conv_kernel_dim=3,
                     rope_parameters=_rope("default", partial_rotary_factor=0.25, mrope_section=[1, 1, 0],
                                           mrope_interleaved=True))),
    Case("qwen3_5_moe", "Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM",
         _llama_like(num_hidden_layers=3, head_dim=16, layer_types=["linear_attention", "linear_attention", "full_attention"],
                     linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=8,
                     linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                     shared_expert_intermediate_size=24)),
    Case("olmo_hybrid", "OlmoHybridConfig", "OlmoHybridForCausalLM",
         _llama_like(num_hidden_layers=4, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                     linear_value_head_dim=8, linear_conv_kernel_dim=3)),
    Case("olmo_hybrid-nope", "OlmoHybridConfig", "OlmoHybridForCausalLM",
         _llama_like(num_hidden_layers=3, num_key_value_heads=4, attention_bias=True,
                     layer_types=["full_attention", "linear_attention", "linear_attention"], linear_num_key_heads=2,
                     linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=4, linear_conv_kernel_dim=4,
                     linear_allow_neg_eigval=False, rope_parameters={"rope_type": "default", "rope_theta": None})),
]

BY_NAME = {case.name: case for case in CASES}
