"""Write a model that maps onto llama.cpp's ``llama`` architecture as one GGUF file.

Tensor names and metadata keys come from the ``gguf`` package's constants (the package llama.cpp
publishes), never spelled here. The file is written to a temporary sibling and renamed into
place, so OUT.gguf is complete or untouched.

Rope layout: llama.cpp's llama graph rotates adjacent channel pairs (2j, 2j+1) of each head
(its "normal" rope, GPT-J's pairing). specformer's default rope (``interleaved: false``, the
layout of Llama's Hugging Face weights) pairs channel j with j + head_dim/2. So, as llama.cpp's
own converter does for Hugging Face Llama weights (``LlamaModel.permute`` in
convert_hf_to_gguf.py), the query and key rows of every head are reordered so that row 2j + s
of a head is our row s * head_dim/2 + j (s = 0, 1): the pair llama.cpp rotates together is the
pair we rotate together, at the same frequency index j, and q.k is unchanged. A spec whose rope
is already ``interleaved: true`` is written as it is. Values, the output projection and
everything else need nothing: the permutation acts within each head on q and k alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from specformer.files.atomic import replacing

from specformer_gguf.llama import LlamaLayout, llama_layout
from specformer_gguf.vocab import GgufVocab

#: --type -> (the matrices' GGML type, the file type recorded in general.file_type).
GGUF_TYPES = {
    "f32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
    "f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
    "bf16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
}

T = gguf.MODEL_TENSOR


def rope_pairs_adjacent(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of a q or k projection reordered from half-split rope pairs to adjacent ones (see the module doc)."""
    rows = w.shape[0]
    # (n_heads, 2 halves, head_dim/2, ...) -> (n_heads, head_dim/2, 2, ...): row s * hd/2 + j goes to 2j + s
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _name(tensor: gguf.MODEL_TENSOR, layer: int | None = None) -> str:
    name = gguf.TENSOR_NAMES[tensor]
    return name.format(bid=layer) if layer is not None else name


def llama_tensors(state: dict[str, torch.Tensor], layout: LlamaLayout, *, vocab_rows: int) -> dict[str, torch.Tensor]:
    """GGUF name -> tensor (our rows, q/k permuted per the module doc); ValueError naming any weight left over."""
    left = dict(state)
    take = left.pop
    out = {_name(T.TOKEN_EMBD): take("embedding.weight")[:vocab_rows]}  # a padded vocabulary's extra rows dropped
    out[_name(T.OUTPUT_NORM)] = take("final_norm.weight")
    if layout.rope_freq_factors is not None:
        out[_name(T.ROPE_FREQS)] = torch.tensor(layout.rope_freq_factors, dtype=torch.float32)
    if not layout.tied:
        out[_name(T.OUTPUT)] = take("lm_head.weight")[:vocab_rows]
    H, KV, hd = layout.n_heads, layout.n_kv_heads, layout.head_dim
    for i in range(layout.n_layers):
        p = f"blocks.{i}."
        q, k, v = take(p + "mixer.qkv.weight").split((H * hd, KV * hd, KV * hd), dim=0)  # rows: [q; k; v]
        if not layout.rope_interleaved:
            q, k = rope_pairs_adjacent(q, H), rope_pairs_adjacent(k, KV)
        gate, up = take(p + "ffn.gate_up.weight").chunk(2, dim=0)  # rows: [gate; up]
        out.update({
            _name(T.ATTN_NORM, i): take(p + "attention_norm.weight"),
            _name(T.ATTN_Q, i): q, _name(T.ATTN_K, i): k, _name(T.ATTN_V, i): v,
            _name(T.ATTN_OUT, i): take(p + "mixer.out.weight"),
            _name(T.FFN_NORM, i): take(p + "ffn_norm.weight"),
            _name(T.FFN_GATE, i): gate, _name(T.FFN_UP, i): up,
            _name(T.FFN_DOWN, i): take(p + "ffn.down.weight"),
        })
    if left:  # a weight with no place in llama.cpp's graph: never silently dropped
        raise ValueError(f"weights with no llama.cpp counterpart: {', '.join(sorted(left))}")
    return out


def _stored(t: torch.Tensor, qtype: gguf.GGMLQuantizationType) -> tuple[np.ndarray, Any]:
    """The array to write and its raw GGML type (None: numpy's own dtype says it)."""
    data = t.detach().to("cpu", torch.float32).contiguous().numpy()
    if data.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:  # norms stay f32, as llama.cpp's converter keeps them
        return data, None
    if qtype == gguf.GGMLQuantizationType.F16:
        return data.astype(np.float16), None
    try:
        return gguf.quants.quantize(data, qtype), qtype
    except gguf.quants.QuantError:  # a row length q8_0's 32-wide blocks do not divide: f16, as the converter falls back
        return data.astype(np.float16), None


def to_gguf(model: Any, path: str | Path, *, tensor_type: str = "f16", vocab: GgufVocab | None = None,
            special_ids: dict[str, int] | None = None, chat_template: str | None = None, name: str | None = None) -> Path:
    """Write ``model`` (llama-like; NoGgufMapping otherwise) to ``path`` with its matrices as ``tensor_type``.

    ``vocab`` (:func:`specformer_gguf.vocab.gguf_vocab`) and ``special_ids`` (bos/eos/pad_token_id) make the file
    carry its tokenizer; ``chat_template`` is written as tokenizer.chat_template.
    """
    if tensor_type not in GGUF_TYPES:
        raise ValueError(f"tensor_type {tensor_type!r}: one of {', '.join(GGUF_TYPES)}")
    layout = llama_layout(model.spec)
    qtype, file_type = GGUF_TYPES[tensor_type]
    tensors = llama_tensors(model.state_dict(), layout, vocab_rows=model.vocab_size)
    ffn_hidden = tensors[_name(T.FFN_GATE, 0)].shape[0]
    path = Path(path)
    with replacing(path) as tmp:
        w = gguf.GGUFWriter(tmp, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
        w.add_name(name or path.stem)
        w.add_context_length(layout.context_length)
        w.add_embedding_length(layout.d_model)
        w.add_block_count(layout.n_layers)
        w.add_feed_forward_length(ffn_hidden)
        w.add_head_count(layout.n_heads)
        w.add_head_count_kv(layout.n_kv_heads)
        w.add_key_length(layout.head_dim)
        w.add_value_length(layout.head_dim)
        w.add_rope_dimension_count(layout.head_dim)
        w.add_rope_freq_base(layout.rope_theta)
        w.add_layer_norm_rms_eps(layout.norm_eps)
        w.add_vocab_size(model.vocab_size)
        w.add_file_type(file_type)
        if vocab is not None:
            w.add_tokenizer_model("gpt2")
            w.add_tokenizer_pre(vocab.pre)
            w.add_token_list(vocab.tokens)
            w.add_token_types(vocab.types)
            w.add_token_merges(vocab.merges)  # never empty: see vocab.NEVER_APPLIED_MERGE
            w.add_add_bos_token(False)  # specformer never prepends a token to a prompt
            ids = special_ids or {}
            for field, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id),
                               ("pad_token_id", w.add_pad_token_id)):
                if field in ids:
                    add(ids[field])
            if chat_template is not None:
                w.add_chat_template(chat_template)
        for tensor_name, t in tensors.items():
            data, raw = _stored(t, qtype)
            w.add_tensor(tensor_name, data, raw_dtype=raw)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return path
