"""The settings of the block layouts, importable without torch (listing components reads only these)."""

from __future__ import annotations

import math

from typing import Any, Callable, ClassVar, Literal

from pydantic import Field, model_validator

from specformer.registry.params import Params, Sized, SubComponent
from specformer.model.sized import linear, total
from specformer_layers.ffn.params import Activation

#: The two sublayers of every block; every other part of a layout is a norm.
SUBLAYERS = ("mixer", "ffn")
#: The prefix of the names of the norms and connections serving each sublayer. The mixer's keep the names they had
#: when the slot was called ``attention`` (``attention_norm``, ``attention_residual``), as every checkpoint has them.
PART_PREFIX = {"mixer": "attention", "ffn": "ffn"}

#: What becomes of one norm of a layout: made by ``make_norm``, an identity (it serves only absent
#: sublayers: no weights, the forward unchanged) or nothing (these params do without it).
NormPlan = Literal["norm", "identity", "none"]


class BlockParams(Params):
    """What every layout takes: nothing beyond its parts (a layout with settings subclasses it)."""

    #: Every part, in registration order: ``mixer``, ``ffn`` and the names of the norms.
    parts: ClassVar[tuple[str, ...]] = ()

    #: Each residual connection and the sublayers whose outputs it writes (one each, unless they share a write).
    residuals: ClassVar[dict[str, tuple[str, ...]]] = {"attention_residual": ("mixer",), "ffn_residual": ("ffn",)}

    def norms_made(self) -> tuple[str, ...]:
        """The norms ``make_norm`` builds for these params (a layout whose norms depend on a param overrides it)."""
        return tuple(p for p in self.parts if p not in SUBLAYERS)

    def norm_serves(self, name: str) -> tuple[str, ...]:
        """The sublayers norm ``name`` serves: the one whose prefix it starts with (a layout sharing norms overrides it)."""
        return tuple(s for s in SUBLAYERS if name.startswith(f"{PART_PREFIX[s]}_"))

    def norm_plan(self, *, absent: dict[str, bool]) -> dict[str, NormPlan]:
        """What becomes of each norm in :attr:`parts`, given which sublayers are absent (``ffn: none``)."""
        made = self.norms_made()
        plan: dict[str, NormPlan] = {}
        for name in self.parts:
            if name in SUBLAYERS:
                continue
            if name not in made:
                plan[name] = "none"
            elif all(absent[s] for s in self.norm_serves(name)):
                plan[name] = "identity"
            else:
                plan[name] = "norm"
        return plan

    def sized(self, *, mixer: Sized, ffn: Sized, make_norm: Callable[[], Any],
              make_residual: Callable[[], Any] | None = None) -> Sized:
        parameters, _ = self.sized_parts(mixer=mixer, ffn=ffn, make_norm=make_norm, make_residual=make_residual)
        return Sized(parameters=parameters)

    def sized_parts(self, *, mixer: Sized, ffn: Sized, make_norm: Callable[[], Any],
                    make_residual: Callable[[], Any] | None = None) -> tuple[int | None, int]:
        """The parameters of the parts every layout makes (sublayers, norms, connections), and the streams they
        write (a layout with more parts adds its own to these)."""
        absent = {"mixer": mixer.absent, "ffn": ffn.absent}
        plan = self.norm_plan(absent=absent)
        norms = [make_norm().parameters for how in plan.values() if how == "norm"]
        # A connection whose sublayers are all absent is a weightless bypass; each other one is made.
        made = [] if make_residual is None else [
            make_residual() for sublayers in self.residuals.values() if not all(absent[s] for s in sublayers)]
        n_streams = max((c.n_streams for c in made), default=1)
        self.check_streams(n_streams)
        return total(mixer.parameters, ffn.parameters, *norms, *(c.parameters for c in made)), n_streams

    def check_streams(self, n_streams: int) -> None:
        """ValueError when this layout cannot run on ``n_streams`` residual streams (every layout here can)."""


