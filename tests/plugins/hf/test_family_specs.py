"""The real-shape specs of the Hugging Face families added here: active parameters per token against transformers.

Totals are checked for every real-shape spec in tests/plugins/layers/test_specs.py. For a
mixture of experts the active count is the transformers model's total (built on the meta
device, no memory) less the experts a token does not use: in every MoE layer,
(n_experts - top_k) experts' gate, up and down projections.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

import specformer

SPECS = Path(__file__).resolve().parents[3] / "specs"

ROPE_1M = {"rope_type": "default", "rope_theta": 1e6}

KIMI_FULL_ATTENTION = [4, 8, 12, 16, 20, 24, 27]
KIMI_LINEAR_ATTENTION = {"full_attn_layers": KIMI_FULL_ATTENTION, "head_dim": 128, "num_heads": 32,
                         "short_conv_kernel_size": 4,
                         "kda_layers": [i for i in range(1, 28) if i not in KIMI_FULL_ATTENTION]}

#: spec file -> (transformers config class, the spec's model as its config fields).
MOE_SPECS = {
    "qwen3-30b-a3b.yaml": ("Qwen3MoeConfig", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
        norm_topk_prob=True, max_position_embeddings=40960, tie_word_embeddings=False, rope_parameters=ROPE_1M)),
    "qwen1.5-moe-a2.7b.yaml": ("Qwen2MoeConfig", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16,
        num_experts=60, num_experts_per_tok=4, max_position_embeddings=8192, tie_word_embeddings=False, rope_parameters=ROPE_1M)),
    "gpt-oss-20b.yaml": ("GptOssConfig", dict(
        num_hidden_layers=24, num_local_experts=32, router_aux_loss_coef=0.9,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": False, "original_max_position_embeddings": 4096})),
    "deepseek-v3.yaml": ("DeepseekV3Config", dict(
        max_position_embeddings=163840,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
                         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0})),
    "deepseek-v3.2.yaml": ("DeepseekV32Config", dict(
        max_position_embeddings=163840,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
                         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0})),
    # transformers' HYV3Config defaults, which its docstring names as tencent/Hy3-preview's.
    "hy3-preview.yaml": ("HYV3Config", dict()),
    # transformers' FlintConfig defaults, whose docstring names RecursiveSI/flint.
    "flint.yaml": ("FlintConfig", dict()),
    # transformers' LaraMiniConfig defaults, which its docstring names as translated/Lara-4-Mini-Base's.
    "lara-4-mini-base.yaml": ("LaraMiniConfig", dict()),
    # transformers' Kolibri1Config defaults, which its docstring names as Aleph-Alpha/Kolibri-1's.
    "kolibri-1.yaml": ("Kolibri1Config", dict()),
    # transformers' MiMoV2FlashConfig defaults, which its docstring names as XiaomiMiMo/MiMo-V2-Flash's.
    "mimo-v2-flash.yaml": ("MiMoV2FlashConfig", dict()),
    # transformers' MellumConfig defaults, which its docstring names as JetBrains/Mellum2-12B-A2.5B-Base's.
    "mellum2-12b-a2.5b.yaml": ("MellumConfig", dict()),
    # transformers' AXK1Config defaults, which its docstring names as skt/A.X-K1's.
    "a.x-k1.yaml": ("AXK1Config", dict()),
    # transformers' AXK2Config defaults, whose values its docstring names as A.X-K2-Light's.
    "a.x-k2-light.yaml": ("AXK2Config", dict()),
    # transformers' PhimoeConfig defaults, which its docstring names as microsoft/Phi-3.5-MoE-instruct's.
    "phi-3.5-moe.yaml": ("PhimoeConfig", dict()),
    # transformers' GlmMoeDsaConfig defaults, which its docstring names as zai-org/GLM-5's.
    "glm-5.yaml": ("GlmMoeDsaConfig", dict()),
    # Kimi Linear's published linear_attn_config: KDA in every layer but 4, 8, ..., 24 and 27 (counted from 1).
    "kimi-linear-48b-a3b.yaml": ("KimiLinearConfig", dict(linear_attn_config=KIMI_LINEAR_ATTENTION)),
    "qwen3-next-80b-a3b.yaml": ("Qwen3NextConfig", dict(
        intermediate_size=5120, max_position_embeddings=262144,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25})),
    "qwen3.5-35b-a3b.yaml": ("Qwen3_5MoeTextConfig", dict()),
    # Their published config.json's fields beyond transformers' defaults (see each spec's header).
    # transformers' GraniteMoeSWAConfig defaults (GraniteMoeShared's sizes: no published model's, see the spec).
    "granitemoe-swa-defaults.yaml": ("GraniteMoeSWAConfig", dict()),
    "glm-4.5-air.yaml": ("Glm4MoeConfig", dict(
        head_dim=128, attention_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5})),
    "minimax-m2.yaml": ("MiniMaxM2Config", dict(rotary_dim=64)),
    # transformers' DeepseekV4Config defaults are DeepSeek-V4-Flash's sizes; its layer pattern as published.
    "deepseek-v4.yaml": ("DeepseekV4Config", dict(layer_types=["sliding_attention"] * 2 + [
        "compressed_sparse_attention" if i % 2 == 0 else "heavily_compressed_attention" for i in range(41)])),
    # transformers' Llama4TextConfig defaults are Llama 4 Scout's text model.
    "llama-4-scout-17b-16e.yaml": ("Llama4TextConfig", dict()),
    # transformers' OlmoeConfig defaults are OLMoE-1B-7B's but for intermediate_size (the published config's 1024).
    "olmoe-1b-7b.yaml": ("OlmoeConfig", dict(intermediate_size=1024)),
    # ibm-granite/granite-3.0-1b-a400m-instruct's config.json as recalled (GraniteMoeConfig's defaults are
    # Llama-2-7B's sizes).
    "granite-3.0-1b-a400m.yaml": ("GraniteMoeConfig", dict(
        vocab_size=49155, hidden_size=1024, intermediate_size=512, num_hidden_layers=24, num_attention_heads=16,
        num_key_value_heads=8, num_local_experts=32, num_experts_per_tok=8, max_position_embeddings=4096,
        rms_norm_eps=1e-6, tie_word_embeddings=True, embedding_multiplier=12.0, residual_multiplier=0.22,
        attention_multiplier=0.015625, logits_scaling=6.0)),
    # deepseek-ai/DeepSeek-V2-Lite's published config.json (DeepseekV2Config's defaults mix V2's and V2-Lite's sizes).
    "deepseek-v2-lite.yaml": ("DeepseekV2Config", DEEPSEEK_V2_LITE := dict(
        vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408, num_hidden_layers=27,
        num_attention_heads=16, num_key_value_heads=16, n_shared_experts=2, n_routed_experts=64, num_experts_per_tok=6,
        routed_scaling_factor=1.0, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=128,
        v_head_dim=128, topk_method="greedy", n_group=1, topk_group=1, first_k_dense_replace=1, norm_topk_prob=False,
        max_position_embeddings=163840, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
                         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707})),
    # transformers' Ernie4_5_MoeConfig defaults are ERNIE-4.5-21B-A3B's sizes (its docstring says so).
    "ernie-4.5-21b-a3b.yaml": ("Ernie4_5_MoeConfig", dict()),
    # rednote-hilab/dots.llm1.base's config.json as recalled (Dots1Config has no defaults for the experts' counts).
    "dots-llm1.yaml": ("Dots1Config", DOTS_LLM1 := dict(
        vocab_size=152064, hidden_size=4096, intermediate_size=10944, moe_intermediate_size=1408, num_hidden_layers=62,
        num_attention_heads=32, num_key_value_heads=32, n_routed_experts=128, n_shared_experts=2, num_experts_per_tok=6,
        first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5, max_position_embeddings=32768,
        rms_norm_eps=1e-5, sliding_window=None, rope_parameters={"rope_type": "default", "rope_theta": 1e7})),
    "flexolmo-7x7b.yaml": ("FlexOlmoConfig", dict()),  # transformers' defaults are FlexOlmo-7x7B-1T's sizes
    "minicpm5-15b-a2.5b.yaml": ("MiniCPM5MoeConfig", dict()),  # transformers' defaults are MiniCPM5-15B-A2.5B's sizes
    "solar-open-100b.yaml": ("SolarOpenConfig", dict()),  # transformers' defaults are Solar-Open-100B's sizes
    "glm-4.7-flash.yaml": ("Glm4MoeLiteConfig", dict()),  # transformers' defaults are GLM-4.7-Flash's sizes
    # transformers' LagunaConfig defaults, which its docstring names as poolside/laguna-XS.2's.
    "laguna-xs.2.yaml": ("LagunaConfig", dict()),
    # transformers' BailingHybridConfig defaults, which its docstring names as inclusionAI/Ling-3.0-Flash's.
    "ling-3.0-flash.yaml": ("BailingHybridConfig", dict()),
    # transformers' Lfm2MoeConfig defaults (LFM2-8B-A1B's sizes) with its 24 layers as recalled (see the spec).
    "lfm2-8b-a1b.yaml": ("Lfm2MoeConfig", dict(num_hidden_layers=24, layer_types=[
        "full_attention" if i in (2, 6, 10, 14, 18, 21) else "conv" for i in range(24)])),
    # transformers' ErgoConfig defaults, which its docstring names as Amazon-FMR/Ergo's.
    "ergo.yaml": ("ErgoConfig", dict()),
}
#: The dense ones: only the reading of their config is checked here.
DENSE_SPECS = {
    "stablelm-2-1.6b.yaml": ("StableLmConfig", dict(
        vocab_size=100352, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24, num_attention_heads=32,
        num_key_value_heads=32, max_position_embeddings=4096, use_qkv_bias=True, tie_word_embeddings=False)),
    # bigcode/starcoder's published config.json (GPTBigCodeConfig's defaults are GPT-2 124M's sizes).
    "starcoder-15.5b.yaml": ("GPTBigCodeConfig", dict(
        vocab_size=49152, n_embd=6144, n_layer=40, n_head=48, n_inner=24576, n_positions=8192, bos_token_id=0,
        eos_token_id=0)),
    "falcon-7b.yaml": ("FalconConfig", dict()),  # transformers' defaults are Falcon-7B's
    "gpt-j-6b.yaml": ("GPTJConfig", dict()),  # transformers' defaults are GPT-J-6B's
    # microsoft/phi-2's published config.json (PhiConfig's defaults are Phi-1's sizes).
    "phi-2.yaml": ("PhiConfig", dict(
        vocab_size=51200, hidden_size=2560, intermediate_size=10240, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, max_position_embeddings=2048, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.4})),
    "smollm3-3b.yaml": ("SmolLM3Config", dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
        num_key_value_heads=4, max_position_embeddings=65536, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 5e6})),
    "gemma-3-1b.yaml": ("Gemma3TextConfig", dict(
        vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, sliding_window=512, max_position_embeddings=32768)),
    "command-r7b.yaml": ("Cohere2Config", dict(
        vocab_size=256000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, logit_scale=0.25, max_position_embeddings=8192, sliding_window=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0})),
    "lfm2-1.2b.yaml": ("Lfm2Config", LFM2_1_2B := dict(
        vocab_size=65536, hidden_size=2048, intermediate_size=12288, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=128000, norm_eps=1e-5, conv_L_cache=3,
        full_attn_idxs=[2, 5, 8, 10, 12, 14])),
    "mamba-codestral-7b.yaml": ("Mamba2Config", dict(max_position_embeddings=4096)),
    # MambaConfig's defaults with mamba-130m's 24 layers; Falcon-Mamba-7B's published sizes over FalconMambaConfig's.
    "mamba-130m.yaml": ("MambaConfig", dict(num_hidden_layers=24, max_position_embeddings=4096)),
    # RWKV/rwkv-4-169m-pile's shape (recalled: hidden 768, 12 layers, vocabulary 50277, context 1024).
    "rwkv-4-169m.yaml": ("RwkvConfig", dict(vocab_size=50277, hidden_size=768, num_hidden_layers=12, context_length=1024)),
    # xLSTMConfig's defaults are NX-AI/xLSTM-7b's sizes (its docstring's checkpoint).
    "xlstm-7b.yaml": ("xLSTMConfig", dict()),
    "falcon-mamba-7b.yaml": ("FalconMambaConfig", dict(
        vocab_size=65024, hidden_size=4096, num_hidden_layers=64, time_step_rank=256, tie_word_embeddings=False,
        max_position_embeddings=4096)),
    "nemotron-h-8b.yaml": ("NemotronHConfig", dict(
        hybrid_override_pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-", max_position_embeddings=8192)),
    "qwen3.5-9b.yaml": ("Qwen3_5TextConfig", dict()),
    "gemma-4-e2b.yaml": ("Gemma4TextConfig", dict(
        vocab_size=262144, hidden_size=1536, intermediate_size=6144, num_hidden_layers=35, num_attention_heads=8,
        num_key_value_heads=1, head_dim=256, global_head_dim=512, sliding_window=512, hidden_size_per_layer_input=256,
        num_kv_shared_layers=20, use_double_wide_mlp=True, final_logit_softcapping=30.0,
        layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 7)),
    "olmo-hybrid-7b.yaml": ("OlmoHybridConfig", dict(rope_parameters={"rope_type": "default", "rope_theta": None})),
    "olmo-3-7b.yaml": ("Olmo3Config", dict(
        vocab_size=100278, max_position_embeddings=65536, rms_norm_eps=1e-6,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 5e5},
                         "full_attention": {"rope_type": "yarn", "rope_theta": 5e5, "factor": 8.0, "beta_fast": 32.0,
                                            "beta_slow": 1.0, "original_max_position_embeddings": 8192,
                                            "attention_factor": 1.2079441541679836}})),
    "exaone-4.0-32b.yaml": ("Exaone4Config", dict(
        hidden_size=5120, intermediate_size=27392, num_hidden_layers=64, num_attention_heads=40, num_key_value_heads=8,
        head_dim=128, max_position_embeddings=131072, sliding_window=4096, sliding_window_pattern="LLLG",
        layer_types=(["sliding_attention"] * 3 + ["full_attention"]) * 16,
        rope_parameters={"rope_type": "llama3", "rope_theta": 1e6, "factor": 16.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
    # transformers' Starcoder2Config defaults are StarCoder2-3B's sizes; context, window and theta as published.
    "starcoder2-3b.yaml": ("Starcoder2Config", dict(
        max_position_embeddings=16384, sliding_window=4096, rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    # Llama under other model_types: transformers' config defaults are these models' sizes.
    "exaone-3.0-7.8b.yaml": ("ExaoneConfig", dict()),
    "internlm3-8b.yaml": ("InternLM3Config", dict()),
    "iquest-coder-40b.yaml": ("IQuestCoderConfig", dict()),
    "command-r-35b.yaml": ("CohereConfig", dict()),  # transformers' defaults are Command R's sizes
    "ernie-4.5-0.3b.yaml": ("Ernie4_5Config", dict()),  # transformers' defaults are ERNIE-4.5-0.3B's sizes
    "helium-1-preview-2b.yaml": ("HeliumConfig", dict()),  # transformers' defaults are helium-1-preview's sizes
    "glm-4-9b.yaml": ("GlmConfig", dict()),  # transformers' defaults are glm-4-9b's sizes
    "glm-4-9b-0414.yaml": ("Glm4Config", dict()),  # transformers' defaults are GLM-4-9B-0414's sizes
    # ibm-granite/granite-3.0-2b-instruct's config.json as recalled (GraniteConfig's defaults are Llama-2-7B's sizes).
    "granite-3.0-2b.yaml": ("GraniteConfig", dict(
        vocab_size=49155, hidden_size=2048, intermediate_size=8192, num_hidden_layers=40, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=True,
        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.015625, logits_scaling=8.0)),
    # transformers' GraniteSWAConfig defaults are granite-swash-2b's sizes (its docstring's checkpoint).
    "granite-swash-2b.yaml": ("GraniteSWAConfig", dict()),
    # transformers' Ministral3Config defaults are Ministral-3-8B's text model (its docstring's checkpoint).
    "ministral-3-8b.yaml": ("Ministral3Config", dict()),
    # transformers' VaultGemmaConfig defaults (Gemma2Config's sizes: no published model's, see the spec).
    "vaultgemma-defaults.yaml": ("VaultGemmaConfig", dict()),
    "minicpm3-4b.yaml": ("MiniCPM3Config", dict()),  # transformers' defaults are MiniCPM3-4B's sizes
    "youtu-llm-2b.yaml": ("YoutuConfig", dict()),  # transformers' defaults are Youtu-LLM-2B's sizes
    # mosaicml/mpt-7b's published config.json (MptConfig's defaults are MPT-1B's sizes).
    "mpt-7b.yaml": ("MptConfig", dict(d_model=4096, n_heads=32, n_layers=32, vocab_size=50432, max_seq_len=2048)),
    "arcee-afm-4.5b.yaml": ("ArceeConfig", dict()),  # transformers' defaults ("AFM-4.5B-Base style")
    "opt-125m.yaml": ("OPTConfig", dict()),  # transformers' defaults are OPT-125M's sizes
    # transformers' NemotronConfig defaults ("nemotron-15b style") with Nemotron-4 15B's 8 key/value heads (its paper).
    "nemotron-4-15b.yaml": ("NemotronConfig", dict(num_key_value_heads=8)),
    "olmo-7b.yaml": ("OlmoConfig", dict()),  # transformers' defaults are OLMo-7B's sizes
    "jais-2-8b.yaml": ("Jais2Config", dict()),  # transformers' defaults are Jais-2-8B's sizes (its docstring's)
    # EleutherAI/gpt-neo-125M's published config.json (GPTNeoConfig's defaults are GPT-Neo 1.3B's sizes).
    "gpt-neo-125m.yaml": ("GPTNeoConfig", dict(
        vocab_size=50257, hidden_size=768, num_layers=12, num_heads=12, attention_types=[[["global", "local"], 6]],
        window_size=256, max_position_embeddings=2048)),
    # Salesforce/codegen-350M-mono's published config.json (CodeGenConfig's defaults are CodeGen-6B's sizes).
    "codegen-350m-mono.yaml": ("CodeGenConfig", dict(
        vocab_size=51200, n_embd=1024, n_layer=20, n_head=16, rotary_dim=32, n_positions=2048)),
    "biogpt.yaml": ("BioGptConfig", dict()),  # transformers' defaults are microsoft/biogpt's sizes
    "xglm-564m.yaml": ("XGLMConfig", dict()),  # transformers' defaults are facebook/xglm-564M's sizes
    "persimmon-8b.yaml": ("PersimmonConfig", dict()),  # transformers' defaults are Persimmon-8B's sizes
    # bigscience/bloom-560m's published config.json (BloomConfig's defaults are tiny test sizes).
    "bloom-560m.yaml": ("BloomConfig", dict(vocab_size=250880, hidden_size=1024, n_layer=24, n_head=16)),
    # transformers' NanoChatConfig defaults (a d12's sizes: no published model's, see the spec).
    "nanochat-defaults.yaml": ("NanoChatConfig", dict()),
    "apertus-defaults.yaml": ("ApertusConfig", dict()),  # transformers' defaults, not a published shape
    "openai-gpt.yaml": ("OpenAIGPTConfig", dict()),  # transformers' defaults are openai-gpt's sizes
    "ctrl.yaml": ("CTRLConfig", dict()),  # transformers' defaults are Salesforce/ctrl's sizes
    # transformers' BitNetConfig defaults (its docstring's BitNet b1.58 2B4T), with online BitLinear quantization.
    "bitnet-b1.58-2b-4t.yaml": ("BitNetConfig", dict(quantization_config={
        "quant_method": "bitnet", "linear_class": "autobitlinear", "quantization_mode": "online"})),
    # transformers' ModernBertDecoderConfig defaults (the 150M Ettin decoder's shape, see the spec).
    "ettin-decoder-150m.yaml": ("ModernBertDecoderConfig", dict()),
    # transformers' defaults are abeja/gpt-neox-japanese-2.7b's sizes (its docstring's checkpoint)
    "gpt-neox-japanese-2.7b.yaml": ("GPTNeoXJapaneseConfig", dict()),
    # transformers' BeamConfig defaults, which its docstring names as reflection/Beam-1.0-501B-A23B's.
    "beam-1.0-501b-a23b.yaml": ("BeamConfig", dict()),
}


#: DBRX's published sizes (see specs/dbrx.yaml), with its rope base where transformers 5 reads it (rope_parameters;
#: the published config.json has it in attn_config only, which transformers 5 ignores).
DBRX = ("DbrxConfig", dict(
    d_model=6144, n_heads=48, n_layers=40, max_seq_len=32768, vocab_size=100352,
    rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    attn_config={"clip_qkv": 8, "kv_n_heads": 8, "rope_theta": 500000.0},
    ffn_config={"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4, "moe_jitter_eps": 0.0,
                "moe_loss_weight": 0.05, "moe_normalize_expert_weights": 1.0}))
#: JetMoE-8B: transformers' JetMoeConfig defaults (its docstring names jetmoe/jetmoe-8b) with the published 24 layers.
JETMOE = ("JetMoeConfig", dict(num_hidden_layers=24))
#: Mixtures whose experts transformers keeps as flat or stacked matrices (no module per expert): their spec -> config.
FLAT_EXPERT_SPECS = {"dbrx.yaml": DBRX, "jetmoe-8b.yaml": JETMOE}


def test_dbrx_active_parameters_match_transformers():
    import transformers

    config_class, fields = DBRX
    config = getattr(transformers, config_class)(**fields)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in hf.parameters())
    ffn = config.ffn_config
    # w1, v1 and w2 each hold (n_experts * ffn_hidden_size, d_model): a token leaves n_experts - top_k of them idle.
    idle = len(hf.transformer.blocks) * (ffn.moe_num_experts - ffn.moe_top_k) * 3 * ffn.ffn_hidden_size * config.d_model
    summary = specformer.summarize(SPECS / "dbrx.yaml")
    assert (summary.total, summary.active) == (total, total - idle)


def test_jetmoe_active_parameters_match_transformers():
    import transformers

    config_class, fields = JETMOE
    config = getattr(transformers, config_class)(**fields)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in hf.parameters())
    idle = 0
    for layer in hf.model.layers:
        # Both mixtures stack their experts (experts, out, in): a token leaves n_experts - top_k of each idle.
        for mixture in (layer.mlp, layer.self_attention.experts):
            per_expert = (mixture.input_linear.weight.numel() + mixture.output_linear.weight.numel()) // config.num_local_experts
            idle += (config.num_local_experts - config.num_experts_per_tok) * per_expert
    summary = specformer.summarize(SPECS / "jetmoe-8b.yaml")
    assert (summary.total, summary.active) == (total, total - idle)


@pytest.mark.parametrize("name", sorted(MOE_SPECS))
def test_active_parameters_match_transformers(name):
    import transformers

    config_class, fields = MOE_SPECS[name]
    config = getattr(transformers, config_class)(**fields)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config)
    # Frozen parameters (ERNIE 4.5 MoE's e_score_correction_bias, requires_grad False) are buffers in specformer.
    total = sum(p.numel() for p in hf.parameters() if p.requires_grad)
    idle = 0
    for layer in hf.model.layers:
        # Llama 4 names it feed_forward, Granite MoE block_sparse_moe
        ffn = next(getattr(layer, name) for name in ("mlp", "feed_forward", "block_sparse_moe") if hasattr(layer, name))
        experts = getattr(ffn, "experts", None)
        if experts is None:
            continue  # a dense layer
        n_experts = (getattr(config, "num_experts", None) or getattr(config, "n_routed_experts", None)
                     or config.num_local_experts)
        per_expert = sum(p.numel() for p in experts.parameters()) // n_experts  # biases included (gpt-oss)
        idle += (n_experts - config.num_experts_per_tok) * per_expert
    summary = specformer.summarize(SPECS / name)
    assert summary.total == total
    assert summary.active == total - idle


def test_llama_4_scout_chunked_layers_cache_only_their_chunk():
    """36 chunked layers keep 8192 tokens at most, the 12 global ones the whole context: 8 kv heads x 128 x (k, v)."""
    summary = specformer.summarize(SPECS / "llama-4-scout-17b-16e.yaml")
    per_token_bf16 = 8 * 128 * 2 * 2
    assert summary.kv_bytes_per_token(torch.bfloat16) == 48 * per_token_bf16
    assert summary.kv_bytes_at_context(torch.bfloat16) == (36 * 8192 + 12 * 131072) * per_token_bf16


@pytest.mark.parametrize("name", sorted({**MOE_SPECS, **DENSE_SPECS, **FLAT_EXPERT_SPECS}))
def test_the_spec_is_what_importing_its_config_gives(name):
    """The hand-written spec and the family's reading of the same config build the same maths."""
    from specformer_hf.config import ConfigReader
    from specformer_hf.family import get_families
    from specformer_hf.specview import differences, math_view

    import transformers

    config_class, fields = {**MOE_SPECS, **DENSE_SPECS, **FLAT_EXPERT_SPECS}[name]
    config = getattr(transformers, config_class)(**fields).to_dict()
    family = get_families().get(config["model_type"])
    read = family.to_spec(ConfigReader(config, defaults=family.defaults, family=family.name))
    # The specs leave out the MTP depths a config counts (num_nextn_predict_layers), as transformers' model that their
    # parameters are counted against does; import reads them only from a file holding them (test_mtp_import.py).
    read.pop("mtp", None)
    ours = yaml.safe_load((SPECS / name).read_text())
    assert differences(math_view(specformer.load_spec(ours)), math_view(specformer.load_spec({"model": read}))) == []


