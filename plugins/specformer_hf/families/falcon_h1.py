"""Falcon-H1 (``model_type: falcon_h1``, Falcon-H1-0.5B to 34B): attention and Mamba-2 side by side in every block,
with muP multipliers throughout.

Every block runs a Mamba-2 mixer and grouped-query attention on the same normalised input
and adds their outputs: the mixer ``parallel`` with ``mixers: [mamba2, attention]``
(Mamba-2 first, as transformers adds them), then a SwiGLU feed-forward; pre-norm RMSNorm.

Falcon-H1's multipliers each get a place of their own, none folded into the weights, so
the checkpoint's tensors come back bit for bit and export writes the config exactly:

- ``ssm_in_multiplier`` / ``attention_in_multiplier`` and ``ssm_out_multiplier`` /
  ``attention_out_multiplier``: the parallel mixer's ``in_multipliers`` and ``out_multipliers``;
- ``ssm_multipliers`` (the muP vector over the Mamba input projection's parts z, x, B, C,
  dt): the Mamba-2 mixer's ``projection_multipliers``;
- ``key_multiplier`` (keys scaled before the scores): the attention's score ``scale``,
  ``key_multiplier / sqrt(head_dim)``, the same scores (export writes the key multiplier
  whose product with ``1/sqrt(head_dim)`` is exactly that scale);
- ``mlp_multipliers`` (gate, down): the SwiGLU's ``gate_multiplier`` and ``output_multiplier``;
- ``embedding_multiplier`` and ``lm_head_multiplier``: the model's ``embedding_multiplier``
  and ``logit_scale``.

``mamba_rms_norm: false`` (the default) gates the Mamba output by ``silu(z)`` with no norm
(``gated_norm: false``); true uses the grouped gated RMSNorm, ``mamba_norm_before_gate``
saying on which side of the gate. ``mamba_d_ssm`` is the Mamba inner width
(``mamba_expand x hidden_size`` when null).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.parts.attention import attention_sizes
from specformer_hf.parts.base import BLOCK_MIXER, LAYER, FamilyView, Part, exact_preimage
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes, embedding_multiplier_config
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.parts.mamba2 import HYBRID_FIELDS, mamba2_rules
from specformer_hf.parts.norms import RMSNorm
from specformer_hf.parts.positions import Rope
from specformer_hf.rules import Copy, Fused, Rule, halves, qkv_sizes
from specformer_hf.specview import NotExpressible

#: transformers' FalconH1Config defaults.
DEFAULTS = {
    "vocab_size": 128000, "tie_word_embeddings": False, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_act": "silu",
    "rms_norm_eps": 1e-5, "max_position_embeddings": 8192, "mamba_d_ssm": 1024, "mamba_n_heads": 128,
    "mamba_d_head": "auto", "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_conv": 4, "mamba_expand": 2,
    "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_proj_bias": False, "mamba_norm_before_gate": True,
    "mamba_rms_norm": False, "time_step_limit": (0.0, float("inf")), "projectors_bias": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "lm_head_multiplier": 1.0, "embedding_multiplier": 1.0, "mlp_multipliers": None, "key_multiplier": 1.0,
    "attention_out_multiplier": 1.0, "attention_in_multiplier": 1.0, "ssm_multipliers": None,
    "ssm_in_multiplier": 1.0, "ssm_out_multiplier": 1.0, "attention_bias": False, "mlp_bias": False,
}

MAMBA, ATTENTION = f"{BLOCK_MIXER}.mixers.0", f"{BLOCK_MIXER}.mixers.1"
FFN = f"{LAYER}.feed_forward"


def multipliers(cfg: ConfigReader, key: str, count: int) -> list[float]:
    """A list of ``count`` numbers (mlp_multipliers, ssm_multipliers); the defaults of 1 when null."""
    values = cfg.get(key)
    if values is None:
        return [1.0] * count
    numbers = isinstance(values, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if not numbers or len(values) != count:
        raise UserError(f"{cfg.family}: {key} must be a list of {count} numbers, got {values!r}")
    return [float(v) for v in values]


def key_scale(head_dim: int) -> float:
    """The score scale of transformers' Falcon-H1 attention for key multiplier 1."""
    return head_dim ** -0.5


