"""The mamba mixer (Mamba-1): equal to transformers' MambaMixer and FalconMambaMixer, exact through a model with a cache.

Through a whole model: a cached token-by-token decode and a prefill by chunks equal the uncached
forward, a left-padded ragged batch equals each row alone, packed documents equal each document
alone, beam reordering and speculative rollback (``keep_steps``) restore states exactly, and the
serve engine batches requests as each alone.
"""

from __future__ import annotations

import re

import pytest
import torch
from pydantic import ValidationError

import specformer
from specformer.model.attention import cache_slots_of, heads_of, reach_of
from specformer.model.state import uses_positions
from specformer_layers.mixers.mamba import Mamba
from specformer_layers.mixers.mamba_params import MambaParams

from tests.fixtures.tiny import tiny_spec
from .through_the_cache import assert_cached_decode_equals_the_uncached_forward, tiny_mixer_model

pytestmark = pytest.mark.usefixtures("one_thread")

MIXER = {"kind": "mamba", "d_inner": 24, "state_size": 6, "conv_kernel": 3, "chunk": 4}


# -- the module against transformers --------------------------------------------------------------


def _hf_mixer(*, falcon: bool, inner: int, size: int, rank: int, kernel: int, conv_bias: bool, bias: bool):
    from transformers import FalconMambaConfig, MambaConfig
    from transformers.models.falcon_mamba.modeling_falcon_mamba import FalconMambaMixer
    from transformers.models.mamba.modeling_mamba import MambaMixer

    config_class, mixer_class = (FalconMambaConfig, FalconMambaMixer) if falcon else (MambaConfig, MambaMixer)
    extra = {"mixer_rms_eps": 1e-3} if falcon else {}
    config = config_class(hidden_size=16, expand=inner // 16, state_size=size, time_step_rank=rank,
                          conv_kernel=kernel, use_conv_bias=conv_bias, use_bias=bias, num_hidden_layers=1,
                          use_associative_scan=False, **extra)
    torch.manual_seed(0)
    # Built as its block builds it: transformers' FalconMambaMixer cannot initialise its own weights (its norms come later).
    mixer = mixer_class(config, layer_idx=0, initialize_mixer_weights=False).eval()
    with torch.no_grad():
        for name, p in mixer.named_parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        mixer.A_log.copy_(torch.rand(inner, size).log())
    return mixer


@pytest.mark.parametrize(("falcon", "kernel", "bias", "rank"), [(False, 4, False, 3), (False, 3, True, 1),
                                                                (True, 4, True, 5), (True, 2, False, 2)])
def test_equals_transformers_mamba_mixer(falcon: bool, kernel: int, bias: bool, rank: int) -> None:
    hf = _hf_mixer(falcon=falcon, inner=32, size=5, rank=rank, kernel=kernel, conv_bias=bias, bias=bias)
    ours = Mamba(MambaParams(d_inner=32, state_size=5, dt_rank=rank, conv_kernel=kernel, conv_bias=bias, bias=bias,
                             bcdt_norm_eps=1e-3 if falcon else None, chunk=3), d_model=16)
    with torch.no_grad():
        for name in ("in_proj", "x_proj", "dt_proj"):
            getattr(ours, name).load_state_dict(getattr(hf, name).state_dict())
        ours.out.load_state_dict(hf.out_proj.state_dict())
        ours.conv_weight.copy_(hf.conv1d.weight.squeeze(1))
        if bias:
            ours.conv_bias.copy_(hf.conv1d.bias)
        for name in ("A_log", "D"):
            getattr(ours, name).copy_(getattr(hf, name))
    x = torch.randn(2, 8, 16)
    want = hf(x)
    torch.testing.assert_close(ours.run(x).out, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours.run(x, steps=True).out, want, rtol=1e-4, atol=1e-5)


def _naive_mamba(layer: Mamba, x: torch.Tensor) -> torch.Tensor:
    """The mixer written out token by token, weighted dt/B/C norms included (Jamba's), for one fresh row batch."""
    eps = layer.bcdt_norm_eps

    def rms(t: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        if eps is None:
            return t
        normed = t / torch.sqrt((t * t).mean(-1, keepdim=True) + eps)
        return normed if weight is None else normed * weight

    batch, length, _ = x.shape
    inner, size, rank = layer.d_inner, layer.state_size, layer.dt_rank
    kernel = layer.conv_weight.shape[1]
    xs, z = layer.in_proj(x).chunk(2, dim=-1)
    A = -torch.exp(layer.A_log)
    h = torch.zeros(batch, inner, size)
    outs = []
    for t in range(length):
        taps = [xs[:, t - j] if t - j >= 0 else torch.zeros(batch, inner) for j in range(kernel - 1, -1, -1)]
        u = sum(layer.conv_weight[:, j] * taps[j] for j in range(kernel))
        u = torch.nn.functional.silu(u + (layer.conv_bias if layer.conv_bias is not None else 0.0))
        proj = layer.x_proj(u)
        dt, B, C = proj[:, :rank], proj[:, rank:rank + size], proj[:, rank + size:]
        dt, B, C = rms(dt, layer.dt_norm_weight), rms(B, layer.b_norm_weight), rms(C, layer.c_norm_weight)
        dt = torch.nn.functional.softplus(dt @ layer.dt_proj.weight.T + layer.dt_proj.bias)  # (B, d_inner)
        h = torch.exp(dt[..., None] * A) * h + (dt * u)[..., None] * B[:, None, :]
        y = (h * C[:, None, :]).sum(-1) + layer.D * u
        outs.append(layer.out(y * torch.nn.functional.silu(z[:, t])))
    return torch.stack(outs, dim=1)


@pytest.mark.parametrize(("eps", "weights"), [(None, False), (1e-3, False), (1e-5, True)])
def test_equals_the_recurrence_written_out(eps: float | None, weights: bool) -> None:
    torch.manual_seed(1)
    layer = Mamba(MambaParams(d_inner=20, state_size=4, dt_rank=3, conv_kernel=3, bcdt_norm_eps=eps,
                              bcdt_norm_weights=weights, chunk=3), d_model=8)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.4)
        layer.A_log.copy_(torch.rand_like(layer.A_log).log())
        x = torch.randn(2, 10, 8)  # not a multiple of the chunk
        want = _naive_mamba(layer, x)
        torch.testing.assert_close(layer.run(x).out, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer.run(x, steps=True).out, want, rtol=1e-5, atol=1e-5)


