"""xLSTM (``model_type: xlstm``, NX-AI/xLSTM-7b): pre-normed mLSTM layers, each followed by a SwiGLU feed-forward,
and soft-capped output logits.

Each block is ``x + mlstm(rmsnorm(x)); x + swiglu(rmsnorm(x))``: a ``prenorm`` block with RMSNorms (``norm_eps``),
mixer ``mlstm`` (``num_heads``; ``qk_dim_factor`` and ``v_dim_factor`` of ``hidden_size`` as transformers' layer
truncates them; ``gate_soft_cap``, ``eps``, ``chunk_size``; the per-head norm's eps is ``norm_eps``) and ffn
``swiglu`` (``hidden_size * ffn_proj_factor`` rounded up to ``ffn_round_up_to_multiple_of``), no positions; the
final ``out_norm`` (transformers applies it whatever ``add_out_norm`` says) and ``output_logit_soft_cap`` ->
``model.logit_softcap``.
"""

from __future__ import annotations

import math
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.family import Family
from specformer_hf.parts.base import BLOCK_MIXER
from specformer_hf.parts.embedding import no_output_bias
from specformer_hf.rules import Copy, Fused, Rule, halves
from specformer_hf.specview import NotExpressible, SpecView

NAME = "xLSTM"

#: transformers' xLSTMConfig defaults (they describe NX-AI/xLSTM-7b).
DEFAULTS = {
    "vocab_size": 50304, "hidden_size": 4096, "embedding_dim": None, "num_hidden_layers": 32, "num_blocks": None,
    "num_heads": 8, "use_bias": False, "norm_reduction_force_float32": True, "tie_word_embeddings": False,
    "add_out_norm": True, "norm_eps": 1e-6, "qk_dim_factor": 0.5, "v_dim_factor": 1.0,
    "chunkwise_kernel": "chunkwise--native_autograd", "sequence_kernel": "native_sequence__native",
    "step_kernel": "native", "mode": "inference", "chunk_size": 64, "return_last_states": True,
    "autocast_kernel_dtype": "bfloat16", "eps": 1e-6, "inference_state_dtype": "float32", "ffn_proj_factor": 2.667,
    "ffn_round_up_to_multiple_of": 64, "gate_soft_cap": 15.0, "output_logit_soft_cap": 30.0, "weight_mode": "single",
    "max_inference_chunksize": 16384,
}
#: Fields that choose transformers' kernels, dtypes or chunking (the same maths), and add_out_norm, which
#: transformers' xLSTMModel never reads (its out_norm is always applied).
NON_MATH_FIELDS = ("chunkwise_kernel", "sequence_kernel", "step_kernel", "mode", "return_last_states",
                   "autocast_kernel_dtype", "inference_state_dtype", "max_inference_chunksize",
                   "norm_reduction_force_float32", "add_out_norm", "embedding_dim", "num_blocks")
#: xLSTM has no context limit and its config no max_position_embeddings; the spec needs one.
DEFAULT_CONTEXT = 4096


