"""DBRX (``model_type: dbrx``, Databricks): bias-free LayerNorms, grouped-query attention through one fused ``Wqkv``
whose output is clamped to ``+-clip_qkv``, rope, and a mixture of SwiGLU experts in every layer; the attention and
expert settings sit in nested ``attn_config`` and ``ffn_config``.

The router takes the softmax over all experts, keeps the ``moe_top_k`` largest and divides them by
their ``moe_normalize_expert_weights``-norm: p = 1 is the usual renormalisation (the kept
probabilities are positive, so their 1-norm is their sum), None none; another p has no
specformer equivalent. The experts are stored as three 2-D matrices ``(moe_num_experts *
ffn_hidden_size, d_model)``: ``w1`` (gate), ``v1`` (up) and ``w2`` (down, applied transposed).
"""

from __future__ import annotations

from typing import Any

from specformer.errors import UserError
from specformer_layers import default_gated_hidden  # the width a gated expert with hidden: null builds

from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from specformer_hf.family import Family
from specformer_hf.parts.base import BLOCK_MIXER
from specformer_hf.parts.embedding import no_output_bias
from specformer_hf.parts.positions import rope, rope_config
from specformer_hf.rules import Copy, FlatExperts, Rule
from specformer_hf.specview import NotExpressible, SpecView

NAME = "DBRX"

#: transformers' DbrxAttentionConfig defaults (the nested ``attn_config``).
ATTN_DEFAULTS = {"attn_pdrop": 0.0, "clip_qkv": None, "kv_n_heads": 1}

#: transformers' DbrxFFNConfig defaults (the nested ``ffn_config``).
FFN_DEFAULTS = {
    "hidden_size": 6144, "ffn_act_fn": None, "ffn_hidden_size": 3584, "moe_num_experts": 4, "moe_top_k": 1,
    "moe_jitter_eps": None, "moe_loss_weight": 0.01, "moe_normalize_expert_weights": 1.0,
}

