"""GGUF export: every tensor and metadata field read back with the gguf package's own reader, and the file's weights
run through a llama forward written out here with llama.cpp's conventions (adjacent-pair rope), to our logits."""

from __future__ import annotations

import copy
import math

import gguf
import numpy as np
import pytest
import torch

import specformer
from specformer.tokenizers.byte_file import byte_to_char
from specformer.tokenizers.tokenizer import ByteTokenizer
from specformer_gguf import to_gguf
from specformer_gguf.vocab import NEVER_APPLIED_MERGE, gguf_vocab, tokenizer_json

from fixtures.tiny import tiny_spec

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is fastest (tests/conftest.py)

# 4 query heads sharing 2 kv heads, head_dim 16, vocabulary 259 padded to 320 rows, untied head, a theta and eps
# of their own: each reaches the file by its own path.
SPEC = tiny_spec(vocab_size=259, d_model=64, context_length=48, tie_embeddings=False, pad_vocab_to_multiple=64,
                 positional={"kind": "rope", "theta": 5000.0},
                 block={"norm": {"kind": "rmsnorm", "eps": 1e-5}, "mixer": {"kind": "attention", "n_heads": 4,
                        "n_kv_heads": 2}, "ffn": {"kind": "swiglu", "hidden": 96}})
H, KV, HD, D, FF = 4, 2, 16, 64, 96


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = specformer.build(SPEC, seed=0).eval()
    with torch.no_grad():  # norms away from 1, so a norm written in the wrong place shows
        for name, p in m.named_parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.2)
    return m


def write(model, path, tensor_type):
    vocab = gguf_vocab(tokenizer_json(ByteTokenizer()), n_rows=model.vocab_size)
    to_gguf(model, path, tensor_type=tensor_type, vocab=vocab, special_ids={"eos_token_id": 256, "bos_token_id": 258})
    return gguf.GGUFReader(path)


def tensors(reader) -> dict[str, np.ndarray]:
    """name -> float32 array in our (rows, columns) layout, dequantized with the gguf package."""
    return {t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape([int(n) for n in reversed(t.shape)])
            for t in reader.tensors}


