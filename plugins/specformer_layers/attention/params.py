"""The settings of the attention layers, importable without torch (listing components reads only these)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from specformer.model.attention import CacheSlots, head_sizes
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
    OLMo-2); ``qk_norm_order: after_rope`` normalises the rotated queries and keys instead
    (Hunyuan-V1; with a learned weight the two orders differ); ``logit_softcap`` bounds
    scores smoothly (Gemma 2); ``scale`` replaces ``1/sqrt(head_dim)`` (Gemma 2's ``query_pre_attn_scalar ** -0.5``); ``chunk`` limits
    each query to its own block of ``chunk`` positions (Llama 4's local layers); ``sinks``
    adds a learned per-head logit to the softmax normalisation (gpt-oss), so a head may
    attend to nothing. ``temperature_tuning`` multiplies each query by
    ``1 + temperature_attn_scale * ln(1 + floor((position + temperature_position_offset) /
    temperature_floor_scale))`` of its absolute position, so attention stays sharp far into a
    long context (Llama 4's NoPE layers, ``attn_temperature_tuning``, offset 1; Ministral 3's
    rope layers, offset 0; Nakanishi 2025, arXiv:2501.19399).
    ``query_length_scale`` multiplies each query by ``(1 + (position + 1) /
    query_length_scale_base) ^ query_length_scale_exponent`` of its absolute position, a smooth
    power where the temperature tuning takes a stepped log (Beam's NoPE layers: base 2048,
    exponent 0.1; the scalable softmax of Nakanishi 2025).
    ``output_gate`` multiplies each channel of the attention output,
    before the output projection, by ``sigmoid(x W_gate)`` of the block input ``x``
    (gated attention, Qiu et al. 2025, arXiv:2505.06708; Qwen3-Next's and Qwen3.5's
    full-attention layers): a head can close itself for a token instead of parking its
    attention on a sink. ``output_gate_scope: head`` gates whole heads instead, one logit
    per head from a projection without bias (LFM3's ``g_proj``). ``output_gate_activation:
    softplus`` gates with ``softplus`` instead of ``sigmoid`` (Laguna): a gate in ``(0, inf)`` that
    can amplify a head as well as close it. ``output_gate_bias: head`` gives the per-channel
    gate a projection without bias and one learned bias per head instead, added to all of the
    head's channel logits (Beam's ``gate_bias``); ``with_qkv`` biases the projection when
    ``qkv_bias`` does. ``backend`` picks the kernel (:mod:`.kernels`): ``auto`` uses the
    fused causal kernel where the mask is plain causal and FlexAttention (block-sparse,
    no ``T x T`` tensor) for every other mask and score modification where it can run;
    ``sdpa`` always uses PyTorch's SDPA (a dense mask when not plain causal); ``flex``
    FlexAttention; ``eager`` writes the softmax out and is the reference. All give the
    same results.

    ``kv_from`` makes the layer read the keys and values of an earlier layer instead of
    projecting its own (cross-layer KV sharing: Brandon et al. 2024, arXiv:2405.12981;
    Gemma 3n's and Gemma 4's last layers): it projects queries only, and keeps no cache
    (the source layer's cache serves both). The source must keep keys and values of the
    same heads and width, and see at least as far back (a window no shorter). ``k_eq_v``
    uses the key projection for the values too (Gemma 4's global layers): the values are
    the keys before their norm and rotation. ``v_norm`` normalises each value head (Gemma
    4: an RMSNorm without a learned scale). ``clip_qkv`` clamps every query, key and value
    channel to ``[-clip_qkv, clip_qkv]`` right after the projection (biases included), before
    any norm or rotation (OLMo, DBRX: a guard against loss spikes, Groeneveld et al. 2024,
    arXiv:2402.00838); with ``clip_qkv_order: after_qk_norm`` the queries and keys are clamped
    after their ``qk_norm`` over all heads instead, the values still after the projection (OLMoE).
    ``differential`` makes the heads pairs of differential attention (Ye et
    al. 2024, arXiv:2410.05258; transformers' DiffLlama): head ``i`` and head ``i + n_heads/2``
    attend with their own softmax, the pair reads a value of ``2 * head_dim`` channels (value
    heads ``g`` and ``g + n_kv_heads/2`` side by side), and its output is
    ``(1 - lambda_init) * differential_norm((softmax_1 - lambda * softmax_2) V)`` with the learned
    ``lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init`` and
    ``lambda_init = 0.8 - 0.6 exp(-0.3 * layer_index)``: the noise both maps share cancels.
    The cache keeps keys and values as plain attention does.
    ``v_head_dim`` gives the value heads a width of their own, wider or narrower than the
    query and key heads (MiMo-V2-Flash: queries and keys of 192 channels, values of 128):
    the output projection reads ``n_heads * v_head_dim`` channels and the cache keeps values
    of that width. ``value_scale`` multiplies every value after its projection (and ``v_norm``), before
    the cache (MiMo-V2-Flash's ``attention_value_scale``, about
    ``sqrt(d_model / (n_heads * v_head_dim))``): the attention output is scaled alike.
    """

    n_heads: int = Field(gt=0, description="Number of query heads.")
    n_kv_heads: int | None = Field(default=None, gt=0, description="Key/value heads; default n_heads (MHA). 1 = MQA.")
    head_dim: int | None = Field(default=None, gt=0, description="Channels per head; default d_model / n_heads.")
    v_head_dim: int | None = Field(
        default=None, gt=0,
        description="Channels per value head, when other than the query/key heads' head_dim (MiMo-V2-Flash); "
                    "the output projection reads n_heads * v_head_dim.",
    )
    value_scale: float = Field(
        default=1.0, gt=0,
        description="Multiplier of the values after their projection (and v_norm), before the cache (MiMo-V2-Flash's "
                    "attention_value_scale).",
    )
    qkv_bias: bool = Field(default=False, description="Biases on the query/key/value projections.")
    out_bias: bool = Field(default=False, description="Bias on the output projection.")
    window: int | None = Field(default=None, gt=0, description="Sliding window: attend to at most this many latest tokens.")
    qk_norm: SubComponent("norm") | None = Field(  # type: ignore[valid-type]
        default=None, description="A norm applied to queries and keys (before RoPE unless qk_norm_order says after).",
    )
    qk_norm_scope: Literal["head", "per_head_weights", "all"] = Field(
        default="head",
        description="head: qk_norm over each head's channels, one weight shared by the heads (Qwen3); "
                    "per_head_weights: the same with a separate weight for every head (StableLM 2 12B); "
                    "all: over all heads' channels at once (OLMo-2).",
    )
    qk_norm_order: Literal["before_rope", "after_rope"] = Field(
        default="before_rope",
        description="before_rope: qk_norm on the projected queries and keys, then rotation (Qwen3, OLMo-2); "
                    "after_rope: rotation first, then qk_norm per head (Hunyuan-V1).",
    )
    logit_softcap: float | None = Field(default=None, gt=0, description="Scores become cap * tanh(scores / cap).")
    scale: float | None = Field(default=None, gt=0, description="Score scale; default 1 / sqrt(head_dim).")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on attention weights (training only).")
    chunk: int | None = Field(default=None, gt=0, description="Chunked local attention: attend only within the same block of this many positions (Llama 4).")
    sinks: bool = Field(default=False, description="Learned per-head sink logits that join the softmax normalisation (gpt-oss).")
    temperature_tuning: bool = Field(
        default=False,
        description="Scale each query by 1 + temperature_attn_scale * ln(1 + floor((position + "
                    "temperature_position_offset) / temperature_floor_scale)) (Llama 4's NoPE layers, Ministral 3).",
    )
    temperature_floor_scale: float = Field(
        default=8192, gt=0, description="Positions per step of the temperature tuning (Llama 4's floor_scale).",
    )
    temperature_attn_scale: float = Field(
        default=0.1, ge=0, description="Strength of the temperature tuning (Llama 4's attn_scale).",
    )
    temperature_position_offset: int = Field(
        default=1, ge=0,
        description="What the temperature tuning adds to the position before the floor: 1 counts positions from 1 "
                    "(Llama 4), 0 from 0 (Ministral 3's llama_4_scaling_beta).",
    )
    query_length_scale: bool = Field(
        default=False,
        description="Scale each query by (1 + (position + 1) / query_length_scale_base) ^ query_length_scale_exponent "
                    "(Beam's NoPE layers).",
    )
    query_length_scale_base: float = Field(
        default=2048, gt=0, description="Positions over which the query length scale's base grows by 1 (Beam: 2048).",
    )
    query_length_scale_exponent: float = Field(
        default=0.1, gt=0, description="The power of the query length scale (Beam: 0.1).",
    )
    output_gate: bool = Field(
        default=False,
        description="Multiply the attention output per channel by sigmoid of a projection of the block input "
                    "(biased when qkv_bias is), before the output projection (Qwen3-Next, Qwen3.5).",
    )
    output_gate_scope: Literal["channel", "head"] = Field(
        default="channel",
        description="channel: one gate logit per output channel of every head (biased when qkv_bias is); head: one "
                    "per head, from a projection without bias, scaling the head's whole output (LFM3).",
    )
    output_gate_activation: Literal["sigmoid", "softplus"] = Field(
        default="sigmoid",
        description="What turns the output gate's logits into gates: sigmoid (Qwen3-Next, LFM3) or softplus (Laguna).",
    )
    output_gate_bias: Literal["with_qkv", "head"] = Field(
        default="with_qkv",
        description="The per-channel output gate's bias: with_qkv, on its projection when qkv_bias is (Qwen3-Next); "
                    "head, a bias-free projection plus one learned bias per head over its channels (Beam).",
    )
    kv_from: int | None = Field(
        default=None, ge=0,
        description="Read the keys and values of this earlier layer (its index) instead of projecting and caching "
                    "its own (cross-layer KV sharing, Gemma 4).",
    )
    k_eq_v: bool = Field(default=False, description="No value projection: the values are the projected keys, "
                                                    "before their norm and rotation (Gemma 4's global layers).")
    v_norm: SubComponent("norm") | None = Field(  # type: ignore[valid-type]
        default=None, description="A norm applied to each value head (Gemma 4: rmsnorm without a weight).",
    )
    clip_qkv: float | None = Field(
        default=None, gt=0,
        description="Clamp queries, keys and values to [-clip_qkv, clip_qkv] right after their projection, "
                    "before norms and rotation (OLMo, DBRX).",
    )
    clip_qkv_order: Literal["after_projection", "after_qk_norm"] = Field(
        default="after_projection",
        description="Where clip_qkv clamps queries and keys: after_projection (OLMo, DBRX); after_qk_norm, after their "
                    "qk_norm over all heads (qk_norm_scope all; OLMoE). Values are always clamped after the projection.",
    )
    differential: bool = Field(
        default=False,
        description="Differential attention: heads i and i + n_heads/2 form a pair whose second softmax, scaled by a "
                    "learned lambda, is subtracted from the first over a value of 2 * head_dim channels (DiffLlama).",
    )
    differential_norm: SubComponent("norm") = Field(  # type: ignore[valid-type]
        default={"kind": "rmsnorm", "eps": 1e-5, "weight": False}, validate_default=True,
        description="With differential: the norm of each pair's 2 * head_dim output channels, one for all pairs "
                    "(DiffLlama: rmsnorm without a weight, eps rms_norm_eps).",
    )
    out_norm: SubComponent("norm") | None = Field(  # type: ignore[valid-type]
        default=None,
        description="A norm over all heads' concatenated outputs right before the output projection (BitNet's "
                    "attn_sub_norm).",
    )
    linear: SubComponent("linear") | None = Field(  # type: ignore[valid-type]
        default=None,
        description="The projections' kind in place of nn.Linear, same weights (bitlinear: ternary weights, int8 "
                    "activations); the fused q/k/v keeps one quantiser scale per projection.",
    )
    indexer: SubComponent("indexer") | None = Field(  # type: ignore[valid-type]
        default=None,
        description="Sparse attention: a selector over the layer's own queries and keys picks the keys each query "
                    "reads (block_pooled, Kolibri 1.1); read through a mask with the sdpa or eager kernel.",
    )
    input_width: int | None = Field(
        default=None, gt=0,
        description="The width the query/key/value (and gate) projections read; the output is still d_model wide. "
                    "Default d_model. Zamba's shared attention reads concat(stream, embeddings): 2 x d_model.",
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
        if self.kv_from is not None and (self.k_eq_v or self.v_norm is not None):
            raise ValueError("a layer with kv_from projects no keys or values, so k_eq_v and v_norm do not apply; "
                             "set them on the layer it reads")
        if self.clip_qkv_order == "after_qk_norm" and (self.clip_qkv is None or self.qk_norm is None
                                                        or self.qk_norm_scope != "all"):
            raise ValueError("clip_qkv_order after_qk_norm clamps the queries and keys after their norm over all heads: "
                             "it needs clip_qkv, qk_norm and qk_norm_scope all")
        if self.qk_norm_order == "after_rope" and self.qk_norm_scope == "all":
            raise ValueError("qk_norm_order after_rope normalises each rotated head, so it takes qk_norm_scope head or "
                             "per_head_weights, not all (a norm over every head's channels comes before rotation)")
        if self.output_gate_bias == "head" and (not self.output_gate or self.output_gate_scope != "channel"):
            raise ValueError("output_gate_bias head biases the per-channel output gate's logits per head: it needs "
                             "output_gate true with output_gate_scope channel")
        if self.differential:
            self._check_differential()
        if self.indexer is not None:
            self._check_indexer()
        if self.input_width is not None and self.indexer is not None:
            raise ValueError("input_width and indexer do not combine: the indexer reads the d_model-wide block input; "
                             "drop one of them")
        if self.v_head_dim is not None:
            self._check_value_width()
        return self

    def _check_value_width(self) -> None:
        for name, on in (("k_eq_v", self.k_eq_v), ("differential", self.differential),
                         ("kv_from", self.kv_from is not None)):
            if on:
                raise ValueError(f"v_head_dim gives the layer's own value projection a width of its own, so it does "
                                 f"not combine with {name} (values that are keys, value pairs, or another layer's); "
                                 f"drop v_head_dim or {name}")

    def _check_indexer(self) -> None:
        indexer = self.indexer.params
        if not getattr(indexer, "reads_attention", False):
            raise ValueError(f"attention's indexer scores the layer's own queries and keys: it takes block_pooled; "
                             f"{self.indexer.component.name} has queries of its own from a latent (use it on mla)")
        if self.differential:
            raise ValueError("an indexer and differential attention do not combine: the pairs' two maps would each "
                             "need the selection, and no model defines one")
        kv = self.n_kv_heads or self.n_heads
        if indexer.n_heads is not None and indexer.n_heads > self.n_heads // kv:
            raise ValueError(f"the indexer's n_heads ({indexer.n_heads}) scores with the query heads of key head 0, "
                             f"of which there are {self.n_heads // kv} (n_heads / n_kv_heads)")

    def _check_differential(self) -> None:
        kv_heads = self.n_kv_heads or self.n_heads
        if kv_heads % 2:
            raise ValueError(f"differential attention pairs key/value head g with g + n_kv_heads/2, so n_kv_heads "
                             f"(n_heads without it) must be even, got {kv_heads}")
        if self.dropout:
            raise ValueError(f"differential attention takes no dropout (its two softmax maps would need one mask, and "
                             f"the paper defines none), got dropout {self.dropout}")
        if self.output_gate:
            raise ValueError("differential attention and output_gate do not combine: the gate is per head or channel "
                             "of plain heads, and differential heads are pairs of 2 * head_dim channels")

    def sized(self, *, d_model: int, layer_index: int = 0) -> Sized:
        sizes = head_sizes(d_model=d_model, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, head_dim=self.head_dim)
        H, KV, hd = sizes.n_heads, sizes.n_kv_heads, sizes.head_dim
        vd = self.v_head_dim or hd
        self.check_kv_from(layer_index)
        # Queries, then keys and values of its own (none when it reads another layer's; no value rows with k_eq_v).
        kv_rows = 0 if self.kv_from is not None else KV * hd + (0 if self.k_eq_v else KV * vd)
        parameters = total(
            self._projection(self.input_width or d_model, H * hd + kv_rows, bias=self.qkv_bias,
                             splits=(H * hd, *(() if self.kv_from is not None else
                                               (KV * hd,) if self.k_eq_v else (KV * hd, KV * vd)))),
            self._projection(H * vd, d_model, bias=self.out_bias),
            self.out_norm.sized(dim=H * vd).parameters if self.out_norm is not None else 0,
            self._gate_parameters(self.input_width or d_model, H, vd),
            H if self.sinks else 0,
            self._qk_norm_parameters(H, KV, hd),
            self.v_norm.sized(dim=vd).parameters if self.v_norm is not None else 0,
            # differential: lambda_q1, lambda_k1, lambda_q2, lambda_k2 and the norm of a pair's channels
            total(4 * hd, self.differential_norm.sized(dim=2 * hd).parameters) if self.differential else 0,
            self.indexer.sized(d_model=d_model, query_dim=H * hd, positional_dim=0).parameters
            if self.indexer is not None else 0,
        )
        # Values of their own width: the cache keeps them so (keys as usual).
        slots = (CacheSlots(key_heads=KV, key_dim=hd, value_heads=KV, value_dim=vd)
                 if vd != hd and self.kv_from is None else None)
        return Sized(parameters=parameters, n_heads=H, n_kv_heads=KV, head_dim=hd, caches_tokens=self.kv_from is None,
                     kv_from=self.kv_from, window=self.window, slots=slots)

    def _projection(self, d_in: int, d_out: int, *, bias: bool, splits: tuple[int, ...] = ()) -> int | None:
        """One projection's parameters: nn.Linear's, or the ``linear`` component's own size check."""
        if self.linear is None:
            return linear(d_in, d_out, bias=bias)
        return self.linear.sized(in_features=d_in, out_features=d_out, bias=bias, splits=splits).parameters

    def _gate_parameters(self, d_model: int, H: int, hd: int) -> int | None:
        if not self.output_gate:
            return 0
        if self.output_gate_scope == "head":
            return self._projection(d_model, H, bias=False)
        if self.output_gate_bias == "head":  # a bias-free projection and one bias per head
            return total(self._projection(d_model, H * hd, bias=False), H)
        return self._projection(d_model, H * hd, bias=self.qkv_bias)

    def check_kv_from(self, layer_index: int) -> None:
        """ValueError unless ``kv_from`` (when set) names a layer before ``layer_index``."""
        if self.kv_from is not None and self.kv_from >= layer_index:
            raise ValueError(f"kv_from ({self.kv_from}) must name an earlier layer than this one ({layer_index}): "
                             f"a layer reads keys and values that were made before it")

    def _qk_norm_parameters(self, H: int, KV: int, hd: int) -> int | None:
        """The query and key norms, sized as ``qk_norm_scope`` says (the layer's ``_qk_norms`` makes the same);
        a layer reading another's keys (``kv_from``) keeps no key norm."""
        if self.qk_norm is None:
            return 0
        keys = self.kv_from is None
        if self.qk_norm_scope == "all":
            return total(self.qk_norm.sized(dim=H * hd).parameters,
                         self.qk_norm.sized(dim=KV * hd).parameters if keys else 0)
        one = self.qk_norm.sized(dim=hd).parameters
        # per_head_weights: one per query and per key head
        copies = (1 + keys) if self.qk_norm_scope == "head" else H + (KV if keys else 0)
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
    ``output_gate`` multiplies each head's output, before the output projection, by
    ``sigmoid(x w_h)``, one logit per head from the block input ``x`` (the head-wise form of
    gated attention, Qiu et al. 2025, arXiv:2505.06708, as Ling 3's latent attention,
    Hugging Face ``bailing_hybrid``, has it); ``output_gate_scope: channel`` gives each value
    channel its own logit (the element-wise form), and ``output_gate_input: query_latent``
    computes the logits from what the query up-projection reads instead of ``x``.
    ``q_up_input: normed_and_raw`` makes the query up-projection read the normalised query
    latent and the latent before its norm side by side, ``[norm(c); c]`` (``2 * q_lora_rank``
    channels; the indexer still reads ``norm(c)``): A.X-K2 (Hugging Face ``axk2``), whose
    fused ``q_gate_proj`` computes its queries and channel gates so.
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
    indexer: SubComponent("indexer") | None = Field(  # type: ignore[valid-type]
        default=None,
        description="Sparse attention: an indexer picks, for each query, the earlier keys attention reads "
                    "(DeepSeek-V3.2's lightning indexer, reading the query latent; the block input without q_lora_rank).",
    )
    output_gate: bool = Field(
        default=False, description="Multiply each head's output by sigmoid(x . w_head) of the block input before the "
                                   "output projection (one gate logit per head, no bias; Ling 3).")
    output_gate_scope: Literal["head", "channel"] = Field(
        default="head", description="head: one gate logit per head; channel: one per value channel (A.X-K2).")
    output_gate_input: Literal["block_input", "query_latent"] = Field(
        default="block_input", description="What the gate logits are computed from: the block input, or what the "
                                           "query up-projection reads (q_lora_rank and q_up_input; A.X-K2).")
    q_up_input: Literal["normed", "normed_and_raw"] = Field(
        default="normed", description="What the query up-projection reads: the normalised query latent, or it and "
                                      "the latent before its norm side by side, [norm(c); c] (A.X-K2).")
    backend: Literal["sdpa", "eager"] = Field(default="sdpa", description="sdpa: fused kernels; eager: explicit softmax.")

    @model_validator(mode="after")
    def _rotary_pairs(self) -> "LatentAttentionParams":
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim ({self.qk_rope_head_dim}) must be even: rotary channels turn in pairs")
        if self.q_lora_rank is None and (self.q_up_input != "normed" or self.output_gate_input == "query_latent"):
            raise ValueError("q_up_input normed_and_raw and output_gate_input query_latent read the query latent; "
                             "give q_lora_rank")
        if self.indexer is not None and getattr(self.indexer.params, "reads_attention", False):
            raise ValueError(f"mla's indexer has queries and keys of its own (lightning); "
                             f"{self.indexer.component.name} scores a plain attention's heads (use it on attention)")
        return self

    @property
    def q_up_width(self) -> int | None:
        """Channels the query up-projection reads (None: queries have no bottleneck)."""
        if self.q_lora_rank is None:
            return None
        return self.q_lora_rank * (2 if self.q_up_input == "normed_and_raw" else 1)

    def gate_width(self, d_model: int) -> tuple[int, int]:
        """The output gate's projection: (channels read, logits)."""
        read = d_model if self.output_gate_input == "block_input" else self.q_up_width
        return read, self.n_heads * (self.v_head_dim if self.output_gate_scope == "channel" else 1)

    def sized(self, *, d_model: int) -> Sized:
        H, rope, nope, v = self.n_heads, self.qk_rope_head_dim, self.qk_nope_head_dim, self.v_head_dim
        qk = nope + rope
        if self.q_lora_rank is None:
            query = linear(d_model, H * qk)
        else:
            query = total(linear(d_model, self.q_lora_rank, bias=self.bias),
                          self.latent_norm.sized(dim=self.q_lora_rank).parameters, linear(self.q_up_width, H * qk))
        parameters = total(
            query,
            linear(d_model, self.kv_lora_rank + rope, bias=self.bias),
            self.latent_norm.sized(dim=self.kv_lora_rank).parameters,
            linear(self.kv_lora_rank, H * (nope + v)),
            linear(H * v, d_model, bias=self.bias),
            linear(*self.gate_width(d_model)) if self.output_gate else 0,
        )
        index_dim = 0
        if self.indexer is not None:
            indexer = self.indexer.sized(d_model=d_model, query_dim=self.q_lora_rank or d_model, positional_dim=rope)
            parameters, index_dim = total(parameters, indexer.parameters), int(indexer.head_dim)
        # Every head has its own key and value once expanded; positions turn only the rotary channels. The cache
        # keeps the latent and the shared rotary key (with the indexer's key beside it).
        slots = CacheSlots(key_heads=1, key_dim=rope + index_dim, value_heads=1, value_dim=self.kv_lora_rank)
        return Sized(parameters=parameters, n_heads=H, n_kv_heads=H, head_dim=qk, positional_dim=rope, slots=slots,
                     window=self.window)


#: How an indexer breaks exact ties of the score at a query's cut (the ReLU makes a score of exactly 0 common).
IndexTies = Literal["first", "topk"]
TIES_DESCRIPTION = (
    "Exact ties of the index score at a query's cut: first: the earliest keys win, whatever the number of keys, so a "
    "cached step chooses what recomputing chooses; topk: the keys torch.topk returns over the row of every key the "
    "forward holds, as transformers chooses (imports set it; its choice depends on the row's length, so at a tie a "
    "cached step may choose otherwise than recomputing, in transformers as here).")


class LightningIndexerParams(Params):
    """Sparse attention's selector: each query reads only the ``topk`` earlier keys it scores highest.

    DeepSeek Sparse Attention (DeepSeek-V3.2, DeepSeek-AI 2025, arXiv:2512.02556). The
    indexer has its own small queries (``n_heads`` heads of ``head_dim`` channels, projected
    from what the attention hands it: the query latent in latent attention), one key per
    token (projected from the block input, normalised by ``key_norm``) and one weight per
    head and token. The score of query ``t`` and key ``s`` is
    ``sum_h w[t,h] * n_heads^-1/2 * relu(q[t,h] . k[s] / sqrt(head_dim))``; the ``topk``
    best allowed keys (causal, window, padding) are the ones attention reads, so a query
    with at most ``topk`` keys attends to all of them, as dense attention. The first
    rotary channels of queries and keys (as many as the attention's rotary part) turn with
    the layer's positional scheme, in halves (``interleaved: false``, DeepSeek-V3.2's
    indexer) or in adjacent pairs. Queries are handled ``block`` at a time against all keys,
    so memory grows linearly with the context. The cache keeps each token's indexer key
    (``head_dim`` values per layer) beside the attention's. Selection is discrete, so the
    indexer learns from its own loss (DeepSeek-V3.2's sparse training stage): while training,
    the KL divergence from the attention's weights over each query's chosen keys (summed over
    heads, normalised) to the softmax of their index scores, averaged over queries, times
    ``loss_coef``, joins the model's auxiliary loss; the indexer reads its inputs detached, so
    this loss trains only the indexer and the language-model loss never reaches it.
    """

    topk: int = Field(gt=0, description="Keys each query reads (DeepSeek-V3.2's index_topk, 2048).")
    n_heads: int = Field(default=64, gt=0, description="Indexer query heads (index_n_heads).")
    head_dim: int = Field(default=128, gt=0, description="Channels of an indexer query head and of its key (index_head_dim).")
    key_norm: SubComponent("norm") = Field(  # type: ignore[valid-type]
        default={"kind": "layernorm", "eps": 1e-6}, validate_default=True,
        description="The norm of the indexer's keys (DeepSeek-V3.2: a LayerNorm with eps 1e-6).",
    )
    interleaved: bool = Field(
        default=False,
        description="The indexer's rotary channels turn in adjacent pairs; false: in halves (DeepSeek-V3.2).",
    )
    block: int = Field(default=64, gt=0, description="Queries scored and attended at once (memory per block: block x keys).")
    ties: IndexTies = Field(default="first", description=TIES_DESCRIPTION)
    loss_coef: float = Field(
        default=1.0, ge=0,
        description="Weight of the indexer's training loss, KL(attention over the chosen keys || softmax of their "
                    "index scores), added to the model's auxiliary loss; 0: the indexer does not learn.",
    )

    def sized(self, *, d_model: int, query_dim: int, positional_dim: int) -> Sized:
        self.check_positional(positional_dim)
        parameters = total(linear(query_dim, self.n_heads * self.head_dim), linear(d_model, self.head_dim),
                           self.key_norm.sized(dim=self.head_dim).parameters, linear(d_model, self.n_heads))
        # head_dim: the width of the key each token keeps in the cache beside its attention's.
        return Sized(parameters=parameters, n_heads=self.n_heads, head_dim=self.head_dim)

    def check_positional(self, positional_dim: int) -> None:
        """ValueError when the attention's rotary channels do not fit in the indexer's heads."""
        if positional_dim > self.head_dim:
            raise ValueError(f"the indexer's head_dim ({self.head_dim}) must hold the attention's "
                             f"{positional_dim} rotary channels")


class CompressedAttentionParams(Params):
    """Sliding-window attention plus keys pooled over blocks of ``compress_rate`` tokens (DeepSeek-V4).

    One key/value head shared by every query head (the key is the value, as in
    DeepSeek-V4): a token's ``kv`` is ``norm(x W_kv)``, its query ``rms(norm(x W_qa) W_qb)``
    per head (the last normalisation without a weight). Each query reads the ``window``
    latest tokens and, with ``compress_rate``, one **compressed entry** per block of
    ``compress_rate`` tokens that is complete at or before it: entry ``b`` pools the block's
    tokens ``C = x W_c`` with softmax weights of ``Z = x W_z + B`` (``B`` a learned bias per
    slot of the block), channel by channel, then is normalised and rotated at the position
    of the block's first token. ``overlap`` (DeepSeek-V4's compressed *sparse* attention)
    pools two series per token over two blocks: the previous block's first series and this
    block's second, so entries overlap by one block. ``index_heads`` adds the lightning
    indexer: each query keeps only the ``index_topk`` entries its own small scorer ranks
    highest (``sum_h w_h relu(q_h . k)``, with its own pooled keys; ties go to the earlier
    entry); its choice is discrete, so it reads its inputs detached and learns from its own
    loss, ``index_loss_coef`` times the KL divergence from the attention's weights over the
    chosen entries (summed over heads) to the softmax of their scores. Rotary channels are the
    last ``rope_dim`` of each head; the output's rotary channels are turned back by the
    query's angle (the value carries the key's rotation). ``sinks`` adds a learned logit
    per head to the softmax. ``out_groups`` splits the heads' outputs into groups projected
    to ``out_rank`` channels each, then mixed to ``d_model`` (the grouped low-rank output
    projection). The generation cache keeps the window's keys per token (a ring of
    ``window`` slots) and, per sequence, every entry the context can hold
    (``context_length // compress_rate``) with the projections of the blocks in progress:
    ``head_dim / compress_rate`` values per token of context instead of ``head_dim``.
    """

    n_heads: int = Field(gt=0, description="Number of query heads (one key/value head is shared by all).")
    head_dim: int = Field(gt=0, description="Channels per head (of queries, the shared key/value and the entries).")
    q_lora_rank: int = Field(gt=0, description="Channels of the normalised low-rank query bottleneck.")
    rope_dim: int = Field(gt=0, description="Rotary channels: the last rope_dim of each head (the layer's positional scheme turns them).")
    window: int = Field(gt=0, description="Sliding window over the uncompressed tokens: the latest this many, the query included.")
    compress_rate: int | None = Field(default=None, gt=1, description="Tokens per compressed entry; none: sliding-window attention only.")
    overlap: bool = Field(default=False, description="Two series per token, each entry pooling the previous block's first and this block's second (DeepSeek-V4 CSA).")
    index_heads: int | None = Field(default=None, gt=0, description="Heads of the lightning indexer that picks index_topk entries per query; none: every complete entry is read.")
    index_head_dim: int = Field(default=128, gt=0, description="Channels per indexer head (and of the indexer's own pooled keys).")
    index_topk: int = Field(default=512, gt=0, description="Compressed entries each query keeps (fewer when fewer are complete).")
    index_ties: IndexTies = Field(default="first", description=TIES_DESCRIPTION)
    index_loss_coef: float = Field(
        default=1.0, ge=0,
        description="Weight of the indexer's training loss, KL(attention over the chosen entries || softmax of their "
                    "index scores), added to the model's auxiliary loss; 0: the indexer does not learn.",
    )
    out_groups: int | None = Field(default=None, gt=0, description="Groups of heads whose outputs are projected separately to out_rank channels; none: one output projection.")
    out_rank: int | None = Field(default=None, gt=0, description="Channels each group is projected to before the mix to d_model (with out_groups).")
    sinks: bool = Field(default=True, description="A learned per-head logit joins the softmax normalisation (gpt-oss, DeepSeek-V4).")
    norm: SubComponent("norm") = Field(  # type: ignore[valid-type]
        default="rmsnorm", validate_default=True,
        description="The norm of the query latent, of the key/value and of every pooled entry.",
    )
    eps: float = Field(default=1e-6, gt=0, description="Epsilon of the weightless per-head query normalisation.")

    @model_validator(mode="after")
    def _consistent(self) -> "CompressedAttentionParams":
        if self.rope_dim % 2 or self.rope_dim > self.head_dim:
            raise ValueError(f"rope_dim ({self.rope_dim}) must be even and at most head_dim ({self.head_dim})")
        if self.compress_rate is None and (self.overlap or self.index_heads is not None):
            raise ValueError("overlap and index_heads pool entries: they need compress_rate")
        if self.index_heads is not None and self.rope_dim > self.index_head_dim:
            raise ValueError(f"rope_dim ({self.rope_dim}) must be at most index_head_dim ({self.index_head_dim})")
        if (self.out_groups is None) != (self.out_rank is None):
            raise ValueError("out_groups and out_rank go together (the grouped low-rank output projection)")
        if self.out_groups is not None and self.n_heads % self.out_groups:
            raise ValueError(f"out_groups ({self.out_groups}) must divide n_heads ({self.n_heads})")
        return self

    def sized(self, *, d_model: int, context_length: int, layer_index: int = 0) -> Sized:
        H, hd, rate = self.n_heads, self.head_dim, self.compress_rate

        def norm(dim: int) -> int | None:
            return self.norm.sized(dim=dim).parameters

        def pooler(dim: int) -> int | None:  # BlockPooler: projections and slot bias per series, and the entries' norm
            series = 2 if self.overlap else 1
            return total(2 * linear(d_model, series * dim), rate * series * dim, norm(dim))

        if self.out_groups is None:
            out = linear(H * hd, d_model)
        else:  # the grouped low-rank output: each group's channels down to out_rank, then mixed to d_model
            assert self.out_rank is not None
            out = self.out_groups * self.out_rank * (H * hd // self.out_groups) + linear(self.out_groups * self.out_rank,
                                                                                         d_model)
        parameters = total(
            linear(d_model, self.q_lora_rank), norm(self.q_lora_rank), linear(self.q_lora_rank, H * hd),
            linear(d_model, hd), norm(hd), H if self.sinks else 0, out,
            pooler(hd) if rate is not None else 0,
        )
        if self.index_heads is not None:
            parameters = total(parameters, pooler(self.index_head_dim),
                               linear(self.q_lora_rank, self.index_heads * self.index_head_dim),
                               linear(d_model, self.index_heads))
        # The cache keeps the window's key (which is the value) per token, split in two halves; the pooled entries
        # are a per-sequence state.
        slots = CacheSlots(key_heads=1, key_dim=hd - hd // 2, value_heads=1, value_dim=hd // 2)
        return Sized(parameters=parameters, n_heads=H, n_kv_heads=1, head_dim=hd, positional_dim=self.rope_dim,
                     slots=slots, window=self.window, keeps_state=rate is not None, uses_positions=True)