def test_equals_transformers_jamba_mixer() -> None:
    """Jamba's Mamba layers: weighted RMSNorms on dt, B and C (eps rms_norm_eps)."""
    from transformers import JambaConfig
    from transformers.models.jamba.modeling_jamba import JambaMambaMixer

    config = JambaConfig(hidden_size=16, mamba_expand=2, mamba_d_state=5, mamba_dt_rank=3, mamba_d_conv=3,
                         mamba_conv_bias=True, mamba_proj_bias=True, rms_norm_eps=1e-4, num_hidden_layers=1,
                         use_associative_scan=False)
    torch.manual_seed(0)
    hf = JambaMambaMixer(config, layer_idx=0).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        hf.A_log.copy_(torch.rand_like(hf.A_log).log())
    ours = Mamba(MambaParams(d_inner=32, state_size=5, dt_rank=3, conv_kernel=3, bias=True, bcdt_norm_eps=1e-4,
                             bcdt_norm_weights=True, chunk=3), d_model=16)
    with torch.no_grad():
        for name in ("in_proj", "x_proj", "dt_proj"):
            getattr(ours, name).load_state_dict(getattr(hf, name).state_dict())
        ours.out.load_state_dict(hf.out_proj.state_dict())
        ours.conv_weight.copy_(hf.conv1d.weight.squeeze(1))
        ours.conv_bias.copy_(hf.conv1d.bias)
        for name in ("A_log", "D"):
            getattr(ours, name).copy_(getattr(hf, name))
        for norm in ("dt", "b", "c"):
            getattr(ours, f"{norm}_norm_weight").copy_(getattr(hf, f"{norm}_layernorm").weight)
        x = torch.randn(2, 9, 16)
        want = hf(x)
        torch.testing.assert_close(ours.run(x).out, want, rtol=1e-4, atol=1e-5)


# -- through a model ------------------------------------------------------------------------------


def tiny_model(mixed: bool = False, **mixer):
    return tiny_mixer_model({**MIXER, **mixer}, mixed=mixed)


@pytest.mark.parametrize(("mixed", "norm", "weights"), [(False, 1e-4, False), (True, 1e-4, True)])
def test_cached_decode_equals_the_uncached_forward(mixed: bool, norm: float | None, weights: bool) -> None:
    model = tiny_model(mixed, bcdt_norm_eps=norm, bcdt_norm_weights=weights)
    if weights:  # weights other than their initial ones, so that a norm's weight not applied would show
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm_weight"):
                    p.copy_(torch.rand_like(p) + 0.5)
    assert_cached_decode_equals_the_uncached_forward(model)


def test_public_facts() -> None:
    layer = tiny_model().blocks[0].mixer
    assert heads_of(layer) is None  # per channel: no heads
    assert not any(hasattr(layer, fact) for fact in ("window", "cache_slots", "uses_positions"))
    assert (reach_of(layer), cache_slots_of(layer), uses_positions(layer)) == (None, None, False)
    assert layer.state_slots.shapes == {"conv": (24, 2), "ssm": (24, 6)}
    assert layer.dt_rank == 2  # ceil(d_model / 16) with the tiny spec's d_model of 32
    assert "chunk 4" in layer.describe_kernel()


@pytest.mark.parametrize(("change", "message", "where"), [
    ({"conv_kernel": 1}, "conv_kernel must be at least 2", "model.block.mixer.conv_kernel: "),
    ({"conv_kernel": 0}, "conv_kernel must be at least 2", "model.block.mixer.conv_kernel: "),
    ({"dt_rank": 0}, "greater than 0", "model.block.mixer.dt_rank: "),
    ({"bcdt_norm_eps": -1.0}, "greater than 0", "model.block.mixer.bcdt_norm_eps: "),
    ({"bcdt_norm_weights": True}, "bcdt_norm_weights needs bcdt_norm_eps", "model.block.mixer: "),
])
def test_bad_params_are_one_clear_line(change: dict, message: str, where: str) -> None:
    with pytest.raises(ValidationError, match=message):
        MambaParams(**{**{k: v for k, v in MIXER.items() if k != "kind"}, **change})
    with pytest.raises(Exception, match=message) as caught:
        specformer.build(tiny_spec(block={"mixer": {**MIXER, **change}}), seed=0)

    lines = [line for line in str(caught.value).splitlines() if re.search(message, line)]
    assert len(lines) == 1 and lines[0].strip().startswith(where)
