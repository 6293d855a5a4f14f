"""Kimi Linear (``model_type: kimi_linear``): Kimi Delta Attention layers interleaved with latent attention
without positions, sigmoid-routed experts with a shared expert, and dense first layers.

The hybrid pattern is one mixer in the block (the more common of ``kda`` and ``mla``) and
``layers:`` overrides for the others; dense feed-forward layers are overrides of the ``moe``
block alike. The latent attention and the experts are DeepSeek-V3's (their weight rules are
reused); Kimi Linear's attention rotates nothing (NoPE), so the model has ``positional: none``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from torch import Tensor

from specformer_hf.parts.attention import LATENT_EPS, LatentAttention
from specformer_hf.parts.base import ATTN, BLOCK_MIXER, LAYER, MLP, FamilyView, Part, SavedNames, layers_of_two_kinds, selection
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import expert_rules, shared_halves
from specformer_hf.parts.norms import Layout, RMSNorm
from specformer_layers import default_gated_hidden
from specformer_hf.rules import Copy, DepthwiseConv, Fused, OneOf, Rule, Site, halves
from specformer_hf.specview import NotExpressible

#: transformers' KimiLinearConfig defaults, under the names the family's parts read.
DEFAULTS = {
    "vocab_size": 163840, "hidden_size": 2304, "intermediate_size": 9216, "moe_intermediate_size": 1024,
    "num_hidden_layers": 27, "num_attention_heads": 32, "num_key_value_heads": 32, "n_shared_experts": 1,
    "routed_scaling_factor": 2.446, "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 1, "topk_group": 1, "num_experts_per_tok": 8,
    "norm_topk_prob": True, "hidden_act": "silu", "max_position_embeddings": 1048576, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False, "attention_bias": False, "num_local_experts": 256, "mlp_layer_types": None,
    "layer_types": None, "linear_head_dim": 128, "linear_num_heads": 32, "linear_conv_kernel_dim": 4,
}

#: (the name config.json holds, as transformers saves it and Moonshot publishes it; the name the parts read).
SAVED_NAMES = (
    ("model_max_length", "max_position_embeddings"), ("num_experts", "num_local_experts"),
    ("num_experts_per_token", "num_experts_per_tok"), ("num_shared_experts", "n_shared_experts"),
    ("num_expert_group", "n_group"), ("moe_renormalize", "norm_topk_prob"),
)
MIXERS = ("kda", "mla")
#: layer_types' names for the two mixers.
LAYER_TYPES = {"kda": "linear_attention", "mla": "full_attention"}


@dataclass(frozen=True)
class NoPositions(Part):
    """transformers' Kimi Linear rotates nothing (its latent attention is NoPE): positional ``none``."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        cfg.require("mla_use_nope", (True,), default=True,
                    why="transformers' Kimi Linear never rotates the latent attention's keys (NoPE)")
        # The published configs carry rope fields that the NoPE attention never reads, in transformers too.
        cfg.mark_read("rope_theta", "rope_scaling", "rope_parameters")
        model["positional"] = {"kind": "none"}

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.view.one_positional(family=view.name)
        view.view.expect(view.positional, "model.positional", ("none",), family=view.name)


def _kda(cfg: ConfigReader, linear: dict[str, Any]) -> dict[str, Any]:
    """The ``kda`` mixer: linear_attn_config's sizes first, as transformers reads them, else the linear_* fields."""
    def size(key: str, field: str) -> int:
        value = linear.get(key, cfg.get(field))
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{cfg.family}: {key} of linear_attn_config (or {field}) must be a positive integer, got {value!r}")
        return value

    kernel = size("short_conv_kernel_size", "linear_conv_kernel_dim")
    if kernel < 2:
        raise UserError(f"{cfg.family}: short_conv_kernel_size {kernel} is not supported: the short convolution needs "
                        "a kernel of 2 or more")
    return {"kind": "kda", "n_heads": size("num_heads", "linear_num_heads"), "head_dim": size("head_dim", "linear_head_dim"),
            "conv_kernel": kernel, "norm_eps": cfg.get_float("rms_norm_eps")}


