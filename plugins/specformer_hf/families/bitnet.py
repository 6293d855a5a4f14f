"""BitNet (``model_type: bitnet``, microsoft/bitnet-b1.58-2B-4T): Llama's pre-norm blocks with squared-ReLU gated
MLPs and two sub-layer RMSNorms, attn_sub_norm before o_proj and ffn_sub_norm before down_proj (Ma et al. 2024)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_hf.config import ConfigReader
from specformer.errors import UserError
from specformer_hf.parts.base import BLOCK_MIXER, LAYER, FamilyView, Part, Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family
from specformer_hf.rules import Copy, Rule
from specformer_hf.specview import NotExpressible

#: transformers' BitNetConfig defaults (bitnet-b1.58-2B-4T's sizes; its rope theta 500000).
DEFAULTS = {
    "vocab_size": 128256, "hidden_size": 2560, "intermediate_size": 6912, "num_hidden_layers": 30,
    "num_attention_heads": 20, "num_key_value_heads": 5, "hidden_act": "relu2", "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
}

#: The quantization_config of a BitNet trained online: float latent weights, quantised in every forward.
ONLINE = {"quant_method": "bitnet", "linear_class": "autobitlinear", "quantization_mode": "online"}


@dataclass(frozen=True)
class SubNorms(Part):
    """attn_sub_norm <-> attention ``out_norm``, ffn_sub_norm <-> the gated MLP's ``inner_norm`` (RMSNorms of eps
    rms_norm_eps, the block norms')."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        norm = {"kind": "rmsnorm", "eps": cfg.get_float("rms_norm_eps")}
        block = model.setdefault("block", {})
        block.setdefault("mixer", {})["out_norm"] = dict(norm)
        block.setdefault("ffn", {})["inner_norm"] = dict(norm)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        eps = config.get("rms_norm_eps")
        for path, hf in (("mixer.out_norm", "attn_sub_norm"), ("ffn.inner_norm", "ffn_sub_norm")):
            norm = view.get(path)
            if norm is None or norm.get("kind") != "rmsnorm" or not norm.get("weight", True) \
                    or norm.get("offset", 0.0) or norm.get("eps") != eps:
                raise NotExpressible(f"model.block.{path}", f"Hugging Face {view.name} has {hf}, an RMSNorm with a "
                                                            f"weight whose eps is rms_norm_eps ({eps}): "
                                                            f"{{kind: rmsnorm, eps: {eps}}}")

    def rules(self) -> list[Rule]:
        return [Copy(f"{LAYER}.self_attn.attn_sub_norm.weight", f"{BLOCK_MIXER}.out_norm.weight"),
                Copy(f"{LAYER}.mlp.ffn_sub_norm.weight", "blocks.{i}.ffn.inner_norm.weight")]


@dataclass(frozen=True)
class Ternary(Part):
    """quantization_config online autobitlinear <-> ``linear: bitlinear`` on attention and the MLP; none: float
    projections (what BitNetForCausalLM builds from a config alone). Packed offline checkpoints are refused."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        quant = cfg.get("quantization_config", None)
        if quant is None:
            return
        seen = {key: quant.get(key) for key in ONLINE}
        extra = {key: quant.get(key) for key in ("use_rms_norm",) if quant.get(key)}
        if seen != ONLINE or extra:
            raise UserError(f"{cfg.family}: quantization_config {dict(quant)} is not imported: only BitNet's online "
                            f"training form {ONLINE} (float latent weights, quantised each forward: linear: "
                            f"bitlinear) is; the offline form of bitnet-b1.58-2B-4T (weights packed 2 bits a value "
                            f"with a weight_scale) is not supported yet")
        block = model.setdefault("block", {})
        block.setdefault("mixer", {})["linear"] = "bitlinear"
        block.setdefault("ffn", {})["linear"] = "bitlinear"

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        linears = {view.get("mixer.linear") is not None, view.get("ffn.linear") is not None}
        if linears == {False}:
            return
        for path in ("mixer.linear", "ffn.linear"):
            ref = view.get(path)
            kind = ref if isinstance(ref, str) else (ref or {}).get("kind")
            extra = {} if isinstance(ref, str) or ref is None else {k: v for k, v in ref.items() if k != "kind"}
            if kind != "bitlinear" or extra not in ({}, {"eps": 1e-5}):
                raise NotExpressible(f"model.block.{path}", f"Hugging Face {view.name}'s projections are all float "
                                                            f"or all bitlinear (eps 1e-5), attention and MLP alike")
        config["quantization_config"] = dict(ONLINE)


FAMILY = decoder_family(
    name="BitNet",
    model_type="bitnet",
    architecture="BitNetForCausalLM",
    defaults=DEFAULTS,
    parts=[*LLAMA_PARTS, Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")), SubNorms(), Ternary()],
    maps="as Llama (prenorm RMSNorm, rope, GQA, gated MLP, here relu2) with attn_sub_norm -> attention out_norm and "
         "ffn_sub_norm -> the MLP's inner_norm, attention_bias -> q/k/v/o biases; quantization_config online autobitlinear -> linear: bitlinear",
    caveats="the packed offline checkpoints (bitnet-b1.58-2B-4T's 2-bit weights with weight_scale) are refused; "
            "without a quantization_config the projections are float, as BitNetForCausalLM builds them",
)
