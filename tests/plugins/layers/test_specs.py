"""The real-shape specs under specs/: parameter counts against transformers and the published totals,
and each one built at a reduced size that runs forward and backward."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import yaml

import specformer

SPECS = Path(__file__).resolve().parents[3] / "specs"


def _llama_like(cls_name: str, **kw: Any) -> Callable[[], Any]:
    def make() -> Any:
        import transformers

        return getattr(transformers, cls_name)(**kw)
    return make


#: Each real-shape spec and the transformers config of the same model (from its published config.json).
HF_CONFIGS: dict[str, Callable[[], Any]] = {
    "gpt2-124m.yaml": _llama_like("GPT2Config", vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12),
    "llama-2-7b.yaml": _llama_like(
        "LlamaConfig", vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096, tie_word_embeddings=False),
    "llama-3.1-8b.yaml": _llama_like(
        "LlamaConfig", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "llama-3.2-1b.yaml": _llama_like(
        "LlamaConfig", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "mistral-7b.yaml": _llama_like(
        "MistralConfig", vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768, sliding_window=4096,
        tie_word_embeddings=False),
    "mixtral-8x7b.yaml": _llama_like(
        "MixtralConfig", vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
        max_position_embeddings=32768, tie_word_embeddings=False),
    "gemma-2b.yaml": _llama_like(
        "GemmaConfig", vocab_size=256000, hidden_size=2048, intermediate_size=16384, num_hidden_layers=18,
        num_attention_heads=8, num_key_value_heads=1, head_dim=256, max_position_embeddings=8192),
    "gemma-2-2b.yaml": _llama_like(
        "Gemma2Config", vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256, max_position_embeddings=8192,
        query_pre_attn_scalar=256, sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
    "qwen2.5-0.5b.yaml": _llama_like(
        "Qwen2Config", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True),
    "qwen3-0.6b.yaml": _llama_like(
        "Qwen3Config", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        tie_word_embeddings=True),
    "olmo-2-1b.yaml": _llama_like(
        "Olmo2Config", vocab_size=100352, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=4096, tie_word_embeddings=False),
    "phi-3-mini.yaml": _llama_like(
        "Phi3Config", vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096, sliding_window=2047,
        tie_word_embeddings=False),
    "pythia-160m.yaml": _llama_like(
        "GPTNeoXConfig", vocab_size=50304, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
        num_attention_heads=12, max_position_embeddings=2048, tie_word_embeddings=False, use_parallel_residual=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
    # bigcode/starcoder's published config.json (GPTBigCodeConfig's defaults are GPT-2 124M's sizes).
    "starcoder-15.5b.yaml": _llama_like(
        "GPTBigCodeConfig", vocab_size=49152, n_embd=6144, n_layer=40, n_head=48, n_inner=24576, n_positions=8192,
        bos_token_id=0, eos_token_id=0),
    "falcon-7b.yaml": _llama_like("FalconConfig"),  # transformers' defaults are Falcon-7B's
    "gpt-j-6b.yaml": _llama_like("GPTJConfig"),  # transformers' defaults are GPT-J-6B's
    # microsoft/phi-2's published config.json (PhiConfig's defaults are Phi-1's sizes).
    "phi-2.yaml": _llama_like(
        "PhiConfig", vocab_size=51200, hidden_size=2560, intermediate_size=10240, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=2048, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.4}),
    "stablelm-2-1.6b.yaml": _llama_like(
        "StableLmConfig", vocab_size=100352, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096, use_qkv_bias=True,
        tie_word_embeddings=False),
    "qwen3-30b-a3b.yaml": _llama_like(
        "Qwen3MoeConfig", vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
        num_experts_per_tok=8, norm_topk_prob=True, max_position_embeddings=40960, tie_word_embeddings=False),
    "qwen1.5-moe-a2.7b.yaml": _llama_like(
        "Qwen2MoeConfig", vocab_size=151936, hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16,
        num_experts=60, num_experts_per_tok=4, max_position_embeddings=8192, tie_word_embeddings=False),
    "smollm3-3b.yaml": _llama_like(
        "SmolLM3Config", vocab_size=128256, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
        num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=65536, tie_word_embeddings=True),
    "gemma-3-1b.yaml": _llama_like(
        "Gemma3TextConfig", vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512, max_position_embeddings=32768),
    "gpt-oss-20b.yaml": _llama_like(
        "GptOssConfig", num_hidden_layers=24, num_local_experts=32, router_aux_loss_coef=0.9,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": False, "original_max_position_embeddings": 4096}),
    "deepseek-v3.yaml": _llama_like(
        "DeepseekV3Config", max_position_embeddings=163840,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
                         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}),
    "deepseek-v3.2.yaml": _llama_like(
        "DeepseekV32Config", max_position_embeddings=163840,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
                         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}),
    "glm-5.yaml": _llama_like("GlmMoeDsaConfig"),  # transformers' defaults are zai-org/GLM-5's, its docstring says
    "lara-4-mini-base.yaml": _llama_like("LaraMiniConfig"),  # transformers' defaults are Lara-4-Mini-Base's, its docstring says
    "kolibri-1.yaml": _llama_like("Kolibri1Config"),  # transformers' defaults are Aleph-Alpha/Kolibri-1's, its docstring says
    "mimo-v2-flash.yaml": _llama_like("MiMoV2FlashConfig"),  # transformers' defaults are MiMo-V2-Flash's, its docstring says
    "laguna-xs.2.yaml": _llama_like("LagunaConfig"),  # transformers' defaults are poolside/laguna-XS.2's, its docstring says
    "mellum2-12b-a2.5b.yaml": _llama_like("MellumConfig"),  # transformers' defaults are Mellum2-12B-A2.5B's, its docstring says
    "a.x-k1.yaml": _llama_like("AXK1Config"),  # transformers' defaults are skt/A.X-K1's, its docstring says
    "a.x-k2-light.yaml": _llama_like("AXK2Config"),  # transformers' defaults are A.X-K2-Light's, its docstring says
    "phi-3.5-moe.yaml": _llama_like("PhimoeConfig"),  # transformers' defaults are Phi-3.5-MoE-instruct's, its docstring says
    "hy3-preview.yaml": _llama_like("HYV3Config"),  # transformers' defaults are tencent/Hy3-preview's, its docstring says
    "flint.yaml": _llama_like("FlintConfig"),  # transformers' defaults, whose docstring names RecursiveSI/flint
    "ling-3.0-flash.yaml": _llama_like("BailingHybridConfig"),  # transformers' defaults are Ling-3.0-Flash's, its docstring says
    "kimi-linear-48b-a3b.yaml": _llama_like(
        "KimiLinearConfig", linear_attn_config={
            "full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4,
            "kda_layers": [i for i in range(1, 28) if i not in (4, 8, 12, 16, 20, 24, 27)]}),
    "command-r7b.yaml": _llama_like(
        "Cohere2Config", vocab_size=256000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, logit_scale=0.25, max_position_embeddings=8192,
        sliding_window=4096),
    "lfm2-1.2b.yaml": _llama_like(
        "Lfm2Config", vocab_size=65536, hidden_size=2048, intermediate_size=12288, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=128000, norm_eps=1e-5, conv_L_cache=3,
        full_attn_idxs=[2, 5, 8, 10, 12, 14]),
    "lfm3-1.7b.yaml": _llama_like("Lfm3Config"),  # transformers' defaults are LiquidAI/LFM3-1.7B's, its docstring says
    "mamba-codestral-7b.yaml": _llama_like("Mamba2Config"),  # transformers' defaults are Mamba-Codestral-7B's
    # transformers' MambaConfig defaults with mamba-130m's 24 layers; Falcon-Mamba-7B's published sizes.
    "mamba-130m.yaml": _llama_like("MambaConfig", num_hidden_layers=24),
    "falcon-mamba-7b.yaml": _llama_like("FalconMambaConfig", vocab_size=65024, hidden_size=4096, num_hidden_layers=64,
                                        time_step_rank=256, tie_word_embeddings=False),
    "nemotron-h-8b.yaml": _llama_like(
        "NemotronHConfig", hybrid_override_pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
        max_position_embeddings=8192),
    # transformers' Zamba2Config defaults with Zamba2-2.7B's published num_mem_blocks 2 and 80 Mamba heads of 64.
    "zamba2-2.7b.yaml": _llama_like("Zamba2Config", n_mamba_heads=80, num_mem_blocks=2),
    # --- hybrid: Falcon-H1, Granite 4.0-H (the same fields as tests/plugins/hf/test_family_specs.py's HYBRID_SPECS) ---
    "granite-4.0-h-tiny.yaml": _llama_like(
        "GraniteMoeHybridConfig", vocab_size=100352, hidden_size=1536, num_hidden_layers=40, num_attention_heads=12,
        num_key_value_heads=4, intermediate_size=512, shared_intermediate_size=1024, num_local_experts=64,
        num_experts_per_tok=6, max_position_embeddings=131072, tie_word_embeddings=True, position_embedding_type="nope",
        layer_types=(["mamba"] * 5 + ["attention"] + ["mamba"] * 4) * 4, mamba_n_heads=48, mamba_d_head=64,
        mamba_d_state=128, mamba_n_groups=1, mamba_d_conv=4, mamba_expand=2),
    "falcon-h1-0.5b.yaml": _llama_like(
        "FalconH1Config", vocab_size=32784, hidden_size=1024, intermediate_size=2048, num_hidden_layers=36,
        num_attention_heads=8, num_key_value_heads=2, head_dim=64, max_position_embeddings=16384,
        tie_word_embeddings=False, mamba_d_ssm=1536, mamba_n_heads=24, mamba_d_head=64, mamba_d_state=128,
        mamba_n_groups=1, mamba_d_conv=4, mamba_rms_norm=False),
    # Jamba-v0.1: transformers' JambaConfig defaults are its sizes (the docstring's checkpoint).
    "jamba-v0.1.yaml": _llama_like("JambaConfig"),
    # RecurrentGemma-2B: the defaults with its MLP (15360, halved by transformers) and one kv head (see the spec).
    "recurrentgemma-2b.yaml": _llama_like("RecurrentGemmaConfig", intermediate_size=15360, num_key_value_heads=1),
    # RWKV-4 169M (recalled; see the spec).
    "rwkv-4-169m.yaml": _llama_like("RwkvConfig", vocab_size=50277, hidden_size=768, num_hidden_layers=12,
                                    context_length=1024),
    # xLSTM-7B: transformers' xLSTMConfig defaults are its sizes.
    "xlstm-7b.yaml": _llama_like("xLSTMConfig"),
    # Hybrid: Gated DeltaNet layers among gated (Qwen) or OLMo-2 attention layers.
    "qwen3-next-80b-a3b.yaml": _llama_like(
        "Qwen3NextConfig", intermediate_size=5120, max_position_embeddings=262144,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}),
    "qwen3.5-9b.yaml": _llama_like("Qwen3_5TextConfig"),
    "gemma-4-e2b.yaml": _llama_like(
        "Gemma4TextConfig", **(GEMMA4_E2B := dict(
            vocab_size=262144, hidden_size=1536, intermediate_size=6144, num_hidden_layers=35, num_attention_heads=8,
            num_key_value_heads=1, head_dim=256, global_head_dim=512, sliding_window=512, hidden_size_per_layer_input=256,
            num_kv_shared_layers=20, use_double_wide_mlp=True, final_logit_softcapping=30.0,
            layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 7))),
    "qwen3.5-35b-a3b.yaml": _llama_like("Qwen3_5MoeTextConfig"),
    "llama-4-scout-17b-16e.yaml": _llama_like("Llama4TextConfig"),  # transformers' defaults are Scout's text model
    "olmo-hybrid-7b.yaml": _llama_like("OlmoHybridConfig", rope_parameters={"rope_type": "default", "rope_theta": None}),
    # GLM-4.5-Air, MiniMax-M2, OLMo 3, EXAONE 4 (the same fields as tests/plugins/hf/test_family_specs.py's)
    "glm-4.5-air.yaml": _llama_like(
        "Glm4MoeConfig",
        head_dim=128, attention_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}),
    "minimax-m2.yaml": _llama_like("MiniMaxM2Config", rotary_dim=64),
    "olmo-3-7b.yaml": _llama_like(
        "Olmo3Config",
        vocab_size=100278, max_position_embeddings=65536, rms_norm_eps=1e-6,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 5e5},
                         "full_attention": {"rope_type": "yarn", "rope_theta": 5e5, "factor": 8.0, "beta_fast": 32.0,
                                            "beta_slow": 1.0, "original_max_position_embeddings": 8192,
                                            "attention_factor": 1.2079441541679836}}),
    "exaone-4.0-32b.yaml": _llama_like(
        "Exaone4Config",
        hidden_size=5120, intermediate_size=27392, num_hidden_layers=64, num_attention_heads=40, num_key_value_heads=8,
        head_dim=128, max_position_embeddings=131072, sliding_window=4096, sliding_window_pattern="LLLG",
        layer_types=(["sliding_attention"] * 3 + ["full_attention"]) * 16,
        rope_parameters={"rope_type": "llama3", "rope_theta": 1e6, "factor": 16.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    # StarCoder2-3B: transformers' Starcoder2Config defaults are its sizes (the same fields as
    # tests/plugins/hf/test_family_specs.py's).
    "starcoder2-3b.yaml": _llama_like(
        "Starcoder2Config", max_position_embeddings=16384, sliding_window=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    # OLMoE-1B-7B: transformers' OlmoeConfig defaults with the published intermediate_size.
    "olmoe-1b-7b.yaml": _llama_like("OlmoeConfig", intermediate_size=1024),
    # Dots1Config has no defaults for the experts' counts: rednote-hilab/dots.llm1.base's as recalled.
    "dots-llm1.yaml": _llama_like(
        "Dots1Config", hidden_size=4096, n_routed_experts=128, n_shared_experts=2, num_experts_per_tok=6,
        first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5, max_position_embeddings=32768,
        rms_norm_eps=1e-5, sliding_window=None, rope_parameters={"rope_type": "default", "rope_theta": 1e7}),
    "flexolmo-7x7b.yaml": _llama_like("FlexOlmoConfig"),  # transformers' defaults are FlexOlmo-7x7B-1T's sizes
    "minicpm5-15b-a2.5b.yaml": _llama_like("MiniCPM5MoeConfig"),  # transformers' defaults are MiniCPM5-15B-A2.5B's sizes
    "solar-open-100b.yaml": _llama_like("SolarOpenConfig"),  # transformers' defaults are Solar-Open-100B's sizes
    "glm-4.7-flash.yaml": _llama_like("Glm4MoeLiteConfig"),  # transformers' defaults are GLM-4.7-Flash's sizes
    # DeepSeek-V2-Lite's published config.json.
    "deepseek-v2-lite.yaml": _llama_like(
        "DeepseekV2Config", vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
        num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, n_shared_experts=2, n_routed_experts=64, num_experts_per_tok=6,
        routed_scaling_factor=1.0, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=128,
        v_head_dim=128, topk_method="greedy", n_group=1, topk_group=1, first_k_dense_replace=1, norm_topk_prob=False,
        max_position_embeddings=163840, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
                         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}),
    # MiniCPM3-4B: transformers' MiniCPM3Config defaults are its sizes.
    "minicpm3-4b.yaml": _llama_like("MiniCPM3Config"),
    # Youtu-LLM-2B: transformers' YoutuConfig defaults are its sizes.
    "youtu-llm-2b.yaml": _llama_like("YoutuConfig"),
    # Llama under other model_types: transformers' config defaults are these models' sizes.
    "exaone-3.0-7.8b.yaml": _llama_like("ExaoneConfig"),
    "internlm3-8b.yaml": _llama_like("InternLM3Config"),
    "iquest-coder-40b.yaml": _llama_like("IQuestCoderConfig"),
    "command-r-35b.yaml": _llama_like("CohereConfig"),  # transformers' defaults are Command R's sizes
    "ernie-4.5-0.3b.yaml": _llama_like("Ernie4_5Config"),  # transformers' defaults are ERNIE-4.5-0.3B's sizes
    # transformers' Ernie4_5_MoeConfig defaults are ERNIE-4.5-21B-A3B's sizes (its docstring says so).
    "ernie-4.5-21b-a3b.yaml": _llama_like("Ernie4_5_MoeConfig"),
    "helium-1-preview-2b.yaml": _llama_like("HeliumConfig"),  # transformers' defaults are helium-1-preview's sizes
    "glm-4-9b.yaml": _llama_like("GlmConfig"),  # transformers' defaults are glm-4-9b's sizes
    "glm-4-9b-0414.yaml": _llama_like("Glm4Config"),  # transformers' defaults are GLM-4-9B-0414's sizes
    # Granite 3 and Granite 3 MoE (the same fields as tests/plugins/hf/test_family_specs.py's).
    "granite-3.0-2b.yaml": _llama_like(
        "GraniteConfig", vocab_size=49155, hidden_size=2048, intermediate_size=8192, num_hidden_layers=40,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096, rms_norm_eps=1e-5,
        tie_word_embeddings=True),
    "granite-3.0-1b-a400m.yaml": _llama_like(
        "GraniteMoeConfig", vocab_size=49155, hidden_size=1024, intermediate_size=512, num_hidden_layers=24,
        num_attention_heads=16, num_key_value_heads=8, num_local_experts=32, num_experts_per_tok=8,
        max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=True),
    # transformers' GraniteSWAConfig defaults are granite-swash-2b's sizes (its docstring's checkpoint).
    "granite-swash-2b.yaml": _llama_like("GraniteSWAConfig"),
    # transformers' GraniteMoeSWAConfig defaults (GraniteMoeShared's sizes: no published model's, see the spec).
    "granitemoe-swa-defaults.yaml": _llama_like("GraniteMoeSWAConfig"),
    # transformers' Ministral3Config defaults are Ministral-3-8B's text model (its docstring's checkpoint).
    "ministral-3-8b.yaml": _llama_like("Ministral3Config"),
    # transformers' VaultGemmaConfig defaults (Gemma2Config's sizes: no published model's, see the spec).
    "vaultgemma-defaults.yaml": _llama_like("VaultGemmaConfig"),
    # mosaicml/mpt-7b's published config.json (MptConfig's defaults are MPT-1B's sizes).
    "mpt-7b.yaml": _llama_like(
        "MptConfig", d_model=4096, n_heads=32, n_layers=32, vocab_size=50432, max_seq_len=2048),
    "arcee-afm-4.5b.yaml": _llama_like("ArceeConfig"),  # transformers' defaults ("AFM-4.5B-Base style")
    "opt-125m.yaml": _llama_like("OPTConfig"),  # transformers' defaults are OPT-125M's sizes
    # transformers' NemotronConfig defaults ("nemotron-15b style") with Nemotron-4 15B's 8 key/value heads.
    "nemotron-4-15b.yaml": _llama_like("NemotronConfig", num_key_value_heads=8),
    # DBRX's published sizes, its rope base in rope_parameters too (see tests/plugins/hf/test_family_specs.py's DBRX).
    "dbrx.yaml": _llama_like(
        "DbrxConfig", d_model=6144, n_heads=48, n_layers=40, max_seq_len=32768, vocab_size=100352,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        attn_config={"clip_qkv": 8, "kv_n_heads": 8, "rope_theta": 500000.0},
        ffn_config={"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4, "moe_jitter_eps": 0.0,
                    "moe_loss_weight": 0.05, "moe_normalize_expert_weights": 1.0}),
    # transformers' JetMoeConfig defaults (jetmoe/jetmoe-8b's, its docstring says) with the published 24 layers.
    "jetmoe-8b.yaml": _llama_like("JetMoeConfig", num_hidden_layers=24),
    "olmo-7b.yaml": _llama_like("OlmoConfig"),  # transformers' defaults are OLMo-7B's sizes
    "jais-2-8b.yaml": _llama_like("Jais2Config"),  # transformers' defaults are Jais-2-8B's sizes (its docstring's)
    # transformers' Lfm2MoeConfig defaults (LFM2-8B-A1B's sizes) with its 24 layers as recalled (see the spec).
    "lfm2-8b-a1b.yaml": _llama_like("Lfm2MoeConfig", num_hidden_layers=24, layer_types=[
        "full_attention" if i in (2, 6, 10, 14, 18, 21) else "conv" for i in range(24)]),
    # EleutherAI/gpt-neo-125M's published config.json (GPTNeoConfig's defaults are GPT-Neo 1.3B's sizes).
    "gpt-neo-125m.yaml": _llama_like(
        "GPTNeoConfig", vocab_size=50257, hidden_size=768, num_layers=12, num_heads=12,
        attention_types=[[["global", "local"], 6]], window_size=256, max_position_embeddings=2048),
    # Salesforce/codegen-350M-mono's published config.json (CodeGenConfig's defaults are CodeGen-6B's sizes).
    "codegen-350m-mono.yaml": _llama_like(
        "CodeGenConfig", vocab_size=51200, n_embd=1024, n_layer=20, n_head=16, rotary_dim=32, n_positions=2048),
    "biogpt.yaml": _llama_like("BioGptConfig"),  # transformers' defaults are microsoft/biogpt's sizes
    "xglm-564m.yaml": _llama_like("XGLMConfig"),  # transformers' defaults are facebook/xglm-564M's sizes
    "persimmon-8b.yaml": _llama_like("PersimmonConfig"),  # transformers' defaults are Persimmon-8B's sizes
    # bigscience/bloom-560m's published config.json (BloomConfig's defaults are tiny test sizes).
    "bloom-560m.yaml": _llama_like("BloomConfig", vocab_size=250880, hidden_size=1024, n_layer=24, n_head=16),
    # transformers' NanoChatConfig defaults (a d12's sizes: no published model's, see the spec).
    "nanochat-defaults.yaml": _llama_like("NanoChatConfig"),
    "apertus-defaults.yaml": _llama_like("ApertusConfig"),  # transformers' defaults, not a published shape
    "openai-gpt.yaml": _llama_like("OpenAIGPTConfig"),  # transformers' defaults are openai-gpt's sizes
    "ctrl.yaml": _llama_like("CTRLConfig"),  # transformers' defaults are Salesforce/ctrl's sizes
    # transformers' BitNetConfig defaults (its docstring's BitNet b1.58 2B4T): ternary weights, float counts alike.
    "bitnet-b1.58-2b-4t.yaml": _llama_like("BitNetConfig"),
    # transformers' ModernBertDecoderConfig defaults (the 150M Ettin decoder's shape, see the spec).
    "ettin-decoder-150m.yaml": _llama_like("ModernBertDecoderConfig"),
    # transformers' defaults are abeja/gpt-neox-japanese-2.7b's sizes (its docstring's checkpoint)
    "gpt-neox-japanese-2.7b.yaml": _llama_like("GPTNeoXJapaneseConfig"),
    # transformers' BeamConfig defaults are reflection/Beam-1.0-501B-A23B's sizes (its docstring's checkpoint)
    "beam-1.0-501b-a23b.yaml": _llama_like("BeamConfig"),
    # transformers' ErgoConfig defaults are Amazon-FMR/Ergo's sizes (its docstring's checkpoint)
    "ergo.yaml": _llama_like("ErgoConfig"),
}

REAL = sorted(HF_CONFIGS)


def published_total(name: str) -> int:
    """The parameter count written in the spec's header comment ('... 1,234 parameters ...')."""
    text = (SPECS / name).read_text()
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    match = re.search(r"([\d,]{5,}) parameters", header)
    assert match, f"{name} has no '<count> parameters' in its header comment"
    return int(match.group(1).replace(",", ""))


