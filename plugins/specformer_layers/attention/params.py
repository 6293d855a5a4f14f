"""The settings of the attention layers, importable without torch (listing components reads only these)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from specformer.model.attention import head_sizes
from specformer.registry.params import Params, Sized, SubComponent
from specformer.model.sized import linear, total

class CausalSelfAttentionParams(Params):
    """Scaled dot-product attention over earlier tokens, with ``n_kv_heads`` shared key/value heads.

    ``n_kv_heads`` = ``n_heads`` is multi-head attention (Vaswani et al. 2017), 1 is
    multi-query (Shazeer 2019), anything between that divides ``n_heads`` is grouped-query
    (Ainslie et al. 2023). ``window`` limits each query to the last ``window`` tokens
    (sliding window, Mistral); ``qk_norm`` normalises queries and keys before RoPE, per
    head (``qk_norm_scope: head``, Qwen3, Gemma 3), per head with separate weights for
    every head (``per_head_weights``, StableLM 2 12B) or over all heads at once (``all``,
    OLMo-2); ``logit_softcap`` bounds scores smoothly (Gemma 2); ``scale`` replaces
    ``1/sqrt(head_dim)`` (Gemma 2's ``query_pre_attn_scalar ** -0.5``); ``chunk`` limits
    each query to its own block of ``chunk`` positions (Llama 4's local layers); ``sinks``
    adds a learned per-head logit to the softmax normalisation (gpt-oss), so a head may
    attend to nothing. ``temperature_tuning`` multiplies each query by
    ``1 + temperature_attn_scale * ln(1 + floor((position + 1) / temperature_floor_scale))``
    of its absolute position, so attention stays sharp far into a long context (Llama 4's
    NoPE layers, ``attn_temperature_tuning``; Nakanishi 2025, arXiv:2501.19399).
    ``output_gate`` multiplies each channel of the attention output,
    before the output projection, by ``sigmoid(x W_gate)`` of the block input ``x``
    (gated attention, Qiu et al. 2025, arXiv:2505.06708; Qwen3-Next's and Qwen3.5's
    full-attention layers): a head can close itself for a token instead of parking its
    attention on a sink. ``backend`` picks the kernel (:mod:`.kernels`): ``auto`` uses the
    fused causal kernel where the mask is plain causal and FlexAttention (block-sparse,
    no ``T x T`` tensor) for every other mask and score modification where it can run;
    ``sdpa`` always uses PyTorch's SDPA (a dense mask when not plain causal); ``flex``
    FlexAttention; ``eager`` writes the softmax out and is the reference. All give the
    same results.
    """

    n_heads: int = Field(gt=0, description="Number of query heads.")
    n_kv_heads: int | None = Field(default=None, gt=0, description="Key/value heads; default n_heads (MHA). 1 = MQA.")
    head_dim: int | None = Field(default=None, gt=0, description="Channels per head; default d_model / n_heads.")
    qkv_bias: bool = Field(default=False, description="Biases on the query/key/value projections.")
    out_bias: bool = Field(default=False, description="Bias on the output projection.")
    window: int | None = Field(default=None, gt=0, description="Sliding window: attend to at most this many latest tokens.")
    qk_norm: SubComponent("norm") | None = Field(  # type: ignore[valid-type]
        default=None, description="A norm applied to queries and keys (before RoPE).",
    )
    qk_norm_scope: Literal["head", "per_head_weights", "all"] = Field(
        default="head",
        description="head: qk_norm over each head's channels, one weight shared by the heads (Qwen3); "
                    "per_head_weights: the same with a separate weight for every head (StableLM 2 12B); "
                    "all: over all heads' channels at once (OLMo-2).",
    )
    logit_softcap: float | None = Field(default=None, gt=0, description="Scores become cap * tanh(scores / cap).")
    scale: float | None = Field(default=None, gt=0, description="Score scale; default 1 / sqrt(head_dim).")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on attention weights (training only).")
    chunk: int | None = Field(default=None, gt=0, description="Chunked local attention: attend only within the same block of this many positions (Llama 4).")
    sinks: bool = Field(default=False, description="Learned per-head sink logits that join the softmax normalisation (gpt-oss).")
    temperature_tuning: bool = Field(
        default=False,
        description="Scale each query by 1 + temperature_attn_scale * ln(1 + floor((position + 1) / "
                    "temperature_floor_scale)) (Llama 4's NoPE layers).",
    )
    temperature_floor_scale: float = Field(
        default=8192, gt=0, description="Positions per step of the temperature tuning (Llama 4's floor_scale).",
    )
    temperature_attn_scale: float = Field(
        default=0.1, ge=0, description="Strength of the temperature tuning (Llama 4's attn_scale).",
    )
    output_gate: bool = Field(
        default=False,
        description="Multiply the attention output per channel by sigmoid of a projection of the block input "
                    "(biased when qkv_bias is), before the output projection (Qwen3-Next, Qwen3.5).",
    )
    backend: Literal["auto", "sdpa", "flex", "eager"] = Field(
        default="auto",
        description="auto: fused causal SDPA where plain causal, FlexAttention otherwise; sdpa: SDPA, dense masks; "
                    "flex: FlexAttention; eager: explicit softmax (the reference).",
    )

    @model_validator(mode="after")
    def _kv_heads_divide(self) -> "CausalSelfAttentionParams":
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})")
        return self

    def sized(self, *, d_model: int) -> Sized:
        sizes = head_sizes(d_model=d_model, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, head_dim=self.head_dim)
        H, KV, hd = sizes.n_heads, sizes.n_kv_heads, sizes.head_dim
        parameters = total(
            linear(d_model, (H + 2 * KV) * hd, bias=self.qkv_bias),
            linear(H * hd, d_model, bias=self.out_bias),
            linear(d_model, H * hd, bias=self.qkv_bias) if self.output_gate else 0,
            H if self.sinks else 0,
            self._qk_norm_parameters(H, KV, hd),
        )
        return Sized(parameters=parameters, n_heads=H, n_kv_heads=KV, head_dim=hd)

    def _qk_norm_parameters(self, H: int, KV: int, hd: int) -> int | None:
        """The query and key norms, sized as ``qk_norm_scope`` says (the layer's ``_qk_norms`` makes the same)."""
        if self.qk_norm is None:
            return 0
        if self.qk_norm_scope == "all":
            return total(self.qk_norm.sized(dim=H * hd).parameters, self.qk_norm.sized(dim=KV * hd).parameters)
        one = self.qk_norm.sized(dim=hd).parameters
        copies = 2 if self.qk_norm_scope == "head" else H + KV  # per_head_weights: one per query and per key head
        return None if one is None else copies * one


class LatentAttentionParams(Params):
    """Keys and values rebuilt from one small latent per token, plus one rotary key shared by all heads.

    Each token is compressed to a latent of ``kv_lora_rank`` channels (normalised by
    ``latent_norm``) and a rotary key of ``qk_rope_head_dim`` channels shared by every head.
    Per head, the key is ``[k_nope; k_rope]``, with ``k_nope`` (``qk_nope_head_dim``) and
    the value (``v_head_dim``) expanded from the latent; the query is ``[q_nope; q_rope]``,
    projected from the input directly or, with ``q_lora_rank``, through a normalised
    low-rank bottleneck. Only the rotary parts carry positions (the layer's positional
    scheme is sized by ``qk_rope_head_dim``: set ``interleaved: true`` on its rope for
    DeepSeek-V3's layout). The generation cache keeps the latent and the rotary key:
    ``kv_lora_rank + qk_rope_head_dim`` values per token per layer, however many heads.
    Scores are scaled by ``scale`` (default ``1/sqrt(qk_nope_head_dim + qk_rope_head_dim)``),
    times ``(0.1 * yarn_mscale_all_dim * ln(yarn_factor) + 1)^2`` when ``yarn_factor`` is
    set, as DeepSeek does with YaRN (DeepSeek-AI 2024, arXiv:2405.04434; 2412.19437).
    """

    n_heads: int = Field(gt=0, description="Number of query heads (each gets its own key and value from the latent).")
    kv_lora_rank: int = Field(gt=0, description="Channels of the compressed key/value latent (what the cache keeps).")
    qk_rope_head_dim: int = Field(gt=0, description="Rotary channels per head; one rotary key is shared by all heads.")
    qk_nope_head_dim: int = Field(ge=0, description="Channels per head of the query and key that carry no position.")
    v_head_dim: int = Field(gt=0, description="Channels per head of the values.")
    q_lora_rank: int | None = Field(default=None, gt=0, description="Low-rank query bottleneck; none: a full query projection (DeepSeek-V2-Lite).")
    latent_norm: SubComponent("norm") = Field(  # type: ignore[valid-type]
        default="rmsnorm", validate_default=True,
        description="The norm of the key/value latent and of the query latent (q_lora_rank).",
    )
    bias: bool = Field(default=False, description="Biases on the down-projections and the output (DeepSeek's attention_bias).")
    window: int | None = Field(default=None, gt=0, description="Sliding window: attend to at most this many latest tokens.")
    scale: float | None = Field(default=None, gt=0, description="Score scale; default 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim).")
    yarn_factor: float | None = Field(default=None, gt=0, description="YaRN factor of the rope: the score scale is multiplied by mscale^2 (DeepSeek).")
    yarn_mscale_all_dim: float = Field(default=0.0, ge=0, description="YaRN mscale_all_dim for that multiplier; 0 leaves the scale alone.")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on attention weights (training only).")
    backend: Literal["sdpa", "eager"] = Field(default="sdpa", description="sdpa: fused kernels; eager: explicit softmax.")

    @model_validator(mode="after")
    def _rotary_pairs(self) -> "LatentAttentionParams":
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim ({self.qk_rope_head_dim}) must be even: rotary channels turn in pairs")
        return self

    def sized(self, *, d_model: int) -> Sized:
        H, rope, nope, v = self.n_heads, self.qk_rope_head_dim, self.qk_nope_head_dim, self.v_head_dim
        qk = nope + rope
        if self.q_lora_rank is None:
            query = linear(d_model, H * qk)
        else:
            query = total(linear(d_model, self.q_lora_rank, bias=self.bias),
                          self.latent_norm.sized(dim=self.q_lora_rank).parameters, linear(self.q_lora_rank, H * qk))
        parameters = total(
            query,
            linear(d_model, self.kv_lora_rank + rope, bias=self.bias),
            self.latent_norm.sized(dim=self.kv_lora_rank).parameters,
            linear(self.kv_lora_rank, H * (nope + v)),
            linear(H * v, d_model, bias=self.bias),
        )
        # Every head has its own key and value once expanded; positions turn only the rotary channels.
        return Sized(parameters=parameters, n_heads=H, n_kv_heads=H, head_dim=qk, positional_dim=rope)
