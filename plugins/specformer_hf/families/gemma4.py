"""Gemma 4 text (``model_type: gemma4_text``, ``Gemma4ForCausalLM``): Gemma 3's sandwich blocks and sliding/global
layers, with wider global heads whose keys may double as values, a proportional rope on the global layers, a value
norm and no score scale, the last layers reading earlier layers' keys and values (cross-layer KV sharing), per-layer
input embeddings, a scalar per layer, and an optional mixture of experts beside every layer's MLP."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from specformer_hf.parts.base import ATTN, BLOCK_MIXER, LAYER, MLP, FamilyView, Part, Refuse, Switch, Value, selection
from specformer_hf.parts.decoder import decoder_family, language_model_of
from specformer_hf.parts.embedding import EmbeddingScale, Sizes
from specformer_hf.parts.norms import Layout, RMSNorm
from specformer_hf.parts.windows import layer_types_from_config
from specformer_hf.rules import Copy, Fused, Rule, Site
from specformer_hf.specview import NotExpressible

#: transformers' Gemma4TextConfig defaults (which describe no published model).
DEFAULTS = {
    "vocab_size": 262_144, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 30,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "attention_bias": False, "sliding_window": 512, "layer_types": None, "final_logit_softcapping": None,
    "use_bidirectional_attention": None, "vocab_size_per_layer_input": 262_144, "hidden_size_per_layer_input": 256,
    "attention_k_eq_v": False, "num_kv_shared_layers": 0, "enable_moe_block": False, "use_double_wide_mlp": False,
    "num_experts": None, "top_k_experts": None, "moe_intermediate_size": None,
}
#: The keywords transformers' __post_init__ turns into per_layer_config (no config fields of their own), and their defaults.
GLOBAL_HEAD_DIM, GLOBAL_KV_HEADS = 512, None
SLIDING, FULL = "sliding_attention", "full_attention"
#: transformers' rope parameters when a config has none (its Gemma4TextConfig().rope_parameters).
DEFAULT_ROPE = {SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
                FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}


def layer_types(cfg: ConfigReader) -> list[str]:
    """layer_types (default: every sixth layer global), the last layer global as transformers forces it."""
    n_layers = cfg.get_layers("num_hidden_layers")
    types = layer_types_from_config(cfg, [SLIDING if (i + 1) % 6 else FULL for i in range(n_layers)])
    types[-1] = FULL  # transformers makes the last layer global whatever layer_types says (with a warning)
    return types


def kv_sources(types: list[str], shared: int, *, family: str) -> list[int | None]:
    """The layer each layer reads keys and values from (None: its own), as transformers' kv_sharing_modes: each of the
    last ``shared`` layers reads the last earlier layer of its type that keeps its own."""
    n_layers = len(types)
    if not 0 <= shared < n_layers:
        raise UserError(f"{family}: num_kv_shared_layers ({shared}) must leave at least one of the {n_layers} layers "
                        f"its own keys and values")
    first = n_layers - shared
    own = types[:first]
    sources: list[int | None] = [None] * first
    for layer_type in types[first:]:
        if layer_type not in own:
            raise UserError(f"{family}: a {layer_type} layer among the last {shared} (num_kv_shared_layers) has no "
                            f"earlier {layer_type} layer to read keys and values from")
        sources.append(first - 1 - own[::-1].index(layer_type))
    return sources


def _head_sizes(cfg: ConfigReader, types: list[str]) -> list[tuple[int, int]]:
    """(head_dim, n_kv_heads) of every layer: per_layer_config as saved, else global_head_dim (and, with
    attention_k_eq_v, num_global_key_value_heads) on the global layers, as transformers' __post_init__ makes it."""
    n_heads = cfg.get_size("num_attention_heads")
    base = (cfg.get_size("head_dim"), cfg.get("num_key_value_heads", None) or n_heads)
    stored = cfg.get("per_layer_config", None)
    cfg.mark_read("global_head_dim", "num_global_key_value_heads")
    if stored is not None:
        if not isinstance(stored, dict):
            raise UserError(f"{cfg.family}: per_layer_config must map layer indices to head sizes, got {stored!r}")
        sizes = [base] * len(types)
        for key, fields in stored.items():
            if not str(key).isdigit() or int(key) >= len(types) or not isinstance(fields, dict) \
                    or set(fields) - {"head_dim", "num_key_value_heads"}:
                raise UserError(f"{cfg.family}: per_layer_config[{key!r}] = {fields!r}: specformer reads layer indices "
                                f"below {len(types)} with head_dim and num_key_value_heads")
            sizes[int(key)] = (int(fields.get("head_dim", base[0])), int(fields.get("num_key_value_heads", base[1])))
        return sizes
    wide = (cfg.get_size("global_head_dim", GLOBAL_HEAD_DIM),
            (cfg.get("num_global_key_value_heads", GLOBAL_KV_HEADS) if cfg.get("attention_k_eq_v") else None) or base[1])
    return [wide if t == FULL else base for t in types]


