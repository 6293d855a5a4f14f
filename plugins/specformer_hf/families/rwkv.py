"""RWKV-4 (``model_type: rwkv``, RWKV/rwkv-4-*-pile, rwkv-raven): time mixing and channel mixing, pre-normed, with
a LayerNorm on the embeddings.

Each layer is ``x + time_mix(ln1(x)); x + channel_mix(ln2(x))``: a ``prenorm`` block with LayerNorms (biases,
``layer_norm_epsilon``), mixer ``rwkv4`` (``attention_hidden_size`` wide) and ffn ``rwkv_channel_mix``
(``intermediate_size`` wide), no positions. Layer 0's ``pre_ln`` normalises the embeddings
(``model.embedding_norm``); ``ln_out`` is transformers' LayerNorm with its default eps (1e-5, whatever
``layer_norm_epsilon`` says).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from specformer_hf.config import ConfigReader
from specformer_hf.family import Family
from specformer_hf.parts.base import BLOCK_MIXER
from specformer_hf.parts.embedding import no_output_bias
from specformer_hf.rules import Copy, Rule, Site
from specformer_hf.specview import NotExpressible, SpecView

NAME = "RWKV"

#: transformers' RwkvConfig defaults.
DEFAULTS = {
    "vocab_size": 50277, "context_length": 1024, "hidden_size": 4096, "num_hidden_layers": 32,
    "attention_hidden_size": None, "intermediate_size": None, "layer_norm_epsilon": 1e-5, "rescale_every": 6,
    "tie_word_embeddings": False,
}
#: transformers' ln_out is nn.LayerNorm(hidden_size): torch's default eps, not layer_norm_epsilon.
FINAL_EPS = 1e-5


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    # rescale_every halves the stream every so many layers in transformers' inference (and the output weights to
    # match) to keep float16 in range: the same maths but for LayerNorm's eps; not reproduced (see caveats).
    cfg.mark_read("rescale_every")
    d_model = cfg.get_size("hidden_size")
    eps = cfg.get_float("layer_norm_epsilon")
    norm = {"kind": "layernorm", "eps": eps}
    width = cfg.get("attention_hidden_size", None) or d_model
    hidden = cfg.get("intermediate_size", None) or 4 * d_model
    return {
        "vocab_size": cfg.get_int("vocab_size"),
        "d_model": d_model,
        "n_layers": cfg.get_layers("num_hidden_layers"),
        "context_length": cfg.get_size("context_length"),
        "tie_embeddings": bool(cfg.get("tie_word_embeddings")),
        "positional": {"kind": "none"},
        "embedding_norm": norm,
        "final_norm": {"kind": "layernorm", "eps": FINAL_EPS},
        "block": {"layout": "prenorm", "norm": norm, "mixer": {"kind": "rwkv4", "width": width},
                  "ffn": {"kind": "rwkv_channel_mix", "hidden": hidden}},
    }


def to_config(view: SpecView) -> dict[str, Any]:
    m = view.model
    no_output_bias(view, NAME)
    if view.positional["kind"] != "none" or any(p is not None and p["kind"] != "none"
                                                for p in view.per_layer("positional")):
        raise NotExpressible("model.positional.kind", f"Hugging Face {NAME} has no positional scheme")
    embedding_norm = None if m.embedding_norm is None else m.embedding_norm.as_dict()
    final_norm = m.final_norm_ref()
    if embedding_norm is None or embedding_norm["kind"] != "layernorm":
        raise NotExpressible("model.embedding_norm", f"Hugging Face {NAME} has a LayerNorm on the embeddings (pre_ln)")
    if final_norm["kind"] != "layernorm" or final_norm.get("eps", 1e-5) != FINAL_EPS:
        raise NotExpressible("model.final_norm", f"Hugging Face {NAME}'s ln_out is a LayerNorm with eps {FINAL_EPS}")
    view.block_kind("layout", ("prenorm",), family=NAME)
    view.block_kind("norm", ("layernorm",), family=NAME)
    view.block_kind("mixer", ("rwkv4",), family=NAME)
    view.block_kind("ffn", ("rwkv_channel_mix",), family=NAME)
    eps = view.uniform("norm", "eps", family=NAME)
    if embedding_norm.get("eps", 1e-5) != eps:
        raise NotExpressible("model.embedding_norm.eps", f"Hugging Face {NAME}'s pre_ln has the blocks' eps ({eps})")
    return {
        "vocab_size": m.vocab_size,
        "hidden_size": m.d_model,
        "num_hidden_layers": m.n_layers,
        "context_length": m.context_length,
        "attention_hidden_size": view.uniform("mixer", "width", family=NAME) or m.d_model,
        "intermediate_size": view.uniform("ffn", "hidden", family=NAME) or 4 * m.d_model,
        "layer_norm_epsilon": eps,
        "rescale_every": 0,  # specformer's maths: no rescaling
        "tie_word_embeddings": m.tie_embeddings,
    }


class TimeMix(Rule):
    """A token-shift weight transformers keeps ``(1, 1, D)`` as ours ``(D,)``."""

    def __init__(self, hf: str, ours: str) -> None:
        self.hf, self.ours = (hf,), (ours,)

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return [tensors[0].reshape(-1)]  # (1, 1, D) -> (D,)

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return [tensors[0].reshape(1, 1, -1)]  # (D,) -> (1, 1, D)


LAYER = "rwkv.blocks.{i}"
FFN = "blocks.{i}.ffn"

WEIGHTS: list[Rule] = [
    Copy("rwkv.embeddings.weight", "embedding.weight"),
    Copy("rwkv.blocks.0.pre_ln.weight", "embedding_norm.weight"),
    Copy("rwkv.blocks.0.pre_ln.bias", "embedding_norm.bias"),
    Copy(f"{LAYER}.ln1.weight", "blocks.{i}.attention_norm.weight"),
    Copy(f"{LAYER}.ln1.bias", "blocks.{i}.attention_norm.bias"),
    *(TimeMix(f"{LAYER}.attention.time_mix_{name}", f"{BLOCK_MIXER}.time_mix_{name}")
      for name in ("key", "value", "receptance")),
    Copy(f"{LAYER}.attention.time_decay", f"{BLOCK_MIXER}.time_decay"),
    Copy(f"{LAYER}.attention.time_first", f"{BLOCK_MIXER}.time_first"),
    *(Copy(f"{LAYER}.attention.{name}.weight", f"{BLOCK_MIXER}.{name}.weight")
      for name in ("key", "value", "receptance", "output")),
    Copy(f"{LAYER}.ln2.weight", "blocks.{i}.ffn_norm.weight"),
    Copy(f"{LAYER}.ln2.bias", "blocks.{i}.ffn_norm.bias"),
    *(TimeMix(f"{LAYER}.feed_forward.time_mix_{name}", f"{FFN}.time_mix_{name}") for name in ("key", "receptance")),
    *(Copy(f"{LAYER}.feed_forward.{name}.weight", f"{FFN}.{name}.weight") for name in ("key", "value", "receptance")),
    Copy("rwkv.ln_out.weight", "final_norm.weight"),
    Copy("rwkv.ln_out.bias", "final_norm.bias"),
    Copy("head.weight", "lm_head.weight"),
]

FAMILY = Family(
    name=NAME,
    model_type="rwkv",
    architecture="RwkvForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=WEIGHTS,
    maps="blocks of rwkv4 (attention_hidden_size -> width; time_mix_* as (d_model,), time_decay, time_first) and "
         "rwkv_channel_mix (intermediate_size -> hidden), pre-norm LayerNorms ln1/ln2 (layer_norm_epsilon), layer 0's "
         "pre_ln -> model.embedding_norm, ln_out -> final_norm (eps 1e-5), positional none; context_length",
    caveats="rescale_every (transformers halves the stream every so many layers at inference, for "
            "float16) is not reproduced, which differs from transformers' eval-mode logits only through "
            "LayerNorm's eps; export writes rescale_every 0",
)
