"""Hugging Face folders forged by hand (safetensors + JSON, no transformers), for untrusted-input tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

#: A one-layer Llama small enough to write in a millisecond.
SIZES = dict(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=2, max_position_embeddings=32)


def llama_config(**changes: Any) -> dict[str, Any]:
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": False,
            "rms_norm_eps": 1e-6, **SIZES, **changes}


def llama_tensors(config: dict[str, Any] | None = None, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """The tensors transformers saves for ``config`` (a Llama), random."""
    c = {**SIZES, **(config or {})}
    g = torch.Generator().manual_seed(seed)
    d, v, f = c["hidden_size"], c["vocab_size"], c["intermediate_size"]
    head = d // c["num_attention_heads"]
    kv = head * c["num_key_value_heads"]

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.1

    out = {"model.embed_tokens.weight": r(v, d), "model.norm.weight": 1 + r(d), "lm_head.weight": r(v, d)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": 1 + r(d), p + "post_attention_layernorm.weight": 1 + r(d),
            p + "self_attn.q_proj.weight": r(d, d), p + "self_attn.k_proj.weight": r(kv, d),
            p + "self_attn.v_proj.weight": r(kv, d), p + "self_attn.o_proj.weight": r(d, d),
            p + "mlp.gate_proj.weight": r(f, d), p + "mlp.up_proj.weight": r(f, d), p + "mlp.down_proj.weight": r(d, f),
        })
    return out


def write_folder(path: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def llama_folder(path: Path, **changes: Any) -> Path:
    """A complete, valid one-layer Llama folder (no tokenizer)."""
    config = llama_config(**changes)
    return write_folder(path, config, llama_tensors(config))


def shard(path: Path, tensors: dict[str, torch.Tensor], weight_map: Any, *, files: dict[str, list[str]]) -> Path:
    """Write ``files`` (shard name -> tensor names) and an index holding ``weight_map`` as given (forged or not)."""
    for name, names in files.items():
        save_file({n: tensors[n] for n in names}, str(path / name), metadata={"format": "pt"})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path
