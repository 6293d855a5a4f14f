"""Attention sinks (gpt-oss): a learned logit per head that joins the softmax normalisation.

Checked against the formula written out here and against transformers' GptOssAttention
(eager) on a tiny random config, on every backend (flex through PyTorch's reference
FlexAttention, the compiled kernel is covered in test_backends), with a sliding window.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from specformer_layers.attention import flex
from specformer_layers.attention.causal import CausalSelfAttention
from specformer_layers.attention.params import CausalSelfAttentionParams

from ..support import context

transformers = pytest.importorskip("transformers")
from transformers.models.gpt_oss.configuration_gpt_oss import GptOssConfig  # noqa: E402
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention  # noqa: E402

D_MODEL, N_HEADS, N_KV, HEAD_DIM, WINDOW, T = 24, 4, 2, 10, 4, 9  # head_dim is not d_model / n_heads


@pytest.fixture(autouse=True)
def reference_flex(monkeypatch):
    monkeypatch.setattr(flex, "_kernel", lambda: flex._flex_attention)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        yield


def ours(backend: str, window: int | None) -> CausalSelfAttention:
    torch.manual_seed(0)
    params = CausalSelfAttentionParams(n_heads=N_HEADS, n_kv_heads=N_KV, head_dim=HEAD_DIM, qkv_bias=True,
                                       out_bias=True, window=window, sinks=True, backend=backend)
    attention = CausalSelfAttention(params, d_model=D_MODEL)
    attention.init_weights(std=0.2, residual_std=0.2)
    torch.nn.init.normal_(attention.sinks, std=1.5)
    return attention


def written_out(attention: CausalSelfAttention, x: torch.Tensor, window: int | None) -> torch.Tensor:
    """out_i = sum_j e^{s_ij} v_j / (sum_j e^{s_ij} + e^{sink_h}) over allowed j, per head, with loops."""
    B = x.shape[0]
    H, KV, hd = N_HEADS, N_KV, HEAD_DIM
    q, k, v = attention.qkv(x).split((H * hd, KV * hd, KV * hd), dim=-1)
    out = torch.zeros(B, T, H, hd, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            g = h // (H // KV)
            for i in range(T):
                keys = [j for j in range(i + 1) if window is None or i - j < window]
                s = torch.stack([q[b, i, h * hd:(h + 1) * hd].double() @ k[b, j, g * hd:(g + 1) * hd].double()
                                 for j in keys]) / math.sqrt(hd)
                e = torch.exp(s)
                denominator = e.sum() + torch.exp(attention.sinks[h].double())
                for n, j in enumerate(keys):
                    out[b, i, h] += e[n] / denominator * v[b, j, g * hd:(g + 1) * hd].double()
    return attention.out(out.reshape(B, T, H * hd).float())


@pytest.mark.parametrize("backend", ["eager", "sdpa", "auto", "flex"])
@pytest.mark.parametrize("window", [None, WINDOW])
def test_sinks_equal_the_written_out_formula(backend: str, window: int | None) -> None:
    attention = ours(backend, window)
    x = torch.randn(2, T, D_MODEL)
    positions = torch.arange(T).expand(2, T)
    with torch.no_grad():
        got = attention(x, context(positions, plain_causal=True))
        want = written_out(attention, x, window)
    assert torch.allclose(got, want, atol=1e-5)


def test_sinks_change_the_output() -> None:
    """The test above can fail: without the sink logits the same weights give another output."""
    attention = ours("eager", None)
    x = torch.randn(1, T, D_MODEL)
    positions = torch.arange(T).expand(1, T)
    with torch.no_grad():
        with_sinks = attention(x, context(positions, plain_causal=True))
        attention.sinks.fill_(-1e4)  # e^sink = 0: plain softmax
        without = attention(x, context(positions, plain_causal=True))
    assert (with_sinks - without).abs().max() > 1e-3


def hf_attention(window: int | None, attention: CausalSelfAttention) -> GptOssAttention:
    config = GptOssConfig(hidden_size=D_MODEL, num_attention_heads=N_HEADS, num_key_value_heads=N_KV,
                          head_dim=HEAD_DIM, sliding_window=window or 128, attention_bias=True,
                          layer_types=["sliding_attention" if window else "full_attention"], num_hidden_layers=1)
    config._attn_implementation = "eager"
    theirs = GptOssAttention(config, layer_idx=0)
    H, KV, hd = N_HEADS, N_KV, HEAD_DIM
    with torch.no_grad():
        wq, wk, wv = attention.qkv.weight.split((H * hd, KV * hd, KV * hd))
        bq, bk, bv = attention.qkv.bias.split((H * hd, KV * hd, KV * hd))
        for proj, w, b in ((theirs.q_proj, wq, bq), (theirs.k_proj, wk, bk), (theirs.v_proj, wv, bv)):
            proj.weight.copy_(w)
            proj.bias.copy_(b)
        theirs.o_proj.weight.copy_(attention.out.weight)
        theirs.o_proj.bias.copy_(attention.out.bias)
        theirs.sinks.copy_(attention.sinks)
    return theirs


@pytest.mark.parametrize("backend", ["eager", "sdpa", "auto", "flex"])
@pytest.mark.parametrize("window", [None, WINDOW])
def test_sinks_equal_transformers_gpt_oss_attention(backend: str, window: int | None) -> None:
    attention = ours(backend, window)
    theirs = hf_attention(window, attention)
    x = torch.randn(2, T, D_MODEL)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = (j <= i) & ((i - j < window) if window else True)
    mask = torch.zeros(T, T).masked_fill(~allowed, float("-inf"))[None, None]  # (1, 1, T, T) additive
    identity = (torch.ones(2, T, HEAD_DIM // 2), torch.zeros(2, T, HEAD_DIM // 2))  # no rotation on either side
    with torch.no_grad():
        want, _ = theirs(x, position_embeddings=identity, attention_mask=mask)
        got = attention(x, context(torch.arange(T).expand(2, T), plain_causal=True))
    assert torch.allclose(got, want, atol=1e-4)