def layer_type_rope(cfg: ConfigReader, layer_type: str,
                    defaults: dict[str, dict[str, Any]] = DEFAULT_ROPE) -> dict[str, Any]:
    """One layer type's rope: default, or proportional (only the first channel pairs turn); ``defaults``: the family's
    rope parameters per layer type when the config has none (Gemma 4's, LFM3's)."""
    stored = cfg.get("rope_parameters", None) or defaults
    params = dict(stored.get(layer_type) or defaults[layer_type]) if isinstance(stored, dict) else None
    if params is None:
        raise UserError(f"{cfg.family}: rope_parameters must map layer types to rope settings, got {stored!r}")
    rope_type = params.pop("rope_type", "default")
    out: dict[str, Any] = {"kind": "rope", "theta": float(params.pop("rope_theta", defaults[layer_type]["rope_theta"]))}
    if rope_type == "proportional":
        out["scaling"] = {"kind": "proportional", "fraction": float(params.pop("partial_rotary_factor", 1.0)),
                          "factor": float(params.pop("factor", 1.0))}
    elif rope_type != "default":
        raise UserError(f"{cfg.family}: rope_type {rope_type!r} of {layer_type} layers is not supported; "
                        f"supported: default, proportional")
    for key in params:  # transformers' default rope ignores partial_rotary_factor, as it ignores these
        cfg.note_unused(f"rope_parameters.{layer_type}.{key} (not used by rope_type {rope_type!r})")
    return out


def layer_type_rope_parameters(scheme: dict[str, Any], family: str = "Gemma 4") -> dict[str, Any]:
    """One layer type's rope parameters (default or proportional), as :func:`layer_type_rope` reads them."""
    scaling = scheme.get("scaling")
    if scheme["kind"] != "rope" or scheme.get("interleaved") or scheme.get("fraction", 1.0) != 1.0 or \
            (scaling and scaling["kind"] != "proportional"):
        raise NotExpressible("model.positional", f"Hugging Face {family} turns whole heads with the default or the "
                                                 "proportional rope (rope_scaling proportional)")
    if not scaling:
        return {"rope_type": "default", "rope_theta": scheme["theta"]}
    params = {"rope_type": "proportional", "partial_rotary_factor": scaling["fraction"], "rope_theta": scheme["theta"]}
    if scaling.get("factor", 1.0) != 1.0:
        params["factor"] = scaling["factor"]
    return params


def layer_overrides(layers: list[dict[str, Any]], base: dict[str, Any]) -> list[dict[str, Any]]:
    """``layers:`` overrides that turn ``base`` into each layer: each field's changed keys, layers with the same
    changes selected together."""
    changes: dict[str, list[int]] = {}
    described: dict[str, dict[str, Any]] = {}
    for index, layer in enumerate(layers):
        change = {}
        for name, part in layer.items():
            differ = {k: part.get(k) for k in {*part, *base[name]} if part.get(k) != base[name].get(k)}
            if differ:
                change[name] = differ
        if change:
            key = repr(sorted((n, sorted(c.items(), key=str)) for n, c in change.items()))
            changes.setdefault(key, []).append(index)
            described[key] = change
    return [{"select": selection(indices, len(layers)), **described[key]} for key, indices in changes.items()]