def test_every_spec_claiming_a_published_count_is_checked() -> None:
    claiming = {p.name for p in SPECS.glob("*") if p.suffix in (".yaml", ".yml", ".json", ".toml")
                and re.search(r"^#.*[\d,]{5,} parameters", p.read_text(), re.M)}
    assert claiming == set(HF_CONFIGS)


@pytest.mark.parametrize("name", REAL)
def test_parameter_count_matches_transformers_and_publication(name: str) -> None:
    from transformers import AutoModelForCausalLM

    ours = specformer.summarize(SPECS / name).total
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(HF_CONFIGS[name]())
    # Frozen parameters (ERNIE 4.5 MoE's e_score_correction_bias, requires_grad False) are buffers in specformer.
    theirs = sum(p.numel() for p in hf.parameters() if p.requires_grad)
    assert ours == theirs, f"{name}: specformer {ours:,}, transformers {theirs:,}"
    assert ours == published_total(name)


# -- reduced size ----------------------------------------------------------------------------------

SHRINK = {"vocab_size": 97, "d_model": 64, "n_layers": 2, "context_length": 64}


def shrink(data: Any) -> Any:
    """The same architecture at toy size: widths, heads, experts, windows and contexts made small."""
    data = copy.deepcopy(data)

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            out = {}
            for key, value in node.items():
                if key == "n_heads":
                    value = 4
                elif key in ("n_kv_heads", "n_key_heads"):  # attention's key/value heads, Gated DeltaNet's key heads
                    # moa has no n_heads; an override may change them alone (MiMo-V2-Flash's full layers): not MHA then
                    value = {True: 4, False: 1 if value == 1 else 2}[value == node.get("n_heads")]
                elif key in ("key_head_dim", "value_head_dim"):
                    value = 16
                elif key == "head_dim":
                    value = 16
                elif key == "qk_rope_head_dim":  # within an indexer's shrunk head_dim
                    value = 8
                elif key == "topk":  # an indexer's keys per query: fewer than the shrunk context, so it chooses
                    value = 4
                elif key in ("hidden", "shared_hidden"):
                    value = 96
                elif key == "n_experts":
                    value = 4
                elif key == "top_k":
                    value = min(value, 2)
                elif key == "n_group":  # 4 experts: 2 groups of 2, one kept (DeepSeek-V3's grouped routing)
                    value = min(value, 2)
                elif key == "topk_group":
                    value = 1
                elif key in ("window", "chunk"):
                    value = 8 if value is not None else None
                elif key == "original_context_length":
                    value = 16
                elif key == "scale":
                    value = 16 ** -0.5
                elif key == "n_groups":  # Mamba-2's groups of B and C must divide its (shrunk) heads
                    value = min(value, 2)
                elif key == "d_inner":  # Mamba-1's inner width (it has no heads)
                    value = 128
                elif key == "dt_rank":
                    value = 8 if value is not None else None
                elif key == "state_size":
                    value = 16
                elif key == "width" and node.get("kind") == "rglru":  # Griffin's recurrence width (no heads)
                    value = 64
                elif key == "gate_blocks":  # blocks of the RG-LRU's gates, dividing its shrunk width
                    value = 4
                elif key == "input_width":  # an attention reading concat(stream, embeddings) (Zamba2's shared block)
                    value = 2 * SHRINK["d_model"]
                elif key == "adapters" and isinstance(value, dict):  # a shared block's per-use LoRA, at the shrunk widths
                    wide = 2 * SHRINK["d_model"] if "input_width" in str(node.get("mixer")) else SHRINK["d_model"]
                    shrunk = {"ffn.gate_up": {"inputs": SHRINK["d_model"], "outputs": [2 * 96]},
                              "mixer.qkv": {"inputs": wide, "outputs": [4 * 16] * 3}}
                    value = {**value, "targets": {path: shrunk[path] for path in value["targets"]}}
                out[key] = walk(value)
            return out
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    original_layers = data["model"]["n_layers"]
    data = walk(data)
    data["model"].update(SHRINK)
    layers = data["model"].get("layers") or []
    names_layers = any(isinstance(layer.get("select"), list) or "kv_from" in (layer.get("mixer") or {})
                       for layer in layers)
    if layers and not names_layers:
        data["model"]["n_layers"] = 6  # layer overrides such as "3::4" (SmolLM3) or "5::6" (Gemma 3) still select one
    elif layers:
        data["model"]["n_layers"] = original_layers  # lists of layers (Nemotron-H's) and kv_from (Gemma 4's) name them
    return data


