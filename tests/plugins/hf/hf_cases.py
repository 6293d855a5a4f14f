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


#: Falcon's config has ffn_hidden_size, not intermediate_size (which it would keep as an unknown field).
FALCON_BASE = {k: v for k, v in BASE.items() if k != "intermediate_size"}


@dataclass(frozen=True)
class Case:
    """A transformers config class name, its keyword arguments and the causal-LM class it builds."""

    name: str
    config: str
    model: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: Why greedy generation is not compared for this case (None: it is compared).
    no_generate: str | None = None
    #: Why transformers' own generate is the reference only one row at a time (None: the batch at once).
    generate_row_by_row: str | None = None
    #: The model_type config.json says, where the config class saves its own instead (GPT-SW3's is GPT2Config).
    model_type: str | None = None
    #: Saved buffers (by the last part of their name) to shake too, by this much: a selection bias that starts at 0
    #: would leave where it is added untested (Kolibri-1's e_score_correction_bias).
    shake_buffers: tuple[str, float] | None = None
    #: Parameters (by how their name ends) replaced by noise of this scale after the shake: an initialisation that
    #: silences a part (xLSTM's input gates start at bias -10, writing almost nothing) would leave it untested.
    reset_params: tuple[tuple[str, float], ...] = ()
    #: The model_type of a multimodal config.json to save the config in, nested as its text_config (Emu3's
    #: ``Emu3ForCausalLM`` saves a flat config that transformers' auto classes do not load; they load the nested one).
    nested_in: str | None = None

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
            if self.shake_buffers is not None:
                name, scale = self.shake_buffers
                for key, b in model.named_buffers():
                    if key.rsplit(".", 1)[-1] == name:
                        b.add_(torch.randn_like(b) * scale)
            for end, scale in self.reset_params:
                for key, p in model.named_parameters():
                    if key.endswith(end):
                        p.copy_(torch.randn_like(p) * scale)
        return model.eval()

    def save(self, model: Any, directory: Any) -> None:
        """``model.save_pretrained(directory)``, config.json then naming :attr:`model_type` if the case has one."""
        import json
        from pathlib import Path

        model.save_pretrained(directory)
        path = Path(directory) / "config.json"
        if self.model_type is not None:
            path.write_text(json.dumps({**json.loads(path.read_text()), "model_type": self.model_type}, indent=2))
        if self.nested_in is not None:
            flat = json.loads(path.read_text())
            text = {k: v for k, v in flat.items() if k not in ("architectures", "transformers_version", "dtype")}
            path.write_text(json.dumps({"architectures": flat["architectures"], "model_type": self.nested_in,
                                        "text_config": text, "tie_word_embeddings": flat["tie_word_embeddings"]},
                                       indent=2))


#: transformers' RWKV decodes one token of a batch wrongly: its token shift takes the saved (B, D) input against
#: the (B, 1, D) new one, which broadcasts to (B, B, D) and mixes the rows (transformers 5.x, modeling_rwkv.py);
#: a batch of one is exact (its cached step equals its uncached forward), so each row is generated alone there.
RWKV_BATCHED_STEP = "transformers' cached RWKV step mixes the rows of a batch (a (B, D) shift against (B, 1, D))"


def _llama_like(**kw: Any) -> dict[str, Any]:
    return {**BASE, "num_key_value_heads": 2, **kw}


def _rope(rope_type: str, **kw: Any) -> dict[str, Any]:
    return {"rope_type": rope_type, "rope_theta": 10000.0, **kw}


#: DeepSeek-V3.2 with two indexer heads (the configuration that found index ties broken otherwise than transformers).
TIED_V32 = _llama_like(num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=20, qk_rope_head_dim=8,
                       qk_nope_head_dim=12, v_head_dim=10, n_routed_experts=8, num_experts_per_tok=3, n_group=4,
                       topk_group=2, n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1,
                       routed_scaling_factor=2.5, index_topk=6, index_n_heads=2, index_head_dim=16)