#: LiquidAI/LFM2-1.2B's config.json as published, in the first configs' spelling (block_ff_dim, full_attn_idxs,
#: tie_embedding, rope_theta) with the duplicate fields transformers never reads (block_dim, conv_dim, num_heads, ...).
LFM2_1_2B_PUBLISHED = {
    "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "vocab_size": 65536, "hidden_size": 2048,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_heads": 32, "num_key_value_heads": 8,
    "max_position_embeddings": 128000, "norm_eps": 1e-05, "block_norm_eps": 1e-05, "conv_bias": False,
    "conv_L_cache": 3, "conv_dim": 2048, "conv_dim_out": 2048, "conv_use_xavier_init": True, "block_dim": 2048,
    "block_ff_dim": 12288, "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": True,
    "block_use_swiglu": True, "block_use_xavier_init": True, "block_mlp_init_scale": 1.0, "block_out_init_scale": 1.0,
    "full_attn_idxs": [2, 5, 8, 10, 12, 14], "rope_theta": 1000000.0, "tie_embedding": True, "initializer_range": 0.02,
    "use_cache": True, "bos_token_id": 1, "eos_token_id": 7, "pad_token_id": 0,
}


def test_the_published_lfm2_config_reads_to_the_spec_and_its_parameter_count():
    """The hand-written LFM2 1.2B spec: what the published config.json (old spelling) reads to, every field understood,
    with as many parameters as transformers' Lfm2ForCausalLM of that config (meta device, no memory)."""
    import warnings

    import transformers

