"""Falcon (``model_type: falcon``): Falcon-7B's parallel blocks with multi-query attention, Falcon-40B/180B's
new_decoder_architecture (grouped key/value heads, two norms or one), and sequential blocks; rotary positions."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from specformer.errors import UserError

from specformer_hf.parts.base import BLOCK_MIXER
from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from specformer_hf.family import Family
from specformer_hf.parts.embedding import model_sizes, model_sizes_config, no_output_bias
from specformer_hf.parts.positions import rope, rope_config
from specformer_hf.rules import AtLayers, Copy, Rule, Site
from specformer_hf.specview import NotExpressible, SpecView

NAME = "Falcon"

#: transformers' FalconConfig defaults (Falcon-7B's sizes).
DEFAULTS = {
    "vocab_size": 65024, "hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71,
    "num_ln_in_parallel_attn": None, "layer_norm_epsilon": 1e-5, "num_kv_heads": None, "alibi": False,
    "new_decoder_architecture": False, "multi_query": True, "parallel_attn": True, "bias": False,
    "max_position_embeddings": 2048, "ffn_hidden_size": None, "activation": "gelu", "tie_word_embeddings": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


class GroupedQKV(Rule):
    """query_key_value grouped per key/value head: each group's queries, then its key, then its value.

    This one layout covers all three Falcon attentions: one key/value head (Falcon-7B's
    multi_query: ``[q (all heads); k; v]``, our order already), one per query head
    (``[q_h; k_h; v_h]`` for each head) and new_decoder_architecture's groups in between.
    Ours groups by role ``[q (all heads); k; v]``.
    """

    def __init__(self, hf: str, ours: str) -> None:
        self.hf, self.ours = (hf,), (ours,)

    @staticmethod
    def _sizes(site: Site) -> tuple[int, int, int]:
        a = site.mixer
        return a.n_kv_heads, a.n_heads // a.n_kv_heads, a.head_dim

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        t = tensors[0]
        kv, per_group, hd = self._sizes(site)
        rest = t.shape[1:]
        grouped = t.reshape(kv, per_group + 2, hd, *rest)  # (KV, the group's queries + k + v, hd, ...)
        q = grouped[:, :per_group].reshape(kv * per_group * hd, *rest)
        k = grouped[:, per_group].reshape(kv * hd, *rest)
        v = grouped[:, per_group + 1].reshape(kv * hd, *rest)
        return [torch.cat([q, k, v]).contiguous()]

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        t = tensors[0]
        kv, per_group, hd = self._sizes(site)
        rest = t.shape[1:]
        q_rows, kv_rows = kv * per_group * hd, kv * hd
        q = t[:q_rows].reshape(kv, per_group, hd, *rest)
        k = t[q_rows:q_rows + kv_rows].reshape(kv, 1, hd, *rest)
        v = t[q_rows + kv_rows:].reshape(kv, 1, hd, *rest)
        return [torch.cat([q, k, v], dim=1).reshape(t.shape).contiguous()]  # (KV, per_group + 2, hd, ...) flattened


def _layout(site: Site) -> str:
    """"prenorm", "parallel" (one norm) or "parallel2" (two norms): which names the block's norms have."""
    layout = site.model.spec.model.block.layout
    if layout.kind == "prenorm":
        return "prenorm"
    return "parallel" if layout.shared_norm else "parallel2"


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    cfg.require("alibi", (False,), why="Falcon's ALiBi (Falcon-RW) divides the slopes by sqrt(head_dim) and rounds "
                "slope x position to bfloat16; specformer's alibi does neither")
    n_heads = cfg.get_size("num_attention_heads")
    new = bool(cfg.require("new_decoder_architecture", (False, True), why="it chooses Falcon-40B's block or Falcon-7B's"))
    parallel = bool(cfg.require("parallel_attn", (True, False), why="it chooses parallel or sequential blocks"))
    multi_query = bool(cfg.get("multi_query"))
    n_kv = cfg.get("num_kv_heads") or n_heads
    if new:
        if not parallel:
            raise UserError(f"{cfg.family}: config field 'parallel_attn' = False is not supported with "
                            "new_decoder_architecture: transformers' Falcon runs only parallel blocks there. "
                            "Supported value: True")
        norms = cfg.require("num_ln_in_parallel_attn", (None, 1, 2), why="one or two norms before a parallel block")
        layout: Any = {"kind": "parallel", "shared_norm": norms == 1}
    else:
        cfg.mark_read("num_ln_in_parallel_attn")  # read with new_decoder_architecture only
        if multi_query:
            n_kv = 1
        elif n_kv != n_heads:
            raise UserError(f"{cfg.family}: config field 'num_kv_heads' = {n_kv} is not supported without "
                            "new_decoder_architecture or multi_query: query_key_value then holds a key and a value for "
                            f"every head. Supported values: None, {n_heads}")
        layout = {"kind": "parallel", "shared_norm": True} if parallel else "prenorm"
    cfg.mark_read("multi_query", "num_key_value_heads")  # transformers derives num_key_value_heads as n_kv here
    bias = bool(cfg.get("bias"))
    d_model = cfg.get_size("hidden_size")
    return {
        **model_sizes(cfg),
        "positional": rope(cfg),
        "block": {
            "layout": layout,
            "norm": {"kind": "layernorm", "eps": cfg.get_float("layer_norm_epsilon")},
            "mixer": {"kind": "attention", "n_heads": n_heads, "n_kv_heads": n_kv, "qkv_bias": bias,
                          "out_bias": bias},
            "ffn": {"kind": "mlp", "hidden": cfg.get("ffn_hidden_size") or 4 * d_model,
                    "activation": activation_from_hf(cfg, "activation"), "bias": bias},
        },
    }