CASES = [
    Case("gpt2", "GPT2Config", "GPT2LMHeadModel",
         dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=CONTEXT, bos_token_id=None, eos_token_id=None)),
    Case("gpt2-untied-layer-scaled", "GPT2Config", "GPT2LMHeadModel",
         dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=CONTEXT, n_inner=80, activation_function="relu",
              scale_attn_by_inverse_layer_idx=True, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None)),
    # GPTBigCode (SantaCoder, StarCoder 1): GPT-2 with one key/value head (multi_query), untied here, unscaled scores
    # in the variant with a key/value head per query head (c_attn grouped per head) and the head tied.
    Case("gpt_bigcode", "GPTBigCodeConfig", "GPTBigCodeForCausalLM",
         dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=CONTEXT, n_inner=80, layer_norm_epsilon=1e-4,
              tie_word_embeddings=False, bos_token_id=None, eos_token_id=None)),
    Case("gpt_bigcode-mha-unscaled", "GPTBigCodeConfig", "GPTBigCodeForCausalLM",
         dict(vocab_size=128, n_embd=60, n_layer=3, n_head=5, n_positions=CONTEXT, multi_query=False,
              scale_attn_weights=False, activation_function="gelu", bos_token_id=None, eos_token_id=None)),
    Case("gpt_neox", "GPTNeoXConfig", "GPTNeoXForCausalLM",
         {**BASE, "rope_parameters": _rope("default", partial_rotary_factor=0.5)}),
    Case("gpt_neox-sequential", "GPTNeoXConfig", "GPTNeoXForCausalLM",
         {**BASE, "use_parallel_residual": False, "attention_bias": False, "tie_word_embeddings": True}),
    # GPT-J: parallel blocks on one LayerNorm, interleaved rotary on the first rotary_dim channels (6 of 16; the
    # variant: whole 20-channel heads of 3 layers), bias-free attention, the LM head's bias.
    Case("gptj", "GPTJConfig", "GPTJForCausalLM",
         dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, rotary_dim=6, n_positions=CONTEXT, n_inner=80,
              layer_norm_epsilon=1e-4, bos_token_id=None, eos_token_id=None)),
    Case("gptj-whole-heads", "GPTJConfig", "GPTJForCausalLM",
         dict(vocab_size=128, n_embd=60, n_layer=3, n_head=3, rotary_dim=20, n_positions=CONTEXT,
              activation_function="gelu", bos_token_id=None, eos_token_id=None)),
    # Falcon: new_decoder_architecture (Falcon-40B/180B) with 2 key/value heads for 6 query heads, two norms, biases
    # on; the variants: Falcon-7B's parallel multi-query block, one norm before a grouped block, sequential blocks.
    Case("falcon", "FalconConfig", "FalconForCausalLM",
         {**FALCON_BASE, "hidden_size": 48, "num_attention_heads": 6, "num_kv_heads": 2, "new_decoder_architecture": True,
          "bias": True, "layer_norm_epsilon": 1e-4, "tie_word_embeddings": False}),
    Case("falcon-7b-shape", "FalconConfig", "FalconForCausalLM",
         {**FALCON_BASE, "num_hidden_layers": 3, "ffn_hidden_size": 80, "rope_parameters": _rope("linear", factor=2.0)}),
    Case("falcon-new-one-norm", "FalconConfig", "FalconForCausalLM",
         {**FALCON_BASE, "num_kv_heads": 1, "new_decoder_architecture": True, "num_ln_in_parallel_attn": 1}),
    Case("falcon-sequential", "FalconConfig", "FalconForCausalLM",
         {**FALCON_BASE, "parallel_attn": False, "multi_query": False, "bias": True, "activation": "gelu_pytorch_tanh"}),
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
    # Phi: parallel blocks on one LayerNorm with biases, half of each head rotated, biases everywhere (the LM head's
    # too); here with GQA and the shared q/k LayerNorms; the variant is Phi-2's shape (0.4 of 20-channel heads, MHA).
    Case("phi", "PhiConfig", "PhiForCausalLM", _llama_like(qk_layernorm=True, layer_norm_eps=1e-4)),
    Case("phi-2-shape", "PhiConfig", "PhiForCausalLM",
         {**BASE, "hidden_size": 80, "intermediate_size": 112, "num_hidden_layers": 3, "hidden_act": "gelu",
          "rope_parameters": _rope("default", partial_rotary_factor=0.4)}),
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
    # DeepSeek-V4: a sliding layer, a CSA layer (rate 4, overlap, the indexer) and an HCA layer (rate 8), one key/value
    # head, grouped output, two hyper-connection streams, a hash-routed first layer then sqrtsoftplus routing. The
    # indexer keeps more entries than 40 tokens make, so no top-k boundary falls on a tie (transformers' topk picks
    # tied entries as its kernel happens to; the module tests cover the choice itself).
    Case("deepseek_v4", "DeepseekV4Config", "DeepseekV4ForCausalLM",
         {**BASE, "num_hidden_layers": 3, "num_key_value_heads": 1, "head_dim": 16, "partial_rotary_factor": 0.5,
          "q_lora_rank": 16, "o_groups": 2, "o_lora_rank": 8, "sliding_window": WINDOW,
          "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
          "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
          "index_n_heads": 4, "index_head_dim": 16, "index_topk": 64, "hc_mult": 2, "hc_sinkhorn_iters": 5,
          "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "swiglu_limit": 1.0,
          "mlp_layer_types": ["hash_moe", "moe", "moe"], "routed_scaling_factor": 1.5}),
    # DeepSeek-V4 with YaRN on the compressed layers' rope (attention_factor 1, as transformers' V4 forces), the
    # default hash layers (the first three) and sigmoid scoring; four layers, no sliding-only one.
    Case("deepseek_v4-yarn-sigmoid", "DeepseekV4Config", "DeepseekV4ForCausalLM",
         {**BASE, "num_hidden_layers": 4, "num_key_value_heads": 1, "head_dim": 16, "partial_rotary_factor": 0.25,
          "q_lora_rank": 12, "o_groups": 4, "o_lora_rank": 6, "sliding_window": WINDOW, "index_n_heads": 2,
          "index_head_dim": 8, "index_topk": 64, "compress_rates": {"compressed_sparse_attention": 2,
                                                                    "heavily_compressed_attention": 4},
          "n_routed_experts": 4, "num_experts_per_tok": 2, "scoring_func": "sigmoid", "routed_scaling_factor": 1.0,
          "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}}),
    Case("deepseek_v3-no-q-lora-yarn", "DeepseekV3Config", "DeepseekV3ForCausalLM",
         _llama_like(num_hidden_layers=2, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8,
                     qk_nope_head_dim=8, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                     topk_group=1, n_shared_experts=2, moe_intermediate_size=24, first_k_dense_replace=0,
                     norm_topk_prob=False, routed_scaling_factor=1.0, attention_bias=True,
                     rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                      "original_max_position_embeddings": 16, "mscale": 1.0, "mscale_all_dim": 1.0,
                                      "beta_fast": 32.0, "beta_slow": 1.0})),
    # DeepSeek Sparse Attention: each query reads the index_topk = 5 keys (of up to 40) its indexer scores highest;
    # indexer heads wider than the rotary part (12 > 8), more indexer heads than attention heads (16: no ties).
    Case("deepseek_v32", "DeepseekV32Config", "DeepseekV32ForCausalLM",
         _llama_like(num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=20, qk_rope_head_dim=8,
                     qk_nope_head_dim=12, v_head_dim=10, n_routed_experts=8, num_experts_per_tok=3, n_group=4,
                     topk_group=2, n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1,
                     routed_scaling_factor=2.5, index_topk=5, index_n_heads=16, index_head_dim=12)),
    # GLM-MoE-DSA: DeepSeek-V3.2 with an interleaved indexer rope; 5 heads (not dividing hidden), 4 keys per query,
    # indexer heads wider than the rotary part (12 > 8), attention biases, non-default eps, experts in 2 groups (1
    # kept), two dense first layers by mlp_layer_types, every indexer its own (indexer_types all 'full').
    Case("glm_moe_dsa", "GlmMoeDsaConfig", "GlmMoeDsaForCausalLM",
         _llama_like(num_hidden_layers=3, num_attention_heads=5, num_key_value_heads=5, q_lora_rank=24,
                     kv_lora_rank=20, qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=10, n_routed_experts=8,
                     num_experts_per_tok=3, n_group=2, topk_group=1, n_shared_experts=1, moe_intermediate_size=32,
                     mlp_layer_types=["dense", "dense", "sparse"], routed_scaling_factor=2.5, attention_bias=True,
                     rms_norm_eps=1e-4, index_topk=4, index_n_heads=16, index_head_dim=12)),
    # Hunyuan 3: per-head q/k RMSNorm, 6 heads of 12 over 2 (not filling hidden), attention biases; 6 sigmoid experts
    # (a selection bias), 3 per token, renormalised and scaled, two shared experts, the first layer dense; eps 1e-4.
    Case("hy_v3", "HYV3Config", "HYV3ForCausalLM",
         _llama_like(num_hidden_layers=3, num_attention_heads=6, head_dim=12, attention_bias=True, num_experts=6,
                     num_experts_per_tok=3, num_shared_experts=2, moe_intermediate_size=24, router_scaling_factor=1.7,
                     rms_norm_eps=1e-4, pad_token_id=None)),
    # Two indexer heads: many keys score exactly 0 (both heads' ReLU closed) at a query's cut of 6, and the keys
    # chosen among them must be the ones torch.topk returns in transformers (test_indexer_ties counts the ties).
    Case("deepseek_v32-tied-cut", "DeepseekV32Config", "DeepseekV32ForCausalLM", TIED_V32),
    # Indexer heads exactly the rotary width, 3 keys per query, YaRN with mscale_all_dim, biases, layers typed by
    # mlp_layer_types (two dense first).
    Case("deepseek_v32-yarn-layer-types", "DeepseekV32Config", "DeepseekV32ForCausalLM",
         _llama_like(num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8,
                     qk_nope_head_dim=8, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                     topk_group=1, n_shared_experts=2, moe_intermediate_size=24,
                     mlp_layer_types=["dense", "dense", "sparse"], norm_topk_prob=False, routed_scaling_factor=1.0,
                     attention_bias=True, index_topk=3, index_n_heads=8, index_head_dim=8,
                     rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                      "original_max_position_embeddings": 16, "mscale": 1.0, "mscale_all_dim": 1.0,
                                      "beta_fast": 32.0, "beta_slow": 1.0})),
    # Three sliding layers with interleaved rope, then a global layer without positions; scaled logits, untied.
    Case("cohere2", "Cohere2Config", "Cohere2ForCausalLM",
         _llama_like(num_hidden_layers=4, sliding_window=WINDOW, logit_scale=0.5, tie_word_embeddings=False)),
    Case("cohere2-pattern", "Cohere2Config", "Cohere2ForCausalLM",
         _llama_like(num_hidden_layers=3, num_key_value_heads=1, sliding_window=WINDOW, sliding_window_pattern=2,
                     attention_bias=True, logit_scale=4.0)),
    # Cohere2-MoE: Cohere2's parallel blocks (bias-free LayerNorm, head_dim 24 not hidden / heads, interleaved rope on
    # the sliding layers) over 5 experts (2 per token) with 2 shared experts averaged with them; a dense first layer of
    # its own width keeps the rope though global (prefix_dense_sliding_window_pattern 1), the last global layer not.
    Case("cohere2_moe", "Cohere2MoeConfig", "Cohere2MoeForCausalLM",
         _llama_like(num_hidden_layers=4, head_dim=24, sliding_window=WINDOW, sliding_window_pattern=3, logit_scale=0.5,
                     num_experts=5, num_experts_per_tok=2, num_shared_experts=2, first_k_dense_replace=1,
                     prefix_dense_intermediate_size=80, attention_bias=True, tie_word_embeddings=False)),
    # RMSNorms (rms_norm_eps set), shared experts summed, no dense layer, MHA, an odd expert count and 3 per token, the
    # sigmoid router (the chosen experts' sigmoids renormalised, norm_topk_prob).
    Case("cohere2_moe-rms-sum", "Cohere2MoeConfig", "Cohere2MoeForCausalLM",
         _llama_like(num_hidden_layers=3, num_key_value_heads=4, head_dim=16, sliding_window=WINDOW,
                     sliding_window_pattern=2, rms_norm_eps=1e-4, num_experts=7, num_experts_per_tok=3,
                     num_shared_experts=1, shared_expert_combination_strategy="sum", logit_scale=4.0,
                     expert_selection_fn="sigmoid")),
    # The sigmoid router without renormalisation (the chosen experts' sigmoids as they are), dense first layer
    # without rope (prefix_dense_sliding_window_pattern 2), tied head.
    Case("cohere2_moe-sigmoid-unnormalized", "Cohere2MoeConfig", "Cohere2MoeForCausalLM",
         _llama_like(num_hidden_layers=3, head_dim=12, sliding_window=WINDOW, sliding_window_pattern=2,
                     num_experts=6, num_experts_per_tok=2, num_shared_experts=1, first_k_dense_replace=1,
                     prefix_dense_sliding_window_pattern=2, expert_selection_fn="sigmoid", norm_topk_prob=False,
                     logit_scale=2.0)),
    # PhiMoE: LayerNorms with biases, q/k/v/o and LM head biases, SparseMixer's top-2 of 5 experts with a jitter_eps
    # wide enough that rivals share the softmax, sliding windows; and Phi-3.5-MoE's longrope (equal mscales, the
    # frequencies from short_factor at every length) with a tied head that still has its own bias.
    Case("phimoe", "PhimoeConfig", "PhimoeForCausalLM",
         _llama_like(num_local_experts=5, num_experts_per_tok=2, router_jitter_noise=0.3, attention_bias=True,
                     lm_head_bias=True, sliding_window=WINDOW, rms_norm_eps=1e-4)),
    Case("phimoe-longrope", "PhimoeConfig", "PhimoeForCausalLM",
         _llama_like(num_hidden_layers=3, num_local_experts=4, num_experts_per_tok=2, lm_head_bias=True,
                     tie_word_embeddings=True,
                     rope_parameters=_rope("longrope", short_factor=[1.0 + 0.1 * i for i in range(8)],
                                           long_factor=[2.0 + 0.3 * i for i in range(8)], short_mscale=1.2,
                                           long_mscale=1.2, original_max_position_embeddings=16))),
    # A.X-K1: DeepSeek-V3's latent attention and grouped sigmoid routing (8 experts in 4 groups, 2 kept, 3 per token,
    # scaled) with an RMSNorm on the mixture's output (eps not the default); dense layers 0 and 1 by mlp_layer_types.
    Case("axk1", "AXK1Config", "AXK1ForCausalLM",
         _llama_like(num_hidden_layers=4, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=20, qk_rope_head_dim=8,
                     qk_nope_head_dim=12, v_head_dim=10, n_routed_experts=8, num_experts_per_tok=3, n_group=4,
                     topk_group=2, n_shared_experts=1, moe_intermediate_size=32, routed_scaling_factor=2.5,
                     rms_norm_eps=1e-4, mlp_layer_types=["dense", "dense", "sparse", "sparse"])),
    # A.X-K2: DeepSeek-V3.2's indexed latent attention (5 heads, 4 keys per query, indexer heads wider than the rotary
    # part) with q_gate_proj (queries and a gate per value channel from [norm(a); a]), gated norms of rank 3 (plain
    # FFN norm on the two dense layers by mlp_layer_types), 8 experts without groups, 3 per token; eps 1e-4.
    Case("axk2", "AXK2Config", "AXK2ForCausalLM",
         _llama_like(num_hidden_layers=4, num_attention_heads=5, num_key_value_heads=5, q_lora_rank=12,
                     kv_lora_rank=20, qk_rope_head_dim=8, qk_nope_head_dim=6, v_head_dim=10, n_routed_experts=8,
                     num_experts_per_tok=3, n_shared_experts=1, moe_intermediate_size=32, routed_scaling_factor=2.5,
                     rms_norm_eps=1e-4, gated_norm_rank=3, mlp_layer_types=["dense", "dense", "sparse", "sparse"],
                     index_topk=4, index_n_heads=16, index_head_dim=12)),
    # Grouped routing (8 experts in 4 groups, 2 kept), the legacy first_k_dense_replace (one dense layer), YaRN with
    # mscale_all_dim, attention biases, tied embeddings.
    Case("axk2-groups-yarn-tied", "AXK2Config", "AXK2ForCausalLM",
         _llama_like(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16,
                     kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12, n_routed_experts=8,
                     num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=2, moe_intermediate_size=24,
                     routed_scaling_factor=1.5, first_k_dense_replace=1, attention_bias=True, tie_word_embeddings=True,
                     gated_norm_rank=5, index_topk=6, index_n_heads=4, index_head_dim=8,
                     rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                      "original_max_position_embeddings": 16, "mscale": 1.0, "mscale_all_dim": 1.0,
                                      "beta_fast": 32.0, "beta_slow": 1.0})),
    # Mellum: Qwen3-MoE's attention (head_dim 24, per-head q/k norms) with sliding and full layers by layer_types, a
    # rope per layer type (different thetas), 5 experts (2 per token, renormalised), a dense layer by mlp_layer_types.
    Case("mellum", "MellumConfig", "MellumForCausalLM",
         _llama_like(num_hidden_layers=3, head_dim=24, sliding_window=WINDOW, num_experts=5, num_experts_per_tok=2,
                     moe_intermediate_size=40, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                     mlp_layer_types=["sparse", "dense", "sparse"],
                     rope_parameters={"full_attention": _rope("default", rope_theta=50000.0),
                                      "sliding_attention": _rope("default")})),
    # num_mtp_layers 1 (transformers builds no module for it; a published checkpoint's mtp.* tensors are skipped on
    # import, issue 47), MHA-like one key/value head, q/k/v/o biases, weights not renormalised.
    Case("mellum-mtp", "MellumConfig", "MellumForCausalLM",
         _llama_like(num_hidden_layers=2, num_key_value_heads=1, head_dim=16, num_experts=4, num_experts_per_tok=2,
                     moe_intermediate_size=32, norm_topk_prob=False, num_mtp_layers=1, attention_bias=True)),
    # MiMo-V2-Flash: query/key heads of 24 (a third rotated: int(24 * 0.334) = 8 channels), value heads of 10, values
    # scaled; layers full, sliding (3 key/value heads, twice the full layers', and sinks), sliding, full, windows
    # shorter than the prompt; 6 sigmoid-routed experts in 3 groups (2 kept), 2 per token, scaled, with a selection
    # bias; a dense first layer; q/k/v biases.
    Case("mimo_v2_flash", "MiMoV2FlashConfig", "MiMoV2FlashForCausalLM",
         _llama_like(num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=1, head_dim=24, v_head_dim=10,
                     attention_value_scale=0.6, sliding_window=WINDOW, attention_bias=True,
                     layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
                     n_routed_experts=6, num_experts_per_tok=2, n_group=3, topk_group=2, moe_intermediate_size=24,
                     routed_scaling_factor=1.5, mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
                     rope_parameters={"full_attention": _rope("default", rope_theta=50000.0, partial_rotary_factor=0.334),
                                      "sliding_attention": _rope("default", partial_rotary_factor=0.334)}),
         shake_buffers=("e_score_correction_bias", 1.0)),
    # Its other switches: value heads wider than query/key heads (32 over 16), half of each head rotated on the full
    # layers and whole heads on the sliding ones (multi-head there: 4 key/value heads), no value scale (null),
    # unnormalised weights, no dense layer, tied embeddings.
    Case("mimo_v2_flash-wide-values-tied", "MiMoV2FlashConfig", "MiMoV2FlashForCausalLM",
         _llama_like(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16, v_head_dim=32,
                     attention_value_scale=None, sliding_window=WINDOW, tie_word_embeddings=True,
                     layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                     n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=False,
                     mlp_layer_types=["sparse"] * 3,
                     rope_parameters={"full_attention": _rope("default", partial_rotary_factor=0.5),
                                      "sliding_attention": _rope("default", partial_rotary_factor=1.0)})),
    # Laguna: heads per layer 4, 6, 2, 6 (the block takes 6, the others are overrides) over 2 key/value heads of 12
    # channels, per-head q/k norms, one softplus gate per head, q/k/v/o biases; sliding, full, sliding, full layers
    # with windows shorter than the prompt, half of each head rotated on the full layers (theta 50000) and all of it
    # on the sliding ones; a dense layer between sparse ones; 5 experts, 2 per token, router logits softcapped at 0.3,
    # a selection bias, scaled by 1.7, one ungated shared expert of 40; eps 1e-5, untied.
    Case("laguna", "LagunaConfig", "LagunaForCausalLM",
         _llama_like(num_hidden_layers=4, head_dim=12, num_attention_heads_per_layer=[4, 6, 2, 6], attention_bias=True,
                     gating=True, sliding_window=WINDOW, rms_norm_eps=1e-5,
                     layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                     rope_parameters={"full_attention": _rope("default", rope_theta=50000.0, partial_rotary_factor=0.5),
                                      "sliding_attention": _rope("default", partial_rotary_factor=1.0)},
                     mlp_layer_types=["sparse", "dense", "sparse", "sparse"], num_experts=5, num_experts_per_tok=2,
                     moe_intermediate_size=24, shared_expert_intermediate_size=40, moe_router_logit_softcapping=0.3,
                     moe_routed_scaling_factor=1.7),
         reset_params=(("e_score_correction_bias", 0.3),)),
    # Its other switches: a gate per channel ("per-element"), MQA, no biases, layer_types, rope_parameters and
    # mlp_layer_types at their defaults (all full, half of each head rotated, the first layer dense), no softcap or
    # scaling, tied embeddings.
    Case("laguna-per-element-mqa-tied", "LagunaConfig", "LagunaForCausalLM",
         _llama_like(num_hidden_layers=3, num_key_value_heads=1, head_dim=20, gating="per-element", num_experts=4,
                     num_experts_per_tok=3, moe_intermediate_size=16, shared_expert_intermediate_size=24,
                     tie_word_embeddings=True)),
    # GLM-4.5: head_dim 24 (not hidden / heads) with half of it rotated, q/k/v biases (none on o), per-head q/k
    # norms, 8 sigmoid-routed experts in 4 groups (2 kept), 3 per token, scaled, a shared expert, a dense first layer.
    Case("glm4_moe", "Glm4MoeConfig", "Glm4MoeForCausalLM",
         _llama_like(num_hidden_layers=3, head_dim=24, attention_bias=True, use_qk_norm=True, n_routed_experts=8,
                     num_experts_per_tok=3, n_group=4, topk_group=2, n_shared_experts=1, moe_intermediate_size=32,
                     first_k_dense_replace=1, routed_scaling_factor=2.5)),
    # GLM-4.5-Air's switches: no q/k norms or biases, one group, unnormalised weights, two shared experts, no dense
    # layer, a quarter of each head rotated under YaRN, tied embeddings.
    Case("glm4_moe-air-yarn", "Glm4MoeConfig", "Glm4MoeForCausalLM",
         _llama_like(num_hidden_layers=2, num_key_value_heads=1, head_dim=32, n_routed_experts=4, num_experts_per_tok=2,
                     n_shared_experts=2, moe_intermediate_size=24, first_k_dense_replace=0, norm_topk_prob=False,
                     tie_word_embeddings=True,
                     rope_parameters=_rope("yarn", factor=4.0, original_max_position_embeddings=16, beta_fast=16.0,
                                           beta_slow=2.0, partial_rotary_factor=0.25))),
    # MiniMax-M2: head_dim 24 with 12 channels rotated (its config's rotary_dim), q/k norms over all heads, 5 experts
    # picked by sigmoid score plus a selection bias, 2 per token.
    Case("minimax_m2", "MiniMaxM2Config", "MiniMaxM2ForCausalLM",
         _llama_like(head_dim=24, rotary_dim=12, num_local_experts=5, num_experts_per_tok=2, intermediate_size=40)),
    Case("minimax_m2-mqa-partial", "MiniMaxM2Config", "MiniMaxM2ForCausalLM",
         _llama_like(num_hidden_layers=3, num_key_value_heads=1, head_dim=32, num_local_experts=4,
                     num_experts_per_tok=3, intermediate_size=24, tie_word_embeddings=True,
                     rope_parameters=_rope("default", partial_rotary_factor=0.25))),
    # OLMo 3: three sliding layers to one global one (the default pattern over 5 layers), each kind with its rope.
    Case("olmo3", "Olmo3Config", "Olmo3ForCausalLM",
         _llama_like(num_hidden_layers=5, sliding_window=WINDOW,
                     rope_parameters={"sliding_attention": _rope("default"),
                                      "full_attention": _rope("yarn", factor=4.0, original_max_position_embeddings=16,
                                                                beta_fast=16.0, beta_slow=2.0)})),
    Case("olmo3-layer-types-bias", "Olmo3Config", "Olmo3ForCausalLM",
         _llama_like(num_hidden_layers=3, num_key_value_heads=4, attention_bias=True, sliding_window=WINDOW,
                     layer_types=["full_attention", "sliding_attention", "full_attention"], tie_word_embeddings=True)),
    # EXAONE 4: norms after the sublayers, per-head q/k norms, head_dim 24, three sliding layers with rope to a
    # global one without; and the 1.2B's form: no window, every layer global with a (llama3-scaled) rope.
    Case("exaone4", "Exaone4Config", "Exaone4ForCausalLM",
         _llama_like(num_hidden_layers=4, head_dim=24, sliding_window=WINDOW, sliding_window_pattern=4)),
    Case("exaone4-global-llama3", "Exaone4Config", "Exaone4ForCausalLM",
         _llama_like(num_hidden_layers=2, num_key_value_heads=1, sliding_window=None,
                     layer_types=["full_attention", "full_attention"], tie_word_embeddings=True,
                     rope_parameters=_rope("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                           original_max_position_embeddings=16))),
    # Llama 4 (text): chunked local attention (chunks of 8, shorter than the inputs) with interleaved rope and
    # l2-normalised q/k, a global NoPE layer every 4th with temperature-tuned queries (floor_scale 4, so the scale
    # moves within the inputs), experts in every layer (top-1 of 4, sigmoid on the input, a shared expert), a
    # head_dim that is not hidden / heads, untied.
    Case("llama4", "Llama4TextConfig", "Llama4ForCausalLM",
         _llama_like(num_hidden_layers=4, head_dim=24, intermediate_size=40, intermediate_size_mlp=72,
                     num_local_experts=4, num_experts_per_tok=1, attention_chunk_size=WINDOW, floor_scale=4,
                     attn_scale=0.5, rope_parameters=_rope("default", rope_theta=500000.0))),
    # Experts every other layer (interleave_moe_layer_step 2: layers 1 and 3) beside dense layers, 2 of 5 experts per
    # token, NoPE every other layer (no_rope_layer_interval 2) with tuning, no qk norm, llama3 rope scaling, attention
    # biases, one kv head, chunks of 16, tied embeddings.
    Case("llama4-interleaved", "Llama4TextConfig", "Llama4ForCausalLM",
         _llama_like(num_hidden_layers=4, num_key_value_heads=1, intermediate_size=24, intermediate_size_mlp=80,
                     num_local_experts=5, num_experts_per_tok=2, interleave_moe_layer_step=2, no_rope_layer_interval=2,
                     use_qk_norm=False, attention_chunk_size=16, floor_scale=3, attn_scale=0.3, attention_bias=True,
                     tie_word_embeddings=True,
                     rope_parameters=_rope("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                           original_max_position_embeddings=16))),
    # Gemma 4: five layers (sliding, global, sliding, sliding, global), wider global heads (32 channels, one kv head)
    # whose keys are their values, the proportional rope, the last two layers reading layers 1's and 2's keys and
    # values with double-wide MLPs, per-layer inputs of 8 channels, a soft-capped head.
    Case("gemma4", "Gemma4TextConfig", "Gemma4ForCausalLM",
         _llama_like(num_hidden_layers=5, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
                     attention_k_eq_v=True, sliding_window=WINDOW, hidden_size_per_layer_input=8,
                     vocab_size_per_layer_input=128, num_kv_shared_layers=2, use_double_wide_mlp=True,
                     final_logit_softcapping=30.0,
                     layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                                  "full_attention"])),
    # The mixture of experts beside every MLP (26B-A4B's shape): 4 experts, 2 per token; no per-layer inputs, no
    # sharing, separate values, an untied head, a rope of another theta on the sliding layers.
    Case("gemma4-moe", "Gemma4TextConfig", "Gemma4ForCausalLM",
         _llama_like(num_hidden_layers=3, head_dim=16, global_head_dim=24, sliding_window=WINDOW,
                     hidden_size_per_layer_input=0, enable_moe_block=True, num_experts=4, top_k_experts=2,
                     moe_intermediate_size=24, tie_word_embeddings=False, attention_bias=True,
                     rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 5000.0},
                                      "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                                                         "rope_theta": 1e6}})),
    # Gemma 4 unified: Gemma 4's attention in Gemma 2's sandwich layer, no per-layer inputs or experts; four
    # layers (sliding, global, sliding, global), wider global heads (24 channels over 2 kv heads) whose keys are their
    # values, the last layer reading layer 1's keys and values with a double-wide MLP, layer_scalar shaken away from 1,
    # an untied soft-capped head.
    Case("gemma4_unified_text", "Gemma4UnifiedTextConfig", "Gemma4UnifiedForCausalLM",
         _llama_like(num_hidden_layers=4, head_dim=16, global_head_dim=24, num_global_key_value_heads=2,
                     attention_k_eq_v=True, sliding_window=WINDOW, num_kv_shared_layers=1, use_double_wide_mlp=True,
                     final_logit_softcapping=20.0, tie_word_embeddings=False, rms_norm_eps=1e-4,
                     layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"]),
         shake_buffers=("layer_scalar", 0.3)),
    # Aria (text): 4 heads of 24 over 2 (head_dim its own: transformers' Aria wants heads dividing hidden), attention biases, 5 experts of 24 (top 2, softmax over
    # the chosen logits) beside two shared experts (48 wide), non-default eps, untied; and multi-query, one shared
    # expert, 3 of 4 experts per token, tied.
    Case("aria_text", "AriaTextConfig", "AriaTextForCausalLM",
         _llama_like(head_dim=24, attention_bias=True, intermediate_size=24, moe_num_experts=5,
                     moe_topk=2, moe_num_shared_experts=2, rms_norm_eps=1e-4, pad_token_id=None)),
    Case("aria_text-mqa-one-shared-tied", "AriaTextConfig", "AriaTextForCausalLM",
         _llama_like(num_key_value_heads=1, intermediate_size=32, moe_num_experts=4, moe_topk=3,
                     moe_num_shared_experts=1, tie_word_embeddings=True, pad_token_id=None)),
    # --- hybrid: LFM2 ---
    # Short-convolution layers with attention between them (the commoner kind is the block's mixer).
    Case("lfm2", "Lfm2Config", "Lfm2ForCausalLM",
         {**BASE, "num_hidden_layers": 4, "num_key_value_heads": 2, "norm_eps": 1e-6, "conv_L_cache": 3,
          "block_multiple_of": 8, "layer_types": ["conv", "full_attention", "conv", "conv"],
          "rope_parameters": _rope("default")}),
    # Built from the first configs' spelling (full_attn_idxs, block_ff_dim, tie_embedding; transformers saves them as
    # layer_types, intermediate_size and tie_word_embeddings: test_family_specs reads a published file as it is);
    # kernel 4, biases, an awkward width (48, 4 heads of 12, one kv head), the feed-forward width as given, untied.
    Case("lfm2-legacy-kernel4-bias", "Lfm2Config", "Lfm2ForCausalLM",
         {**BASE, "hidden_size": 48, "num_hidden_layers": 4, "num_key_value_heads": 1, "conv_L_cache": 4,
          "conv_bias": True, "full_attn_idxs": [0, 3], "block_ff_dim": 40, "block_auto_adjust_ff_dim": False,
          "tie_embedding": False, "rope_parameters": _rope("default")}),
    # Mostly attention: the block is attention and the conv layer an override; a multiplier and an odd multiple.
    Case("lfm2-attention-majority", "Lfm2Config", "Lfm2ForCausalLM",
         {**BASE, "num_hidden_layers": 3, "num_key_value_heads": 2, "conv_L_cache": 4, "block_ffn_dim_multiplier": 1.5,
          "block_multiple_of": 40,
          "layer_types": ["full_attention", "conv", "full_attention"], "rope_parameters": _rope("linear", factor=2.0)}),
    # LFM3: short convolutions, a sliding layer (window shorter than the prompt) and global layers with the
    # proportional rope on half of each head; 6 heads of 12 over 2 (not filling hidden), q/k/v/o biases, the head gate,
    # sandwich norms, non-default eps, kernel 4 with biases, untied.
    Case("lfm3", "Lfm3Config", "Lfm3ForCausalLM",
         {**BASE, "num_hidden_layers": 5, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 12,
          "norm_eps": 1e-4, "conv_L_cache": 4, "conv_bias": True, "attention_bias": True, "sliding_window": WINDOW,
          "tie_word_embeddings": False,
          "layer_types": ["conv", "full_attention", "conv", "sliding_attention", "full_attention"]}),
    # Mostly attention (the block is attention), no gate, no sandwich norms, tied, Lfm3Config's own rope defaults
    # and layer pattern (conv, conv, global, conv, sliding).
    Case("lfm3-prenorm-ungated", "Lfm3Config", "Lfm3ForCausalLM",
         {**BASE, "num_hidden_layers": 5, "num_key_value_heads": 1, "head_dim": 16, "use_sandwich_norm": False,
          "use_attention_gate": False, "sliding_window": WINDOW}),
    # --- hybrid: Falcon-H1, Granite 4.0-H ---
    # Falcon-H1: Mamba-2 beside attention in every block. Every multiplier away from 1, Mamba without its norm,
    # 2 groups of B/C, conv kernel 3, an inner width of its own (mamba_d_ssm); then the gated norm on either side of
    # the gate, conv kernel 4, biases everywhere, a head_dim of its own, tied embeddings.
    Case("falcon_h1", "FalconH1Config", "FalconH1ForCausalLM",
         _llama_like(num_hidden_layers=2, mamba_d_ssm=96, mamba_n_heads=4, mamba_n_groups=2, mamba_d_state=12,
                     mamba_d_conv=3, mamba_chunk_size=16, key_multiplier=0.7, attention_in_multiplier=1.3,
                     attention_out_multiplier=0.6, ssm_in_multiplier=0.8, ssm_out_multiplier=1.2,
                     ssm_multipliers=[0.5, 1.5, 0.9, 1.1, 0.7], mlp_multipliers=[0.8, 1.25], embedding_multiplier=2.0,
                     lm_head_multiplier=0.4, rope_parameters=_rope("default", rope_theta=5000.0))),
    Case("falcon_h1-rms-norm", "FalconH1Config", "FalconH1ForCausalLM",
         _llama_like(num_hidden_layers=3, head_dim=24, mamba_d_ssm=None, mamba_expand=2, mamba_n_heads=8,
                     mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=8, mamba_rms_norm=True,
                     mamba_norm_before_gate=True, mamba_proj_bias=True, projectors_bias=True, attention_bias=True,
                     mlp_bias=True, key_multiplier=1.5, ssm_multipliers=[1.2, 0.8, 1.0, 1.3, 0.6])),
    Case("falcon_h1-gate-then-norm", "FalconH1Config", "FalconH1ForCausalLM",
         _llama_like(num_hidden_layers=2, mamba_d_ssm=64, mamba_n_heads=4, mamba_n_groups=4, mamba_d_state=8,
                     mamba_d_conv=2, mamba_chunk_size=16, mamba_rms_norm=True, mamba_norm_before_gate=False,
                     tie_word_embeddings=True, attention_out_multiplier=0.5, ssm_out_multiplier=2.0)),
    # Granite 4.0-H with attention layers only: rope, GQA, 5 experts (2 per token) plus the shared expert, and
    # every multiplier away from 1; then no experts (the shared expert alone) and no positions.
    Case("granitemoehybrid-attention", "GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
         _llama_like(num_hidden_layers=2, layer_types=["attention", "attention"], position_embedding_type="rope",
                     num_local_experts=5, num_experts_per_tok=2, intermediate_size=40, shared_intermediate_size=56,
                     embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.3, logits_scaling=2.5,
                     attention_bias=True)),
    # Mamba-2 and attention layers mixed (mamba, attention, mamba, mamba), no positions, 2 groups of B/C over 4 heads,
    # conv kernel 3, biases on the projections and no conv bias, a clamped step; then conv kernel 4, one attention layer
    # first and the legacy layer type names.
    Case("granitemoehybrid", "GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
         _llama_like(num_hidden_layers=4, layer_types=["mamba", "attention", "mamba", "mamba"], num_local_experts=4,
                     num_experts_per_tok=2, intermediate_size=40, shared_intermediate_size=48, mamba_n_heads=4,
                     mamba_d_head=32, mamba_expand=2, mamba_n_groups=2, mamba_d_state=12,
                     mamba_d_conv=3, mamba_conv_bias=False, mamba_proj_bias=True, mamba_chunk_size=16,
                     time_step_limit=[0.01, 2.0], embedding_multiplier=2.0, residual_multiplier=0.7,
                     attention_multiplier=0.2, logits_scaling=1.5)),
    Case("granitemoehybrid-rope-dense", "GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
         _llama_like(num_hidden_layers=3, layer_types=["full_attention", "linear_attention", "linear_attention"],
                     position_embedding_type="rope", num_local_experts=0, shared_intermediate_size=56,
                     mamba_n_heads=8, mamba_expand=2, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4,
                     mamba_chunk_size=8, residual_multiplier=0.3, logits_scaling=3.0)),
    Case("granitemoehybrid-dense-nope", "GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
         _llama_like(num_hidden_layers=3, layer_types=["full_attention"] * 3, position_embedding_type="nope", num_local_experts=0,
                     shared_intermediate_size=72, embedding_multiplier=12.0, residual_multiplier=0.22,
                     attention_multiplier=0.0078125, logits_scaling=6.0, tie_word_embeddings=True)),
]

# --- hybrid: mamba2 families ---


def _mamba2(**kw: Any) -> dict[str, Any]:
    return dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_heads=4, head_dim=16, expand=2, state_size=8,
                chunk_size=16, bos_token_id=None, eos_token_id=None, pad_token_id=None, **kw)


def _nemotron_h(pattern: str, **kw: Any) -> dict[str, Any]:
    return dict(vocab_size=128, hidden_size=32, hybrid_override_pattern=pattern, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, intermediate_size=48, mamba_num_heads=4, mamba_head_dim=12,
                ssm_state_size=8, chunk_size=16, max_position_embeddings=CONTEXT, bos_token_id=None, eos_token_id=None,
                pad_token_id=None, **kw)


CASES += [
    # Two groups of B and C, a 3-tap convolution without bias, biased projections, chunks that do not divide the input.
    Case("mamba2", "Mamba2Config", "Mamba2ForCausalLM", _mamba2(n_groups=2, conv_kernel=3, use_conv_bias=False, use_bias=True)),
    # Four groups (one head each), tied embeddings, an upper clamp of the step.
    Case("mamba2-tied-clamped", "Mamba2Config", "Mamba2ForCausalLM",
         _mamba2(n_groups=4, conv_kernel=4, tie_word_embeddings=True, time_step_limit=[0.0, 0.05])),
    # Mamba, attention and MLP layers with two Mamba layers in a row and an attention layer without its MLP.
    Case("nemotron_h", "NemotronHConfig", "NemotronHForCausalLM", _nemotron_h("M-MM*-", n_groups=2, conv_kernel=3)),
    Case("nemotron_h-biased", "NemotronHConfig", "NemotronHForCausalLM",
         _nemotron_h("*M-M", n_groups=4, conv_kernel=4, use_conv_bias=False, use_bias=True, mlp_bias=True,
                     time_step_min=0.01)),
    # --- hybrid: Kimi Linear ---
    # KDA layers (3 heads of 12: not hidden / heads; kernel 3) around one latent-attention layer (a query bottleneck,
    # no positions), the pattern from linear_attn_config's 1-based lists; one dense layer, then 6 experts in 2 groups
    # (1 group kept), 2 per token, 2 shared experts.
    Case("kimi_linear", "KimiLinearConfig", "KimiLinearForCausalLM",
         _llama_like(num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=20, qk_rope_head_dim=8,
                     qk_nope_head_dim=12, v_head_dim=10, num_experts=6, num_experts_per_tok=2, n_group=2, topk_group=1,
                     n_shared_experts=2, moe_intermediate_size=32, first_k_dense_replace=1, routed_scaling_factor=2.5,
                     rms_norm_eps=1e-5, linear_attn_config={"num_heads": 3, "head_dim": 12, "short_conv_kernel_size": 3,
                                                            "kda_layers": [1, 3], "full_attn_layers": [2]})),
    # Mostly latent attention (the block is mla, KDA an override), no query bottleneck, attention biases, kernel 4;
    # experts on the first and last layers only (mlp_layer_types), top-k weights not renormalised.
    Case("kimi_linear-mla-base", "KimiLinearConfig", "KimiLinearForCausalLM",
         _llama_like(num_hidden_layers=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=4,
                     qk_nope_head_dim=8, v_head_dim=16, num_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                     n_shared_experts=1, moe_intermediate_size=24, routed_scaling_factor=1.0, norm_topk_prob=False,
                     attention_bias=True, linear_num_heads=2, linear_head_dim=16, linear_conv_kernel_dim=4,
                     layer_types=["full_attention", "linear_attention", "full_attention", "full_attention"],
                     mlp_layer_types=["sparse", "dense", "dense", "sparse"])),
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
    # StarCoder2: LayerNorm with biases, a plain GELU MLP, use_bias on every projection, a window shorter than the
    # prompt; and without biases, untied, a head_dim of its own (3 query heads per kv head, non-default eps).
    Case("starcoder2", "Starcoder2Config", "Starcoder2ForCausalLM",
         _llama_like(sliding_window=WINDOW, norm_epsilon=1e-4)),
    Case("starcoder2-no-bias-untied", "Starcoder2Config", "Starcoder2ForCausalLM",
         _llama_like(num_attention_heads=6, head_dim=12, use_bias=False, tie_word_embeddings=False, hidden_act="gelu",
                     rope_parameters=_rope("linear", factor=2.0))),
    # OLMoE: RMSNorm over all of q and k (k's over the 2 kv heads only), experts in every layer, biases on, q and k
    # clamped after their norms (clip_qkv below their largest values); and tied, one kv head, the top-k weights
    # renormalised, unclipped.
    Case("olmoe", "OlmoeConfig", "OlmoeForCausalLM",
         _llama_like(num_experts=5, num_experts_per_tok=2, intermediate_size=40, attention_bias=True, rms_norm_eps=1e-4,
                     clip_qkv=0.6)),
    Case("olmoe-mqa-normalized-tied", "OlmoeConfig", "OlmoeForCausalLM",
         _llama_like(num_hidden_layers=3, num_key_value_heads=1, num_experts=4, num_experts_per_tok=3,
                     norm_topk_prob=True, tie_word_embeddings=True)),
    # Granite 3: Llama with every muP multiplier away from 1, biases on, untied, non-default eps; and tied, 6 query heads
    # over 3 kv heads of a head_dim of their own, a linear rope scaling, logits multiplied (logits_scaling below 1).
    Case("granite", "GraniteConfig", "GraniteForCausalLM",
         _llama_like(embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.3, logits_scaling=2.5,
                     attention_bias=True, mlp_bias=True, rms_norm_eps=1e-4)),
    Case("granite-tied-head_dim", "GraniteConfig", "GraniteForCausalLM",
         _llama_like(num_attention_heads=6, num_key_value_heads=3, head_dim=12, tie_word_embeddings=True,
                     embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.015625,
                     logits_scaling=0.25, rope_parameters=_rope("linear", factor=2.0))),
    # Granite SWA: the default layer_types (layers 0 and 4 full, 1-3 sliding through a window shorter than the prompt),
    # a rope base per layer with two NoPE layers (theta 0), sinks, the multipliers, biases, 6 heads of 12 over 2, untied.
    Case("granite_swa", "GraniteSWAConfig", "GraniteSWAForCausalLM",
         _llama_like(num_hidden_layers=5, num_attention_heads=6, head_dim=12, sliding_window=WINDOW,
                     layer_rope_theta=[10000.0, 0, 500.0, 10000.0, 0], embedding_multiplier=3.0,
                     residual_multiplier=0.5, attention_multiplier=0.3, logits_scaling=2.5, attention_bias=True,
                     mlp_bias=True, rms_norm_eps=1e-4, tie_word_embeddings=False)),
    # Granite MoE SWA: a shared expert wider than the 5 routed ones (2 per token), full, sliding, sliding layers (the
    # window shorter than the prompt) with a NoPE middle layer, sinks, the multipliers, attention biases, MQA, tied.
    Case("granitemoe_swa", "GraniteMoeSWAConfig", "GraniteMoeSWAForCausalLM",
         _llama_like(num_hidden_layers=3, num_key_value_heads=1, num_local_experts=5, num_experts_per_tok=2,
                     intermediate_size=40, shared_intermediate_size=56, sliding_window=WINDOW,
                     layer_rope_theta=[10000.0, 0, 2000.0], embedding_multiplier=2.0, residual_multiplier=0.7,
                     attention_multiplier=0.2, logits_scaling=1.5, attention_bias=True, rms_norm_eps=1e-4,
                     tie_word_embeddings=True)),
    # Granite 3 MoE: 5 experts (2 per token) in every layer, the multipliers, biased attention, non-default eps; and tied,
    # MQA, 3 of 4 experts per token.
    Case("granitemoe", "GraniteMoeConfig", "GraniteMoeForCausalLM",
         _llama_like(num_local_experts=5, num_experts_per_tok=2, intermediate_size=40, embedding_multiplier=3.0,
                     residual_multiplier=0.5, attention_multiplier=0.3, logits_scaling=2.5, attention_bias=True,
                     rms_norm_eps=1e-4)),
    Case("granitemoe-mqa-tied", "GraniteMoeConfig", "GraniteMoeForCausalLM",
         _llama_like(num_hidden_layers=3, num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=3,
                     intermediate_size=24, tie_word_embeddings=True, embedding_multiplier=12.0, residual_multiplier=0.22,
                     attention_multiplier=0.015625, logits_scaling=0.5)),
    # Granite MoE with a shared expert wider than the routed ones; and with none (shared_intermediate_size 0).
    Case("granitemoeshared", "GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM",
         _llama_like(num_local_experts=5, num_experts_per_tok=2, intermediate_size=40, shared_intermediate_size=56,
                     embedding_multiplier=2.0, residual_multiplier=0.7, attention_multiplier=0.2, logits_scaling=1.5,
                     attention_bias=True)),
    Case("granitemoeshared-no-shared", "GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM",
         _llama_like(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, shared_intermediate_size=0,
                     tie_word_embeddings=True, residual_multiplier=0.3)),
    # Llama under other model_types (transformers builds LlamaForCausalLM): EXAONE 3 with its own tensor names and
    # biases on; InternLM3 with biases (which it requires together) and a head_dim of its own; IQuest-Coder tied.
    Case("exaone", "ExaoneConfig", "LlamaForCausalLM",
         _llama_like(attention_bias=True, mlp_bias=True, rms_norm_eps=1e-4, pad_token_id=None)),
    Case("internlm3", "InternLM3Config", "LlamaForCausalLM",
         _llama_like(head_dim=24, attention_bias=True, mlp_bias=True, pad_token_id=None)),
    Case("iquestcoder", "IQuestCoderConfig", "LlamaForCausalLM",
         _llama_like(num_attention_heads=8, head_dim=16, tie_word_embeddings=True,
                     rope_parameters=_rope("llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                           original_max_position_embeddings=16))),
    # GPT-SW3: GPT-2 under its own model_type (transformers maps it to GPT2Config): untied, GELU, biased LayerNorms.
    Case("gpt-sw3", "GPT2Config", "GPT2LMHeadModel",
         dict(vocab_size=128, n_embd=60, n_layer=2, n_head=5, n_positions=CONTEXT, n_inner=72, activation_function="gelu",
              layer_norm_epsilon=1e-4, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None),
         model_type="gpt-sw3"),
    # Sarvam-105B: DeepSeek-V3 under its own model_type; Sarvam's shape: no query bottleneck, experts in one group,
    # a dense first layer, 6 experts with 2 per token, two shared experts, YaRN with mscale_all_dim, untied.
    Case("sarvam_mla", "SarvamMLAConfig", "DeepseekV3ForCausalLM",
         _llama_like(num_hidden_layers=3, hidden_size=80, num_key_value_heads=5, num_attention_heads=5, q_lora_rank=None,
                     kv_lora_rank=20, qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=10, n_routed_experts=6,
                     num_experts_per_tok=2, n_shared_experts=2, moe_intermediate_size=24, routed_scaling_factor=2.5,
                     rms_norm_eps=1e-5, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                         "original_max_position_embeddings": 16, "mscale": 1.0,
                                                         "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0})),
    # Param2: GLM-4.5 with whole heads rotated (its default), q/k norms, q/k/v biases, tied, 6 experts in 2 groups
    # (1 kept), 2 per token, two shared experts, a dense first layer.
    Case("param2moe", "Param2MoeConfig", "Glm4MoeForCausalLM",
         _llama_like(num_hidden_layers=3, head_dim=16, attention_bias=True, n_routed_experts=6, num_experts_per_tok=2,
                     n_group=2, topk_group=1, n_shared_experts=2, moe_intermediate_size=24, first_k_dense_replace=1,
                     rms_norm_eps=1e-5, pad_token_id=None)),
    # Sarvam-30B: GLM-4.5 with whole heads rotated, q/k norms, MQA over 6 heads of 12, untied, no dense layer.
    Case("sarvam_moe", "SarvamMoEConfig", "Glm4MoeForCausalLM",
         _llama_like(num_attention_heads=6, num_key_value_heads=1, head_dim=12, n_routed_experts=5,
                     num_experts_per_tok=3, n_shared_experts=1, moe_intermediate_size=20, first_k_dense_replace=0,
                     pad_token_id=None)),
    # Helium: interleaved rope, q/k/v biases (none on o), MLP biases, 4 heads of 16 (filling hidden) over 2, tied.
    Case("helium", "HeliumConfig", "HeliumForCausalLM",
         _llama_like(head_dim=16, attention_bias=True, mlp_bias=True, rms_norm_eps=1e-5, tie_word_embeddings=True,
                     pad_token_id=None)),
    # Seed-OSS: q/k/v biases and an o_proj bias of its own, MLP biases, 3 heads of 20 over 1, untied.
    Case("seed_oss", "SeedOssConfig", "SeedOssForCausalLM",
         _llama_like(num_attention_heads=3, num_key_value_heads=1, head_dim=20, attention_out_bias=True, mlp_bias=True,
                     rms_norm_eps=1e-5, pad_token_id=None)),
    # Ministral: full, sliding, sliding layers (the window shorter than the prompt), head_dim of its own.
    Case("ministral", "MinistralConfig", "MinistralForCausalLM",
         _llama_like(num_hidden_layers=3, head_dim=24, sliding_window=WINDOW,
                     layer_types=["full_attention", "sliding_attention", "sliding_attention"])),
    # Ministral 3: queries scaled by 1 + 0.3 ln(1 + floor(p / 16)) (steps within the prompt), YaRN from 16 positions,
    # a sliding window shorter than the prompt on every layer, 6 heads of 12 over 2, untied; and a plain rope with the
    # scaling every 8 positions, MQA, tied.
    Case("ministral3", "Ministral3Config", "Ministral3ForCausalLM",
         _llama_like(num_attention_heads=6, head_dim=12, sliding_window=WINDOW, rms_norm_eps=1e-4, pad_token_id=None,
                     rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                      "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0,
                                      "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.3})),
    Case("ministral3-plain-rope-tied", "Ministral3Config", "Ministral3ForCausalLM",
         _llama_like(num_hidden_layers=3, num_key_value_heads=1, head_dim=16, tie_word_embeddings=True, pad_token_id=None,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                      "original_max_position_embeddings": 8, "llama_4_scaling_beta": 0.5})),
    # VaultGemma: Gemma 2 with pre-norm blocks; the default layer_types (even layers slide, through a window shorter than
    # the prompt), both soft-caps, a query_pre_attn_scalar of its own, biases, 6 heads of 16 (not hidden / heads) over 2,
    # untied.
    Case("vaultgemma", "VaultGemmaConfig", "VaultGemmaForCausalLM",
         _llama_like(num_hidden_layers=3, hidden_size=72, num_attention_heads=6, head_dim=16, sliding_window=WINDOW,
                     query_pre_attn_scalar=20, attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                     attention_bias=True, rms_norm_eps=1e-4, tie_word_embeddings=False, pad_token_id=None)),
    # CWM: the default layer_types (layer 0 and 4 full, 1-3 sliding), llama3 rope, MLP biases, MQA, tied.
    Case("cwm", "CwmConfig", "CwmForCausalLM",
         _llama_like(num_hidden_layers=5, num_key_value_heads=1, head_dim=16, sliding_window=WINDOW, mlp_bias=True,
                     tie_word_embeddings=True, rms_norm_eps=1e-4, bos_token_id=0,
                     rope_parameters=_rope("llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                           original_max_position_embeddings=16))),
    # Cohere (Command R): parallel blocks, interleaved rope on every layer, scaled logits, biases; and Command R+'s
    # per-head q/k LayerNorms (one weight row per head), MQA, untied, a linear rope scaling.
    Case("cohere", "CohereConfig", "CohereForCausalLM",
         _llama_like(attention_bias=True, logit_scale=0.25, layer_norm_eps=1e-4, pad_token_id=None)),
    Case("cohere-qk_norm", "CohereConfig", "CohereForCausalLM",
         _llama_like(num_key_value_heads=1, use_qk_norm=True, tie_word_embeddings=False, logit_scale=1.0, pad_token_id=None,
                     rope_parameters=_rope("linear", factor=2.0))),
    # ERNIE 4.5 (dense): an interleaved rope over whole heads, use_bias on every projection, tied; and MQA with 6
    # heads of a head_dim of its own (hidden / heads would be 10), untied, no biases, a linear rope scaling.
    Case("ernie4_5", "Ernie4_5Config", "Ernie4_5ForCausalLM",
         _llama_like(head_dim=None, use_bias=True, rms_norm_eps=1e-4, pad_token_id=None)),
    Case("ernie4_5-mqa-untied", "Ernie4_5Config", "Ernie4_5ForCausalLM",
         _llama_like(num_attention_heads=6, num_key_value_heads=1, head_dim=12, tie_word_embeddings=False,
                     pad_token_id=None, rope_parameters=_rope("linear", factor=2.0))),
    # ERNIE 4.5 MoE: layer 0 dense, 1 and 2 experts (the default start index 1) with two shared experts, 5 heads over
    # 1 kv head, tied; and experts on every second layer up to index 3 only (1 and 3 of 5), use_bias with an untied
    # head, no shared experts, a normalisation floor (moe_norm_min) above many tokens' kept probabilities.
    Case("ernie4_5_moe", "Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM",
         _llama_like(num_hidden_layers=3, num_attention_heads=5, num_key_value_heads=1, hidden_size=80,
                     moe_num_experts=6, moe_k=2, moe_intermediate_size=24, moe_num_shared_experts=2,
                     rms_norm_eps=1e-4, tie_word_embeddings=True)),
    Case("ernie4_5_moe-interval-bias", "Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM",
         _llama_like(num_hidden_layers=5, moe_num_experts=5, moe_k=3, moe_intermediate_size=32,
                     moe_num_shared_experts=0, moe_layer_start_index=0, moe_layer_end_index=3, moe_layer_interval=2,
                     moe_norm_min=0.8, use_bias=True, tie_word_embeddings=False,
                     rope_parameters=_rope("linear", factor=2.0))),
    # GLM (glm-4-9b): head_dim 24 (not hidden / heads) with half of it rotated in adjacent pairs (the default factor,
    # not written), q/k/v biases (none on o), the fused gate_up_proj, tied; and MQA, no biases, a quarter of each
    # head rotated under a linear scaling, untied.
    Case("glm", "GlmConfig", "GlmForCausalLM",
         _llama_like(head_dim=24, rms_norm_eps=1e-4, tie_word_embeddings=True, pad_token_id=None)),
    Case("glm-mqa-quarter", "GlmConfig", "GlmForCausalLM",
         _llama_like(num_attention_heads=6, num_key_value_heads=1, head_dim=16, attention_bias=False, pad_token_id=None,
                     rope_parameters=_rope("linear", factor=2.0, partial_rotary_factor=0.25))),
    # GLM-4-0414: GLM with sandwich norms (post_self_attn_layernorm, post_mlp_layernorm), q/k/v biases, untied; and
    # 3 heads of 20 over 1 kv head, no biases, tied, whole heads rotated.
    Case("glm4", "Glm4Config", "Glm4ForCausalLM", _llama_like(head_dim=16, rms_norm_eps=1e-4, pad_token_id=None)),
    Case("glm4-mqa-whole-tied", "Glm4Config", "Glm4ForCausalLM",
         _llama_like(num_attention_heads=3, num_key_value_heads=1, head_dim=20, attention_bias=False,
                     tie_word_embeddings=True, pad_token_id=None,
                     rope_parameters=_rope("default", partial_rotary_factor=1.0))),
    # DeepSeek-V2: latent attention with a query bottleneck and paired rotary channels; 8 softmax-scored experts in
    # 4 groups (group_limited_greedy keeps 2), 3 per token, not renormalised, scaled; 2 shared experts, one dense
    # first layer. And V2-Lite's shape: greedy routing over all experts (the groups ignored), no query bottleneck,
    # biases, YaRN with mscale_all_dim, norm_topk_prob true (transformers ignores it), two dense layers.
    Case("deepseek_v2", "DeepseekV2Config", "DeepseekV2ForCausalLM",
         _llama_like(num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=20, qk_rope_head_dim=8,
                     qk_nope_head_dim=12, v_head_dim=10, n_routed_experts=8, num_experts_per_tok=3, n_group=4,
                     topk_group=2, topk_method="group_limited_greedy", n_shared_experts=2, moe_intermediate_size=16,
                     first_k_dense_replace=1, routed_scaling_factor=2.5, rms_norm_eps=1e-5)),
    Case("deepseek_v2-lite-greedy-yarn", "DeepseekV2Config", "DeepseekV2ForCausalLM",
         _llama_like(num_hidden_layers=3, hidden_size=80, num_attention_heads=5, num_key_value_heads=5, q_lora_rank=None,
                     kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_routed_experts=6,
                     num_experts_per_tok=2, n_group=3, topk_group=1, topk_method="greedy", n_shared_experts=1,
                     moe_intermediate_size=24, first_k_dense_replace=2, norm_topk_prob=True, attention_bias=True,
                     tie_word_embeddings=True,
                     rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                      "original_max_position_embeddings": 16, "mscale": 0.707, "mscale_all_dim": 0.707,
                                      "beta_fast": 32.0, "beta_slow": 1.0})),
    # MiniCPM3: latent attention with a query bottleneck and a rope turning halves, muP scales (embeddings x12,
    # residual branches x 1.4 / sqrt(3), the final state / (64 / 16)), tied, biases; and without the query bottleneck,
    # v_head_dim and the scales null (no scaling: hidden / heads and sqrt(layers)), untied, a linear rope scaling.
    Case("minicpm3", "MiniCPM3Config", "MiniCPM3ForCausalLM",
         _llama_like(num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=20, qk_rope_head_dim=8,
                     qk_nope_head_dim=12, v_head_dim=10, scale_emb=12, scale_depth=1.4, dim_model_base=16,
                     attention_bias=True, mlp_bias=True, rms_norm_eps=1e-4, tie_word_embeddings=True)),
    Case("minicpm3-no-q-lora-unscaled", "MiniCPM3Config", "MiniCPM3ForCausalLM",
         _llama_like(num_hidden_layers=2, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8,
                     qk_nope_head_dim=8, v_head_dim=None, scale_emb=1, scale_depth=None, dim_model_base=None,
                     tie_word_embeddings=False, rope_parameters=_rope("linear", factor=2.0))),
    # Youtu-LLM: dense latent attention with a query bottleneck and interleaved rope, SwiGLU everywhere, biases on
    # the attention, untied, non-default eps.
    Case("youtu", "YoutuConfig", "YoutuForCausalLM",
         _llama_like(num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=20, qk_rope_head_dim=8,
                     qk_nope_head_dim=12, v_head_dim=10, attention_bias=True, rms_norm_eps=1e-4,
                     tie_word_embeddings=False)),
    # MPT: ALiBi with a head count that is no power of two (the slopes' interleaved second half), a softmax_scale of
    # its own, untied, non-default eps, the fused q/k/v clamped to 0.3 (below its largest values); and the defaults'
    # layout (4 heads, tied), unclipped.
    Case("mpt", "MptConfig", "MptForCausalLM",
         dict(vocab_size=128, d_model=60, n_layers=2, n_heads=6, max_seq_len=CONTEXT, layer_norm_epsilon=1e-4,
              tie_word_embeddings=False, attn_config={"softmax_scale": 0.3, "clip_qkv": 0.3})),
    Case("mpt-tied", "MptConfig", "MptForCausalLM",
         dict(vocab_size=128, d_model=64, n_layers=3, n_heads=4, max_seq_len=CONTEXT)),
    # Arcee (AFM): Llama with an ungated squared-ReLU MLP; GQA, biases on, non-default eps, untied; and tied with a
    # head_dim of its own, 4 query heads per kv head, the MLP in another activation.
    Case("arcee", "ArceeConfig", "ArceeForCausalLM",
         _llama_like(attention_bias=True, mlp_bias=True, rms_norm_eps=1e-4, pad_token_id=None)),
    Case("arcee-tied-head-dim", "ArceeConfig", "ArceeForCausalLM",
         _llama_like(num_attention_heads=8, head_dim=12, tie_word_embeddings=True, hidden_act="gelu_pytorch_tanh",
                     pad_token_id=None, rope_parameters=_rope("linear", factor=2.0))),
    # OPT: learned positions read from row 2 of their table, biases on, the head untied, 5 heads of 12; and without
    # biases nor LayerNorm weights (enable_bias, layer_norm_elementwise_affine false), GELU, tied, 3 layers.
    Case("opt", "OPTConfig", "OPTForCausalLM",
         dict(vocab_size=128, hidden_size=60, num_hidden_layers=2, num_attention_heads=5, ffn_dim=80,
              max_position_embeddings=CONTEXT, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
              pad_token_id=None)),
    Case("opt-no-bias-no-affine", "OPTConfig", "OPTForCausalLM",
         dict(vocab_size=128, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, ffn_dim=96,
              max_position_embeddings=CONTEXT, enable_bias=False, layer_norm_elementwise_affine=False,
              activation_function="gelu", bos_token_id=None, eos_token_id=None, pad_token_id=None)),
    # GPT-Neo: a global layer then two local ones with a window shorter than the prompt, unscaled scores, 5 heads of
    # 12, untied, non-default eps; and every layer global, tied, GELU.
    Case("gpt_neo", "GPTNeoConfig", "GPTNeoForCausalLM",
         dict(vocab_size=128, hidden_size=60, num_layers=3, num_heads=5, intermediate_size=80,
              attention_types=[[["global", "local"], 1], [["local"], 1]], window_size=WINDOW,
              max_position_embeddings=CONTEXT, layer_norm_epsilon=1e-4, tie_word_embeddings=False, bos_token_id=None,
              eos_token_id=None)),
    Case("gpt_neo-global-tied", "GPTNeoConfig", "GPTNeoForCausalLM",
         dict(vocab_size=128, hidden_size=64, num_layers=2, num_heads=4, attention_types=[[["global"], 2]],
              activation_function="gelu", max_position_embeddings=CONTEXT, bos_token_id=None, eos_token_id=None)),
    # CodeGen: GPT-J's maths with qkv_proj in 4 shards of [q_s v_s k_s]: 8 heads (two per shard), rotary on 6 of 8
    # channels, non-default eps; and 3 heads of 20 that straddle the shards (n_embd 60), whole heads rotated, GELU.
    Case("codegen", "CodeGenConfig", "CodeGenForCausalLM",
         dict(vocab_size=128, n_embd=64, n_layer=2, n_head=8, rotary_dim=6, n_positions=CONTEXT, n_inner=80,
              layer_norm_epsilon=1e-4, bos_token_id=None, eos_token_id=None)),
    Case("codegen-straddling-heads", "CodeGenConfig", "CodeGenForCausalLM",
         dict(vocab_size=128, n_embd=60, n_layer=3, n_head=3, rotary_dim=20, n_positions=CONTEXT,
              activation_function="gelu", bos_token_id=None, eos_token_id=None)),
    # BioGPT: OPT's learned positions (row 2 on) under BART blocks, embeddings scaled by sqrt(60), 5 heads of 12, untied,
    # a layer_norm_eps transformers never reads; and unscaled, tied, ReLU, 3 layers.
    Case("biogpt", "BioGptConfig", "BioGptForCausalLM",
         dict(vocab_size=128, hidden_size=60, num_hidden_layers=2, num_attention_heads=5, intermediate_size=80,
              max_position_embeddings=CONTEXT, layer_norm_eps=1e-3, tie_word_embeddings=False, bos_token_id=None,
              eos_token_id=None, pad_token_id=None)),
    Case("biogpt-unscaled-tied", "BioGptConfig", "BioGptForCausalLM",
         dict(vocab_size=128, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
              max_position_embeddings=CONTEXT, scale_embedding=False, hidden_act="relu", bos_token_id=None,
              eos_token_id=None, pad_token_id=None)),
    # XGLM: fairseq's sinusoidal positions (offset 2, halves, 10000^(-i/29)) under biased pre-norm blocks, embeddings
    # scaled by sqrt(60), 5 heads of 12, untied, the published pad_token_id 1 (its zeroed row is never read); and
    # unscaled, tied, ReLU, 3 layers.
    Case("xglm", "XGLMConfig", "XGLMForCausalLM",
         dict(vocab_size=128, d_model=60, num_layers=2, attention_heads=5, ffn_dim=80, max_position_embeddings=CONTEXT,
              tie_word_embeddings=False, pad_token_id=1, bos_token_id=None, eos_token_id=None)),
    Case("xglm-unscaled-tied", "XGLMConfig", "XGLMForCausalLM",
         dict(vocab_size=128, d_model=64, num_layers=3, attention_heads=4, ffn_dim=96, max_position_embeddings=CONTEXT,
              scale_embedding=False, activation_function="relu", pad_token_id=None, bos_token_id=None,
              eos_token_id=None)),
    # Persimmon: rope on 6 of 12 channels per head, per-head [q k v] fused, q/k LayerNorms, relu2, 5 heads, non-default
    # eps, untied; and without the q/k norms, whole heads rotated, tied, GELU, 3 layers.
    Case("persimmon", "PersimmonConfig", "PersimmonForCausalLM",
         {**BASE, "hidden_size": 60, "num_attention_heads": 5, "intermediate_size": 80, "layer_norm_eps": 1e-4,
          "rope_parameters": _rope("default", partial_rotary_factor=0.5)}),
    Case("persimmon-no-qk-norm-tied", "PersimmonConfig", "PersimmonForCausalLM",
         {**BASE, "num_hidden_layers": 3, "qk_layernorm": False, "tie_word_embeddings": True, "hidden_act": "gelu",
          "rope_parameters": _rope("default", partial_rotary_factor=1.0)}),
]

# --- recurrent: Mamba-1 families (issue 45) ---


def _mamba(**kw: Any) -> dict[str, Any]:
    return dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, state_size=5, bos_token_id=None, eos_token_id=None,
                pad_token_id=None, use_associative_scan=False, **kw)


CASES += [
    # An inner width of 3 x hidden, a 3-tap convolution without bias, biased projections, a step of rank 3, untied.
    Case("mamba", "MambaConfig", "MambaForCausalLM",
         _mamba(expand=3, conv_kernel=3, use_conv_bias=False, use_bias=True, time_step_rank=3, tie_word_embeddings=False,
                layer_norm_epsilon=1e-4)),
    # The "auto" rank (ceil(32 / 16) = 2), tied embeddings, a 4-tap biased convolution.
    Case("mamba-auto-rank-tied", "MambaConfig", "MambaForCausalLM", _mamba(expand=2, conv_kernel=4)),
    # Falcon-Mamba's norms on dt, B and C with a non-default eps, a step of rank 5, untied.
    Case("falcon_mamba", "FalconMambaConfig", "FalconMambaForCausalLM",
         _mamba(expand=2, conv_kernel=4, time_step_rank=5, mixer_rms_eps=1e-3, tie_word_embeddings=False)),
    # dots.llm1: Qwen3's attention (head_dim 24, not hidden / heads; per-head q/k norms; biases on q, k, v and o) over
    # DeepSeek-V3's experts: 8 in 4 groups (2 kept), 3 per token, scaled and renormalised, two shared experts, a dense
    # first layer; the layers from max_window_layers on slide with a window shorter than the prompt.
    Case("dots1", "Dots1Config", "Dots1ForCausalLM",
         _llama_like(num_hidden_layers=3, head_dim=24, attention_bias=True, n_routed_experts=8, num_experts_per_tok=3,
                     n_group=4, topk_group=2, n_shared_experts=2, moe_intermediate_size=32, first_k_dense_replace=1,
                     norm_topk_prob=True, routed_scaling_factor=2.5, rms_norm_eps=1e-5, sliding_window=WINDOW,
                     max_window_layers=1)),
    # FlexOlmo: OLMo-2's post-sublayer norms and q/k norms over all heads (5 heads of 12 over 1: the k norm is 12
    # wide), biases on, non-default eps, 5 softmax-routed experts with 2 per token renormalised, tied.
    Case("flex_olmo", "FlexOlmoConfig", "FlexOlmoForCausalLM",
         _llama_like(hidden_size=60, num_attention_heads=5, num_key_value_heads=1, attention_bias=True,
                     num_experts=5, num_experts_per_tok=2, norm_topk_prob=True, rms_norm_eps=1e-5,
                     tie_word_embeddings=True)),
    # MiniCPM5-MoE: gated attention (each head's query then its gate in q_gate_proj) with head_dim 24, 4 heads over
    # 2, biases on; 8 sigmoid-routed experts in 4 groups (2 kept), 3 per token, scaled, one shared expert, the first
    # layer dense by mlp_layer_types.
    Case("minicpm5_moe", "MiniCPM5MoeConfig", "MiniCPM5MoeForCausalLM",
         _llama_like(num_hidden_layers=3, head_dim=24, attention_bias=True, n_routed_experts=8, num_experts_per_tok=3,
                     n_group=4, topk_group=2, n_shared_experts=1, moe_intermediate_size=32, routed_scaling_factor=2.5,
                     rms_norm_eps=1e-5, mlp_layer_types=["dense", "sparse", "sparse"], pad_token_id=None)),
    # Solar Open: 6 heads of 16 over 2 (not filling hidden), q/k/v biases (none on o), tied, 6 sigmoid-routed experts in
    # 2 groups (1 kept), 2 per token, not renormalised, scaled, two shared experts, experts in every layer.
    Case("solar_open", "SolarOpenConfig", "SolarOpenForCausalLM",
         _llama_like(num_attention_heads=6, head_dim=16, attention_bias=True, n_routed_experts=6, num_experts_per_tok=2,
                     n_group=2, topk_group=1, n_shared_experts=2, moe_intermediate_size=24, norm_topk_prob=False,
                     routed_scaling_factor=1.5, rms_norm_eps=1e-4, tie_word_embeddings=True)),
    # GLM-4.7-Flash: latent attention with a query bottleneck over 5 heads (not dividing hidden 64, as its 20 do not
    # divide 2048), interleaved rope, attention biases; 8 sigmoid experts in 4 groups (2 kept), 3 per token, scaled, a
    # shared expert, two dense first layers by mlp_layer_types.
    Case("glm4_moe_lite", "Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM",
         _llama_like(num_hidden_layers=3, num_attention_heads=5, num_key_value_heads=5, q_lora_rank=24,
                     kv_lora_rank=20, qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=10, n_routed_experts=8,
                     num_experts_per_tok=3, n_group=4, topk_group=2, n_shared_experts=1, moe_intermediate_size=32,
                     routed_scaling_factor=2.5, attention_bias=True, mlp_layer_types=["dense", "dense", "sparse"],
                     rms_norm_eps=1e-6)),
    # K-EXAONE: EXAONE 4's per-head q/k norms, head_dim 24, 4 heads over 2, three sliding layers with rope (a window
    # shorter than the prompt) to a global one without; 8 sigmoid experts in 4 groups (2 kept), 3 per token, two
    # shared experts, the first layer dense.
    Case("exaone_moe", "ExaoneMoeConfig", "ExaoneMoeForCausalLM",
         _llama_like(num_hidden_layers=4, head_dim=24, sliding_window=WINDOW, sliding_window_pattern=4, num_experts=8,
                     num_experts_per_tok=3, n_group=4, topk_group=2, num_shared_experts=2, moe_intermediate_size=32,
                     first_k_dense_replace=1, routed_scaling_factor=1.5, rms_norm_eps=1e-4, pad_token_id=None)),
    # Nemotron: LayerNorm1P (1 + w) with biases, rope on half of each head, squared-ReLU MLP; GQA, biases on, 6 heads
    # of 12 (a head_dim of its own), non-default eps, untied; and tied, every head its own kv head, a quarter rotated.
    Case("nemotron", "NemotronConfig", "NemotronForCausalLM",
         _llama_like(num_attention_heads=6, num_key_value_heads=2, head_dim=12, attention_bias=True, mlp_bias=True,
                     norm_eps=1e-4, tie_word_embeddings=False,
                     rope_parameters=_rope("default", partial_rotary_factor=0.5))),
    Case("nemotron-mha-quarter-tied", "NemotronConfig", "NemotronForCausalLM",
         _llama_like(num_key_value_heads=4, tie_word_embeddings=True,
                     rope_parameters=_rope("default", partial_rotary_factor=0.25))),
    # OLMo: non-parametric LayerNorms, q/k/v clamped at 0.3 (most projected channels are larger), GQA, biases on,
    # untied; and 5 heads of 12 (hidden 60), multi-head, tied, no clipping.
    Case("olmo", "OlmoConfig", "OlmoForCausalLM",
         _llama_like(clip_qkv=0.3, attention_bias=True, tie_word_embeddings=False)),
    Case("olmo-mha-tied-unclipped", "OlmoConfig", "OlmoForCausalLM",
         {**BASE, "hidden_size": 60, "num_attention_heads": 5, "tie_word_embeddings": True}),
    # Jais 2: Arcee's decoder with biased LayerNorms (the final one too): 6 heads of 10 over 2 (hidden 60), biases on
    # (the defaults), squared ReLU, non-default eps, untied; and tied, multi-head, no biases, GELU, linear rope.
    Case("jais2", "Jais2Config", "Jais2ForCausalLM",
         _llama_like(hidden_size=60, num_attention_heads=6, layer_norm_eps=1e-4, tie_word_embeddings=False)),
    Case("jais2-tied-no-bias", "Jais2Config", "Jais2ForCausalLM",
         _llama_like(num_hidden_layers=3, num_key_value_heads=4, attention_bias=False, mlp_bias=False,
                     tie_word_embeddings=True, hidden_act="gelu_pytorch_tanh", rope_parameters=_rope("linear", factor=2.0))),
    # LFM2-MoE: conv, attention, conv layers (6 heads of 10 over 2, hidden 60), the first dense (width 80), then 6
    # sigmoid-routed experts of width 24, 3 per token, renormalised, scaled by 1.5, with the expert bias, untied; and
    # two dense layers, not renormalised, biased convolutions of 4 taps, tied.
    Case("lfm2_moe", "Lfm2MoeConfig", "Lfm2MoeForCausalLM",
         _llama_like(hidden_size=60, num_attention_heads=6, num_hidden_layers=3, intermediate_size=80,
                     layer_types=["conv", "full_attention", "conv"], num_dense_layers=1, num_experts=6,
                     num_experts_per_tok=3, moe_intermediate_size=24, routed_scaling_factor=1.5, norm_eps=1e-4,
                     conv_L_cache=3, tie_word_embeddings=False)),
    Case("lfm2_moe-dense-pair-tied", "Lfm2MoeConfig", "Lfm2MoeForCausalLM",
         _llama_like(num_hidden_layers=4, layer_types=["full_attention", "conv", "conv", "full_attention"],
                     num_dense_layers=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                     norm_topk_prob=False, conv_L_cache=4, conv_bias=True,
                     tie_word_embeddings=True)),
    # BLOOM: a LayerNorm on the embeddings, ALiBi over 6 heads (not a power of two: the interleaved extra slopes),
    # per-head fused q/k/v, non-default eps, untied; and tied with 4 heads of 16.
    Case("bloom", "BloomConfig", "BloomForCausalLM",
         dict(vocab_size=128, hidden_size=60, n_layer=2, n_head=6, layer_norm_epsilon=1e-4, tie_word_embeddings=False,
              bos_token_id=None, eos_token_id=None, pad_token_id=None)),
    # nanochat: weightless RMSNorms (embeddings, blocks, q/k after the reversed rope, final), 6 heads of 12 over 2 kv
    # heads (a head_dim of its own), attention biases, non-default eps, soft-capped logits, untied; and tied, every
    # head its own kv head, no biases, no soft-cap.
    Case("nanochat", "NanoChatConfig", "NanoChatForCausalLM",
         _llama_like(num_attention_heads=6, head_dim=12, attention_bias=True, rms_norm_eps=1e-4,
                     final_logit_softcapping=15.0, tie_word_embeddings=False)),
    Case("nanochat-mha-tied-uncapped", "NanoChatConfig", "NanoChatForCausalLM",
         _llama_like(num_key_value_heads=4, final_logit_softcapping=None, tie_word_embeddings=True)),
    # GPT-1: post-norm blocks and no final norm, learned positions, 6 heads of 10 (hidden 60), non-default eps,
    # untied; and tied with relu.
    Case("openai-gpt", "OpenAIGPTConfig", "OpenAIGPTLMHeadModel",
         dict(vocab_size=128, n_positions=CONTEXT, n_embd=60, n_layer=2, n_head=6, layer_norm_epsilon=1e-4,
              tie_word_embeddings=False)),
    Case("openai-gpt-tied-relu", "OpenAIGPTConfig", "OpenAIGPTLMHeadModel",
         dict(vocab_size=128, n_positions=CONTEXT, n_embd=64, n_layer=3, n_head=4, afn="relu",
              tie_word_embeddings=True)),
    # CTRL: a bias on the tied LM head, sinusoidal positions (sines then cosines) on sqrt(d)-scaled embeddings, 6 heads
    # of 10 (hidden 60), a ReLU MLP of 100, non-default final eps; and untied (the head's bias in its own Linear).
    Case("ctrl", "CTRLConfig", "CTRLLMHeadModel",
         dict(vocab_size=128, n_positions=CONTEXT, n_embd=60, dff=100, n_layer=2, n_head=6, layer_norm_epsilon=1e-4,
              tie_word_embeddings=True)),
    Case("ctrl-untied", "CTRLConfig", "CTRLLMHeadModel",
         dict(vocab_size=128, n_positions=CONTEXT, n_embd=64, dff=96, n_layer=3, n_head=4, tie_word_embeddings=False)),
    Case("bloom-tied", "BloomConfig", "BloomForCausalLM",
         dict(vocab_size=128, hidden_size=64, n_layer=3, n_head=4, tie_word_embeddings=True, bos_token_id=None,
              eos_token_id=None, pad_token_id=None)),
    # Jamba: attention (6 heads of 8 over 2, no positions) at layers 1 and 4 of 5 (period 3, offset 1), Mamba-1 elsewhere
    # (weighted norms on dt, B and C at a non-default eps, rank 5, a 3-tap convolution without bias, biased
    # projections); 5 experts, 2 per token, not renormalised, at layers 0, 2, 4 (period 2, offset 0), SwiGLU between.
    Case("jamba", "JambaConfig", "JambaForCausalLM",
         _llama_like(hidden_size=48, num_hidden_layers=5, num_attention_heads=6, intermediate_size=40,
                     attn_layer_period=3, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=0,
                     num_experts=5, num_experts_per_tok=2, mamba_expand=2, mamba_d_state=5, mamba_d_conv=3,
                     mamba_dt_rank=5, mamba_conv_bias=False, mamba_proj_bias=True, rms_norm_eps=1e-5,
                     use_associative_scan=False, tie_word_embeddings=False)),
    # RecurrentGemma: recurrent, recurrent, attention (4 layers: the pattern cut short); the RG-LRU 36 wide (not
    # hidden 48) with its gates in 6 blocks, a 3-tap convolution; attention 6 heads of 8 over 2, a window shorter than
    # the prompt, rope on half of each head; untied, non-default eps.
    Case("recurrent_gemma", "RecurrentGemmaConfig", "RecurrentGemmaForCausalLM",
         dict(vocab_size=128, hidden_size=48, num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2,
              intermediate_size=80, lru_width=36, conv1d_width=3, attention_window_size=WINDOW, rms_norm_eps=1e-5,
              logits_soft_cap=20.0, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
              pad_token_id=None)),
    # RWKV-4: attention_hidden_size = hidden_size (transformers' state needs it), a narrower channel mix, 3 layers
    # (under rescale_every 6: transformers rescales nothing), untied head.
    Case("rwkv", "RwkvConfig", "RwkvForCausalLM",
         dict(vocab_size=128, hidden_size=48, num_hidden_layers=3, intermediate_size=72, context_length=64,
              layer_norm_epsilon=1e-4, bos_token_id=None, eos_token_id=None, pad_token_id=None),
         generate_row_by_row=RWKV_BATCHED_STEP),
    # Tied embeddings, two layers (transformers' init divides by layers - 1), rescale_every 0 (what export writes),
    # the default 4 x hidden channel mix.
    Case("rwkv-tied", "RwkvConfig", "RwkvForCausalLM",
         dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, context_length=64, rescale_every=0,
              tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, pad_token_id=None),
         generate_row_by_row=RWKV_BATCHED_STEP),
    # Attention first in every other layer (the block is attention on a tie: 2 of 3), no experts (one expert is a
    # plain MLP), the "auto" rank, tied embeddings.
    Case("jamba-dense-tied", "JambaConfig", "JambaForCausalLM",
         _llama_like(hidden_size=32, num_hidden_layers=3, attn_layer_period=2, attn_layer_offset=0, num_experts=1,
                     mamba_expand=2, mamba_d_state=4, mamba_d_conv=4, use_associative_scan=False,
                     tie_word_embeddings=True)),
    # Hunyuan-V1 dense: q/k RMSNorm after RoPE (weights shaken away from 1, so the order shows), head_dim 20 (not
    # hidden / heads), GQA, biased attention, the NTK-alpha rope (alpha 3), untied; and multi-head, default rope, tied
    # (head_dim written out: transformers' Hunyuan-V1 attention has no default for it).
    # DiffLlama: differential attention over 3 layers (three lambda_init values), 8 heads of 12 (not hidden / heads)
    # over 4 key/value heads, so a pair's keys and values come from two different groups; biased attention, non-default
    # eps (the pair norm's too), untied; and 6 heads of 10, multi-head, linear rope scaling, tied.
    Case("diffllama", "DiffLlamaConfig", "DiffLlamaForCausalLM",
         _llama_like(num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4, head_dim=12,
                     attention_bias=True, rms_norm_eps=1e-4, tie_word_embeddings=False)),
    Case("diffllama-mha-linear-tied", "DiffLlamaConfig", "DiffLlamaForCausalLM",
         {**BASE, "hidden_size": 60, "num_attention_heads": 6, "tie_word_embeddings": True,
          "rope_parameters": _rope("linear", factor=2.0)}),
    # BitNet: relu2 gated MLP and the two sub-layer norms (attn_sub_norm over all heads, ffn_sub_norm over the
    # hidden channels), float projections as BitNetForCausalLM builds them from a config; 6 heads of 10 over 2
    # key/value heads, biased attention, non-default eps, untied; and 3 heads of 16 over 1 (multi-query), tied, rope theta 10000.
    Case("bitnet", "BitNetConfig", "BitNetForCausalLM",
         {**BASE, "hidden_size": 60, "num_attention_heads": 6, "num_key_value_heads": 2, "rms_norm_eps": 1e-4,
          "attention_bias": True, "tie_word_embeddings": False}),
    Case("bitnet-mqa-tied", "BitNetConfig", "BitNetForCausalLM",
         {**BASE, "hidden_size": 48, "num_attention_heads": 3, "num_key_value_heads": 1, "tie_word_embeddings": True,
          "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    Case("hunyuan_v1_dense", "HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM",
         _llama_like(head_dim=20, attention_bias=True, rms_norm_eps=1e-5, tie_word_embeddings=False,
                     rope_parameters=_rope("dynamic", alpha=3.0, factor=1.0))),
    Case("hunyuan_v1_dense-mha-tied", "HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM",
         {**BASE, "hidden_size": 60, "num_attention_heads": 5, "head_dim": 12, "tie_word_embeddings": True}),
    # Hunyuan-V1 MoE: 5 experts, 3 per token (renormalised), the ungated shared expert as wide as each (40), MQA with
    # head_dim 12, the NTK-alpha rope, untied.
    Case("hunyuan_v1_moe", "HunYuanMoEV1Config", "HunYuanMoEV1ForCausalLM",
         _llama_like(num_key_value_heads=1, head_dim=12, intermediate_size=40, num_experts=5, moe_topk=3,
                     rms_norm_eps=1e-5, tie_word_embeddings=False, rope_parameters=_rope("dynamic", alpha=2.0, factor=1.0))),
    # Apertus: xIELU's alpha_p / alpha_n shaken per layer (every tensor is), q/k RMSNorm before RoPE, GQA with
    # head_dim 20, biased attention, llama3 rope scaling (its default), untied; and multi-head, default rope, tied.
    Case("apertus", "ApertusConfig", "ApertusForCausalLM",
         _llama_like(head_dim=20, attention_bias=True, intermediate_size=80, tie_word_embeddings=False,
                     rope_parameters=_rope("llama3", factor=8.0, original_max_position_embeddings=16,
                                           low_freq_factor=1.0, high_freq_factor=4.0))),
    Case("apertus-mha-tied", "ApertusConfig", "ApertusForCausalLM",
         {**BASE, "hidden_size": 60, "num_attention_heads": 5, "tie_word_embeddings": True,
          "rope_parameters": _rope("default")}),
    # Apertus 1.5's text model, its head unpruned (output_vocab_size null), MQA.
    Case("apertus1p5_text", "Apertus1p5TextConfig", "Apertus1p5TextForCausalLM",
         _llama_like(num_key_value_heads=1, tie_word_embeddings=False, rope_parameters=_rope("default"))),
    # DBRX (transformers' attention reads attn_config.rope_theta, so every config has one; the rope uses
    # rope_parameters): q/k/v clamped at 0.3 (most fused Wqkv channels are larger), 6 heads of 10 over 2 (hidden 60),
    # a rope theta of its own; 5 experts of width 24, 2 per token, renormalised (p = 1); and clipped at the published 8
    # (transformers' DBRX fails without a clip_qkv), multi-query, 3 per token not renormalised (p null), gelu experts.
    Case("dbrx", "DbrxConfig", "DbrxForCausalLM",
         dict(vocab_size=128, d_model=60, n_heads=6, n_layers=2, max_seq_len=CONTEXT,
              rope_parameters=_rope("default", rope_theta=5000.0),
              attn_config={"clip_qkv": 0.3, "kv_n_heads": 2, "rope_theta": 5000.0},
              ffn_config={"ffn_hidden_size": 24, "moe_num_experts": 5, "moe_top_k": 2})),
    Case("dbrx-mqa-unnormalized", "DbrxConfig", "DbrxForCausalLM",
         dict(vocab_size=128, d_model=64, n_heads=4, n_layers=3, max_seq_len=CONTEXT,
              attn_config={"clip_qkv": 8, "kv_n_heads": 1, "rope_theta": 10000.0},
              ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 3,
                          "moe_normalize_expert_weights": None, "ffn_act_fn": {"name": "gelu"}})),
    # Flint: sinks, 6 heads of 12 over 2 (not filling hidden), per-head q/k norms; layers 1 and 3 slide through a
    # window shorter than the prompt with rope, the others global without positions; layer 0 dense (width 80), then
    # 6 sigmoid-scored experts of width 24, 3 per token, renormalised, beside an ungated shared expert of 40; eps 1e-4.
    Case("flint", "FlintConfig", "FlintForCausalLM",
         _llama_like(num_hidden_layers=4, num_attention_heads=6, head_dim=12, intermediate_size=80,
                     layer_types=["full_attention", "sliding_attention", "full_attention", "sliding_attention"],
                     sliding_window=WINDOW, mlp_only_layers=[0], num_experts=6, num_experts_per_tok=3,
                     moe_intermediate_size=24, shared_expert_intermediate_size=40, rms_norm_eps=1e-4,
                     max_position_embeddings=CONTEXT)),
    # The default layer_types and mlp_only_layers (5 layers: 0, 1 and 4 global, the first two dense), experts in every
    # other layer of the rest (decoder_sparse_step 2), not renormalised, attention biases, a rope theta of its own.
    Case("flint-defaults-unnormalized-biased", "FlintConfig", "FlintForCausalLM",
         _llama_like(num_hidden_layers=5, sliding_window=WINDOW, decoder_sparse_step=2, num_experts=4,
                     num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                     norm_topk_prob=False, attention_bias=True, max_position_embeddings=CONTEXT,
                     rope_parameters=_rope("default", rope_theta=500.0))),
    # AFMoE: sandwich norms, 6 heads of 12 over 2 (not filling hidden) with per-head q/k norms and a channel output
    # gate; layers 0 and 2 slide through a window shorter than the prompt with rope, 1 and 3 global without
    # positions; the first layer dense (width 80), then 6 sigmoid experts of 24 (a selection bias), 3 per token,
    # renormalised and scaled by 1.7, two ungated shared experts; embeddings scaled (mup), untied, eps 1e-4.
    Case("afmoe", "AfmoeConfig", "AfmoeForCausalLM",
         _llama_like(num_hidden_layers=4, num_attention_heads=6, head_dim=12, intermediate_size=80,
                     global_attn_every_n_layers=2, sliding_window=WINDOW, num_dense_layers=1, num_experts=6,
                     num_experts_per_tok=3, moe_intermediate_size=24, num_shared_experts=2, route_scale=1.7,
                     mup_enabled=True, rms_norm_eps=1e-4, tie_word_embeddings=False)),
    # Explicit layer_types (global, sliding, sliding), no dense layer, one shared expert, tied, no mup.
    Case("afmoe-layer-types-tied", "AfmoeConfig", "AfmoeForCausalLM",
         _llama_like(num_hidden_layers=3, layer_types=["full_attention", "sliding_attention", "sliding_attention"],
                     sliding_window=WINDOW, num_dense_layers=0, num_experts=4, num_experts_per_tok=2,
                     moe_intermediate_size=32, num_shared_experts=1, tie_word_embeddings=True,
                     rope_parameters=_rope("default", rope_theta=500.0))),
    # Beam: depth-scaled sandwich adds, sliding/global layers by hand (global the second and last: no positions, the
    # query length scale), sparse and dense MLPs interleaved (dense, sparse, dense, sparse, sparse), 6 heads of 12 over
    # 2, q/k/v/o biases, a per-head gate bias, 8 experts in 4 groups (2 picked), 3 per token, renormalised and scaled
    # by 1.7, a logit softcap that bites (3.0), theta 500, untied. eps 0.002: with RMSNorm before every reader the
    # depth scaling is a uniform rescale of the stream, seen only through eps, and a large eps shrinks the normalised
    # queries until the query scale (at most 0.2% over 40 tokens) is lost; at 0.002 dropping either moves the logits
    # by more than the 1e-4 tolerance (0.2 and 2.7e-4).
    Case("beam", "BeamConfig", "BeamForCausalLM",
         _llama_like(num_hidden_layers=5, num_attention_heads=6, head_dim=12, intermediate_size=80,
                     sliding_window=WINDOW, attention_bias=True, rms_norm_eps=0.002, tie_word_embeddings=False,
                     layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                                  "full_attention"],
                     mlp_layer_types=["dense", "sparse", "dense", "sparse", "sparse"],
                     rope_parameters={"sliding_attention": _rope("default", rope_theta=500.0), "full_attention": None},
                     num_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3, moe_intermediate_size=24,
                     norm_topk_prob=True, routed_scaling_factor=1.7, final_logit_softcapping=3.0),
         shake_buffers=("e_score_correction_bias", 1.0)),
    # transformers' defaults for layer and MLP types (three sliding then a global layer; three dense then sparse), no
    # biases, weights not renormalised, no groups, no softcap, MQA, tied.
    Case("beam-defaults-mqa-tied", "BeamConfig", "BeamForCausalLM",
         _llama_like(num_hidden_layers=4, num_key_value_heads=1, sliding_window=WINDOW, tie_word_embeddings=True,
                     num_experts=4, n_group=1, topk_group=1, num_experts_per_tok=2, moe_intermediate_size=32,
                     norm_topk_prob=False, routed_scaling_factor=1.0, final_logit_softcapping=None),
         shake_buffers=("e_score_correction_bias", 1.0)),
    # Ergo: residual-gated sandwich adds (the gates shaken well off their zero start), 6 heads of 8 over 2 in one fused
    # qkv_proj, per-head q/k norms, every third layer global (no positions, its logits scaled by 1.3), the others
    # windowed with the interleaved rope (theta 500, given flat as the checkpoints give it); the first two layers a
    # squared-ReLU MLP, the other three 6 ungated squared-ReLU experts, 3 per token, renormalised and scaled by 1.7, each
    # expert and the shared one (width 20) ending with its own RMSNorm; eps 1e-5; the head never tied.
    Case("ergo", "ErgoConfig", "ErgoForCausalLM",
         {**{k: v for k, v in BASE.items() if k != "intermediate_size"}, "hidden_size": 48, "num_hidden_layers": 5,
          "num_attention_heads": 6, "num_key_value_heads": 2, "first_dense_intermediate_size": 40,
          "num_dense_blocks": 2, "moe_intermediate_size": 24, "shared_intermediate_size": 20, "num_experts": 6,
          "num_experts_per_tok": 3, "moe_routed_scaling_factor": 1.7, "rms_norm_eps": 1e-5,
          "sliding_window": WINDOW, "global_attention_every_n_layers": 3, "global_attention_scale": 1.3,
          "rope_parameters": _rope("default", rope_theta=500.0)},
         shake_buffers=("e_score_correction_bias", 1.0), reset_params=(("residual_gate.weight", 1.0),)),
    # Dense and sparse layers interleaved by mlp_layer_types (sparse, dense, sparse, sparse), layer_types by hand (global
    # first and last), no global_attention_scale, MQA, rope_parameters keyed by layer type as transformers keeps them.
    Case("ergo-types-mqa", "ErgoConfig", "ErgoForCausalLM",
         {**{k: v for k, v in BASE.items() if k != "intermediate_size"}, "hidden_size": 32, "num_hidden_layers": 4,
          "num_attention_heads": 4, "num_key_value_heads": 1, "first_dense_intermediate_size": 48,
          "mlp_layer_types": ["sparse", "dense", "sparse", "sparse"], "moe_intermediate_size": 16,
          "shared_intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2, "sliding_window": WINDOW,
          "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
          "rope_parameters": {"sliding_attention": _rope("default", rope_theta=800.0), "full_attention": None}},
         shake_buffers=("e_score_correction_bias", 1.0), reset_params=(("residual_gate.weight", 1.0),)),
    # Bamba: Mamba-2, attention, Mamba-2 (hidden 48; the attention 6 heads of 8 over 2, biases on, the rope on half of
    # each head); Mamba-2 of 12 heads of 8 in 2 groups (mamba_expand 2), state 8, a 3-tap convolution with bias,
    # biased projections, the step clamped to [0.001, 0.5], a chunk shorter than the prompt; SwiGLU with biases,
    # untied, non-default eps.
    # MiniMax-Text-01: Lightning and softmax layers by layer_types (Lightning the majority: the attention layers are
    # the override), 3 heads of 10 (head_dim not hidden / heads), GQA 3/1 on the softmax layers, a block_size (3) that
    # the prompt is no multiple of, every residual factor different (DeepNorm alphas and betas per layer type and the
    # MLP's), 4 experts, 2 per token, untied.
    Case("minimax", "MiniMaxConfig", "MiniMaxForCausalLM",
         dict(BASE, hidden_size=32, num_hidden_layers=4, num_attention_heads=3, num_key_value_heads=1, head_dim=10,
              intermediate_size=24, num_local_experts=4, num_experts_per_tok=2, block_size=3, rms_norm_eps=1e-5,
              layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
              full_attn_alpha_factor=1.7, full_attn_beta_factor=0.6, linear_attn_alpha_factor=1.3,
              linear_attn_beta_factor=0.8, mlp_alpha_factor=1.5, mlp_beta_factor=0.9, tie_word_embeddings=False)),
    # transformers' default pattern (softmax attention first, then every other layer), equal factors, one layer of
    # each plus one more softmax (softmax the majority, so Lightning is the override), tied embeddings.
    Case("minimax-default-types-tied", "MiniMaxConfig", "MiniMaxForCausalLM",
         dict(BASE, hidden_size=48, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=40, num_local_experts=3, num_experts_per_tok=1, block_size=4,
              full_attn_alpha_factor=2.0, linear_attn_alpha_factor=2.0, mlp_alpha_factor=2.0,
              tie_word_embeddings=True)),
    # xLSTM: 3 heads of 64 query/key and 64 value channels over hidden 96 (qk and v wider than the stream; transformers'
    # cache rounds the widths up to multiples of 64, so they are such multiples), chunks of 4 (the prompts are longer
    # and no multiple of it), low gate and logit soft caps, eps 1e-4 beside norm_eps 1e-5, a feed-forward of
    # 96 * 1.3 rounded up to 16 (128). transformers starts the input gates at bias -10 (writing almost nothing):
    # they are reset to noise so that the memory carries the logits.
    Case("xlstm", "xLSTMConfig", "xLSTMForCausalLM",
         dict(vocab_size=128, hidden_size=96, num_hidden_layers=3, num_heads=3, qk_dim_factor=2.0, v_dim_factor=2.0,
              chunk_size=4, gate_soft_cap=5.0, output_logit_soft_cap=3.0, norm_eps=1e-5, eps=1e-4,
              ffn_proj_factor=1.3, ffn_round_up_to_multiple_of=16, bos_token_id=None, eos_token_id=None,
              pad_token_id=None),
         reset_params=(("igate_preact.weight", 0.3), ("igate_preact.bias", 1.0), ("fgate_preact.weight", 0.3))),
    # xLSTM-7B's factors and caps (qk 0.5, v 1.0, gate cap 15, logit cap 30, ffn 2.667 rounded to 64), 2 heads, one
    # chunk of 64 longer than any prompt, a tie_word_embeddings that transformers ignores.
    Case("xlstm-defaults-tie-ignored", "xLSTMConfig", "xLSTMForCausalLM",
         dict(vocab_size=128, hidden_size=128, num_hidden_layers=2, num_heads=2, tie_word_embeddings=True,
              bos_token_id=None, eos_token_id=None, pad_token_id=None),
         reset_params=(("igate_preact.weight", 0.3), ("igate_preact.bias", 1.0))),
    # JetMoE: 5 attention experts of 3 query heads of 6 (top-k slots 2: 6 query heads over 3 shared key/value heads,
    # 18 channels, not hidden 36), 5 feed-forward experts of 20, the experts' shared biases, the final norm's eps
    # (1e-5) differing from the blocks' fixed 1e-6, tied head.
    Case("jetmoe", "JetMoeConfig", "JetMoeForCausalLM",
         dict(vocab_size=128, hidden_size=36, num_hidden_layers=2, num_key_value_heads=3, kv_channels=6,
              intermediate_size=20, num_local_experts=5, num_experts_per_tok=2, max_position_embeddings=CONTEXT,
              bos_token_id=None, eos_token_id=None, pad_token_id=None,
              rms_norm_eps=1e-5, rope_parameters=_rope("default", rope_theta=5000.0))),
    # One key/value head of 8 (multi-query within each slot), 3 of 4 experts per token, gelu experts, untied.
    Case("jetmoe-mqa-top3-untied", "JetMoeConfig", "JetMoeForCausalLM",
         dict(vocab_size=128, hidden_size=32, num_hidden_layers=3, num_key_value_heads=1, kv_channels=8,
              intermediate_size=24, num_local_experts=4, num_experts_per_tok=3, max_position_embeddings=CONTEXT,
              bos_token_id=None, eos_token_id=None, pad_token_id=None,
              activation_function="gelu", tie_word_embeddings=False)),
    # Ling 3: the bounded-forget linear attention (a lower bound of -3) in three of four layers, latent attention with
    # a gate per head in every 4th (layer_group_size), 3 heads of 12 (head_dim not hidden / heads, query bottleneck),
    # kernel 3, 6 experts in 2 groups (1 kept), 2 per token, 2 shared experts, a dense first layer, a shaken
    # selection bias.
    Case("bailing_hybrid", "BailingHybridConfig", "BailingHybridForCausalLM",
         _llama_like(num_hidden_layers=4, num_attention_heads=3, num_key_value_heads=3, head_dim=12, q_lora_rank=24,
                     kv_lora_rank=20, qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=10, num_local_experts=6,
                     num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=2, moe_intermediate_size=32,
                     first_k_dense_replace=1, routed_scaling_factor=2.5, rms_norm_eps=1e-5, short_conv_kernel_size=3,
                     layer_group_size=4, kda_lower_bound=-3.0, rope_parameters=_rope("default")),
         shake_buffers=("e_score_correction_bias", 0.1)),
    # Mostly latent attention (the block is mla, the linear attention an override) by layer_types, the softplus forget
    # gate (kda_safe_gate off), no query bottleneck, attention biases, kernel 4, experts on the first and last layers
    # only, top-k weights not renormalised, tie_word_embeddings set (which transformers ignores: the head stays its own).
    Case("bailing_hybrid-softplus-mla-base", "BailingHybridConfig", "BailingHybridForCausalLM",
         _llama_like(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, head_dim=16, q_lora_rank=None,
                     kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=16, num_local_experts=4,
                     num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=1, moe_intermediate_size=24,
                     routed_scaling_factor=1.0, norm_topk_prob=False, attention_bias=True, kda_safe_gate=False,
                     layer_types=["full_attention", "linear_attention", "full_attention", "full_attention"],
                     mlp_layer_types=["sparse", "dense", "dense", "sparse"], tie_word_embeddings=True,
                     rope_parameters=_rope("default"))),
    Case("bamba", "BambaConfig", "BambaForCausalLM",
         _llama_like(hidden_size=48, num_hidden_layers=3, num_attention_heads=6, intermediate_size=80,
                     attn_layer_indices=[1], attention_bias=True, mlp_bias=True, mamba_n_heads=12, mamba_n_groups=2,
                     mamba_d_state=8, mamba_d_conv=3, mamba_expand=2, mamba_chunk_size=16, mamba_conv_bias=True,
                     mamba_proj_bias=True, time_step_limit=(0.001, 0.5), rms_norm_eps=1e-4,
                     tie_word_embeddings=False)),
    # Attention in two of three layers (the block is attention), the rope on every channel (partial_rotary_factor
    # 1 written), the "auto" head width, no biases, tied.
    Case("bamba-attention-full-rope-tied", "BambaConfig", "BambaForCausalLM",
         _llama_like(num_hidden_layers=3, attn_layer_indices=[0, 2], mamba_n_heads=8, mamba_d_state=4,
                     mamba_chunk_size=16, tie_word_embeddings=True,
                     rope_parameters=_rope("default", partial_rotary_factor=1.0))),
]

CASES += [
    # HyperCLOVA X: peri-layer norms (use_post_norm) with every muP multiplier away from 1 and logits_scaling
    # multiplying, 4 query heads of 12 over 2 kv heads (head_dim not hidden / heads), biases, untied; and without the
    # post norms, tied, the attention multiplier left to its default 1/sqrt(head_dim).
    Case("hyperclovax", "HyperCLOVAXConfig", "HyperCLOVAXForCausalLM",
         _llama_like(num_attention_heads=4, head_dim=12, embedding_multiplier=3.0, residual_multiplier=0.5,
                     attention_multiplier=0.2, logits_scaling=0.4, attention_bias=True, mlp_bias=True,
                     rms_norm_eps=1e-4)),
    Case("hyperclovax-prenorm-tied", "HyperCLOVAXConfig", "HyperCLOVAXForCausalLM",
         _llama_like(num_hidden_layers=3, use_post_norm=False, tie_word_embeddings=True, embedding_multiplier=12.0,
                     residual_multiplier=0.22, logits_scaling=3.0)),
]

#: Kolibri1Config has no intermediate_size (every layer is experts).
_KOLIBRI_BASE = {k: v for k, v in BASE.items() if k != "intermediate_size"}

CASES += [
    # Kolibri-1: sliding, full, sliding, full layers (the window shorter than the prompt; the full ones without rope),
    # 6 query heads of 12 over 2, 6 experts with 2 per token renormalised, a selection bias large enough to change the
    # choice (on the logits, not the sigmoid scores), a shared expert wider than the routed ones, untied.
    Case("kolibri1", "Kolibri1Config", "Kolibri1ForCausalLM",
         {**_KOLIBRI_BASE, "num_hidden_layers": 4, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 12,
          "sliding_window": WINDOW,
          "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
          "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
          "shared_expert_intermediate_size": 40, "norm_topk_prob": True, "rms_norm_eps": 1e-5},
         shake_buffers=("e_score_correction_bias", 1.0)),
    # The default layer_types (both layers sliding: the first full one would be the fifth), weights not renormalised,
    # 3 of 4 experts per token, a shared expert narrower than the routed ones, MQA, tied. (transformers' Kolibri-1
    # cannot run without a sliding_window: its model always builds the sliding mask.)
    Case("kolibri1-sliding-unnormalized", "Kolibri1Config", "Kolibri1ForCausalLM",
         {**_KOLIBRI_BASE, "num_key_value_heads": 1, "head_dim": 16, "sliding_window": WINDOW, "num_experts": 4,
          "num_experts_per_tok": 3, "moe_intermediate_size": 24, "shared_expert_intermediate_size": 16,
          "tie_word_embeddings": True},
         shake_buffers=("e_score_correction_bias", 1.0)),
]

#: LaraMiniConfig has no intermediate_size (every layer is experts); small Gated DeltaNets: 2 key heads of 8 serving
#: 4 value heads of 12, a 4-tap convolution.
_LARA_BASE = {**_KOLIBRI_BASE, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
              "linear_value_head_dim": 12, "linear_conv_kernel_dim": 4}

CASES += [
    # Lara-Mini: the default layer_types over 5 layers (linear, sliding, linear, full, sliding: the window shorter than
    # the prompt, the full layer without positions), 4 heads of 16 over 2 with q/k norms, 6 experts with 2 per token
    # renormalised and an ungated shared expert wider than them, tied.
    Case("lara_mini", "LaraMiniConfig", "LaraMiniForCausalLM",
         {**_LARA_BASE, "num_hidden_layers": 5, "num_key_value_heads": 2, "head_dim": 16, "sliding_window": WINDOW,
          "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 40,
          "rms_norm_eps": 1e-5}),
    # Irregular layer_types with attention the commonest (full first, then linear, then two sliding), attention biases,
    # weights not renormalised, MQA, untied.
    Case("lara_mini-irregular-biased", "LaraMiniConfig", "LaraMiniForCausalLM",
         {**_LARA_BASE, "num_hidden_layers": 4, "num_key_value_heads": 1, "head_dim": 12, "sliding_window": WINDOW,
          "layer_types": ["full_attention", "linear_attention", "sliding_attention", "sliding_attention"],
          "attention_bias": True, "num_experts": 4, "num_experts_per_tok": 3, "moe_intermediate_size": 24,
          "shared_expert_intermediate_size": 16, "norm_topk_prob": False, "tie_word_embeddings": False}),
    # ModernBERT-decoder: 5 layers (global 0 and 3, sliding between), local_attention 17 (the window 8, odd on
    # purpose), each layer type's rope with its own theta, biases everywhere (LayerNorms, q/k/v/o, Wi/Wo, the
    # prediction head's dense, the tied decoder's), a tanh GELU head over a SiLU GeGLU, 6 heads of 8; and untied
    # with no biases, a global layer every second one (the older global_attn_every_n_layers), the window longer
    # than half the inputs.
    Case("modernbert-decoder", "ModernBertDecoderConfig", "ModernBertDecoderForCausalLM",
         dict(BASE, hidden_size=48, num_hidden_layers=5, num_attention_heads=6, intermediate_size=40, norm_eps=1e-4,
              norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True, decoder_bias=True,
              hidden_activation="silu", classifier_activation="gelu_pytorch_tanh", local_attention=2 * WINDOW + 1,
              rope_parameters={"sliding_attention": _rope("default", rope_theta=500.0),
                               "full_attention": _rope("default", rope_theta=160_000.0)},
              pad_token_id=0, bos_token_id=1, cls_token_id=1, sep_token_id=2)),
    Case("modernbert-decoder-untied-every-2", "ModernBertDecoderConfig", "ModernBertDecoderForCausalLM",
         dict(BASE, hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=24,
              decoder_bias=False, tie_word_embeddings=False, global_attn_every_n_layers=2, local_attention=24,
              pad_token_id=0, bos_token_id=1, cls_token_id=1, sep_token_id=2)),
]

#: Emu3TextConfig's token ids are ints (no None).
_EMU3_IDS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}

CASES += [
    # Emu3: Llama's blocks in the nested config Emu3ForCausalLM loads (text_config, model.* names); 6 query heads of 12
    # over 2 (head_dim not hidden / heads, a field the config class lacks but the attention reads), attention and MLP
    # biases (class attributes of the config, set here), eps 1e-4, the default rope theta 1e6, untied; and multi-query
    # with linear rope scaling, tied.
    Case("emu3", "Emu3TextConfig", "Emu3ForCausalLM",
         _llama_like(num_hidden_layers=3, num_attention_heads=6, head_dim=12, attention_bias=True, mlp_bias=True,
                     rms_norm_eps=1e-4, **_EMU3_IDS),
         nested_in="emu3"),
    Case("emu3-mqa-linear-tied", "Emu3TextConfig", "Emu3ForCausalLM",
         _llama_like(num_key_value_heads=1, tie_word_embeddings=True,
                     rope_parameters=_rope("linear", factor=2.0), **_EMU3_IDS),
         nested_in="emu3"),
]

CASES += [
    # Cohere Compass (text): Cohere2's parallel blocks with sliding, global, sliding, sliding layers (the window
    # shorter than the prompt), the global one without positions (its rope entry null) and the sliding ones rotating
    # halves with their own theta and Qwen3-VL's rope sections (no change on text), 4 heads over 2, attention biases,
    # eps 1e-4, logits scaled, untied; and full layers only with a linear-scaled rope, no logit_scale, MQA, tied.
    Case("cohere_compass_text", "CohereCompassTextConfig", "CohereCompassForCausalLM",
         _llama_like(num_hidden_layers=4, sliding_window=WINDOW, attention_bias=True, layer_norm_eps=1e-4,
                     logit_scale=0.5, tie_word_embeddings=False,
                     layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
                     rope_parameters={"sliding_attention": _rope("default", rope_theta=5000.0, mrope_section=[2, 3, 3]),
                                      "full_attention": None})),
    Case("cohere_compass_text-rope-everywhere-mqa-tied", "CohereCompassTextConfig", "CohereCompassForCausalLM",
         _llama_like(num_hidden_layers=3, num_key_value_heads=1, tie_word_embeddings=True,
                     rope_parameters={"full_attention": _rope("linear", factor=2.0)})),
]

#: GPTNeoXJapaneseConfig has no intermediate_size (intermediate_multiple_size instead).
_NEOX_JA_BASE = {k: v for k, v in BASE.items() if k != "intermediate_size"}

CASES += [
    # GPT-NeoX Japanese: 3 sequential pre-norm layers, 4 heads of 16 with per-head fused qkv, half of each head
    # rotated (theta 5000), the last layer's dense_bias (shaken off 0), a GELU MLP 3 times as wide, eps 1e-4,
    # untied; and full rotary given through the legacy rotary_pct / rotary_emb_base arguments, ReLU, one layer (its only layer has
    # the bias), tied.
    Case("gpt_neox_japanese", "GPTNeoXJapaneseConfig", "GPTNeoXJapaneseForCausalLM",
         {**_NEOX_JA_BASE, "num_hidden_layers": 3, "intermediate_multiple_size": 3, "layer_norm_eps": 1e-4,
          "tie_word_embeddings": False,
          "rope_parameters": _rope("default", rope_theta=5000.0, partial_rotary_factor=0.5)}),
    Case("gpt_neox_japanese-one-layer-relu-tied", "GPTNeoXJapaneseConfig", "GPTNeoXJapaneseForCausalLM",
         {**_NEOX_JA_BASE, "num_hidden_layers": 1, "intermediate_multiple_size": 2, "hidden_act": "relu",
          "rotary_pct": 1.0, "rotary_emb_base": 20000.0, "tie_word_embeddings": True}),
]

def _zamba2(**kw: Any) -> dict[str, Any]:
    return {**dict(vocab_size=128, hidden_size=32, num_hidden_layers=6, mamba_d_state=8, mamba_d_conv=3,
                   mamba_expand=2, n_mamba_heads=4, mamba_ngroups=2, chunk_size=16, intermediate_size=40,
                   num_attention_heads=4, adapter_rank=4, max_position_embeddings=CONTEXT, bos_token_id=None,
                   eos_token_id=None, pad_token_id=None), **kw}


CASES += [
    # Zamba2: three hybrid layers over two shared blocks (the first runs twice, its adapters at slots 0 and 2), q/k/v
    # and gate_up adapters, mem RoPE, exact GELU, rms_norm_eps away from the Mamba norm's fixed 1e-5, a step clamp.
    Case("zamba2", "Zamba2Config", "Zamba2ForCausalLM",
         _zamba2(layers_block_type=["mamba", "hybrid", "mamba", "hybrid", "hybrid", "mamba"], num_mem_blocks=2,
                 use_shared_attention_adapter=True, use_mem_rope=True, rms_norm_eps=1e-4, time_step_min=0.01,
                 rope_parameters=_rope("default", rope_theta=5000.0))),
    # No positions, grouped keys (no q/k/v adapters), SwiGLU with biases (add_bias_linear, the Mamba projections
    # too), untied, and num_mem_blocks 3 over two hybrid layers (transformers builds two).
    Case("zamba2-gqa-nope-biased-untied", "Zamba2Config", "Zamba2ForCausalLM",
         _zamba2(num_hidden_layers=4, layers_block_type=["mamba", "hybrid", "mamba", "hybrid"], num_mem_blocks=3,
                 num_key_value_heads=2, hidden_act="silu", add_bias_linear=True, tie_word_embeddings=False)),
]

BY_NAME = {case.name: case for case in CASES}

#: Further variants of a family whose first case runs in the default suite: they run with the slow tests
#: (every parity check of each takes about a second, and there are many).
SLOW_VARIANTS = frozenset({
    "deepseek_v32-yarn-layer-types", "lfm2-attention-majority", "lfm3-prenorm-ungated", "falcon_h1-rms-norm",
    "falcon_h1-gate-then-norm", "granitemoehybrid-attention", "granitemoehybrid-rope-dense",
    "granitemoehybrid-dense-nope", "mamba2-tied-clamped", "nemotron_h-biased", "kimi_linear-mla-base",
    "qwen3_next-irregular", "olmo_hybrid-nope", "glm4_moe-air-yarn", "minimax_m2-mqa-partial",
    "olmo3-layer-types-bias", "exaone4-global-llama3", "llama4-interleaved", "gemma4-moe", "phi-2-shape",
    "gpt_bigcode-mha-unscaled", "gptj-whole-heads", "falcon-7b-shape", "falcon-new-one-norm", "falcon-sequential",
    "starcoder2-no-bias-untied", "olmoe-mqa-normalized-tied", "cohere-qk_norm", "ernie4_5-mqa-untied",
    "ernie4_5_moe-interval-bias", "glm-mqa-quarter", "glm4-mqa-whole-tied", "granite-tied-head_dim",
    "granitemoe-mqa-tied", "granitemoeshared-no-shared", "deepseek_v2-lite-greedy-yarn",
    "minicpm3-no-q-lora-unscaled", "mpt-tied", "arcee-tied-head-dim", "mamba-auto-rank-tied",
    "ministral3-plain-rope-tied", "opt-no-bias-no-affine", "gpt_neo-global-tied", "codegen-straddling-heads",
    "biogpt-unscaled-tied", "xglm-unscaled-tied", "persimmon-no-qk-norm-tied", "nemotron-mha-quarter-tied",
    "olmo-mha-tied-unclipped", "jais2-tied-no-bias", "lfm2_moe-dense-pair-tied", "jamba-dense-tied",
    "hunyuan_v1_dense-mha-tied", "apertus-mha-tied", "dbrx-mqa-unnormalized", "flint-defaults-unnormalized-biased",
    "afmoe-layer-types-tied", "bamba-attention-full-rope-tied", "hyperclovax-prenorm-tied",
    "kolibri1-sliding-unnormalized", "lara_mini-irregular-biased", "cohere2_moe-rms-sum", "phimoe-longrope",
    "mellum-mtp", "aria_text-mqa-one-shared-tied", "bloom-tied", "nanochat-mha-tied-uncapped", "openai-gpt-tied-relu",
    "ctrl-untied", "rwkv-tied", "diffllama-mha-linear-tied", "cohere2_moe-sigmoid-unnormalized",
    "minimax-default-types-tied", "xlstm-defaults-tie-ignored", "jetmoe-mqa-top3-untied",
    "modernbert-decoder-untied-every-2", "bailing_hybrid-softplus-mla-base", "emu3-mqa-linear-tied",
    "cohere_compass_text-rope-everywhere-mqa-tied", "gpt_neox_japanese-one-layer-relu-tied",
    "laguna-per-element-mqa-tied", "beam-defaults-mqa-tied", "axk2-groups-yarn-tied",
    "gpt2-untied-layer-scaled", "gpt_neox-sequential", "llama-tied-head_dim", "llama-rope-linear",
    "llama-rope-dynamic", "llama-rope-yarn", "llama-rope-llama3", "llama-rope-longrope", "phi3-longrope-partial",
    "stablelm-parallel", "stablelm-qk_layernorm", "qwen2_moe-sliding", "qwen3_moe-sliding", "smollm3-no_rope_layers",
    "smollm3-sliding", "gemma3-pattern-softcapped", "deepseek_v4-yarn-sigmoid", "deepseek_v3-no-q-lora-yarn",
    "deepseek_v32-tied-cut", "cohere2-pattern", "mimo_v2_flash-wide-values-tied", "lfm2-legacy-kernel4-bias",
    "bitnet-mqa-tied",
    "ergo-types-mqa",
    "zamba2-gqa-nope-biased-untied",
})
assert SLOW_VARIANTS <= set(BY_NAME), sorted(SLOW_VARIANTS - set(BY_NAME))


def _family_of(case: Case) -> tuple[str, str | None, str | None]:
    return case.config, case.model_type, case.nested_in


def _default_cases() -> dict[tuple[str, str | None, str | None], list[str]]:
    found: dict[tuple[str, str | None, str | None], list[str]] = {}
    for case in CASES:
        found.setdefault(_family_of(case), [])
        if case.name not in SLOW_VARIANTS:
            found[_family_of(case)].append(case.name)
    return found


# The default suite's budget (docs/testing.md): exactly one case per family runs there, every further variant in
# SLOW_VARIANTS (the slow suite, which CI runs too).
_WRONG = {family[0]: names for family, names in _default_cases().items() if len(names) != 1}
assert not _WRONG, f"each family needs exactly one case outside SLOW_VARIANTS (add the others to it): {_WRONG}"