@dataclass(frozen=True)
class Gemma4Layers(Part):
    """Every layer's attention, feed-forward and rope, the per-layer inputs and the block layout: layer_types,
    sliding_window, head_dim with per_layer_config (or global_head_dim, num_global_key_value_heads),
    attention_k_eq_v, num_kv_shared_layers, rope_parameters per layer type, intermediate_size with
    use_double_wide_mlp, enable_moe_block with num_experts, top_k_experts and moe_intermediate_size,
    hidden_size_per_layer_input and vocab_size_per_layer_input."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        types = layer_types(cfg)
        sources = kv_sources(types, cfg.get_int("num_kv_shared_layers"), family=cfg.family)
        sizes = _head_sizes(cfg, types)
        eps = cfg.get_float("rms_norm_eps")
        activation = activation_from_hf(cfg, "hidden_activation")
        window = cfg.get_size("sliding_window")
        k_eq_v = bool(cfg.get("attention_k_eq_v"))
        double = bool(cfg.get("use_double_wide_mlp"))
        hidden = cfg.get_size("intermediate_size")
        ropes = {t: layer_type_rope(cfg, t) for t in (SLIDING, FULL)}
        moe = self._moe(cfg, activation, eps) if cfg.get("enable_moe_block") else None
        cfg.mark_read("num_experts", "top_k_experts", "moe_intermediate_size")  # without the mixture they do nothing
        layers = []
        for i, (layer_type, source, (head_dim, n_kv)) in enumerate(zip(types, sources, sizes)):
            attention: dict[str, Any] = {
                "kind": "attention", "n_heads": cfg.get_size("num_attention_heads"), "n_kv_heads": n_kv,
                "head_dim": head_dim, "window": window if layer_type == SLIDING else None,
                "qk_norm": {"kind": "rmsnorm", "eps": eps}, "scale": 1.0, "kv_from": source,
                # transformers' alternative attention (keys as values) is on the global layers only.
                "k_eq_v": k_eq_v and layer_type == FULL and source is None,
                "v_norm": {"kind": "rmsnorm", "eps": eps, "weight": False} if source is None else None,
            }
            # transformers doubles the MLP of the layers that read another's keys and values.
            dense = {"kind": "geglu", "hidden": hidden * (2 if double and source is not None else 1),
                     "activation": activation}
            ffn = dense if moe is None else {"kind": "parallel", "norm": {"kind": "rmsnorm", "eps": eps},
                                             "ffns": [dense, moe]}
            layers.append({"mixer": attention, "ffn": ffn, "positional": ropes[layer_type]})
        base = layers[max(range(len(layers)), key=lambda i: sum(layer == layers[i] for layer in layers))]
        model["positional"] = base["positional"]
        block = model.setdefault("block", {})
        block.update(mixer=base["mixer"], ffn=base["ffn"])
        block["layout"] = {"kind": "sandwich", "layer_scale": True, "per_layer_activation": activation,
                           "ffn_pre_norm": moe is None}
        overrides = layer_overrides(layers, base)
        if overrides:
            model.setdefault("layers", []).extend(overrides)
        width = cfg.get_int("hidden_size_per_layer_input")
        vocab = cfg.get_int("vocab_size_per_layer_input")
        if width:
            model["per_layer_input"] = {"kind": "per_layer_embedding", "width": width, "vocab_size": vocab,
                                        "norm": {"kind": "rmsnorm", "eps": eps}}

    @staticmethod
    def _moe(cfg: ConfigReader, activation: str, eps: float) -> dict[str, Any]:
        return {"kind": "moe", "n_experts": cfg.get_size("num_experts"), "top_k": cfg.get_size("top_k_experts"),
                "hidden": cfg.get_size("moe_intermediate_size"), "activation": activation,
                "router": {"kind": "normed_softmax_topk", "eps": eps}}

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        n_layers = view.view.n_layers
        attention = view.per_layer("mixer")
        windows = [a["window"] for a in attention]
        types = [SLIDING if w is not None else FULL for w in windows]
        if types[-1] != FULL:
            raise NotExpressible(f"model.layers[{n_layers - 1}].mixer.window", "Hugging Face Gemma 4's last layer is "
                                                                                  "global (window null)")
        sliding = {w for w in windows if w is not None}
        if len(sliding) > 1:
            raise NotExpressible("model.layers[*].mixer.window", f"several window sizes {sorted(sliding)}; Hugging "
                                                                     f"Face Gemma 4 has one sliding_window")
        shared = sum(a.get("kv_from") is not None for a in attention)
        first = n_layers - shared
        if any(a.get("kv_from") is not None for a in attention[:first]):
            raise NotExpressible("model.layers[*].mixer.kv_from", "Hugging Face Gemma 4 shares keys and values in "
                                                                      "its last layers only (num_kv_shared_layers)")
        expected = kv_sources(types, shared, family=view.name)
        for i, (a, source) in enumerate(zip(attention, expected)):
            if a.get("kv_from") != source:
                raise NotExpressible(f"model.layers[{i}].mixer.kv_from", f"{a.get('kv_from')}: Hugging Face Gemma 4's "
                                     f"layer {i} reads layer {source}'s (the last earlier {types[i]} layer of its own)")
        sizes = [(a["head_dim"] or view.model.d_model // a["n_heads"], a["n_kv_heads"] or a["n_heads"]) for a in attention]
        base = sizes[types.index(SLIDING)] if SLIDING in types else sizes[0]
        own_full = [a for a, s in zip(attention, expected) if s is None and a["window"] is None]
        ffns = view.per_layer("ffn")
        moe = ffns[0]["kind"] == "parallel"
        dense = [f["ffns"][0] if moe else f for f in ffns]
        hidden = next(d["hidden"] for d, s in zip(dense, expected) if s is None)
        config.update(
            layer_types=types, sliding_window=sliding.pop() if sliding else DEFAULTS["sliding_window"],
            num_attention_heads=view.uniform("mixer", "n_heads"), head_dim=base[0], num_key_value_heads=base[1],
            per_layer_config={str(i): {"head_dim": hd, "num_key_value_heads": kv}
                              for i, (hd, kv) in enumerate(sizes) if (hd, kv) != base},
            attention_k_eq_v=bool(own_full and own_full[0].get("k_eq_v")), num_kv_shared_layers=shared,
            rope_parameters={t: layer_type_rope_parameters(next(p or view.positional for p, u in
                                                      zip(view.per_layer("positional"), types) if u == t))
                             for t in dict.fromkeys(types)},
            intermediate_size=hidden, hidden_activation=ACTIVATIONS_TO_HF[dense[0]["activation"]],
            use_double_wide_mlp=any(d["hidden"] == 2 * hidden for d, s in zip(dense, expected) if s is not None),
            enable_moe_block=moe,
        )
        if moe:
            experts = ffns[0]["ffns"][1]
            config.update(num_experts=experts["n_experts"], top_k_experts=experts["top_k"],
                          moe_intermediate_size=experts["hidden"])
        per_layer = view.model.per_layer_input
        params = per_layer.as_dict() if per_layer is not None else {}
        config.update(hidden_size_per_layer_input=params.get("width", 0),
                      vocab_size_per_layer_input=params.get("vocab_size") or view.model.vocab_size)

    def rules(self) -> list[Rule]:
        moe_ffn = "blocks.{i}.ffn.ffns.1"
        return [
            ProjectedHeads("weight"), ProjectedHeads("bias"),
            Copy(f"{ATTN}.o_proj.weight", f"{BLOCK_MIXER}.out.weight"),
            Copy(f"{ATTN}.o_proj.bias", f"{BLOCK_MIXER}.out.bias"),
            Copy(f"{ATTN}.q_norm.weight", f"{BLOCK_MIXER}.q_norm.weight"),
            Copy(f"{ATTN}.k_norm.weight", f"{BLOCK_MIXER}.k_norm.weight"),
            # The MLP: the feed-forward itself, or the first branch beside the mixture of experts.
            Fused([f"{MLP}.gate_proj.weight", f"{MLP}.up_proj.weight"], "blocks.{i}.ffn.gate_up.weight",
                  sizes=lambda site: (site.ffn.hidden,) * 2),
            Copy(f"{MLP}.down_proj.weight", "blocks.{i}.ffn.down.weight"),
            Fused([f"{MLP}.gate_proj.weight", f"{MLP}.up_proj.weight"], "blocks.{i}.ffn.ffns.0.gate_up.weight",
                  sizes=lambda site: (site.ffn.ffns[0].hidden,) * 2),
            Copy(f"{MLP}.down_proj.weight", "blocks.{i}.ffn.ffns.0.down.weight"),
            Copy(f"{LAYER}.pre_feedforward_layernorm.weight", "blocks.{i}.ffn.pre_norms.0.weight"),
            Copy(f"{LAYER}.post_feedforward_layernorm_1.weight", "blocks.{i}.ffn.post_norms.0.weight"),
            Copy(f"{LAYER}.pre_feedforward_layernorm_2.weight", "blocks.{i}.ffn.pre_norms.1.weight"),
            Copy(f"{LAYER}.post_feedforward_layernorm_2.weight", "blocks.{i}.ffn.post_norms.1.weight"),
            Copy(f"{LAYER}.router.proj.weight", f"{moe_ffn}.router.weight"),
            Copy(f"{LAYER}.router.scale", f"{moe_ffn}.router.scale"),
            Copy(f"{LAYER}.router.per_expert_scale", f"{moe_ffn}.router.expert_scale"),
            Copy(f"{LAYER}.experts.gate_up_proj", f"{moe_ffn}.experts_in"),  # (E, [gate; up], D), as ours
            Copy(f"{LAYER}.experts.down_proj", f"{moe_ffn}.experts_out"),
            # Per-layer inputs: the model's table and projection, each block's gate.
            Copy("model.embed_tokens_per_layer.weight", "per_layer_input.table.weight"),
            Copy("model.per_layer_model_projection.weight", "per_layer_input.projection.weight"),
            Copy("model.per_layer_projection_norm.weight", "per_layer_input.norm.weight"),
            Copy(f"{LAYER}.per_layer_input_gate.weight", "blocks.{i}.per_layer.gate.weight"),
            Copy(f"{LAYER}.per_layer_projection.weight", "blocks.{i}.per_layer.projection.weight"),
            Copy(f"{LAYER}.post_per_layer_input_norm.weight", "blocks.{i}.per_layer.norm.weight"),
            Copy(f"{LAYER}.layer_scalar", "blocks.{i}.layer_scale"),
        ]


class ProjectedHeads(Rule):
    """q_proj, k_proj and v_proj as each layer has them <-> our fused ``qkv``: all three; q and k where the keys are
    the values (attention_k_eq_v); q alone where the layer reads another layer's keys and values."""

    def __init__(self, tensor: str) -> None:
        self.hf = tuple(f"{ATTN}.{p}_proj.{tensor}" for p in "qkv")
        self.ours = (f"{BLOCK_MIXER}.qkv.{tensor}",)

    def expand_at(self, site: Site) -> tuple[tuple[str, ...], tuple[str, ...]]:
        hf, ours = super().expand_at(site)
        return hf[:1 + len(site.mixer.kv_splits)], ours

    def to_ours(self, tensors: list[Any], site: Site) -> list[Any]:
        import torch  # late: family modules are imported to list families, without torch

        return [torch.cat(tensors, dim=0)]

    def to_hf(self, tensors: list[Any], site: Site) -> list[Any]:
        a = site.mixer
        return [part.contiguous() for part in tensors[0].split([a.n_heads * a.head_dim, *a.kv_splits], dim=0)]