def _layer_types(cfg: ConfigReader, linear: dict[str, Any], n_layers: int) -> list[str]:
    """layer_types, else linear_attn_config's 1-based kda_layers / full_attn_layers, else every 4th layer from 4 on."""
    types = cfg.get("layer_types")
    if types is None and "kda_layers" in linear and "full_attn_layers" in linear:
        types = [None] * n_layers
        for key, kind in (("full_attn_layers", "full_attention"), ("kda_layers", "linear_attention")):
            for number in linear[key]:
                if not isinstance(number, int) or not 1 <= number <= n_layers:
                    raise UserError(f"{cfg.family}: linear_attn_config.{key} numbers layers 1 to {n_layers}, got {number!r}")
                types[number - 1] = kind
    elif types is None:
        types = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers or any(t not in LAYER_TYPES.values() for t in types):
        raise UserError(f"{cfg.family}: the layer types must be linear_attention or full_attention for each of the "
                        f"{n_layers} layers, got {types!r}")
    return list(types)


@dataclass(frozen=True)
class HybridMixers(Part):
    """linear_attn_config (num_heads, head_dim, short_conv_kernel_size, kda_layers, full_attn_layers) or the
    linear_* fields and layer_types <-> attention ``kda`` and ``mla`` layers (the more common one in the block,
    the others as ``layers:`` overrides); the MLA fields as DeepSeek-V3's."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        linear = cfg.get("linear_attn_config", None) or {}  # Moonshot's files; transformers takes it as a keyword
        if not isinstance(linear, dict):
            raise UserError(f"{cfg.family}: linear_attn_config must be a mapping, got {linear!r}")
        cfg.mark_read("linear_head_dim", "linear_num_heads", "linear_conv_kernel_dim")
        types = _layer_types(cfg, linear, n_layers)
        mixers = {"kda": _kda(cfg, linear)}
        latent: dict[str, Any] = {"positional": model["positional"]}
        LatentAttention().read(cfg, latent)
        mixers["mla"] = latent["block"]["mixer"]
        kinds = ["kda" if t == "linear_attention" else "mla" for t in types]
        if "kda" in kinds:
            # The short convolution's activation is hidden_act in transformers; KDA's is SiLU.
            cfg.require("hidden_act", ("silu",), why="Kimi Delta Attention's short convolution uses hidden_act, "
                                                     "and KDA's is SiLU")
        layers_of_two_kinds(model, kinds, {kind: {"mixer": mixers[kind]} for kind in MIXERS})

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        layers = view.per_layer("mixer")
        for i, attention in enumerate(layers):
            if attention["kind"] not in MIXERS:
                raise NotExpressible(f"model.layers[{i}].mixer.kind", f"{attention['kind']!r} has no equivalent in "
                                     f"Hugging Face {view.name} (which uses 'kda' or 'mla')")
        config["layer_types"] = [LAYER_TYPES[a["kind"]] for a in layers]
        kda = _one_setting(view, [a for a in layers if a["kind"] == "kda"], "kda")
        mla = _one_setting(view, [a for a in layers if a["kind"] == "mla"], "mla")
        if kda is not None:
            head_dim = kda["head_dim"] or view.model.d_model // kda["n_heads"]
            value_dim = kda["value_head_dim"] or head_dim
            sizes = {"value_head_dim": value_dim, "decay_rank": kda["decay_rank"] or head_dim,
                     "gate_rank": kda["gate_rank"] or value_dim}
            if any(size != head_dim for size in sizes.values()) or kda["conv_bias"]:
                raise NotExpressible("model.layers[*].mixer", f"Hugging Face {view.name}'s KDA has values, decay "
                                     f"and gate ranks of head_dim ({head_dim}, got {sizes}) and no conv_bias")
            if kda["norm_eps"] != view.uniform("norm", "eps"):
                raise NotExpressible("model.layers[*].mixer.norm_eps", f"Hugging Face {view.name}'s KDA output norm "
                                     "shares rms_norm_eps with the block norms")
            config.update(linear_num_heads=kda["n_heads"], linear_head_dim=head_dim,
                          linear_conv_kernel_dim=kda["conv_kernel"])
        if mla is not None:
            if mla["latent_norm"].get("kind") != "rmsnorm" or mla["latent_norm"].get("eps") != LATENT_EPS or mla["window"] is not None:
                raise NotExpressible("model.layers[*].mixer", f"Hugging Face {view.name}'s latent attention has "
                                     f"RMSNorm latents (eps {LATENT_EPS}) and no window")
            if mla["scale"] is not None or mla["yarn_factor"] is not None:
                raise NotExpressible("model.layers[*].mixer.scale", f"Hugging Face {view.name}'s latent attention "
                                     "scales scores by 1/sqrt(qk_nope_head_dim + qk_rope_head_dim)")
            config.update(num_attention_heads=mla["n_heads"], num_key_value_heads=mla["n_heads"],
                          kv_lora_rank=mla["kv_lora_rank"], qk_rope_head_dim=mla["qk_rope_head_dim"],
                          qk_nope_head_dim=mla["qk_nope_head_dim"], v_head_dim=mla["v_head_dim"],
                          q_lora_rank=mla["q_lora_rank"], attention_bias=mla["bias"])

    def rules(self) -> list[Rule]:
        return LatentAttention().rules() + _kda_rules()


def _one_setting(view: FamilyView, mixers: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    """The setting every ``kind`` layer shares (None if no layer has one); dropout aside, which is not maths."""
    strip = lambda a: {k: v for k, v in a.items() if k != "dropout"}  # noqa: E731
    if any(strip(a) != strip(mixers[0]) for a in mixers[1:]):
        raise NotExpressible("model.layers[*].mixer", f"the {kind} layers differ; Hugging Face {view.name} has one setting")
    return mixers[0] if mixers else None


def _kda_qkv_sizes(site: Site) -> tuple[int, int, int]:
    a = site.mixer
    return a.n_heads * a.head_dim, a.n_heads * a.head_dim, a.n_heads * a.value_head_dim


class HeadDecayRate(Rule):
    """``A_log`` ``(1, 1, H, 1)`` <-> ours ``(H,)``."""

    def __init__(self, hf: str, ours: str) -> None:
        self.hf, self.ours = (hf,), (ours,)

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return [tensors[0].reshape(-1)]

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return [tensors[0].reshape(1, 1, -1, 1).contiguous()]


#: Where save_pretrained (and Moonshot's files) keep the feed-forward; transformers' modules name it mlp.
SAVED_MLP = f"{LAYER}.block_sparse_moe"


def _kda_rules() -> list[Rule]:
    """KimiLinearDeltaAttention's tensors, read as saved (the forget gate's tensors directly in self_attn, q/k/v
    convolutions apart) or as transformers' modules hold them; written as saved. Skipped in latent-attention layers."""
    gate = f"{ATTN}.forget_gate"
    return [
        Fused([f"{ATTN}.q_proj.weight", f"{ATTN}.k_proj.weight", f"{ATTN}.v_proj.weight"], f"{BLOCK_MIXER}.qkv.weight",
              sizes=_kda_qkv_sizes),
        OneOf(DepthwiseConv([f"{ATTN}.{x}_conv1d.weight" for x in "qkv"], f"{BLOCK_MIXER}.conv_weight", sizes=_kda_qkv_sizes),
              DepthwiseConv(f"{ATTN}.conv1d.weight", f"{BLOCK_MIXER}.conv_weight")),
        *(OneOf(Copy(f"{ATTN}.{name}", f"{BLOCK_MIXER}.{ours}"), Copy(f"{gate}.{name}", f"{BLOCK_MIXER}.{ours}"))
          for name, ours in (("f_a_proj.weight", "f_a.weight"), ("f_b_proj.weight", "f_b.weight"), ("dt_bias", "dt_bias"))),
        OneOf(HeadDecayRate(f"{ATTN}.A_log", f"{BLOCK_MIXER}.A_log"), HeadDecayRate(f"{gate}.A_log", f"{BLOCK_MIXER}.A_log")),
        *(Copy(f"{ATTN}.{name}.weight", f"{BLOCK_MIXER}.{ours}.weight")
          for name, ours in (("b_proj", "b"), ("g_a_proj", "g_a"), ("g_b_proj", "g_b"), ("o_norm", "norm"), ("o_proj", "out"))),
    ]


