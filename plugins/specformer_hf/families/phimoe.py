"""PhiMoE (``model_type: phimoe``, Phi-3.5-MoE): Mixtral's blocks with LayerNorms (with biases), attention and LM head
biases as switched, and SparseMixer's top-2 router.

The router (transformers' ``sparsemixer`` at inference) is our ``sparsemixer`` with
``router_jitter_noise`` as its ``jitter_eps``. Checkpoints keep the experts as Mixtral's
(``block_sparse_moe.gate``, ``experts.j.w1/w3/w2``); transformers 5's modules hold them as
``mlp.router`` and the fused ``mlp.experts`` tensors. Both are read; the checkpoint's are written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from specformer_hf.parts.attention import Attention
from specformer_hf.parts.base import LAYER, MLP, FamilyView, Part, Switch, Value
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes, model_sizes, model_sizes_config
from specformer_hf.parts.feedforward import expert_rules
from specformer_hf.parts.norms import LayerNorm, Layout
from specformer_hf.parts.positions import Rope
from specformer_hf.rules import Copy, OneOf, Rule
from specformer_hf.specview import NotExpressible

#: transformers' PhimoeConfig defaults.
DEFAULTS = {
    "vocab_size": 32064, "hidden_size": 4096, "intermediate_size": 6400, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_act": "silu", "max_position_embeddings": 4096 * 32,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "sliding_window": None, "num_experts_per_tok": 2,
    "num_local_experts": 16, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.01, "input_jitter_noise": 0.0,
    "attention_bias": False, "lm_head_bias": False, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
}


@dataclass(frozen=True)
class HeadBiasSizes(Part):
    """Sizes, and lm_head_bias <-> the LM head's bias (PhimoeForCausalLM gives its head one even when tied)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model.update(model_sizes(cfg), lm_head_bias=bool(cfg.get("lm_head_bias")))

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        config.update(model_sizes_config(view.view), lm_head_bias=bool(view.model.lm_head_bias))

    def rules(self) -> list[Rule]:
        # Untied, the bias is our head's own; tied, a separate module beside the shared weight (head_bias).
        return [*Sizes().rules(), Copy("lm_head.bias", "lm_head.bias"), Copy("lm_head.bias", "head_bias.bias")]


@dataclass(frozen=True)
class PhimoeRope(Rope):
    """rope_parameters <-> rope, default or longrope as PhiMoE's rotary computes it: the frequencies always from
    short_factor (transformers never passes it the length, so long_factor is never used) and cos/sin times
    short_mscale, which must equal long_mscale (one attention factor; different ones are refused)."""

    rope_types: tuple[str, ...] = ("default", "longrope")

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        for key in ("rope_scaling", "rope_parameters"):  # the legacy field (Phi-3.5-MoE's config.json) or transformers 5's
            params = cfg.data.get(key)
            if not isinstance(params, dict) or params.get("rope_type", params.get("type")) != "longrope":
                continue
            short, long = params.get("short_mscale"), params.get("long_mscale")
            if short is None or short != long:
                raise UserError(f"{cfg.family}: longrope with short_mscale {short!r} and long_mscale {long!r} is not "
                                "supported: specformer's longrope has one attention factor; supported: equal mscales")
            cfg.data[key] = {
                **{k: v for k, v in params.items() if k not in ("short_mscale", "long_mscale", "type")},
                "rope_type": "longrope", "long_factor": params.get("short_factor"), "attention_factor": short,
            }
        cfg.mark_read("original_max_position_embeddings")
        super().read(cfg, model)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        scaling = view.positional.get("scaling") or {}
        if scaling.get("kind") != "longrope":
            return
        if scaling["long_factor"] != scaling["short_factor"]:
            raise NotExpressible("model.positional.scaling.long_factor", f"Hugging Face {view.name} rotates with "
                                 "short_factor at every length (long_factor equal to short_factor)")
        if scaling.get("attention_factor") is None:
            raise NotExpressible("model.positional.scaling.attention_factor", f"Hugging Face {view.name} takes the "
                                 "attention factor from short_mscale / long_mscale: give attention_factor")
        for key in ("rope_parameters", "rope_scaling"):
            if key in config:
                factor = config[key].pop("attention_factor")
                config[key].update(short_mscale=factor, long_mscale=factor)
        config["original_max_position_embeddings"] = scaling["original_context_length"]


