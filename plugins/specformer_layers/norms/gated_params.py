"""The settings of the low-rank gated norm, importable without torch."""

from __future__ import annotations

from pydantic import Field

from specformer.model.sized import linear, total
from specformer.registry.params import Params, Sized, SubComponent
from specformer_layers.ffn.params import Activation


class GatedNormParams(Params):
    """A norm whose output is scaled per channel by an input-dependent gate: ``y * sigmoid(up(act(down(y))))``, ``y = norm(x)``.

    The gate reads the normalised vector through a low-rank bottleneck (``down``: ``dim ->
    rank``, ``up``: ``rank -> dim``, no biases), so it adds ``2 * dim * rank`` parameters to
    the norm's. It is Megatron-LM's ``GatedNormWrapper`` as A.X-K2 (Hugging Face ``axk2``,
    SK Telecom) places it on every layer's attention norm and on the MoE layers' FFN norm
    (with ``norm: rmsnorm``, ``rank: 16``, ``activation: silu``); the sigmoid is computed in
    float32 at least. In the style of the input-dependent sigmoid gates of gated attention
    (Qiu et al. 2025, arXiv:2505.06708), here on the sublayer's input.
    """

    norm: SubComponent("norm") = Field(  # type: ignore[valid-type]
        default="rmsnorm", validate_default=True, description="The norm whose output is gated.",
    )
    rank: int = Field(default=16, gt=0, description="Channels of the gate's bottleneck (A.X-K2's gated_norm_rank).")
    activation: Activation = Field(default="silu", description="The non-linearity between the gate's two projections.")

    def sized(self, *, dim: int) -> Sized:
        return Sized(parameters=total(self.norm.sized(dim=dim).parameters, linear(dim, self.rank),
                                      linear(self.rank, dim)))