def _ffn_rules() -> list[Rule]:
    """Experts (w1 gate, w3 up, w2 down per expert as saved, or fused), the router and its selection bias, the
    shared experts and the dense layers, each read from block_sparse_moe (saved) or mlp (transformers' modules)."""

    def both(make: Any) -> Rule:
        return OneOf(make(SAVED_MLP), make(MLP))

    return [
        *expert_rules(saved=SAVED_MLP, gate="w1", up="w3", down="w2"),
        both(lambda m: Copy(f"{m}.gate.e_score_correction_bias", "blocks.{i}.ffn.router.selection_bias")),
        both(lambda m: Fused([f"{m}.shared_experts.gate_proj.weight", f"{m}.shared_experts.up_proj.weight"],
                             "blocks.{i}.ffn.shared.gate_up.weight", sizes=shared_halves)),
        both(lambda m: Copy(f"{m}.shared_experts.down_proj.weight", "blocks.{i}.ffn.shared.down.weight")),
        both(lambda m: Fused([f"{m}.gate_proj.weight", f"{m}.up_proj.weight"], "blocks.{i}.ffn.gate_up.weight",
                             sizes=halves)),
        both(lambda m: Copy(f"{m}.down_proj.weight", "blocks.{i}.ffn.down.weight")),
    ]


