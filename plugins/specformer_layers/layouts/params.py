"""The settings of the block layouts, importable without torch (listing components reads only these)."""

from __future__ import annotations

from pydantic import Field

from specformer.registry.params import Params
from specformer_layers.ffn.params import Activation


class BlockParams(Params):
    """What every layout takes: nothing beyond its parts (a layout with settings subclasses it)."""


class PreNormBlockParams(BlockParams):
    """``x = x + attention(norm(x))``; ``x = x + ffn(norm(x))``. Trains stably without warm-up tricks (Xiong et al. 2020).

    ``residual_multiplier`` scales both sublayers' outputs before they are added,
    ``x = x + r * attention(norm(x))`` (Granite's ``residual_multiplier``, a muP-style
    width scaling); 1 leaves the block as above.
    """

    residual_multiplier: float = Field(
        default=1.0, description="Each sublayer's output is multiplied by this before the residual add (Granite).",
    )


class PostNormBlockParams(BlockParams):
    """``x = norm(x + attention(x))``; ``x = norm(x + ffn(x))`` (Vaswani et al. 2017)."""


class ParallelBlockParams(BlockParams):
    """``x = x + attention(norm_1(x)) + ffn(norm_2(x))``: one residual add, both sublayers side by side.

    With ``shared_norm`` one norm feeds both sublayers (GPT-J, PaLM; the block then has
    ``attention_norm`` only and ``ffn_norm`` is None); without it each has its own
    (GPT-NeoX, Pythia: ``attention_norm`` and ``ffn_norm``). The two sublayers can run
    concurrently, which is why large models used it (Wang & Komatsuzaki 2021).
    """

    shared_norm: bool = Field(default=False, description="One norm for both sublayers (GPT-J) instead of two (GPT-NeoX).")


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
    """

    per_layer_activation: Activation = Field(
        default="gelu_tanh", description="The activation of the per-layer input's gate (with model.per_layer_input).",
    )
    layer_scale: bool = Field(
        default=False, description="Multiply the stream leaving the block by a per-layer scalar buffer (Gemma 4).",
    )
    ffn_pre_norm: bool = Field(
        default=True, description="Normalise the FFN's input; false: the FFN reads the raw stream and brings its own "
                                  "norms (Gemma 4's parallel MLP and MoE).",
    )


class PostNormInsideBlockParams(BlockParams):
    """``x = x + norm(attention(x))``; ``x = x + norm(ffn(x))`` (OLMo-2).

    Sublayers read the raw residual stream; their outputs are normalised before being
    added (``attention_norm`` and ``ffn_norm``), which the OLMo 2 report found more
    stable than pre-norm. Unlike ``postnorm``, the stream itself is never normalised.
    """


class AbsentParams(Params):
    """No sublayer here: the block adds nothing for it and makes none of the norms that only serve it."""


class AbsentMixerParams(AbsentParams):
    """No token mixer in this block (``attention: none``): the block is its feed-forward alone.

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