def to_config(view: SpecView) -> dict[str, Any]:
    m = view.model
    no_output_bias(view, NAME)
    kind = view.block_kind("layout", ("parallel", "prenorm"), family=NAME)
    view.block_kind("norm", ("layernorm",), family=NAME)
    view.block_kind("mixer", ("attention",), family=NAME)
    view.block_kind("ffn", ("mlp",), family=NAME)
    n_heads, n_kv, head_dim = view.attention_sizes()
    if head_dim * n_heads != m.d_model:
        raise NotExpressible("model.block.mixer.head_dim", f"Hugging Face {NAME} has head_dim = d_model / n_heads "
                             f"({m.d_model} / {n_heads})")
    bias = view.uniform("mixer", "qkv_bias", family=NAME)
    if view.uniform("mixer", "out_bias", family=NAME) != bias or view.uniform("ffn", "bias", family=NAME) != bias:
        raise NotExpressible("model.block", f"Hugging Face {NAME}'s one bias switch covers q/k/v, the output "
                             "projection and the MLP alike")
    shared = kind == "prenorm" or bool(view.uniform("layout", "shared_norm", family=NAME))
    config: dict[str, Any] = {"parallel_attn": kind == "parallel", "num_attention_heads": n_heads}
    if n_kv in (1, n_heads) and shared:  # Falcon-7B's block (or its sequential variant)
        config.update(new_decoder_architecture=False, multi_query=n_kv == 1, num_kv_heads=n_heads)
    elif kind == "prenorm":
        raise NotExpressible("model.block.mixer.n_kv_heads", f"{n_kv} key/value heads in a sequential block: "
                             f"Hugging Face {NAME} has one (multi_query) or one per query head ({n_heads}) there")
    else:
        config.update(new_decoder_architecture=True, multi_query=True, num_kv_heads=n_kv,
                      num_ln_in_parallel_attn=1 if shared else 2)
    return {
        **model_sizes_config(view),
        **config,
        "bias": bias,
        "alibi": False,
        "ffn_hidden_size": view.uniform("ffn", "hidden", family=NAME) or 4 * m.d_model,
        "activation": ACTIVATIONS_TO_HF[view.uniform("ffn", "activation", family=NAME)],
        "layer_norm_epsilon": view.uniform("norm", "eps", family=NAME),
        **rope_config(view, NAME),
    }