# --- hybrid: Falcon-H1, Granite 4.0-H, Jamba, RecurrentGemma ---

#: spec file -> (transformers config class, the spec's model as its config fields).
HYBRID_SPECS = {
    # transformers' Lfm3Config defaults, which its docstring names as LiquidAI/LFM3-1.7B's.
    "lfm3-1.7b.yaml": ("Lfm3Config", {}),
    "granite-4.0-h-tiny.yaml": ("GraniteMoeHybridConfig", dict(
        vocab_size=100352, hidden_size=1536, num_hidden_layers=40, num_attention_heads=12, num_key_value_heads=4,
        intermediate_size=512, shared_intermediate_size=1024, num_local_experts=64, num_experts_per_tok=6,
        max_position_embeddings=131072, tie_word_embeddings=True, rms_norm_eps=1e-5, position_embedding_type="nope",
        layer_types=(["mamba"] * 5 + ["attention"] + ["mamba"] * 4) * 4, mamba_n_heads=48, mamba_d_head=64,
        mamba_d_state=128, mamba_n_groups=1, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=256,
        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125, logits_scaling=6.0)),
    "falcon-h1-0.5b.yaml": ("FalconH1Config", dict(
        vocab_size=32784, hidden_size=1024, intermediate_size=2048, num_hidden_layers=36, num_attention_heads=8,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=16384, tie_word_embeddings=False, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1e11}, mamba_d_ssm=1536, mamba_n_heads=24,
        mamba_d_head=64, mamba_d_state=128, mamba_n_groups=1, mamba_d_conv=4, mamba_chunk_size=128,
        mamba_rms_norm=False, mamba_norm_before_gate=False, embedding_multiplier=5.656854249492381,
        lm_head_multiplier=0.0390625, key_multiplier=0.39062499999999994, attention_in_multiplier=1.0,
        attention_out_multiplier=0.9375, ssm_in_multiplier=1.25, ssm_out_multiplier=0.23570226039551587,
        mlp_multipliers=[0.8838834764831844, 0.5859375],
        ssm_multipliers=[0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738])),
    # transformers' JambaConfig defaults, which describe ai21labs/Jamba-v0.1 (its docstring's checkpoint).
    "jamba-v0.1.yaml": ("JambaConfig", dict()),
    # RecurrentGemmaConfig's defaults with recurrentgemma-2b's MLP (15360, halved by transformers) and one kv head.
    "recurrentgemma-2b.yaml": ("RecurrentGemmaConfig", dict(intermediate_size=15360, num_key_value_heads=1)),
    # transformers' Zamba2Config defaults (its docstring's Zyphra/Zamba2-2.7B) with the published num_mem_blocks 2 and
    # mamba_headdim 64 (80 heads): Zyphra/Zamba2's config.json and mamba_config.py.
    "zamba2-2.7b.yaml": ("Zamba2Config", dict(n_mamba_heads=80, num_mem_blocks=2)),
}