@dataclass(frozen=True)
class KimiExperts(Part):
    """num_experts, num_experts_per_token, moe_intermediate_size, num_shared_experts, moe_renormalize,
    routed_scaling_factor, num_expert_group, topk_group <-> ffn ``moe`` with a sigmoid_topk router (as DeepSeek-V3's);
    mlp_layer_types (or first_k_dense_replace) <-> dense ``layers:`` overrides of intermediate_size."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        types = cfg.get("mlp_layer_types")
        dense_first = cfg.get_int("first_k_dense_replace", 1)  # a keyword of transformers' config, default 1
        if types is None:
            types = ["dense" if i < dense_first else "sparse" for i in range(n_layers)]
        if not isinstance(types, list) or len(types) != n_layers or any(t not in ("dense", "sparse") for t in types):
            raise UserError(f"{cfg.family}: mlp_layer_types must be dense or sparse for each of the {n_layers} layers, "
                            f"got {types!r}")
        # Moonshot's published configs describe the routing with fields transformers never reads (it always
        # scores with a sigmoid, and every layer past the dense ones is sparse): only their one meaning is accepted.
        cfg.require("moe_router_activation_func", ("sigmoid",), default="sigmoid", why="transformers' Kimi Linear "
                    "scores experts with a sigmoid")
        cfg.require("moe_layer_freq", (1,), default=1, why="transformers' Kimi Linear places experts by mlp_layer_types")
        cfg.mark_read("num_nextn_predict_layers")
        activation = activation_from_hf(cfg, "hidden_act")
        dense_ffn = {"kind": "swiglu" if activation == "silu" else "geglu", "hidden": cfg.get_int("intermediate_size"),
                     "activation": activation}
        sparse = [i for i, t in enumerate(types) if t == "sparse"]
        if not sparse:
            model.setdefault("block", {})["ffn"] = dense_ffn
            cfg.mark_read("num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
                          "norm_topk_prob", "routed_scaling_factor", "n_group", "topk_group")
            return
        n_shared = cfg.get_int("n_shared_experts")
        if n_shared < 1:
            raise UserError(f"{cfg.family}: num_shared_experts {n_shared} is not supported: transformers' Kimi Linear "
                            "always has a shared expert (0 would make it zero-width)")
        model.setdefault("block", {})["ffn"] = {
            "kind": "moe", "n_experts": cfg.get_int("num_local_experts"), "top_k": cfg.get_int("num_experts_per_tok"),
            "hidden": cfg.get_int("moe_intermediate_size"), "activation": activation, "n_shared_experts": n_shared,
            "router": {"kind": "sigmoid_topk", "normalize": bool(cfg.get("norm_topk_prob")),
                       "scaling_factor": cfg.get_float("routed_scaling_factor"),
                       "n_group": cfg.get("n_group") or 1, "topk_group": cfg.get("topk_group") or 1},
            "aux_loss_coef": 0.0,  # balanced through the selection bias, not a loss
        }
        dense = [i for i in range(n_layers) if i not in sparse]
        if dense:
            model.setdefault("layers", []).append({"select": selection(dense, n_layers), "ffn": dense_ffn})

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        ffns = view.per_layer("ffn")
        for i, ffn in enumerate(ffns):
            if ffn["kind"] not in ("moe", "swiglu"):
                raise NotExpressible(f"model.layers[{i}].ffn.kind", f"{ffn['kind']!r} has no equivalent in Hugging Face "
                                     f"{view.name} (which uses 'moe' or 'swiglu')")
        config["mlp_layer_types"] = ["sparse" if f["kind"] == "moe" else "dense" for f in ffns]
        dense = [f for f in ffns if f["kind"] != "moe"]
        moe = [f for f in ffns if f["kind"] == "moe"]
        strip = lambda f: {k: v for k, v in f.items() if k != "aux_loss_coef"}  # noqa: E731
        if any(strip(f) != strip(moe[0]) for f in moe[1:]):
            raise NotExpressible("model.layers[*].ffn", f"the moe layers differ; Hugging Face {view.name} has one setting")
        if any(f != dense[0] for f in dense[1:]):
            raise NotExpressible("model.layers[*].ffn", f"the dense layers differ; Hugging Face {view.name} has one "
                                 "intermediate_size")
        activations = {f["activation"] for f in ffns}
        if len(activations) > 1 or not activations <= set(ACTIVATIONS_TO_HF):
            raise NotExpressible("model.layers[*].ffn.activation", f"{sorted(activations)}: Hugging Face {view.name} "
                                 "has one hidden_act")
        config["hidden_act"] = ACTIVATIONS_TO_HF[activations.pop()]
        if dense:
            if dense[0].get("bias"):
                raise NotExpressible("model.layers[*].ffn.bias", f"Hugging Face {view.name}'s dense layers have no biases")
            config["intermediate_size"] = dense[0]["hidden"] or default_gated_hidden(view.model.d_model)
        if moe:
            ffn, router = moe[0], moe[0].get("router") or {}
            if router.get("kind") != "sigmoid_topk" or router.get("bias"):
                raise NotExpressible("model.block.ffn.router", f"Hugging Face {view.name} routes with sigmoid_topk "
                                     "(no score bias)")
            hidden, n_shared = ffn["hidden"], ffn["n_shared_experts"]
            if not n_shared or (ffn.get("shared_hidden") or hidden * n_shared) != hidden * n_shared or ffn.get("shared_gate"):
                raise NotExpressible("model.block.ffn.n_shared_experts", f"Hugging Face {view.name} has ungated shared "
                                     "experts, n_shared_experts * hidden wide (at least one)")
            config.update(num_local_experts=ffn["n_experts"], num_experts_per_tok=ffn["top_k"],
                          moe_intermediate_size=hidden, n_shared_experts=n_shared, norm_topk_prob=router["normalize"],
                          routed_scaling_factor=router["scaling_factor"], n_group=router["n_group"],
                          topk_group=router["topk_group"])

    def rules(self) -> list[Rule]:
        return _ffn_rules()


@dataclass(frozen=True)
class WrittenNames(Part):
    """Export writes the fields under the names transformers saves them (its attribute_map)."""

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        for saved, name in SAVED_NAMES:
            if name in config:
                config[saved] = config.pop(name)


FAMILY = decoder_family(
    name="Kimi Linear",
    model_type="kimi_linear",
    architecture="KimiLinearForCausalLM",
    defaults=DEFAULTS,
    parts=[SavedNames(SAVED_NAMES), Sizes(), NoPositions(), Layout("prenorm"), RMSNorm(), HybridMixers(), KimiExperts(),
           WrittenNames()],
    maps="attention kda (linear_attn_config num_heads, head_dim, short_conv_kernel_size, or the linear_* fields; "
         "gated output norm with rms_norm_eps) and mla (as DeepSeek-V3's, without positions) per layer: layer_types or "
         "linear_attn_config kda_layers / full_attn_layers -> layers: overrides; ffn moe with router sigmoid_topk "
         "(moe_renormalize, routed_scaling_factor, num_expert_group, topk_group; e_score_correction_bias -> "
         "selection_bias), num_shared_experts; mlp_layer_types (or first_k_dense_replace) -> dense layers",
    caveats="positional none: transformers' latent attention is NoPE (mla_use_nope must be true, the rope fields are "
            "not read); KDA's short convolution uses hidden_act, which must be silu; at least one shared expert; "
            "aux_loss_coef is 0 on import",
)