@dataclass(frozen=True)
class FalconSizes(Sizes):
    """As :class:`Sizes`, with Falcon-H1's final norm (model.final_layernorm)."""

    def rules(self) -> list[Rule]:
        return [Copy("model.embed_tokens.weight", "embedding.weight"),
                Copy("model.final_layernorm.weight", "final_norm.weight"), Copy("lm_head.weight", "lm_head.weight")]


@dataclass(frozen=True)
class FalconBlocks(Part):
    """Pre-norm blocks: input_layernorm before the mixers, pre_ff_layernorm before the feed-forward."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model.setdefault("block", {})["layout"] = "prenorm"
        cfg.mark_read("layer_types", "layers_block_type")  # always "hybrid": a property, not a setting

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("layout", ("prenorm",))

    def rules(self) -> list[Rule]:
        return [Copy(f"{LAYER}.input_layernorm.weight", "blocks.{i}.attention_norm.weight"),
                Copy(f"{LAYER}.pre_ff_layernorm.weight", "blocks.{i}.ffn_norm.weight")]


@dataclass(frozen=True)
class HybridMixer(Part):
    """Mamba-2 beside attention in every block, with their in/out multipliers, the key and the muP multipliers."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        attention = attention_sizes(cfg)
        bias = bool(cfg.get("attention_bias"))
        attention.update(qkv_bias=bias, out_bias=bias)
        key_multiplier = cfg.get_float("key_multiplier")
        if key_multiplier != 1.0:
            attention["scale"] = key_multiplier * key_scale(attention["head_dim"])
        d_ssm = cfg.get("mamba_d_ssm")
        d_inner = int(d_ssm) if d_ssm is not None else cfg.get_size("mamba_expand") * cfg.get_size("hidden_size")
        if d_ssm is not None:
            cfg.mark_read("mamba_expand")  # mamba_d_ssm decides the width
        mamba = HYBRID_FIELDS.spec(cfg, d_inner=d_inner)
        if bool(cfg.get("projectors_bias")) != mamba["bias"]:
            raise UserError(f"{cfg.family}: mamba_proj_bias ({mamba['bias']}) and projectors_bias "
                            f"({cfg.get('projectors_bias')}) differ; specformer's mamba2 has biases on both of its "
                            "projections or on neither")
        gated_norm = bool(cfg.get("mamba_rms_norm"))
        before = bool(cfg.get("mamba_norm_before_gate"))
        mamba.update(gated_norm=gated_norm, norm_before_gate=before if gated_norm else False,
                     projection_multipliers=multipliers(cfg, "ssm_multipliers", 5))
        model.setdefault("block", {})["mixer"] = {
            "kind": "parallel", "mixers": [mamba, attention],
            "in_multipliers": [cfg.get_float("ssm_in_multiplier"), cfg.get_float("attention_in_multiplier")],
            "out_multipliers": [cfg.get_float("ssm_out_multiplier"), cfg.get_float("attention_out_multiplier")],
        }

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("mixer", ("parallel",))
        parallel = view.uniform("mixer")
        kinds = [mixer["kind"] for mixer in parallel["mixers"]]
        if kinds != ["mamba2", "attention"]:
            raise NotExpressible("model.block.mixer.mixers", f"{kinds}: Hugging Face {view.name} runs "
                                 "['mamba2', 'attention'] side by side")
        mamba, attention = parallel["mixers"]
        n_heads = attention["n_heads"]
        head_dim = attention.get("head_dim") or view.model.d_model // n_heads
        scale = attention.get("scale")
        config.update(
            num_attention_heads=n_heads, num_key_value_heads=attention.get("n_kv_heads") or n_heads, head_dim=head_dim,
            attention_bias=attention["qkv_bias"],
            key_multiplier=1.0 if scale is None else exact_preimage(scale, lambda v: v * key_scale(head_dim),
                                                                    scale / key_scale(head_dim)),
        )
        if mamba["norm_eps"] != view.uniform("norm", "eps"):
            raise NotExpressible("model.block.mixer.mixers[0].norm_eps", f"Hugging Face {view.name}'s Mamba norm "
                                 f"uses rms_norm_eps, the block norms' eps ({view.uniform('norm', 'eps')})")
        ins, outs = parallel["in_multipliers"], parallel["out_multipliers"]
        config.update(HYBRID_FIELDS.config(mamba, d_model=view.model.d_model, family=view.name),
                      mamba_d_ssm=mamba["n_heads"] * mamba["head_dim"],
                      projectors_bias=mamba["bias"], mamba_rms_norm=mamba["gated_norm"],
                      mamba_norm_before_gate=mamba["norm_before_gate"],
                      ssm_multipliers=mamba.get("projection_multipliers") or [1.0] * 5,
                      ssm_in_multiplier=ins[0], attention_in_multiplier=ins[1], ssm_out_multiplier=outs[0],
                      attention_out_multiplier=outs[1])

    def rules(self) -> list[Rule]:
        attention = f"{LAYER}.self_attn"
        return [
            Fused([f"{attention}.q_proj.weight", f"{attention}.k_proj.weight", f"{attention}.v_proj.weight"],
                  f"{ATTENTION}.qkv.weight", sizes=qkv_sizes),
            Fused([f"{attention}.q_proj.bias", f"{attention}.k_proj.bias", f"{attention}.v_proj.bias"],
                  f"{ATTENTION}.qkv.bias", sizes=qkv_sizes),
            Copy(f"{attention}.o_proj.weight", f"{ATTENTION}.out.weight"),
            Copy(f"{attention}.o_proj.bias", f"{ATTENTION}.out.bias"),
            *mamba2_rules(f"{LAYER}.mamba", MAMBA),
        ]


