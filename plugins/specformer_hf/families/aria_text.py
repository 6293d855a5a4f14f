"""Aria text (``model_type: aria_text``, the language model of rhymes-ai/Aria): Llama's attention with a mixture of
experts in every layer beside always-on shared experts.

The router (``mlp.router``, no bias) picks the top ``moe_topk`` of ``moe_num_experts`` experts
by their logits and weighs them by the softmax of those logits alone: the softmax over every
expert renormalised over the chosen ones (``routing: softmax_then_topk``, ``normalize_topk``).
The routed experts are SiLU-gated, ``intermediate_size`` wide, and stored transposed as
``experts.fc1`` (n_experts, d_model, [gate | up]) and ``experts.fc2`` (n_experts, hidden,
d_model) (transformers reads them as ``gate_up_proj`` and ``down_proj``); the
``moe_num_shared_experts`` shared experts are one gated MLP ``moe_num_shared_experts *
intermediate_size`` wide (``mlp.shared_experts``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.parts.base import MLP, FamilyView, Part, Refuse, Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.feedforward import GatedFFN, shared_halves
from specformer_hf.rules import Copy, Fused, OneOf, Rule, TransposedExperts
from specformer_hf.specview import NotExpressible
from specformer_layers import default_gated_hidden

#: transformers' AriaTextConfig defaults (LlamaConfig's with Aria's experts; they describe no published model).
DEFAULTS = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
    "mlp_bias": False, "moe_num_experts": 8, "moe_topk": 2, "moe_num_shared_experts": 2,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


@dataclass(frozen=True)
class AriaExperts(Part):
    """moe_num_experts, moe_topk, intermediate_size, moe_num_shared_experts <-> ffn moe (softmax over the chosen
    experts' logits) with moe_num_shared_experts * intermediate_size of always-on shared experts."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        # The routed experts are always SiLU-gated; hidden_act is the shared experts' (one activation here).
        cfg.require("hidden_act", ("silu",), why="Aria's routed experts are SiLU-gated whatever it says, and specformer's "
                                                 "shared experts use the routed experts' activation")
        ffn: dict[str, Any] = {
            "kind": "moe", "n_experts": cfg.get_size("moe_num_experts"), "top_k": cfg.get_size("moe_topk"),
            "hidden": cfg.get_size("intermediate_size"), "activation": "silu", "gated": True,
            "routing": "softmax_then_topk", "normalize_topk": True, "aux_loss_coef": 0.0,
        }
        n_shared = cfg.get_int("moe_num_shared_experts")
        if n_shared:
            ffn["n_shared_experts"] = n_shared
        model.setdefault("block", {})["ffn"] = ffn

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("ffn", ("moe",))
        ffn = view.uniform("ffn")
        wanted = {"activation": "silu", "gated": True, "routing": "softmax_then_topk", "normalize_topk": True,
                  "router": None, "expert_bias": False, "swiglu_limit": None, "shared_gate": False}
        for key, value in wanted.items():
            if ffn.get(key, value) != value:
                raise NotExpressible(f"model.block.ffn.{key}", f"{ffn.get(key)!r}: Hugging Face {view.name} has {value!r}")
        hidden = ffn["hidden"] or default_gated_hidden(view.model.d_model)
        n_shared = ffn.get("n_shared_experts") or 0
        if n_shared and (ffn.get("shared_hidden") or hidden * n_shared) != hidden * n_shared:
            raise NotExpressible("model.block.ffn.shared_hidden", f"Hugging Face {view.name}'s shared experts are "
                                 "n_shared_experts * hidden wide")
        config.update(moe_num_experts=ffn["n_experts"], moe_topk=ffn["top_k"], intermediate_size=hidden,
                      moe_num_shared_experts=n_shared, hidden_act="silu")

    def rules(self) -> list[Rule]:
        experts = f"{MLP}.experts"
        return [
            Copy(f"{MLP}.router.weight", "blocks.{i}.ffn.router.weight"),
            # save_pretrained writes the checkpoints' fc1 / fc2 names back; a file saved as in memory is read too
            OneOf(TransposedExperts(f"{experts}.fc1.weight", "blocks.{i}.ffn.experts_in"),
                  TransposedExperts(f"{experts}.gate_up_proj", "blocks.{i}.ffn.experts_in")),
            OneOf(TransposedExperts(f"{experts}.fc2.weight", "blocks.{i}.ffn.experts_out"),
                  TransposedExperts(f"{experts}.down_proj", "blocks.{i}.ffn.experts_out")),
            Fused([f"{MLP}.shared_experts.gate_proj.weight", f"{MLP}.shared_experts.up_proj.weight"],
                  "blocks.{i}.ffn.shared.gate_up.weight", sizes=shared_halves),
            Copy(f"{MLP}.shared_experts.down_proj.weight", "blocks.{i}.ffn.shared.down.weight"),
        ]


FAMILY = decoder_family(
    name="Aria (text)",
    model_type="aria_text",
    architecture="AriaTextForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *replace_part(LLAMA_PARTS, AriaExperts(), instead_of=GatedFFN),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        Refuse("mlp_bias", (False,), why="it puts biases on the shared experts, which specformer's have not"),
    ],
    maps="as Llama (prenorm RMSNorm, rope, grouped-query attention, head_dim, attention_bias) with ffn moe in every "
         "layer: moe_num_experts, moe_topk (softmax over the chosen experts' logits: softmax_then_topk renormalised), "
         "intermediate_size, router -> router, experts fc1 / fc2 (transposed), moe_num_shared_experts shared experts "
         "moe_num_shared_experts * intermediate_size wide",
    caveats="text only (the aria multimodal checkpoint is not read); hidden_act must be silu and mlp_bias false",
)
