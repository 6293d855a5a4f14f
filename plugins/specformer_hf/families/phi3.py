"""Phi-3 (``model_type: phi3``): Llama-like blocks with fused qkv and gate_up projections, LongRoPE, sliding window."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.parts.base import ATTN, BLOCK_MIXER, MLP, FamilyView, Value
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.norms import Layout
from specformer_hf.parts.positions import Rope
from specformer_hf.rules import Copy

#: transformers' Phi3Config defaults.
DEFAULTS = {
    "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 4096,
    "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "sliding_window": None, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


@dataclass(frozen=True)
class LongRope(Rope):
    """Rope (default or longrope, partial) with Phi-3's history: "su" and "yarn" meant longrope, and a top-level
    original_max_position_embeddings is LongRoPE's original context."""

    rope_types: tuple[str, ...] = ("default", "longrope")
    partial: bool = True
    original_override: str | None = "original_max_position_embeddings"

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        cfg.mark_read("original_max_position_embeddings")
        for key in ("rope_scaling", "rope_parameters"):  # the legacy field wins when both are there
            params = cfg.data.get(key)
            if isinstance(params, dict):
                if params.get("rope_type", params.get("type")) in ("su", "yarn"):
                    # transformers reads Phi-3's old "su" and "yarn" as longrope (Phi3Config.convert_rope_params_to_dict).
                    cfg.data[key] = {**{k: v for k, v in params.items() if k != "type"}, "rope_type": "longrope"}
                break
        super().read(cfg, model)
        scaling = model["positional"].get("scaling")
        if isinstance(scaling, dict) and scaling.get("kind") == "longrope":
            scaling["reencode"] = True  # Phi3ForCausalLM.generate drops its cache at the switch; we encode again

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        scaling = view.positional.get("scaling") or {}
        # transformers takes LongRoPE's original context from this top-level field when it is there.
        config["original_max_position_embeddings"] = scaling.get("original_context_length") or view.model.context_length


FAMILY = decoder_family(
    name="Phi-3",
    model_type="phi3",
    architecture="Phi3ForCausalLM",
    defaults=DEFAULTS,
    # Phi3Config has no head_dim field, but the attention reads one if config.json has it (Attention does).
    parts=[*replace_part(LLAMA_PARTS, LongRope(), instead_of=Rope), Value("sliding_window", "mixer.window")],
    rules=[
        *Sizes().rules(),
        *Layout("prenorm").rules(),
        # qkv_proj rows are [q; k; v] and gate_up_proj rows [gate; up]: our fused layouts exactly.
        Copy(f"{ATTN}.qkv_proj.weight", f"{BLOCK_MIXER}.qkv.weight"),
        Copy(f"{ATTN}.o_proj.weight", f"{BLOCK_MIXER}.out.weight"),
        Copy(f"{MLP}.gate_up_proj.weight", "blocks.{i}.ffn.gate_up.weight"),
        Copy(f"{MLP}.down_proj.weight", "blocks.{i}.ffn.down.weight"),
    ],
    maps="fused qkv_proj and gate_up_proj copied as is, rope (default or longrope, partial_rotary_factor), "
         "sliding_window on every layer",
    caveats="original_max_position_embeddings (top level) is LongRoPE's original context, as in transformers",
)