@pytest.mark.parametrize("name", sorted(HYBRID_SPECS))
def test_hybrid_total_and_active_parameters_match_transformers(name):
    """Totals against the transformers model on the meta device; active: less the experts a token does not use."""
    import transformers

    config_class, fields = HYBRID_SPECS[name]
    config = getattr(transformers, config_class)(**fields)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config)
    # Frozen parameters (ERNIE 4.5 MoE's e_score_correction_bias, requires_grad False) are buffers in specformer.
    total = sum(p.numel() for p in hf.parameters() if p.requires_grad)
    idle = 0
    for layer in hf.model.layers:
        moe = getattr(layer, "block_sparse_moe", None)  # Granite's routed experts (Falcon-H1 has none)
        if moe is None and hasattr(getattr(layer, "feed_forward", None), "experts"):
            moe = layer.feed_forward  # Jamba's, in its expert layers only
        if moe is not None:
            per_expert = sum(p.numel() for p in moe.experts.parameters()) // config.num_local_experts
            idle += (config.num_local_experts - config.num_experts_per_tok) * per_expert
    summary = specformer.summarize(SPECS / name)
    assert summary.total == total
    assert summary.active == total - idle


def test_the_published_lfm2_config_reads_to_the_spec_and_its_parameter_count():
    """The hand-written LFM2 1.2B spec: what the published config.json (old spelling) reads to, every field understood,
    with as many parameters as transformers' Lfm2ForCausalLM of that config (meta device, no memory)."""
    import warnings

    import transformers

    from specformer_hf.config import ConfigReader
    from specformer_hf.family import get_families
    from specformer_hf.specview import differences, math_view

    family = get_families().get("lfm2")
    reader = ConfigReader(LFM2_1_2B_PUBLISHED, defaults=family.defaults, family=family.name)
    read = family.to_spec(reader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reader.warn_unread(also_harmless=family.non_math_fields) == []
    ours = yaml.safe_load((SPECS / "lfm2-1.2b.yaml").read_text())
    assert differences(math_view(specformer.load_spec(ours)), math_view(specformer.load_spec({"model": read}))) == []
    published = {k: v for k, v in LFM2_1_2B_PUBLISHED.items() if k not in ("architectures", "model_type")}
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(transformers.Lfm2Config(**published))
    assert specformer.summarize(SPECS / "lfm2-1.2b.yaml").total == sum(p.numel() for p in hf.parameters()) == 1_170_340_608


@pytest.mark.parametrize("name", sorted(HYBRID_SPECS))
def test_the_hybrid_spec_is_what_importing_its_config_gives(name):
    from specformer_hf.config import ConfigReader
    from specformer_hf.family import get_families
    from specformer_hf.specview import differences, math_view

    import transformers

    config_class, fields = HYBRID_SPECS[name]
    config = getattr(transformers, config_class)(**fields).to_dict()
    family = get_families().get(config["model_type"])
    read = family.to_spec(ConfigReader(config, defaults=family.defaults, family=family.name))
    ours = yaml.safe_load((SPECS / name).read_text())
    assert differences(math_view(specformer.load_spec(ours)), math_view(specformer.load_spec({"model": read}))) == []


#: microsoft/phi-2's config.json as published (transformers 4.37: partial_rotary_factor and rope_theta at the top level).
PHI_2_PUBLISHED = {
    "_name_or_path": "microsoft/phi-2", "architectures": ["PhiForCausalLM"], "attention_dropout": 0.0,
    "bos_token_id": 50256, "embd_pdrop": 0.0, "eos_token_id": 50256, "hidden_act": "gelu_new", "hidden_size": 2560,
    "initializer_range": 0.02, "intermediate_size": 10240, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
    "model_type": "phi", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "partial_rotary_factor": 0.4, "qk_layernorm": False, "resid_pdrop": 0.1, "rope_scaling": None,
    "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.37.0",
    "use_cache": True, "vocab_size": 51200,
}


def test_the_published_phi_2_config_reads_to_the_spec_and_its_parameter_count():
    """Phi-2's top-level partial_rotary_factor (0.4, not the class default 0.5) is read, every field understood."""
    import warnings

    from specformer_hf.config import ConfigReader
    from specformer_hf.family import get_families
    from specformer_hf.specview import differences, math_view

    family = get_families().get("phi")
    reader = ConfigReader(PHI_2_PUBLISHED, defaults=family.defaults, family=family.name)
    read = family.to_spec(reader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reader.warn_unread(also_harmless=family.non_math_fields) == []
    assert read["positional"]["fraction"] == 0.4
    ours = yaml.safe_load((SPECS / "phi-2.yaml").read_text())
    assert differences(math_view(specformer.load_spec(ours)), math_view(specformer.load_spec({"model": read}))) == []
    assert specformer.summarize(SPECS / "phi-2.yaml").total == 2_779_683_840


def test_a_tied_phi_head_is_refused_naming_its_bias():
    from specformer.errors import UserError
    from specformer_hf.config import ConfigReader
    from specformer_hf.family import get_families

    family = get_families().get("phi")
    with pytest.raises(UserError, match=r"'tie_word_embeddings' = True is not supported: Phi's LM head has a bias"):
        family.to_spec(ConfigReader({**PHI_2_PUBLISHED, "tie_word_embeddings": True}, defaults=family.defaults,
                                    family=family.name))