def halves_to_pairs(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Row h*hd + 2j + s of the result is row h*hd + s*hd/2 + j of ``w``: written as a loop, not as writer.py's reshape."""
    out = torch.empty_like(w)
    for h in range(heads):
        for j in range(HD // 2):
            for s in range(2):
                out[h * HD + 2 * j + s] = w[h * HD + s * HD // 2 + j]
    return out


def expected(model) -> dict[str, torch.Tensor]:
    sd = model.state_dict()
    out = {"token_embd": sd["embedding.weight"][:259], "output_norm": sd["final_norm.weight"],
           "output": sd["lm_head.weight"][:259]}
    for i in range(2):
        qkv = sd[f"blocks.{i}.mixer.qkv.weight"]
        gate_up = sd[f"blocks.{i}.ffn.gate_up.weight"]
        out |= {f"blk.{i}.attn_norm": sd[f"blocks.{i}.attention_norm.weight"],
                f"blk.{i}.attn_q": halves_to_pairs(qkv[: H * HD], H),
                f"blk.{i}.attn_k": halves_to_pairs(qkv[H * HD: (H + KV) * HD], KV),
                f"blk.{i}.attn_v": qkv[(H + KV) * HD:],
                f"blk.{i}.attn_output": sd[f"blocks.{i}.mixer.out.weight"],
                f"blk.{i}.ffn_norm": sd[f"blocks.{i}.ffn_norm.weight"],
                f"blk.{i}.ffn_gate": gate_up[:FF], f"blk.{i}.ffn_up": gate_up[FF:],
                f"blk.{i}.ffn_down": sd[f"blocks.{i}.ffn.down.weight"]}
    return out


def test_f32_tensors_are_ours_under_llama_cpp_names(model, tmp_path) -> None:
    reader = write(model, tmp_path / "m.gguf", "f32")
    got, want = tensors(reader), expected(model)
    assert set(got) == set(want)
    for name, w in want.items():
        assert got[name].shape == tuple(w.shape), name
        np.testing.assert_array_equal(got[name], w.numpy(), err_msg=name)
    assert {t.tensor_type for t in reader.tensors} == {gguf.GGMLQuantizationType.F32}


@pytest.mark.parametrize("tensor_type, ggml, tolerance", [
    ("f16", gguf.GGMLQuantizationType.F16, 2 ** -11),
    ("bf16", gguf.GGMLQuantizationType.BF16, 2 ** -8),
])
def test_half_types_round_each_matrix_and_keep_norms_f32(model, tmp_path, tensor_type, ggml, tolerance) -> None:
    reader = write(model, tmp_path / "m.gguf", tensor_type)
    got, want = tensors(reader), expected(model)
    for t in reader.tensors:
        assert t.tensor_type == (gguf.GGMLQuantizationType.F32 if len(t.shape) == 1 else ggml), t.name
        w = want[t.name].numpy()
        assert np.all(np.abs(got[t.name] - w) <= np.abs(w) * tolerance + 2 ** -25), t.name  # + half of f16's subnormal step


def test_q8_0_is_within_a_quantization_step_and_odd_widths_fall_back_to_f16(model, tmp_path) -> None:
    reader = write(model, tmp_path / "m.gguf", "q8_0")
    got, want = tensors(reader), expected(model)
    for t in reader.tensors:
        w = want[t.name].numpy()
        if w.ndim == 1:
            assert t.tensor_type == gguf.GGMLQuantizationType.F32
            continue
        if w.shape[1] % 32:  # ffn_down's 96 columns: 32-wide blocks fit; check the rule, not one shape
            assert t.tensor_type == gguf.GGMLQuantizationType.F16, t.name
            continue
        assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0, t.name
        blocks = w.reshape(w.shape[0], -1, 32)
        step = np.abs(blocks).max(axis=-1, keepdims=True) / 127  # q8_0: int8 values times one scale a block
        err = np.abs(got[t.name].reshape(blocks.shape) - blocks)
        # half a step from rounding to int8, plus 127 times the f16 rounding of the scale (2^-11 relative)
        assert np.all(err <= step * (0.5 + 127 * 2 ** -11) + 1e-9), t.name
        assert np.any(err > 0), t.name  # quantized, not stored as it was


def test_metadata_and_byte_vocabulary(model, tmp_path) -> None:
    reader = write(model, tmp_path / "m.gguf", "f16")
    f = {name: field.contents() for name, field in reader.fields.items()}
    arch = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA]
    K = gguf.Keys
    assert f[K.General.ARCHITECTURE] == arch
    assert f[K.General.FILE_TYPE] == gguf.LlamaFileType.MOSTLY_F16
    for key, value in ((K.LLM.CONTEXT_LENGTH, 48), (K.LLM.EMBEDDING_LENGTH, D), (K.LLM.BLOCK_COUNT, 2),
                       (K.LLM.FEED_FORWARD_LENGTH, FF), (K.Attention.HEAD_COUNT, H), (K.Attention.HEAD_COUNT_KV, KV),
                       (K.Attention.KEY_LENGTH, HD), (K.Attention.VALUE_LENGTH, HD), (K.Rope.DIMENSION_COUNT, HD),
                       (K.LLM.VOCAB_SIZE, 259)):
        assert f[key.format(arch=arch)] == value, key
    assert f[K.Rope.FREQ_BASE.format(arch=arch)] == 5000.0
    assert f[K.Attention.LAYERNORM_RMS_EPS.format(arch=arch)] == pytest.approx(1e-5)
    assert f[K.Tokenizer.MODEL] == "gpt2"
    chars = byte_to_char()
    assert f[K.Tokenizer.LIST] == [chars[b] for b in range(256)] + ["<|endoftext|>", "<|pad|>", "<|bos|>"]
    assert f[K.Tokenizer.TOKEN_TYPE] == [gguf.TokenType.NORMAL] * 256 + [gguf.TokenType.CONTROL] * 3
    assert f[K.Tokenizer.MERGES] == [NEVER_APPLIED_MERGE]
    assert (f[K.Tokenizer.EOS_ID], f[K.Tokenizer.BOS_ID], f[K.Tokenizer.ADD_BOS]) == (256, 258, False)


def llama_cpp_logits(w: dict[str, np.ndarray], tokens: list[int], *, theta: float, eps: float) -> torch.Tensor:
    """A llama forward over the file's tensors as llama.cpp's llama graph computes it: its rope (LLAMA_ROPE_TYPE_NORM)
    turns adjacent channels (2j, 2j+1) of each head by position * theta^(-2j/head_dim)."""
    t = {k: torch.from_numpy(v.copy()).double() for k, v in w.items()}
    T = len(tokens)

    def rms(x, weight):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight

    def rope(x):  # (T, heads, HD)
        j = torch.arange(HD // 2, dtype=torch.float64)
        freq = theta ** (-2 * j / HD) / (t["rope_freqs"] if "rope_freqs" in t else 1.0)  # rope_freqs: llama3's divisors
        angle = torch.arange(T, dtype=torch.float64)[:, None] * freq  # (T, HD/2)
        a, b = x[..., 0::2], x[..., 1::2]
        cos, sin = angle.cos()[:, None], angle.sin()[:, None]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)

    x = t["token_embd"][tokens]
    mask = torch.full((T, T), -math.inf).triu(1)
    for i in range(2):
        h = rms(x, t[f"blk.{i}.attn_norm"])
        q = rope((h @ t[f"blk.{i}.attn_q"].T).view(T, H, HD))
        k = rope((h @ t[f"blk.{i}.attn_k"].T).view(T, KV, HD))
        v = (h @ t[f"blk.{i}.attn_v"].T).view(T, KV, HD)
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)  # query head h reads kv h // 2
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(HD) + mask
        x = x + torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(T, H * HD) @ t[f"blk.{i}.attn_output"].T
        h = rms(x, t[f"blk.{i}.ffn_norm"])
        x = x + (torch.nn.functional.silu(h @ t[f"blk.{i}.ffn_gate"].T) * (h @ t[f"blk.{i}.ffn_up"].T)) @ t[f"blk.{i}.ffn_down"].T
    return rms(x, t["output_norm"]) @ t["output"].T


# Llama 3.1's scaling with an original context shorter than the tokens, so every regime of it (kept, blended,
# divided by factor) turns some pair within them.
LLAMA3 = {"kind": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_context_length": 8}


@pytest.mark.parametrize("rope", [{"interleaved": False}, {"interleaved": True}, {"scaling": LLAMA3}],
                         ids=["halves", "interleaved", "llama3"])
def test_the_file_run_with_llama_cpp_conventions_gives_our_logits(tmp_path, rope) -> None:
    spec = copy.deepcopy(SPEC)
    spec["model"]["positional"].update(rope)  # interleaved: llama.cpp's own pairing, written unpermuted
    model = specformer.build(spec, seed=1).eval()
    reader = write(model, tmp_path / "m.gguf", "f32")
    assert ("rope_freqs" in {t.name for t in reader.tensors}) == ("scaling" in rope)
    tokens = [3, 200, 17, 45, 45, 9, 120, 258, 0, 77, 31, 5]
    with torch.no_grad():
        ours = model(torch.tensor([tokens]))[0, :, :259].double()  # (T, vocabulary): the padded rows dropped
    theirs = llama_cpp_logits(tensors(reader), tokens, theta=5000.0, eps=1e-5)
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)
