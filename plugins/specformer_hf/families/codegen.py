"""CodeGen (``model_type: codegen``): GPT-J's maths and config fields, with q, k and v in one qkv_proj laid out for the
four model-parallel shards CodeGen was trained on."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.families import gptj
from specformer_hf.family import Family
from specformer_hf.parts.base import BLOCK_MIXER
from specformer_hf.rules import Fused, Rule, Site
from specformer_hf.specview import NotExpressible, SpecView

NAME = "CodeGen"

#: transformers' CodeGenConfig defaults (GPT-J-6B's sizes, which CodeGen-6B shares).
DEFAULTS = {
    "vocab_size": 50400, "n_positions": 2048, "n_embd": 4096, "n_layer": 28, "n_head": 16, "rotary_dim": 64,
    "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False,
}

#: CodeGenAttention's mp_num, fixed in its code: qkv_proj's output is 4 shards of [q_s, v_s, k_s].
SHARDS = 4
#: The order of the three parts inside each shard, as indices into our [q; k; v].
SHARD_ORDER = (0, 2, 1)


class ShardedQKV(Rule):
    """qkv_proj: ``SHARDS`` blocks of ``[q_s; v_s; k_s]`` rows, each part ``n_embd / SHARDS`` rows; q (and k, v) is its
    parts of every shard in shard order. Ours is ``[q; k; v]``."""

    def __init__(self, hf: str, ours: str) -> None:
        self.hf, self.ours = (hf,), (ours,)

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        t = tensors[0]
        sharded = t.reshape(SHARDS, 3, -1, *t.shape[1:])  # (shard, [q v k], rows of the shard, ...)
        parts = [sharded[:, SHARD_ORDER.index(j)] for j in range(3)]  # q, k, v: (shard, rows, ...)
        return [torch.cat([p.reshape(-1, *t.shape[1:]) for p in parts]).contiguous()]

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        t = tensors[0]
        ours = t.reshape(3, SHARDS, -1, *t.shape[1:])  # ([q k v], shard, rows of the shard, ...)
        sharded = torch.stack([ours[j] for j in SHARD_ORDER], dim=1)  # (shard, [q v k], rows, ...)
        return [sharded.reshape(t.shape).contiguous()]


def _sharded_width(d_model: int) -> bool:
    return d_model % SHARDS == 0


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    model = gptj.to_spec(cfg, name=NAME)
    if not _sharded_width(model["d_model"]):
        raise UserError(f"{cfg.family}: config field 'n_embd' = {model['d_model']} is not supported: CodeGen splits "
                        f"q, k and v into {SHARDS} shards of n_embd / {SHARDS} channels, so it must be a multiple of "
                        f"{SHARDS}")
    return model


def to_config(view: SpecView) -> dict[str, Any]:
    if not _sharded_width(view.model.d_model):
        raise NotExpressible("model.d_model", f"{view.model.d_model}: Hugging Face {NAME} splits q, k and v into "
                             f"{SHARDS} shards, so d_model must be a multiple of {SHARDS}")
    return gptj.to_config(view, name=NAME)


LAYER = "transformer.h.{i}"

# GPT-J's rules but for its q/k/v (one Fused rule over q_proj, k_proj, v_proj): CodeGen saves them as one tensor.
WEIGHTS: list[Rule] = [rule for rule in gptj.WEIGHTS if not isinstance(rule, Fused)] + [
    ShardedQKV(f"{LAYER}.attn.qkv_proj.weight", f"{BLOCK_MIXER}.qkv.weight"),
]

FAMILY = Family(
    name=NAME,
    model_type="codegen",
    architecture="CodeGenForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=WEIGHTS,
    # Old checkpoints carry the causal mask as a buffer.
    ignore_tensors=(r"transformer\.h\.\d+\.attn\.(causal_mask|bias|masked_bias)",),
    non_math_fields=("n_ctx",),
    maps="as GPT-J (layout parallel with one shared LayerNorm, rope interleaved on the first rotary_dim channels of each "
         "head, GELU MLP with biases, LM head with a bias); qkv_proj regrouped from 4 shards of [q_s v_s k_s] to "
         "[q; k; v]",
    caveats="multi-head attention only; n_embd must be a multiple of 4 (the shards); the head cannot be tied (it has its "
            "own bias)",
)