#: Gemma 4's parts (the unified text model's too).
FAMILY_PARTS = (
    Refuse("use_bidirectional_attention", (None, "vision"),
           why="'all' makes every token read every other (not a causal LM); 'vision' changes only image tokens"),
    Sizes(), Layout("sandwich"), RMSNorm(), EmbeddingScale(), Gemma4Layers(),
    Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
    Value("final_logit_softcapping", "logit_softcap"),
)
#: Published checkpoints keep k/v projections and norms for the layers that read another's keys and values;
#: transformers drops them on load (_keys_to_ignore_on_load_unexpected), and so does specformer.
IGNORED_TENSORS = (r"model\.layers\.\d+\.self_attn\.(k_proj|v_proj|k_norm)\.weight",)

FAMILY = decoder_family(
    name="Gemma 4",
    model_type="gemma4_text",
    architecture="Gemma4ForCausalLM",
    defaults=DEFAULTS,
    parts=FAMILY_PARTS,
    ignore_tensors=IGNORED_TENSORS,
    maps="as Gemma 3 (sandwich norms, sqrt(d) embeddings, per-layer windows and ropes by layer_types) with "
         "per_layer_config (or global_head_dim, num_global_key_value_heads) -> per-layer heads, attention_k_eq_v -> "
         "k_eq_v on the global layers, num_kv_shared_layers -> kv_from, the proportional rope -> rope_scaling "
         "proportional, q/k norms (w, not 1 + w), a value norm and score scale 1, use_double_wide_mlp, "
         "enable_moe_block -> ffn parallel (geglu beside moe with the normed_softmax_topk router), "
         "hidden_size_per_layer_input -> model.per_layer_input, layer_scalar -> sandwich layer_scale",
    caveats="text only (Gemma4ForCausalLM); use_bidirectional_attention 'all' is refused; the k/v projections a "
            "published checkpoint keeps for its KV-sharing layers are skipped, as transformers skips them",
)

#: The published checkpoints: the multimodal model's config.json and weights, read for its language model.
MULTIMODAL = language_model_of(FAMILY, name="Gemma 4 (multimodal)", model_type="gemma4",
                               architecture="Gemma4ForConditionalGeneration",
                               skipped=(r"model\.vision_tower\..*", r"model\.audio_tower\..*", r"model\.embed_vision\..*",
                                        r"model\.embed_audio\..*"),
                               skipped_what="the vision and audio encoders (model.vision_tower.*, model.audio_tower.*, "
                                            "model.embed_vision.*, model.embed_audio.*) are")