class PreNormBlockParams(BlockParams):
    """``x = x + attention(norm(x))``; ``x = x + ffn(norm(x))``. Trains stably without warm-up tricks (Xiong et al. 2020).

    ``residual_multiplier`` scales both sublayers' outputs before they are added,
    ``x = x + r * attention(norm(x))`` (Granite's ``residual_multiplier``, a muP-style
    width scaling); 1 leaves the block as above.

    DeepNorm's scales (Wang et al. 2022, arXiv:2203.00555) as MiniMax-01 places them:
    ``x = a x + b attention(norm(x))`` with ``a`` from ``residual_scales`` and ``b`` from
    ``output_scales`` (one each for the mixer and the FFN); with ``normed_residual`` what is
    added to is the sublayer's normalised input, ``h = norm(x); x = a h + b attention(h)``
    (MiniMax-Text-01's layers, whose stream is each norm's output). Both need one residual
    stream; the defaults leave the block as above.

    With ``mixer_pre_norm: false`` the block has no ``attention_norm`` and the mixer reads the
    raw stream, ``x = x + attention(x)`` (ModernBERT-decoder's first layer, whose input is the
    already normalised embeddings; set it on that layer with a ``layers:`` override).

    ``ffn_norm`` gives the FFN a norm of another kind than the block's (``block.norm``), which
    stays the mixer's: A.X-K2's dense layers gate their attention norm and not their FFN's
    (``norm: {kind: gated}`` with ``ffn_norm: rmsnorm`` on those layers).
    """

    parts: ClassVar[tuple[str, ...]] = ("attention_norm", "mixer", "ffn_norm", "ffn")

    residual_multiplier: float = Field(
        default=1.0, description="Each sublayer's output is multiplied by this before the residual add (Granite).",
    )
    normed_residual: bool = Field(
        default=False, description="Each sublayer adds to its normalised input instead of the stream: "
                                   "x = a n(x) + b f(n(x)) (MiniMax-01).",
    )
    residual_scales: tuple[float, float] = Field(
        default=(1.0, 1.0), description="DeepNorm's alpha: what is added to is multiplied by this before each add, "
                                        "[mixer's, ffn's] (MiniMax-01's layernorm_*_alpha). 0: no add, the "
                                        "sublayer's output is the stream (Zamba's shared block keeps no residual).",
    )
    output_scales: tuple[float, float] = Field(
        default=(1.0, 1.0), description="DeepNorm's beta: each sublayer's output is multiplied by this (and by "
                                        "residual_multiplier) before its add, [mixer's, ffn's] (MiniMax-01's "
                                        "layernorm_*_beta).",
    )
    mixer_pre_norm: bool = Field(
        default=True, description="Normalise the mixer's input; false: the mixer reads the raw stream and the block "
                                  "has no attention_norm (ModernBERT-decoder's first layer).",
    )

    ffn_norm: SubComponent("norm") | None = Field(  # type: ignore[valid-type]
        default=None, description="The FFN's norm when it differs from the block's (block.norm, then the mixer's "
                                  "only); none: the block's (A.X-K2's dense layers: rmsnorm under a gated block norm).",
    )

    def norms_made(self) -> tuple[str, ...]:
        return tuple(p for p in super().norms_made() if p != "attention_norm" or self.mixer_pre_norm)

    def sized(self, *, mixer: Sized, ffn: Sized, make_norm: Callable[[], Any],
              make_residual: Callable[[], Any] | None = None, d_model: int = 0) -> Sized:
        parameters, _ = self.sized_parts(mixer=mixer, ffn=ffn, make_norm=make_norm, make_residual=make_residual)
        if self.ffn_norm is not None and self.norm_plan(absent={"mixer": mixer.absent, "ffn": ffn.absent})["ffn_norm"] == "norm":
            # sized_parts counted the block's norm in the FFN's place.
            own, block = self.ffn_norm.sized(dim=d_model).parameters, make_norm().parameters
            parameters = None if None in (parameters, own, block) else parameters - block + own
        return Sized(parameters=parameters)

    def check_streams(self, n_streams: int) -> None:
        if n_streams != 1 and (self.normed_residual or self.residual_scales != (1.0, 1.0)):
            raise ValueError(f"normed_residual and residual_scales act on a single residual stream; this model's "
                             f"residual has {n_streams} (use residual: single with them)")


class PostNormBlockParams(BlockParams):
    """``x = norm(x + attention(x))``; ``x = norm(x + ffn(x))`` (Vaswani et al. 2017)."""

    parts: ClassVar[tuple[str, ...]] = ("mixer", "attention_norm", "ffn", "ffn_norm")

    def check_streams(self, n_streams: int) -> None:
        if n_streams != 1:
            raise ValueError(f"postnorm normalises the residual stream itself, which needs one stream; this model's "
                             f"residual has {n_streams} (use prenorm, sandwich, parallel or postnorm_inside with it, "
                             f"or residual: single)")