LAYER = "transformer.h.{i}"


def attention_and_mlp_rules(layer: str) -> list[Rule]:
    """The fused ``query_key_value``, ``dense`` and ``dense_h_to_4h``/``dense_4h_to_h`` of a layer: BLOOM's names, Falcon's too."""
    return [
        GroupedQKV(f"{layer}.self_attention.query_key_value.weight", f"{BLOCK_MIXER}.qkv.weight"),
        GroupedQKV(f"{layer}.self_attention.query_key_value.bias", f"{BLOCK_MIXER}.qkv.bias"),
        Copy(f"{layer}.self_attention.dense.weight", f"{BLOCK_MIXER}.out.weight"),
        Copy(f"{layer}.self_attention.dense.bias", f"{BLOCK_MIXER}.out.bias"),
        Copy(f"{layer}.mlp.dense_h_to_4h.weight", "blocks.{i}.ffn.fc_in.weight"),
        Copy(f"{layer}.mlp.dense_h_to_4h.bias", "blocks.{i}.ffn.fc_in.bias"),
        Copy(f"{layer}.mlp.dense_4h_to_h.weight", "blocks.{i}.ffn.fc_out.weight"),
        Copy(f"{layer}.mlp.dense_4h_to_h.bias", "blocks.{i}.ffn.fc_out.bias"),
    ]


#: ``ln_f`` and the LM head, as BLOOM and Falcon name them.
FINAL_NORM_AND_HEAD: list[Rule] = [
    Copy("transformer.ln_f.weight", "final_norm.weight"),
    Copy("transformer.ln_f.bias", "final_norm.bias"),
    Copy("lm_head.weight", "lm_head.weight"),
]


def _norm(hf: str, ours: str, *, layouts: tuple[str, ...]) -> list[Rule]:
    return [AtLayers(Copy(f"{LAYER}.{hf}.{p}", f"blocks.{{i}}.{ours}.{p}"), where=lambda site: _layout(site) in layouts,
                     layers=" and ".join(layouts)) for p in ("weight", "bias")]


WEIGHTS: list[Rule] = [
    Copy("transformer.word_embeddings.weight", "embedding.weight"),
    # The norms' names follow the block: Falcon-7B's input_layernorm (and post_attention_layernorm when sequential),
    # new_decoder_architecture's ln_attn and ln_mlp.
    *_norm("input_layernorm", "attention_norm", layouts=("prenorm", "parallel")),
    *_norm("post_attention_layernorm", "ffn_norm", layouts=("prenorm",)),
    *_norm("ln_attn", "attention_norm", layouts=("parallel2",)),
    *_norm("ln_mlp", "ffn_norm", layouts=("parallel2",)),
    *attention_and_mlp_rules(LAYER),
    *FINAL_NORM_AND_HEAD,
]

FAMILY = Family(
    name=NAME,
    model_type="falcon",
    architecture="FalconForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=WEIGHTS,
    # transformers' Falcon never reads it (the published Falcon configs all say false).
    non_math_fields=("apply_residual_connection_post_layernorm",),
    maps="parallel_attn -> layout parallel with one LayerNorm (Falcon-7B) or prenorm; new_decoder_architecture -> "
         "layout parallel with two LayerNorms (ln_attn, ln_mlp; num_ln_in_parallel_attn 1: one) and num_kv_heads "
         "grouped key/value heads; multi_query -> one key/value head; query_key_value regrouped from per-group "
         "[queries, k, v] to [q; k; v]; rope; bias on every projection; GELU MLP (ffn_hidden_size)",
    caveats="alibi (Falcon-RW) is refused: its slopes are divided by sqrt(head_dim) and rounded to bfloat16, which "
            "specformer's alibi does not do; head_dim is always hidden / heads",
)