@dataclass(frozen=True)
class SparseMixerExperts(Part):
    """num_local_experts, num_experts_per_tok (always 2), intermediate_size, router_jitter_noise, router_aux_loss_coef
    <-> ffn moe with router sparsemixer (jitter_eps); Mixtral's expert tensors, the router as block_sparse_moe.gate
    or mlp.router."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        top_k = cfg.get_int("num_experts_per_tok")
        if top_k != 2:
            raise UserError(f"{cfg.family}: num_experts_per_tok {top_k} is not supported: transformers' SparseMixer "
                            "always routes each token to 2 experts; supported: 2")
        # Multiplicative noise on the MoE input while training only; the forward does not change.
        cfg.mark_read("input_jitter_noise")
        model.setdefault("block", {})["ffn"] = {
            "kind": "moe", "n_experts": cfg.get_int("num_local_experts"), "top_k": 2,
            "hidden": cfg.get_int("intermediate_size"), "activation": activation_from_hf(cfg, "hidden_act"),
            "gated": True, "router": {"kind": "sparsemixer", "jitter_eps": cfg.get_float("router_jitter_noise")},
            "aux_loss_coef": cfg.get_float("router_aux_loss_coef"),
        }

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("ffn", ("moe",))
        ffn = view.uniform("ffn")
        router = ffn.get("router") or {}
        if router.get("kind") != "sparsemixer":
            raise NotExpressible("model.block.ffn.router", f"Hugging Face {view.name} routes with sparsemixer")
        for key, wanted in (("expert_bias", False), ("swiglu_limit", None), ("gated", True), ("n_shared_experts", 0)):
            if ffn.get(key, wanted) != wanted:
                raise NotExpressible(f"model.block.ffn.{key}", f"{ffn.get(key)!r}: Hugging Face {view.name} has {wanted!r}")
        config.update(num_local_experts=ffn["n_experts"], num_experts_per_tok=ffn["top_k"], intermediate_size=ffn["hidden"],
                      hidden_act=ACTIVATIONS_TO_HF[ffn["activation"]], router_jitter_noise=router["jitter_eps"],
                      router_aux_loss_coef=ffn["aux_loss_coef"])

    def rules(self) -> list[Rule]:
        saved, router = f"{LAYER}.block_sparse_moe", "blocks.{i}.ffn.router.weight"
        return [
            OneOf(Copy(f"{saved}.gate.weight", router), Copy(f"{MLP}.router.weight", router)),
            *expert_rules(saved=saved, gate="w1", up="w3", down="w2")[1:],
        ]


FAMILY = decoder_family(
    name="PhiMoE",
    model_type="phimoe",
    architecture="PhimoeForCausalLM",
    defaults=DEFAULTS,
    parts=[
        HeadBiasSizes(),
        PhimoeRope(),
        Layout("prenorm", norm_bias=True),
        LayerNorm(eps_key="rms_norm_eps"),
        Attention(),
        SparseMixerExperts(),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        Value("sliding_window", "mixer.window"),
    ],
    maps="as Mixtral (prenorm, GQA, sliding_window, SwiGLU experts: num_local_experts, intermediate_size) with LayerNorms "
         "with biases (eps rms_norm_eps), attention_bias on q/k/v/o, lm_head_bias, and router sparsemixer (top-2; "
         "router_jitter_noise -> jitter_eps); rope default, or longrope with short_factor and short_mscale = "
         "long_mscale as the attention factor",
    caveats="inference routing only: transformers trains the router by sampling with SparseMixer's gradient estimator, "
            "here training follows the deterministic forward's plain gradients; input_jitter_noise (training-time "
            "input noise) is not applied; longrope's long_factor is read as short_factor, as transformers' PhiMoE "
            "always rotates with short_factor, and unequal short_mscale / long_mscale are refused",
)