@dataclass(frozen=True)
class FalconFFN(GatedFFN):
    """intermediate_size, hidden_act, mlp_bias and mlp_multipliers (gate, down) <-> the SwiGLU and its multipliers."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        super().read(cfg, model)
        gate, down = multipliers(cfg, "mlp_multipliers", 2)
        model["block"]["ffn"].update(gate_multiplier=gate, output_multiplier=down)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        config["mlp_multipliers"] = [view.uniform("ffn", "gate_multiplier"), view.uniform("ffn", "output_multiplier")]

    def rules(self) -> list[Rule]:
        return [
            Fused([f"{FFN}.gate_proj.weight", f"{FFN}.up_proj.weight"], "blocks.{i}.ffn.gate_up.weight", sizes=halves),
            Fused([f"{FFN}.gate_proj.bias", f"{FFN}.up_proj.bias"], "blocks.{i}.ffn.gate_up.bias", sizes=halves),
            Copy(f"{FFN}.down_proj.weight", "blocks.{i}.ffn.down.weight"),
            Copy(f"{FFN}.down_proj.bias", "blocks.{i}.ffn.down.bias"),
        ]


@dataclass(frozen=True)
class ModelMultipliers(Part):
    """embedding_multiplier <-> the model's; lm_head_multiplier <-> logit_scale."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model["embedding_multiplier"] = cfg.get_float("embedding_multiplier")
        model["logit_scale"] = cfg.get_float("lm_head_multiplier")

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        config["embedding_multiplier"] = embedding_multiplier_config(view.model)
        config["lm_head_multiplier"] = view.model.logit_scale


FAMILY = decoder_family(
    name="Falcon-H1",
    model_type="falcon_h1",
    architecture="FalconH1ForCausalLM",
    defaults=DEFAULTS,
    parts=[FalconSizes(), Rope(), FalconBlocks(), RMSNorm(), HybridMixer(), FalconFFN(bias_key="mlp_bias"),
           ModelMultipliers()],
    non_math_fields=("num_logits_to_keep",),
    maps="mixer: parallel [mamba2, attention] in every block (ssm/attention in and out multipliers); mamba_* "
         "(mamba_d_ssm, mamba_rms_norm -> gated_norm, ssm_multipliers -> projection_multipliers) -> mamba2; "
         "key_multiplier -> mixer.scale; mlp_multipliers -> swiglu gate_multiplier and output_multiplier; "
         "embedding_multiplier; lm_head_multiplier -> logit_scale",
    caveats="mamba_proj_bias and projectors_bias must agree (one bias switch on mamba2); transformers clamps the Mamba "
            "step (time_step_limit) when prefilling but not when decoding one token, so a finite limit generates "
            "differently there",
)
