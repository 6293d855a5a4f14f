"""The settings of the prediction head in the final-norm slot, importable without torch."""

from __future__ import annotations

from pydantic import Field

from specformer.model.sized import linear, total
from specformer.registry.params import Params, Sized, SubComponent
from specformer_layers.ffn.params import Activation


class PredictionHeadParams(Params):
    """The final norm followed by BERT's prediction-head transform: ``norm2(act(dense(norm(x))))``.

    BERT's masked-LM head transforms the stream before the vocabulary projection with a
    ``d_model -> d_model`` dense layer, an activation and a layer norm (Devlin et al. 2018,
    arXiv:1810.04805); ModernBERT keeps it, and so does its causal sibling ModernBERT-decoder
    (Ettin, Weller et al. 2025, arXiv:2507.11412), after its final norm. It takes the place of
    ``model.final_norm``: whatever reaches the LM head has gone through it. ``norm`` is both the
    final norm (``norm``) and the head's own (``head_norm``), each with its own weights;
    ``bias`` gives the dense layer a bias (ModernBERT's ``classifier_bias``).
    """

    norm: SubComponent("norm") = Field(  # type: ignore[valid-type]
        default="layernorm", validate_default=True,
        description="The norm before the transform and the one ending it (each its own weights).",
    )
    activation: Activation = Field(default="gelu", description="The non-linearity after the dense layer.")
    bias: bool = Field(default=False, description="Give the dense layer a bias.")

    def sized(self, *, dim: int) -> Sized:
        one = self.norm.sized(dim=dim).parameters
        return Sized(parameters=total(one, linear(dim, dim, bias=self.bias), one))