@pytest.mark.parametrize("name", REAL)
def test_reduced_size_builds_and_trains(name: str) -> None:
    original = yaml.safe_load((SPECS / name).read_text())
    small = shrink(original)
    spec = specformer.load_spec(small)
    assert spec.model.block.layout.kind == specformer.load_spec(SPECS / name).model.block.layout.kind
    model = specformer.build(spec, seed=0)
    x = torch.randint(0, 97, (2, 24))
    logits = model(x)
    assert logits.shape == (2, 24, 97) and torch.isfinite(logits).all()
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x.roll(-1, 1).flatten())
    aux = model.auxiliary_loss()
    if aux is not None:
        loss = loss + aux
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    if "window" in str(original):
        # (a recurrent or convolutional mixer beside the attention has no window)
        assert any(getattr(a, "window", None) == 8 for a in model.attention_modules())
        assert any(getattr(a, "window", None) == 8 for a in model.attention_modules())  # recurrent mixers have none


def test_gemma2_alternates_local_and_global_layers() -> None:
    model = specformer.build(shrink(yaml.safe_load((SPECS / "gemma-2-2b.yaml").read_text())), device="meta")
    assert [a.window for a in model.attention_modules()] == [8, None] * 3
    full = specformer.build(SPECS / "gemma-2-2b.yaml", device="meta")
    windows = [a.window for a in full.attention_modules()]
    assert windows[0::2] == [4096] * 13 and windows[1::2] == [None] * 13