#: transformers' DbrxConfig defaults (no published model's sizes: DBRX's are in specs/dbrx.yaml).
DEFAULTS = {
    "d_model": 2048, "n_heads": 16, "n_layers": 24, "max_seq_len": 2048, "vocab_size": 32000, "attn_config": None,
    "ffn_config": None, "tie_word_embeddings": False, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def _nested(cfg: ConfigReader, key: str, defaults: dict[str, Any]) -> ConfigReader:
    """A reader of the nested ``key`` (a mapping, or null for its defaults); what it leaves unread is reported."""
    data = cfg.get(key)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{cfg.family}: config field {key!r} must be a mapping of settings, got {data!r}")
    return ConfigReader(data, defaults=defaults, family=f"{cfg.family} {key}")


def _attention(cfg: ConfigReader, *, n_heads: int, d_model: int, theta: float) -> dict[str, Any]:
    inner = _nested(cfg, "attn_config", ATTN_DEFAULTS)
    n_kv = inner.get_size("kv_n_heads")
    if d_model % n_heads or n_heads % n_kv:
        raise UserError(f"{cfg.family}: d_model ({d_model}) must be a multiple of n_heads ({n_heads}) and n_heads of "
                        f"attn_config.kv_n_heads ({n_kv}); DBRX's heads split the model width evenly")
    attn: dict[str, Any] = {"kind": "attention", "n_heads": n_heads, "n_kv_heads": n_kv, "qkv_bias": False,
                            "out_bias": False}
    clip = inner.get("clip_qkv")
    if clip is not None:
        attn["clip_qkv"] = inner.get_float("clip_qkv")
    inner.mark_read("attn_pdrop")  # dropout
    # transformers 4 read the rope base here; 5 reads rope_parameters only. The same value is the same model.
    if inner.has("rope_theta") and inner.data["rope_theta"] == theta:
        inner.mark_read("rope_theta")
    cfg.unused.extend(f"attn_config.{key}" for key in inner.unread())
    return attn


def _experts(cfg: ConfigReader, *, d_model: int) -> dict[str, Any]:
    inner = _nested(cfg, "ffn_config", FFN_DEFAULTS)
    act = inner.get("ffn_act_fn") or {"name": "silu"}
    if not isinstance(act, dict) or set(act) != {"name"}:
        raise UserError(f"{cfg.family}: ffn_config.ffn_act_fn = {act!r} is not supported: it must be a mapping with "
                        "only a 'name' (DBRX's experts call the named activation without arguments)")
    activation = activation_from_hf(ConfigReader(act, defaults={}, family=f"{cfg.family} ffn_config.ffn_act_fn"), "name")
    p = inner.get("moe_normalize_expert_weights")
    if p not in (None, 1, 1.0):
        raise UserError(f"{cfg.family}: config field 'ffn_config.moe_normalize_expert_weights' = {p!r} is not supported: "
                        "the kept expert weights divided by their p-norm match a specformer router only for p = 1 "
                        "(rescaled to sum to one) or null (left as they are). Supported values: 1.0, None")
    # transformers sets ffn_config.hidden_size to d_model whatever the file says; jitter only acts in training.
    inner.mark_read("hidden_size", "moe_jitter_eps")
    ffn = {
        "kind": "moe", "n_experts": inner.get_size("moe_num_experts"), "top_k": inner.get_size("moe_top_k"),
        "hidden": inner.get_size("ffn_hidden_size"), "activation": activation, "gated": True,
        "routing": "softmax_then_topk", "normalize_topk": p is not None,
        "aux_loss_coef": inner.get_float("moe_loss_weight"),
    }
    cfg.unused.extend(f"ffn_config.{key}" for key in inner.unread())
    return ffn


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    cfg.require("tie_word_embeddings", (False,), why="transformers' DBRX refuses tied embeddings")
    d_model, n_heads = cfg.get_size("d_model"), cfg.get_size("n_heads")
    positional = rope(cfg)
    cfg.mark_read("num_key_value_heads", "emb_pdrop")  # a copy of attn_config.kv_n_heads DbrxConfig writes; dropout
    norm = {"kind": "layernorm", "eps": 1e-5, "bias": False}  # nn.LayerNorm's eps: DBRX's config has none
    return {
        "vocab_size": cfg.get_int("vocab_size"),
        "d_model": d_model,
        "n_layers": cfg.get_layers("n_layers"),
        "context_length": cfg.get_int("max_seq_len"),
        "tie_embeddings": False,
        "positional": positional,
        "block": {
            "layout": "prenorm",
            "norm": norm,
            "mixer": _attention(cfg, n_heads=n_heads, d_model=d_model, theta=positional["theta"]),
            "ffn": _experts(cfg, d_model=d_model),
        },
    }


def to_config(view: SpecView) -> dict[str, Any]:
    m = view.model
    no_output_bias(view, NAME)
    if m.tie_embeddings:
        raise NotExpressible("model.tie_embeddings", f"Hugging Face {NAME} refuses tied embeddings")
    view.block_kind("layout", ("prenorm",), family=NAME)
    view.block_kind("norm", ("layernorm",), family=NAME)
    view.block_kind("mixer", ("attention",), family=NAME)
    view.block_kind("ffn", ("moe",), family=NAME)
    norm = view.uniform("norm", family=NAME)
    if norm["bias"] or not norm["affine"] or norm["offset"] or norm["eps"] != 1e-5:
        raise NotExpressible("model.block.norm", f"Hugging Face {NAME}'s LayerNorms have a weight, no bias and eps 1e-5")
    n_heads, n_kv, head_dim = view.attention_sizes()
    if head_dim * n_heads != m.d_model:
        raise NotExpressible("model.block.mixer.head_dim", f"Hugging Face {NAME} has head_dim = d_model / n_heads "
                             f"({m.d_model} / {n_heads})")
    if any(view.uniform("mixer", key, family=NAME) for key in ("qkv_bias", "out_bias")):
        raise NotExpressible("model.block.mixer", f"Hugging Face {NAME}'s attention has no biases")
    ffn = view.uniform("ffn", family=NAME)
    for key, wanted in (("router", None), ("gated", True), ("expert_bias", False), ("swiglu_limit", None),
                        ("n_shared_experts", 0), ("routing", "softmax_then_topk")):
        if ffn.get(key, wanted) != wanted:
            raise NotExpressible(f"model.block.ffn.{key}", f"{ffn.get(key)!r}: Hugging Face {NAME} has {wanted!r}")
    clip = view.uniform("mixer", "clip_qkv", family=NAME)
    if clip is None:
        raise NotExpressible("model.block.mixer.clip_qkv", f"Hugging Face {NAME} always clamps q, k and v (transformers' "
                             "attention fails with a null clip_qkv); give the mixer a clip_qkv")
    rope_fields = rope_config(view, NAME, legacy_theta=None)
    theta = rope_fields["rope_parameters"]["rope_theta"]
    return {
        "vocab_size": m.vocab_size,
        "d_model": m.d_model,
        "n_heads": n_heads,
        "n_layers": m.n_layers,
        "max_seq_len": m.context_length,
        "tie_word_embeddings": False,
        **rope_fields,
        # rope_theta here too: transformers 4 read the rope base from attn_config.
        "attn_config": {"kv_n_heads": n_kv, "clip_qkv": clip,
                        "rope_theta": theta},
        "ffn_config": {
            "ffn_act_fn": {"name": ACTIVATIONS_TO_HF[ffn["activation"]]},
            "ffn_hidden_size": ffn["hidden"] or default_gated_hidden(m.d_model),
            "moe_num_experts": ffn["n_experts"],
            "moe_top_k": ffn["top_k"],
            "moe_loss_weight": ffn["aux_loss_coef"],
            "moe_normalize_expert_weights": 1.0 if ffn["normalize_topk"] else None,
        },
    }


LAYER = "transformer.blocks.{i}"
EXPERTS = f"{LAYER}.ffn.experts.mlp"

WEIGHTS: list[Rule] = [
    Copy("transformer.wte.weight", "embedding.weight"),
    Copy(f"{LAYER}.norm_attn_norm.norm_1.weight", "blocks.{i}.attention_norm.weight"),
    # Wqkv's rows are [q (all heads); k; v], ours already.
    Copy(f"{LAYER}.norm_attn_norm.attn.Wqkv.weight", f"{BLOCK_MIXER}.qkv.weight"),
    Copy(f"{LAYER}.norm_attn_norm.attn.out_proj.weight", f"{BLOCK_MIXER}.out.weight"),
    Copy(f"{LAYER}.norm_attn_norm.norm_2.weight", "blocks.{i}.ffn_norm.weight"),
    Copy(f"{LAYER}.ffn.router.layer.weight", "blocks.{i}.ffn.router.weight"),
    FlatExperts([f"{EXPERTS}.w1", f"{EXPERTS}.v1"], "blocks.{i}.ffn.experts_in"),
    FlatExperts([f"{EXPERTS}.w2"], "blocks.{i}.ffn.experts_out", transposed=True),
    Copy("transformer.norm_f.weight", "final_norm.weight"),
    Copy("lm_head.weight", "lm_head.weight"),
]

FAMILY = Family(
    name=NAME,
    model_type="dbrx",
    architecture="DbrxForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=WEIGHTS,
    non_math_fields=("emb_pdrop",),
    maps="prenorm LayerNorms without biases (eps 1e-5); rope (rope_parameters); attention with n_heads, "
         "attn_config.kv_n_heads and attn_config.clip_qkv (q, k and v clamped after the fused Wqkv); ffn moe in every "
         "layer from ffn_config: moe_num_experts, moe_top_k, ffn_hidden_size, ffn_act_fn.name, softmax-then-top-k "
         "routing renormalised when moe_normalize_expert_weights is 1 (null: not), moe_loss_weight as aux_loss_coef; "
         "the 2-D expert matrices w1 / v1 / w2 as our stacked experts; untied head",
    caveats="a null attn_config.clip_qkv is read as no clamping, but export refuses a spec without clip_qkv "
            "(transformers' DBRX attention fails without one); moe_normalize_expert_weights other than 1 or null (a p-norm of the kept weights) is refused; "
            "attn_config.rope_theta is read by transformers 4 only (5 reads rope_parameters): a value that differs "
            "from rope_parameters' is reported as unused, and export writes both; tied embeddings are refused, as "
            "transformers refuses them",
)
