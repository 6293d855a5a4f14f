"""Jamba (``model_type: jamba``, ai21labs/Jamba-v0.1, AI21-Jamba-Mini/Large-1.5): Mamba-1 and attention layers,
with a mixture of experts every other layer.

Every layer is a pre-normed block (RMSNorm ``input_layernorm`` before the mixer, ``pre_ff_layernorm``
before the feed-forward). Its mixer is grouped-query attention without positions or biases where
``i % attn_layer_period == attn_layer_offset``, else a Mamba-1 mixer whose step, B and C pass
RMSNorms *with* weights (``dt_layernorm``, ``b_layernorm``, ``c_layernorm``, eps ``rms_norm_eps``:
the ``mamba`` mixer's ``bcdt_norm_weights``). Its feed-forward is a mixture of ``num_experts``
SwiGLU experts where ``i % expert_layer_period == expert_layer_offset`` (the softmax over all
experts, top-``num_experts_per_tok`` kept without renormalising), else one SwiGLU of the same
``intermediate_size``. The block holds the more common mixer and feed-forward; ``layers:`` overrides
the others, and export finds the period and offset that give the spec's layers back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.parts.attention import Attention, attention_sizes
from specformer_hf.parts.base import (BLOCK_MIXER, LAYER, FamilyView, Part, keeps_keys, keeps_state, selection,
                                      uniform_mixers)
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.mamba import JambaMambaFields, mamba_rules
from specformer_hf.parts.norms import Layout, RMSNorm
from specformer_hf.parts.positions import no_positions
from specformer_hf.rules import AtLayers, Copy, Fused, OneOf, PerExpert, Rule, Site, halves
from specformer_hf.specview import NotExpressible

#: transformers' JambaConfig defaults (its docstring's checkpoint: ai21labs/Jamba-v0.1).
DEFAULTS = {
    "vocab_size": 65536, "tie_word_embeddings": False, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_act": "silu",
    "rms_norm_eps": 1e-6, "router_aux_loss_coef": 0.001, "max_position_embeddings": 262144,
    "num_experts_per_tok": 2, "num_experts": 16, "expert_layer_period": 2, "expert_layer_offset": 1,
    "attn_layer_period": 8, "attn_layer_offset": 4, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
    "mamba_dt_rank": "auto", "mamba_conv_bias": True, "mamba_proj_bias": False,
}
MIXER = JambaMambaFields()
FFN = f"{LAYER}.feed_forward"


def periodic(cfg: ConfigReader, period_key: str, offset_key: str, n_layers: int) -> list[int]:
    """The layers ``i`` with ``i % period == offset`` (transformers' layers_block_type, layers_num_experts)."""
    period, offset = cfg.get_size(period_key), cfg.get_int(offset_key)
    if not 0 <= offset < period:
        raise UserError(f"{cfg.family}: {offset_key} must be at least 0 and below {period_key} ({period}), got {offset}")
    return [i for i in range(n_layers) if i % period == offset]


def period_of(indices: list[int], n_layers: int, *, what: str, field: str, family: str) -> tuple[int, int]:
    """The smallest ``(period, offset)`` whose layers ``i % period == offset`` are ``indices``; NotExpressible if none."""
    for period in range(1, n_layers + 2):
        for offset in range(period):
            if [i for i in range(n_layers) if i % period == offset] == indices:
                return period, offset
    raise NotExpressible(f"model.layers[*].{field}", f"{what} at layers {indices}; Hugging Face {family} places them "
                         "every period layers from an offset (i % period == offset)")


def _put(model: dict[str, Any], field: str, chosen: list[int], n_layers: int, on: Any, off: Any) -> None:
    """``on`` at the layers ``chosen``, ``off`` at the others: the more common one in the block, the rest overridden."""
    rest = [i for i in range(n_layers) if i not in chosen]
    base, other, where = (on, off, rest) if len(chosen) >= len(rest) else (off, on, chosen)
    model.setdefault("block", {})[field] = base
    if where and len(where) < n_layers:
        model.setdefault("layers", []).append({"select": selection(where, n_layers), field: other})
    elif where:
        model["block"][field] = other


def _n_experts(site: Site) -> int:
    return getattr(site.ffn, "n_experts", 0)  # 0 in a dense layer: no expert tensors there


@dataclass(frozen=True)
class JambaLayers(Part):
    """attn_layer_period/offset and the attention's sizes, the mamba_* fields, expert_layer_period/offset, the experts."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        attention = periodic(cfg, "attn_layer_period", "attn_layer_offset", n_layers)
        experts = periodic(cfg, "expert_layer_period", "expert_layer_offset", n_layers)
        model["positional"] = {"kind": "none"}
        _put(model, "mixer", attention, n_layers, attention_sizes(cfg), MIXER.spec(cfg))
        swiglu = {"kind": "swiglu", "hidden": cfg.get_int("intermediate_size"), "activation": "silu"}
        n_experts = cfg.get_int("num_experts")
        moe = {"kind": "moe", "n_experts": n_experts, "top_k": cfg.get_int("num_experts_per_tok"),
               "hidden": cfg.get_int("intermediate_size"), "activation": "silu", "gated": True,
               "routing": "softmax_then_topk", "normalize_topk": False,
               "aux_loss_coef": cfg.get_float("router_aux_loss_coef")}
        # transformers builds a plain MLP wherever a layer would have one expert.
        _put(model, "ffn", experts if n_experts > 1 else [], n_layers, moe, swiglu)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        no_positions(view)
        m, layers = view.model, view.view.layers
        kinds = view.per_layer("mixer", "kind")
        for i, kind in enumerate(kinds):
            if kind not in ("attention", "mamba"):
                raise NotExpressible(f"model.layers[{i}].mixer.kind", f"{kind!r} has no equivalent in Hugging Face "
                                     f"{view.name} (whose layers are 'mamba' or 'attention')")
        attention = [i for i, kind in enumerate(kinds) if kind == "attention"]
        period, offset = period_of(attention, m.n_layers, what="attention", field="mixer", family=view.name)
        config.update(attn_layer_period=period, attn_layer_offset=offset)
        eps = view.uniform("norm", "eps")
        if attention:
            a = uniform_mixers([layers[i]["mixer"] for i in attention], family=view.name, what="attention")
            if a["qkv_bias"] or a["out_bias"] or a.get("scale") is not None:
                raise NotExpressible("model.layers[*].mixer", f"Hugging Face {view.name}'s attention has no biases and "
                                     "the usual head_dim^-1/2 scale")
            n_heads, n_kv, head_dim = view.view.attention_sizes(attention[0])
            config.update(num_attention_heads=n_heads, num_key_value_heads=n_kv)
            if head_dim != m.d_model // n_heads:
                config["head_dim"] = head_dim
        mamba = [layers[i]["mixer"] for i, kind in enumerate(kinds) if kind == "mamba"]
        if mamba:
            mixer = uniform_mixers(mamba, family=view.name, what="Mamba")
            config.update(MIXER.config(mixer, d_model=m.d_model, norm_eps=eps, family=view.name))
        self._write_ffn(view, config)

    def _write_ffn(self, view: FamilyView, config: dict[str, Any]) -> None:
        m, layers = view.model, view.view.layers
        kinds = view.per_layer("ffn", "kind")
        for i, kind in enumerate(kinds):
            if kind not in ("moe", "swiglu"):
                raise NotExpressible(f"model.layers[{i}].ffn.kind", f"{kind!r}: Hugging Face {view.name}'s feed-forwards "
                                     "are swiglu or a mixture of swiglu experts (moe)")
        experts = [i for i, kind in enumerate(kinds) if kind == "moe"]
        dense = [layers[i]["ffn"] for i, kind in enumerate(kinds) if kind != "moe"]
        widths = set()
        if experts:
            moe = uniform_mixers([layers[i]["ffn"] for i in experts], family=view.name, what="mixture-of-experts")
            wanted = {"routing": "softmax_then_topk", "normalize_topk": False, "gated": True, "activation": "silu",
                      "expert_bias": False, "swiglu_limit": None, "router": None}
            if moe.get("n_shared_experts"):
                raise NotExpressible("model.block.ffn.n_shared_experts", f"Hugging Face {view.name} has no shared experts")
            for key, value in wanted.items():
                if moe.get(key, value) != value:
                    raise NotExpressible(f"model.block.ffn.{key}", f"{moe.get(key)!r}: Hugging Face {view.name}'s experts "
                                         f"have {key} {value!r}")
            if moe["n_experts"] < 2:
                raise NotExpressible("model.block.ffn.n_experts", f"Hugging Face {view.name} needs 2 or more experts")
            period, offset = period_of(experts, m.n_layers, what="experts", field="ffn", family=view.name)
            config.update(num_experts=moe["n_experts"], num_experts_per_tok=moe["top_k"],
                          router_aux_loss_coef=moe["aux_loss_coef"], expert_layer_period=period,
                          expert_layer_offset=offset)
            widths.add(moe["hidden"])
        else:
            config.update(num_experts=1, expert_layer_period=1, expert_layer_offset=0)
        for ffn in dense:
            if ffn["activation"] != "silu" or ffn["bias"]:
                raise NotExpressible("model.layers[*].ffn", f"Hugging Face {view.name}'s MLPs are SwiGLU without biases")
            widths.add(ffn["hidden"])
        if None in widths or len(widths) != 1:
            raise NotExpressible("model.layers[*].ffn.hidden", f"widths {sorted(widths, key=str)}; Hugging Face "
                                 f"{view.name} has one stated intermediate_size for its MLPs and experts")
        config.update(intermediate_size=widths.pop(), hidden_act="silu")

    def rules(self) -> list[Rule]:
        attention = [AtLayers(rule, where=lambda site: keeps_keys(site.mixer), layers="attention")
                     for rule in Attention().rules()]
        mamba = [AtLayers(rule, where=lambda site: keeps_state(site.mixer), layers="Mamba")
                 for rule in mamba_rules(f"{LAYER}.mamba", BLOCK_MIXER)]
        # Dense layers' MLP and the experts' layers (a rule whose parameters a layer lacks is skipped there);
        # the experts are read per expert (as Jamba's checkpoints keep them) or fused (transformers 5 in memory).
        ffn = [
            Fused([f"{FFN}.gate_proj.weight", f"{FFN}.up_proj.weight"], "blocks.{i}.ffn.gate_up.weight", sizes=halves),
            Copy(f"{FFN}.down_proj.weight", "blocks.{i}.ffn.down.weight"),
            Copy(f"{FFN}.router.weight", "blocks.{i}.ffn.router.weight"),
            OneOf(PerExpert([f"{FFN}.experts.{{j}}.gate_proj.weight", f"{FFN}.experts.{{j}}.up_proj.weight"],
                            "blocks.{i}.ffn.experts_in", n_experts=_n_experts),
                  Copy(f"{FFN}.experts.gate_up_proj", "blocks.{i}.ffn.experts_in")),
            OneOf(PerExpert([f"{FFN}.experts.{{j}}.down_proj.weight"], "blocks.{i}.ffn.experts_out", n_experts=_n_experts),
                  Copy(f"{FFN}.experts.down_proj", "blocks.{i}.ffn.experts_out")),
        ]
        return attention + mamba + ffn


LAYOUT = Layout("prenorm", names=(("attention_norm", "input_layernorm"), ("ffn_norm", "pre_ff_layernorm")))
FAMILY = decoder_family(
    name="Jamba",
    model_type="jamba",
    architecture="JambaForCausalLM",
    defaults=DEFAULTS,
    parts=[Sizes(), LAYOUT, RMSNorm(), JambaLayers()],
    # Sizes' rules name the final norm model.norm: Jamba's is model.final_layernorm.
    rules=[Copy("model.embed_tokens.weight", "embedding.weight"), Copy("model.final_layernorm.weight", "final_norm.weight"),
           Copy("lm_head.weight", "lm_head.weight"), *LAYOUT.rules(), *JambaLayers().rules()],
    # Initialisation, or transformers' choice of algorithm only.
    non_math_fields=("use_mamba_kernels", "use_mambapy", "use_associative_scan", "output_router_logits",
                     "num_logits_to_keep"),
    maps="attn_layer_period/offset -> attention (no positions, no biases) or mamba per layer (layers: overrides); "
         "mamba_expand x hidden_size -> d_inner, mamba_d_state, mamba_d_conv, mamba_dt_rank, mamba_conv_bias, "
         "mamba_proj_bias, and rms_norm_eps -> mamba's bcdt_norm_eps with bcdt_norm_weights (the weighted RMSNorms "
         "on dt, B and C); expert_layer_period/offset -> moe (softmax then top-k, not renormalised) or swiglu per "
         "layer; pre-norm RMSNorm (input_layernorm, pre_ff_layernorm, final_layernorm)",
    caveats="one attention, one Mamba and one expert setting for all layers; reads per-expert or fused expert "
            "tensors, writes them per expert",
)
