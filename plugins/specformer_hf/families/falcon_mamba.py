"""Falcon-Mamba (``model_type: falcon_mamba``, tiiuae/falcon-mamba-7b): Mamba with weightless RMSNorms on B, C and dt.

The same stack and tensors as :mod:`~specformer_hf.families.mamba`; its mixer normalises the
low-rank step, B and C before use (``mixer_rms_eps``, the ``mamba`` mixer's ``bcdt_norm_eps``).
The norms have no weight: transformers' ``dt_layernorm`` and friends hold non-persistent buffers only.
"""

from __future__ import annotations

from specformer_hf.families.mamba import CAVEATS, DEFAULTS, NON_MATH_FIELDS, MambaModel
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.mamba import MambaFields

FAMILY = decoder_family(
    name="Falcon-Mamba",
    model_type="falcon_mamba",
    architecture="FalconMambaForCausalLM",
    defaults={**DEFAULTS, "mixer_rms_eps": 1e-6},  # transformers' FalconMambaConfig: MambaConfig's and its own eps
    parts=[MambaModel(mixer=MambaFields(rms_eps="mixer_rms_eps"))],
    non_math_fields=NON_MATH_FIELDS,
    maps="as mamba, and mixer_rms_eps -> mamba's bcdt_norm_eps (the weightless RMSNorms on dt, B and C)",
    caveats=CAVEATS,
)
