"""EXAONE 3 and 3.5 (``model_type: exaone``): transformers runs them as Llama; the checkpoints keep their own tensor
names (``transformer.h.{i}.attn.attention.q_proj``, ``mlp.c_fc_0``, ...) and config.json may spell three fields
otherwise (num_layers, layer_norm_epsilon, activation_function)."""

from __future__ import annotations

from specformer_hf.families import llama
from specformer_hf.parts.base import BLOCK_MIXER, SavedNames, Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family
from specformer_hf.rules import Copy, Fused, halves, qkv_sizes

#: transformers' ExaoneConfig defaults (EXAONE-3.0-7.8B's sizes): LlamaConfig's, with these changed.
DEFAULTS = {
    **llama.DEFAULTS, "vocab_size": 102400, "intermediate_size": 14336, "num_key_value_heads": 8,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
}

#: ExaoneConfig's attribute_map: the published config.json files use the first names.
SAVED_NAMES = (("num_layers", "num_hidden_layers"), ("layer_norm_epsilon", "rms_norm_eps"),
               ("activation_function", "hidden_act"))

LAYER = "transformer.h.{i}"
ATTN = f"{LAYER}.attn.attention"

#: The tensors as transformers saves them (it renames them to Llama's in memory, and back on save_pretrained).
RULES = [
    Copy("transformer.wte.weight", "embedding.weight"),
    Copy("transformer.ln_f.weight", "final_norm.weight"),
    Copy("lm_head.weight", "lm_head.weight"),
    Copy(f"{LAYER}.ln_1.weight", "blocks.{i}.attention_norm.weight"),
    Copy(f"{LAYER}.ln_2.weight", "blocks.{i}.ffn_norm.weight"),
    *(Fused([f"{ATTN}.q_proj.{p}", f"{ATTN}.k_proj.{p}", f"{ATTN}.v_proj.{p}"], f"{BLOCK_MIXER}.qkv.{p}",
            sizes=qkv_sizes) for p in ("weight", "bias")),
    *(Copy(f"{ATTN}.out_proj.{p}", f"{BLOCK_MIXER}.out.{p}") for p in ("weight", "bias")),
    *(Fused([f"{LAYER}.mlp.c_fc_0.{p}", f"{LAYER}.mlp.c_fc_1.{p}"], f"blocks.{{i}}.ffn.gate_up.{p}", sizes=halves)
      for p in ("weight", "bias")),
    *(Copy(f"{LAYER}.mlp.c_proj.{p}", f"blocks.{{i}}.ffn.down.{p}") for p in ("weight", "bias")),
]

FAMILY = decoder_family(
    name="EXAONE 3",
    model_type="exaone",
    architecture="LlamaForCausalLM",
    defaults=DEFAULTS,
    parts=[
        SavedNames(SAVED_NAMES),
        *LLAMA_PARTS,
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        Switch("mlp_bias", ("ffn.bias",)),
    ],
    rules=RULES,
    ignore_tensors=(r"transformer\.h\.\d+\.attn\.attention\.rotary_emb\.inv_freq",),
    maps="as Llama (transformers builds LlamaForCausalLM); num_layers, layer_norm_epsilon, activation_function read as "
         "num_hidden_layers, rms_norm_eps, hidden_act; the tensors under EXAONE's names (transformer.wte, "
         "transformer.h.{i}.attn.attention.{q,k,v,out}_proj, ln_1, ln_2, mlp.c_fc_0 / c_fc_1 / c_proj, transformer.ln_f)",
    caveats="export writes Llama's field names and EXAONE's tensor names, as transformers' save_pretrained does; the "
            "default rope theta is 5e5",
)