class ParallelBlockParams(BlockParams):
    """``x = x + attention(norm_1(x)) + ffn(norm_2(x))``: one residual add, both sublayers side by side.

    With ``shared_norm`` one norm feeds both sublayers (GPT-J, PaLM; the block then has
    ``attention_norm`` only and ``ffn_norm`` is None); without it each has its own
    (GPT-NeoX, Pythia: ``attention_norm`` and ``ffn_norm``). The two sublayers can run
    concurrently, which is why large models used it (Wang & Komatsuzaki 2021).
    """

    parts: ClassVar[tuple[str, ...]] = ("attention_norm", "mixer", "ffn_norm", "ffn")

    #: Both sublayers read the stream once and are written back together.
    residuals: ClassVar[dict[str, tuple[str, ...]]] = {"residual": ("mixer", "ffn")}

    shared_norm: bool = Field(default=False, description="One norm for both sublayers (GPT-J) instead of two (GPT-NeoX).")

    def norms_made(self) -> tuple[str, ...]:
        return ("attention_norm",) if self.shared_norm else ("attention_norm", "ffn_norm")

    def norm_serves(self, name: str) -> tuple[str, ...]:
        shared = self.shared_norm and name == "attention_norm"  # it feeds the ffn too
        return ("mixer", "ffn") if shared else super().norm_serves(name)


class SandwichBlockParams(BlockParams):
    """``x = x + post_norm(attention(pre_norm(x)))``; the same around the FFN (Gemma 2).

    Four norms per block: ``attention_norm`` and ``attention_post_norm`` around attention,
    ``ffn_norm`` and ``ffn_post_norm`` around the FFN. Normalising each sublayer's output
    before the residual add keeps the stream's scale in check (Ding et al. 2021, CogView).

    When the model has per-layer inputs (``model.per_layer_input``, Gemma 4), the block then
    gates its slice ``p`` into the stream: ``x = x + norm(proj(act(x G) * p))``, with
    ``per_layer_activation`` as ``act`` and a norm of its own. ``layer_scale`` multiplies
    the whole stream leaving the block by a scalar of the layer's (Gemma 4's
    ``layer_scalar``, a buffer that checkpoints set and training leaves alone). With
    ``ffn_pre_norm: false`` the block has no ``ffn_norm`` and the FFN reads the raw stream:
    an FFN that normalises its own branches (``ffn: parallel``, Gemma 4's MoE layers).

    ``residual_multiplier`` scales each sublayer's post-normed output before the residual add,
    ``x = x + r * post_norm(attention(pre_norm(x)))`` (HyperCLOVA X's muP-style
    ``residual_multiplier`` on its peri-layer norms); 1 leaves the block as above.

    ``depth_scaled_residual`` makes each add keep the stream's scale with depth (the squared
    weights sum to 1), ``x = x sqrt((k-1)/k) + post_norm(f(pre_norm(x))) / sqrt(k)``, where ``k``
    counts the adds up to this one: ``2l + 2`` for the mixer and ``2l + 3`` for the FFN of
    layer ``l`` (from 0; Beam's ``depth_scaled_residual_add``). It needs one residual stream.

    ``residual_gate`` mixes each sublayer's post-normed output into the stream with a learned
    weight per channel, one vector ``w`` for the mixer's add and one for the FFN's (initialised to
    zero): ``x = sigmoid(w) out + sqrt(1 + sigmoid(w)) exp(-softplus(w) / 2) x`` (Amazon's Ergo,
    ``ErgoResidualGate``; at ``w = 0`` both weights are ``1/2`` and ``sqrt(3)/2``). The gates are
    computed in float32. It needs one residual stream and excludes ``depth_scaled_residual``.
    """

    parts: ClassVar[tuple[str, ...]] = ("attention_norm", "mixer", "attention_post_norm", "ffn_norm", "ffn",
                                       "ffn_post_norm")

    per_layer_activation: Activation = Field(
        default="gelu_tanh", description="The activation of the per-layer input's gate (with model.per_layer_input).",
    )
    layer_scale: bool = Field(
        default=False, description="Multiply the stream leaving the block by a per-layer scalar buffer (Gemma 4).",
    )
    residual_multiplier: float = Field(
        default=1.0, description="Each sublayer's post-normed output is multiplied by this before the residual add "
                                 "(HyperCLOVA X).",
    )
    ffn_pre_norm: bool = Field(
        default=True, description="Normalise the FFN's input; false: the FFN reads the raw stream and brings its own "
                                  "norms (Gemma 4's parallel MLP and MoE).",
    )
    depth_scaled_residual: bool = Field(
        default=False, description="Each add is x sqrt((k-1)/k) + out / sqrt(k), k = 2l+2 for the mixer and 2l+3 for "
                                   "the FFN of layer l (Beam).",
    )
    residual_gate: bool = Field(
        default=False, description="Each add is sigmoid(w) out + sqrt(1 + sigmoid(w)) exp(-softplus(w)/2) x, with a "
                                   "learned per-channel w for the mixer's add and one for the FFN's (Ergo).",
    )

    @model_validator(mode="after")
    def _one_residual_scaling(self) -> "SandwichBlockParams":
        if self.residual_gate and self.depth_scaled_residual:
            raise ValueError("residual_gate and depth_scaled_residual both weight each residual add; choose one")
        return self

    def norms_made(self) -> tuple[str, ...]:
        return tuple(p for p in super().norms_made() if p != "ffn_norm" or self.ffn_pre_norm)

    def sized(self, *, mixer: Sized, ffn: Sized, make_norm: Callable[[], Any],
              make_residual: Callable[[], Any] | None = None, d_model: int = 0, per_layer_input: int = 0) -> Sized:
        parameters, n_streams = self.sized_parts(mixer=mixer, ffn=ffn, make_norm=make_norm,
                                                 make_residual=make_residual)
        self.check_single_stream(n_streams, per_layer_input=per_layer_input)
        if per_layer_input:  # the gate d_model -> width, the projection back and a norm of its own
            parameters = total(parameters, linear(d_model, per_layer_input), linear(per_layer_input, d_model),
                               make_norm().parameters)
        if self.residual_gate:  # one d_model vector per add that is made (an absent sublayer adds nothing)
            parameters = total(parameters, d_model * sum(not s.absent for s in (mixer, ffn)))
        # layer_scale is a buffer (checkpoints set it), not a parameter.
        return Sized(parameters=parameters, per_layer_width=per_layer_input)

    def check_single_stream(self, n_streams: int, *, per_layer_input: int) -> None:
        """ValueError when a per-layer input, ``layer_scale``, ``depth_scaled_residual`` or ``residual_gate`` would meet
        several residual streams."""
        used = [name for name, on in (("a per-layer input", per_layer_input), ("layer_scale", self.layer_scale),
                                      ("depth_scaled_residual", self.depth_scaled_residual),
                                      ("residual_gate", self.residual_gate)) if on]
        if n_streams != 1 and used:
            named = used[0] if len(used) == 1 else f"{', '.join(used[:-1])} and {used[-1]}"
            raise ValueError(f"{named} {'acts' if len(used) == 1 else 'act'} on a single residual stream; this model's "
                             f"residual has {n_streams} (use residual: single with {'it' if len(used) == 1 else 'them'})")

    def depth_scales(self, layer_index: int) -> tuple[tuple[float, float], tuple[float, float]]:
        """``((a_mixer, b_mixer), (a_ffn, b_ffn))``: each add is ``a x + b out`` (``b`` times residual_multiplier)."""
        r = self.residual_multiplier
        if not self.depth_scaled_residual:
            return (1.0, r), (1.0, r)
        k_mixer, k_ffn = 2 * layer_index + 2, 2 * layer_index + 3  # the adds counted from the first, 2 per layer
        return tuple((math.sqrt((k - 1) / k), r / math.sqrt(k)) for k in (k_mixer, k_ffn))  # type: ignore[return-value]


