"""The settings of the tutorial's components, in a module that imports no torch.

Listing components (``specformer components``, ``specformer schema``, ``--help``) reads
only these models, so it never pays for importing torch; the classes that compute are
imported the first time a model or a sampler is built. Each setting and its default is
written once, here: a spec and a Python caller get the same values.
"""

from __future__ import annotations

from pydantic import Field
from specformer.registry.params import Params, Sized


class DyTParams(Params):
    """Squash each channel with a learned-steepness tanh, then scale and shift: ``weight * tanh(alpha * x) + bias``.

    No statistics are computed over the channels: ``alpha`` is one learned scalar,
    ``weight`` and ``bias`` are per channel. The paper finds it matches LayerNorm and
    RMSNorm in trained transformers when ``alpha`` starts small (0.5 by default).
    """

    alpha_init: float = Field(default=0.5, gt=0, description="Starting value of the learned steepness alpha.")
    bias: bool = Field(default=True, description="Learn a per-channel shift after the scale.")

    def sized(self, *, dim: int) -> Sized:
        # What DyT(params, dim=dim) would hold, said without building it: `specformer validate`
        # asks this instead of importing torch. Any width fits, so there is nothing to refuse.
        return Sized(parameters=1 + dim + (dim if self.bias else 0))  # alpha, weight, bias


class EtaSamplingParams(Params):
    """Drop every token whose probability is below ``eta = min(epsilon, sqrt(epsilon) * exp(-entropy))``.

    A confident (low-entropy) distribution gets a threshold close to ``epsilon``; a
    flat one a much lower threshold, so it keeps more of its long tail. The
    ``min_tokens_to_keep`` likeliest tokens always stay. ``epsilon`` between 3e-4
    and 2e-3 is the range the paper recommends.
    """

    epsilon: float = Field(gt=0, lt=1, examples=[0.0009], description="Upper bound of the threshold, in (0, 1).")
    min_tokens_to_keep: int = Field(default=1, ge=1, description="Never keep fewer tokens than this.")