def round_up(x: float, multiple: int) -> int:
    """transformers' ``round_up_to_next_multiple_of``: the feed-forward's width."""
    return int(((x + multiple - 1) // multiple) * multiple)


def _context_length(cfg: ConfigReader) -> int:
    value = cfg.get("max_position_embeddings", None)
    return DEFAULT_CONTEXT if value is None else cfg.get_size("max_position_embeddings")


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    cfg.require("use_bias", (False,), why="it puts biases on xLSTM's RMSNorms, which specformer's rmsnorm lacks")
    cfg.require("weight_mode", ("single",), why="'fused' keeps q, k, v and the output gate (and the two gates) as one "
                                                "tensor each, which this mapping does not split")
    d_model = cfg.get_size("hidden_size")
    eps = cfg.get_float("norm_eps")
    heads = cfg.get_size("num_heads")
    # transformers' layer truncates the widths (int()), where its config's qk_dim/v_dim properties round up.
    qk, v = int(d_model * cfg.get_float("qk_dim_factor")), int(d_model * cfg.get_float("v_dim_factor"))
    if qk % heads or v % heads or not qk or not v:
        raise UserError(f"{NAME}: num_heads ({heads}) must divide the query/key width ({qk}) and the value width "
                        f"({v}) that qk_dim_factor and v_dim_factor give")
    hidden = round_up(d_model * cfg.get_float("ffn_proj_factor"), cfg.get_size("ffn_round_up_to_multiple_of"))
    cap = cfg.get("gate_soft_cap")
    logit_cap = cfg.get("output_logit_soft_cap")
    cfg.mark_read("tie_word_embeddings")  # transformers' xLSTM never ties its head (see caveats)
    norm = {"kind": "rmsnorm", "eps": eps}
    return {
        "vocab_size": cfg.get_int("vocab_size"),
        "d_model": d_model,
        "n_layers": cfg.get_layers("num_hidden_layers"),
        "context_length": _context_length(cfg),
        "tie_embeddings": False,
        "positional": {"kind": "none"},
        "final_norm": {"kind": "rmsnorm", "eps": eps},
        "logit_softcap": None if logit_cap is None else cfg.get_float("output_logit_soft_cap"),
        "block": {"layout": "prenorm", "norm": norm,
                  "mixer": {"kind": "mlstm", "n_heads": heads, "qk_dim": qk, "v_dim": v,
                            "gate_soft_cap": None if cap is None else cfg.get_float("gate_soft_cap"),
                            "norm_eps": eps, "eps": cfg.get_float("eps"), "chunk": cfg.get_size("chunk_size")},
                  "ffn": {"kind": "swiglu", "hidden": hidden}},
    }


def _factor(width: int, d_model: int, field: str) -> float:
    """A factor whose product with ``d_model`` is exactly ``width`` (transformers truncates it with int())."""
    base = width / d_model
    for f in (base, math.nextafter(base, math.inf), math.nextafter(base, -math.inf)):
        if d_model * f == width:
            return f
    raise NotExpressible(f"model.block.mixer.{field}", f"{width} is no exact multiple of d_model ({d_model}) by a "
                                                       f"float factor, which Hugging Face {NAME} needs")


def _ffn_fields(hidden: int, d_model: int) -> dict[str, Any]:
    """ffn_proj_factor and ffn_round_up_to_multiple_of that give ``hidden``: xLSTM-7B's own where they do."""
    if round_up(d_model * DEFAULTS["ffn_proj_factor"], DEFAULTS["ffn_round_up_to_multiple_of"]) == hidden:
        return {"ffn_proj_factor": DEFAULTS["ffn_proj_factor"],
                "ffn_round_up_to_multiple_of": DEFAULTS["ffn_round_up_to_multiple_of"]}
    # Multiple 1 rounds down: half a channel above the width lands on it whatever the float's last bit.
    return {"ffn_proj_factor": (hidden + 0.5) / d_model, "ffn_round_up_to_multiple_of": 1}


def to_config(view: SpecView) -> dict[str, Any]:
    m = view.model
    no_output_bias(view, NAME)
    if m.tie_embeddings:
        raise NotExpressible("model.tie_embeddings", f"Hugging Face {NAME} never ties its head to the embeddings")
    if view.positional["kind"] != "none" or any(p is not None and p["kind"] != "none"
                                                for p in view.per_layer("positional")):
        raise NotExpressible("model.positional.kind", f"Hugging Face {NAME} has no positional scheme")
    if m.embedding_norm is not None:
        raise NotExpressible("model.embedding_norm", f"Hugging Face {NAME} has no norm on the embeddings")
    if m.embedding_multiplier != 1.0 or m.logit_scale != 1.0:
        raise NotExpressible("model.embedding_multiplier", f"Hugging Face {NAME} scales neither embeddings nor logits")
    view.block_kind("layout", ("prenorm",), family=NAME)
    view.block_kind("norm", ("rmsnorm",), family=NAME)
    view.block_kind("mixer", ("mlstm",), family=NAME)
    view.block_kind("ffn", ("swiglu",), family=NAME)
    eps = view.uniform("norm", "eps", family=NAME)
    for key in ("offset",):
        if view.uniform("norm", key, family=NAME):
            raise NotExpressible(f"model.block.norm.{key}", f"Hugging Face {NAME}'s RMSNorms have no weight offset")
    final_norm = m.final_norm_ref()
    if final_norm["kind"] != "rmsnorm" or final_norm.get("eps", 1e-6) != eps or final_norm.get("offset"):
        raise NotExpressible("model.final_norm", f"Hugging Face {NAME}'s out_norm is an RMSNorm with the blocks' eps")
    mixer = {key: view.uniform("mixer", key, family=NAME)
             for key in ("n_heads", "qk_dim", "v_dim", "bias", "gate_soft_cap", "norm_eps", "eps", "chunk")}
    if mixer["bias"]:
        raise NotExpressible("model.block.mixer.bias", f"Hugging Face {NAME}'s use_bias would also bias its RMSNorms")
    if mixer["norm_eps"] != eps:
        raise NotExpressible("model.block.mixer.norm_eps", f"Hugging Face {NAME}'s per-head norm uses norm_eps ({eps})")
    if view.uniform("ffn", "bias", family=NAME):
        raise NotExpressible("model.block.ffn.bias", f"Hugging Face {NAME}'s feed-forward has no biases")
    d_model = m.d_model
    qk = mixer["qk_dim"] or d_model // 2
    v = mixer["v_dim"] or d_model
    return {
        "vocab_size": m.vocab_size,
        "hidden_size": d_model,
        "num_hidden_layers": m.n_layers,
        "max_position_embeddings": m.context_length,
        "num_heads": mixer["n_heads"],
        "use_bias": False,
        "norm_eps": eps,
        "qk_dim_factor": _factor(qk, d_model, "qk_dim"),
        "v_dim_factor": _factor(v, d_model, "v_dim"),
        "chunk_size": mixer["chunk"],
        "eps": mixer["eps"],
        **_ffn_fields(view.uniform("ffn", "hidden", family=NAME), d_model),
        "gate_soft_cap": mixer["gate_soft_cap"],
        "output_logit_soft_cap": m.logit_softcap,
        "weight_mode": "single",
        "tie_word_embeddings": False,
    }


LAYER = "backbone.blocks.{i}"
MLSTM = f"{LAYER}.mlstm_layer"
FFN = f"{LAYER}.ffn"

#: transformers' mLSTM layer's linear names -> ours.
LINEARS = {"q": "q", "k": "k", "v": "v", "ogate_preact": "out_gate", "out_proj": "out"}

WEIGHTS: list[Rule] = [
    Copy("backbone.embeddings.weight", "embedding.weight"),
    Copy(f"{LAYER}.norm_mlstm.weight", "blocks.{i}.attention_norm.weight"),
    *(Copy(f"{MLSTM}.{theirs}.weight", f"{BLOCK_MIXER}.{ours}.weight") for theirs, ours in LINEARS.items()),
    Copy(f"{MLSTM}.igate_preact.weight", f"{BLOCK_MIXER}.input_gate.weight"),
    Copy(f"{MLSTM}.igate_preact.bias", f"{BLOCK_MIXER}.input_gate.bias"),
    Copy(f"{MLSTM}.fgate_preact.weight", f"{BLOCK_MIXER}.forget_gate.weight"),
    Copy(f"{MLSTM}.fgate_preact.bias", f"{BLOCK_MIXER}.forget_gate.bias"),
    Copy(f"{MLSTM}.multihead_norm.weight", f"{BLOCK_MIXER}.norm_weight"),
    Copy(f"{LAYER}.norm_ffn.weight", "blocks.{i}.ffn_norm.weight"),
    Fused([f"{FFN}.proj_up_gate.weight", f"{FFN}.proj_up.weight"], "blocks.{i}.ffn.gate_up.weight", sizes=halves),
    Copy(f"{FFN}.proj_down.weight", "blocks.{i}.ffn.down.weight"),
    Copy("backbone.out_norm.weight", "final_norm.weight"),
    Copy("lm_head.weight", "lm_head.weight"),
]

FAMILY = Family(
    name=NAME,
    model_type="xlstm",
    architecture="xLSTMForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=WEIGHTS,
    non_math_fields=NON_MATH_FIELDS,
    maps="blocks of mlstm (num_heads; qk_dim_factor, v_dim_factor -> qk_dim, v_dim as transformers truncates them; "
         "gate_soft_cap, eps, chunk_size -> chunk, norm_eps -> the per-head norm's eps) and swiglu (hidden_size * "
         "ffn_proj_factor rounded up to ffn_round_up_to_multiple_of -> hidden), pre-norm RMSNorms (norm_eps), "
         "out_norm -> final_norm, output_logit_soft_cap -> logit_softcap, positional none; max_position_embeddings "
         "(written by specformer) -> context_length",
    caveats=f"context_length is {DEFAULT_CONTEXT} when config.json has no max_position_embeddings (xLSTM has no "
            "limit); use_bias true (biased RMSNorms) and weight_mode fused are refused; tie_word_embeddings is "
            "ignored as transformers ignores it (its head is never tied); export writes ffn_proj_factor 2.667 and "
            "multiple 64 where they give the width, else a factor with multiple 1",
)