class PostNormInsideBlockParams(BlockParams):
    """``x = x + norm(attention(x))``; ``x = x + norm(ffn(x))`` (OLMo-2).

    Sublayers read the raw residual stream; their outputs are normalised before being
    added (``attention_norm`` and ``ffn_norm``), which the OLMo 2 report found more
    stable than pre-norm. Unlike ``postnorm``, the stream itself is never normalised.
    """

    parts: ClassVar[tuple[str, ...]] = ("mixer", "attention_norm", "ffn", "ffn_norm")


class AbsentParams(Params):
    """No sublayer here: the block adds nothing for it and makes none of the norms that only serve it."""

    def sized(self, *, d_model: int) -> Sized:
        return Sized(parameters=0, absent=True)  # no heads: it keeps nothing and reads no positions


class AbsentMixerParams(AbsentParams):
    """No token mixer in this block (``mixer: none``): the block is its feed-forward alone.

    Nemotron-H's MLP layers are such blocks: its layers are each one of a Mamba-2 mixer,
    attention or an MLP, each pre-normed and added to the residual stream (NVIDIA 2025,
    arXiv:2504.03624). The block's norms that serve only the mixer are not made.
    """


class AbsentFFNParams(AbsentParams):
    """No feed-forward in this block (``ffn: none``): the block is its token mixer alone.

    Mamba-2's blocks are a pre-normed mixer and nothing else (Dao & Gu 2024,
    arXiv:2405.21060), as are Nemotron-H's Mamba-2 and attention layers. The block's norms
    that serve only the feed-forward are not made.
    """
