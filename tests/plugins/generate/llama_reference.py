"""A Hugging Face ``LlamaForCausalLM`` holding the same weights as a specformer Llama-style model.

The specformer side fuses projections: attention's ``qkv`` rows are ``[q; k; v]`` and the
gated FFN's ``gate_up`` rows are ``[gate; up]``; transformers keeps them apart. Norm
weights, the embedding and the (tied) head copy over as they are.
"""

from __future__ import annotations

from typing import Any

import torch
from fixtures.tiny import tiny_spec

LLAMA_SPEC: dict[str, Any] = tiny_spec(
    d_model=64, context_length=128,
    # untied head, wide init: greedy output varies (a tied random model repeats its last token)
    tie_embeddings=False, init_std=0.2,
    positional={"kind": "rope", "theta": 10000.0},
    block={"layout": "prenorm", "norm": {"kind": "rmsnorm", "eps": 1e-5}, "ffn": {"kind": "swiglu", "hidden": 96}},
)


def hf_llama_from(model: Any) -> Any:
    """``LlamaForCausalLM`` with ``model``'s weights (a rope + rmsnorm + swiglu + prenorm specformer model)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = model.spec.model
    attention = model.blocks[0].mixer
    ffn = model.blocks[0].ffn
    theta = spec.positional.as_dict().get("theta", 10000.0)
    config = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.d_model,
        intermediate_size=ffn.hidden,
        num_hidden_layers=spec.n_layers,
        num_attention_heads=attention.n_heads,
        num_key_value_heads=attention.n_kv_heads,
        head_dim=attention.head_dim,
        max_position_embeddings=spec.context_length,
        rms_norm_eps=model.blocks[0].attention_norm.eps,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        tie_word_embeddings=spec.tie_embeddings,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    hf = LlamaForCausalLM(config).to(dtype=next(model.parameters()).dtype).eval()
    H, KV, hd = attention.n_heads, attention.n_kv_heads, attention.head_dim
    with torch.no_grad():
        hf.model.embed_tokens.weight.copy_(model.embedding.weight[: spec.vocab_size])
        for ours, theirs in zip(model.blocks, hf.model.layers):
            q, k, v = ours.mixer.qkv.weight.split((H * hd, KV * hd, KV * hd), dim=0)
            theirs.self_attn.q_proj.weight.copy_(q)
            theirs.self_attn.k_proj.weight.copy_(k)
            theirs.self_attn.v_proj.weight.copy_(v)
            theirs.self_attn.o_proj.weight.copy_(ours.mixer.out.weight)
            gate, up = ours.ffn.gate_up.weight.chunk(2, dim=0)
            theirs.mlp.gate_proj.weight.copy_(gate)
            theirs.mlp.up_proj.weight.copy_(up)
            theirs.mlp.down_proj.weight.copy_(ours.ffn.down.weight)
            theirs.input_layernorm.weight.copy_(ours.attention_norm.weight)
            theirs.post_attention_layernorm.weight.copy_(ours.ffn_norm.weight)
        hf.model.norm.weight.copy_(model.final_norm.weight)
        if not spec.tie_embeddings:
            hf.lm_head.weight.copy_(model.lm_head.weight[: spec.vocab_size])
    hf.generation_config.eos_token_id = None
    hf.generation_config.bos_token_id = None
    hf.generation_config.pad_token_id = None
    return hf
