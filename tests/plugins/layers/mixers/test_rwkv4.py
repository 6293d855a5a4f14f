"""The rwkv4 mixer (RWKV-4's time mixing): the WKV recurrence written out, transformers' RwkvSelfAttention,
and exact through a model with a cache.

The chunked WKV (prefill, training) and the token loop (decoding, kept steps) each equal the
sums written out, for lengths around the chunk, from a carried state, with keys past float32's
exp range, with padding and with packed documents.

Through a whole model: a cached token-by-token decode equals the uncached forward, a
left-padded ragged batch equals each row alone, packed documents equal each document alone
(the token shift and the recurrence start fresh at each), beam reordering and speculative
rollback (``keep_steps``) restore states exactly, and the serve engine batches requests as
each alone.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from pydantic import ValidationError

import specformer
from specformer.model.attention import cache_slots_of, heads_of, reach_of
from specformer.model.state import uses_positions
from specformer_layers.mixers.rwkv4 import Rwkv4
from specformer_layers.mixers.rwkv4_params import Rwkv4Params
from specformer_layers.mixers.wkv import CHUNK, WKVState, wkv, wkv_chunked

from tests.fixtures.tiny import tiny_spec
from .through_the_cache import decode, tiny_mixer_model

pytestmark = pytest.mark.usefixtures("one_thread")

MIXER = {"kind": "rwkv4", "width": 24}


def _wkv_written_out(k: torch.Tensor, v: torch.Tensor, time_decay: torch.Tensor, time_first: torch.Tensor,
                     start: WKVState | None = None) -> torch.Tensor:
    """The WKV as the paper writes it (Peng et al. 2023, eq. 14), in float64, each sum formed in full.

    ``start``: what came before, the sums ``num e^p`` and ``den e^p``, decayed once per token since.
    """
    k, v, w, u = k.double(), v.double(), torch.exp(time_decay.double()), time_first.double()
    batch, length, width = k.shape
    out = torch.zeros(batch, length, width, dtype=torch.float64)
    for t in range(length):
        num = math.e ** (u + k[:, t]) * v[:, t]
        den = math.e ** (u + k[:, t])
        if start is not None:
            num = num + torch.exp(start.exponent.double() - t * w) * start.num.double()
            den = den + torch.exp(start.exponent.double() - t * w) * start.den.double()
        for i in range(t):
            weight = torch.exp(-(t - 1 - i) * w + k[:, i])
            num = num + weight * v[:, i]
            den = den + weight
        out[:, t] = num / den
    return out


def _randomised(layer: Rwkv4) -> Rwkv4:
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
        layer.time_mix_key.uniform_(0, 1)
        layer.time_mix_value.uniform_(0, 1)
        layer.time_mix_receptance.uniform_(0, 1)
    return layer


def _time_mixing_written_out(layer: Rwkv4, x: torch.Tensor) -> torch.Tensor:
    """The whole time mixing for fresh rows: shift, interpolate, project, WKV (written out), gate, project."""
    previous = torch.cat((torch.zeros_like(x[:, :1]), x[:, :-1]), dim=1)
    mixed = {name: x * getattr(layer, f"time_mix_{name}") + previous * (1 - getattr(layer, f"time_mix_{name}"))
             for name in ("key", "value", "receptance")}
    k, v = layer.key(mixed["key"]), layer.value(mixed["value"])
    r = torch.sigmoid(layer.receptance(mixed["receptance"]))
    return layer.output(r * _wkv_written_out(k, v, layer.time_decay, layer.time_first).float())


@pytest.mark.parametrize("length", [1, 7, 13])
def test_the_wkv_equals_the_sums_written_out(length: int) -> None:
    torch.manual_seed(0)
    k, v = torch.randn(2, length, 6) * 3, torch.randn(2, length, 6)
    time_decay, time_first = torch.randn(6), torch.randn(6)
    want = _wkv_written_out(k, v, time_decay, time_first).float()
    out, _, _ = wkv(k, v, decay=torch.exp(time_decay), bonus=time_first)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    # From the state after a first part, the rest equals the whole; the steps are the states after each token.
    cut = length // 2
    first, state, steps = wkv(k[:, :cut], v[:, :cut], decay=torch.exp(time_decay), bonus=time_first, steps=True)
    rest, _, _ = wkv(k[:, cut:], v[:, cut:], decay=torch.exp(time_decay), bonus=time_first, state=state)
    torch.testing.assert_close(torch.cat((first, rest), 1), want, rtol=1e-5, atol=1e-5)
    if cut:
        torch.testing.assert_close(steps.num[:, -1], state.num)


def test_large_keys_neither_overflow_nor_lose_the_average() -> None:
    """Keys far past float32's exp range (e^100): the stabilised form still gives the weighted average."""
    k = torch.tensor([[[100.0], [90.0], [-80.0]]])
    v = torch.tensor([[[1.0], [3.0], [5.0]]])
    time_decay, time_first = torch.tensor([0.5]), torch.tensor([-1.0])
    out, state, _ = wkv(k, v, decay=torch.exp(time_decay), bonus=time_first)
    assert torch.isfinite(out).all() and torch.isfinite(state.num).all()
    torch.testing.assert_close(out, _wkv_written_out(k, v, time_decay, time_first).float(), rtol=1e-5, atol=1e-5)


def test_padding_leaves_the_state_and_gives_zero() -> None:
    torch.manual_seed(1)
    k, v = torch.randn(1, 5, 4), torch.randn(1, 5, 4)
    decay, bonus = torch.rand(4) + 0.1, torch.randn(4)
    real = torch.tensor([[False, False, True, True, True]])
    out, state, _ = wkv(k, v, decay=decay, bonus=bonus, real=real)
    want, alone, _ = wkv(k[:, 2:], v[:, 2:], decay=decay, bonus=bonus)
    assert (out[:, :2] == 0).all()
    torch.testing.assert_close(out[:, 2:], want)
    torch.testing.assert_close(state.num, alone.num)


def _random_state(batch: int, width: int) -> WKVState:
    """A state as a cache holds one: any numerator, a positive denominator, an exponent of a few units."""
    return WKVState(torch.randn(batch, width), torch.rand(batch, width) + 0.1, torch.randn(batch, width) * 3)


LENGTHS = [1, CHUNK - 1, CHUNK, 2 * CHUNK + 3]


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("carried", [False, True])
def test_chunked_and_token_loop_equal_the_sums_written_out(length: int, carried: bool) -> None:
    torch.manual_seed(length)
    k, v = torch.randn(2, length, 6) * 3, torch.randn(2, length, 6)
    time_decay, time_first = torch.randn(6), torch.randn(6)
    start = _random_state(2, 6) if carried else None
    want = _wkv_written_out(k, v, time_decay, time_first, start).float()
    loop, loop_after, _ = wkv(k, v, decay=torch.exp(time_decay), bonus=time_first, state=start)
    chunked, after = wkv_chunked(k, v, decay=torch.exp(time_decay), bonus=time_first, state=start)
    torch.testing.assert_close(loop, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunked, want, rtol=1e-5, atol=1e-5)
    # The same state after, in the same format: either form continues what the other left.
    for got, expected in zip((after.num, after.den, after.exponent), (loop_after.num, loop_after.den, loop_after.exponent)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    more_k, more_v = torch.randn(2, 5, 6) * 3, torch.randn(2, 5, 6)
    whole = _wkv_written_out(torch.cat((k, more_k), 1), torch.cat((v, more_v), 1), time_decay, time_first, start).float()
    rest, _ = wkv_chunked(more_k, more_v, decay=torch.exp(time_decay), bonus=time_first, state=loop_after, chunk=3)
    torch.testing.assert_close(rest, whole[:, length:], rtol=1e-5, atol=1e-5)
    rest, _, _ = wkv(more_k, more_v, decay=torch.exp(time_decay), bonus=time_first, state=after)
    torch.testing.assert_close(rest, whole[:, length:], rtol=1e-5, atol=1e-5)


def test_chunked_survives_keys_and_decays_past_float32s_exp() -> None:
    """Keys of about 100 (e^100 is inf in float32) and decays up to e^5 per token: stabilised, the averages hold."""
    torch.manual_seed(3)
    length = 2 * CHUNK + 3
    k = 95 + torch.randn(2, length, 8) * 20
    v = torch.randn(2, length, 8)
    time_decay = torch.linspace(-5.0, 5.0, 8)  # w = e^-5 .. e^5 = 148: the state decays by e^-148 per token
    time_first = torch.randn(8) * 3
    start = WKVState(torch.randn(2, 8), torch.rand(2, 8) + 0.1, torch.full((2, 8), 110.0))
    assert not torch.isfinite(torch.exp(k)).all()  # unstabilised, the sums would overflow
    want = _wkv_written_out(k, v, time_decay, time_first, start).float()
    loop, _, _ = wkv(k, v, decay=torch.exp(time_decay), bonus=time_first, state=start)
    chunked, after = wkv_chunked(k, v, decay=torch.exp(time_decay), bonus=time_first, state=start)
    assert all(torch.isfinite(t).all() for t in (chunked, after.num, after.den, after.exponent))
    torch.testing.assert_close(chunked, want, rtol=1e-5, atol=1e-5)
    # The token loop rounds its exponent (about 100, float32 steps of 8e-6) again at every token,
    # so over 67 tokens it drifts a few times 1e-5 from the sums; the chunk forms each exponent once.
    torch.testing.assert_close(loop, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("padded", "length"), [(3, 9), (CHUNK + 4, CHUNK + 9), (CHUNK, 2 * CHUNK + 3)])
def test_chunked_padding_leaves_the_state_and_gives_zero(padded: int, length: int) -> None:
    """Left padding across and up to chunk boundaries: the rest equals its sums written out, from fresh or a carried state."""
    torch.manual_seed(padded)
    k, v = torch.randn(3, length, 4) * 3, torch.randn(3, length, 4)
    time_decay, time_first = torch.randn(4), torch.randn(4)
    opening = torch.tensor([padded, 0, length])  # the last row all padding
    real = torch.arange(length)[None, :] >= opening[:, None]
    for start in (None, _random_state(3, 4)):
        out, after = wkv_chunked(k, v, decay=torch.exp(time_decay), bonus=time_first, state=start, real=real)
        loop, loop_after, _ = wkv(k, v, decay=torch.exp(time_decay), bonus=time_first, state=start, real=real)
        torch.testing.assert_close(out, loop, rtol=1e-5, atol=1e-5)
        for got, expected in zip((after.num, after.den, after.exponent), (loop_after.num, loop_after.den, loop_after.exponent)):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        assert (out[~real] == 0).all()
        for row in range(2):
            alone = None if start is None else WKVState(*(t[row:row + 1] for t in (start.num, start.den, start.exponent)))
            want = _wkv_written_out(k[row:row + 1, opening[row]:], v[row:row + 1, opening[row]:], time_decay, time_first, alone)
            torch.testing.assert_close(out[row:row + 1, opening[row]:], want.float(), rtol=1e-5, atol=1e-5)
        if start is not None:  # a row of padding only keeps its state as it was
            torch.testing.assert_close((after.num[2], after.den[2], after.exponent[2]),
                                       (start.num[2], start.den[2], start.exponent[2]))


@pytest.mark.parametrize(("width", "length"), [(None, 11), (12, 9), (16, 1)])
def test_equals_the_time_mixing_written_out(width: int | None, length: int) -> None:
    torch.manual_seed(0)
    layer = _randomised(Rwkv4(Rwkv4Params(width=width), d_model=8))
    x = torch.randn(2, length, 8)
    with torch.no_grad():
        want = _time_mixing_written_out(layer, x)
        torch.testing.assert_close(layer.run(x).out, want, rtol=1e-5, atol=1e-5)
        # Token by token through the state equals the whole sequence at once.
        state, outs = None, []
        for t in range(length):
            done = layer.run(x[:, t:t + 1], state=state)
            outs.append(done.out)
            state = done.state
        torch.testing.assert_close(torch.cat(outs, 1), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("width", [16, 12])
def test_equals_transformers_self_attention(width: int) -> None:
    from transformers import RwkvConfig
    from transformers.models.rwkv.modeling_rwkv import RwkvSelfAttention

    config = RwkvConfig(hidden_size=16, attention_hidden_size=width, num_hidden_layers=1, context_length=32)
    torch.manual_seed(0)
    hf = RwkvSelfAttention(config, layer_id=0).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    ours = Rwkv4(Rwkv4Params(width=width), d_model=16)
    with torch.no_grad():
        for name in ("key", "value", "receptance", "output"):
            getattr(ours, name).load_state_dict(getattr(hf, name).state_dict())
        for name in ("time_mix_key", "time_mix_value", "time_mix_receptance"):
            getattr(ours, name).copy_(getattr(hf, name).reshape(-1))
        ours.time_decay.copy_(hf.time_decay)
        ours.time_first.copy_(hf.time_first)
        x = torch.randn(2, 10, 16)
        want, _ = hf(x)
        torch.testing.assert_close(ours.run(x).out, want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ours.run(x, steps=True).out, want, rtol=1e-4, atol=1e-5)


# -- through a model ------------------------------------------------------------------------------


def tiny_model(mixed: bool = False, **mixer):
    # decays, bonuses and shifts away from their initial values
    return tiny_mixer_model({**MIXER, **mixer}, mixed=mixed, perturb=lambda name, p: (
        None if ".mixer.time_" not in name else torch.rand_like(p) if "time_mix" in name else torch.randn_like(p)))


def test_public_facts() -> None:
    layer = tiny_model().blocks[0].mixer
    assert heads_of(layer) is None
    assert not any(hasattr(layer, fact) for fact in ("window", "cache_slots", "uses_positions"))
    assert (reach_of(layer), cache_slots_of(layer), uses_positions(layer)) == (None, None, False)
    d_model = layer.time_mix_key.shape[0]
    assert layer.state_slots.shapes == {"shift": (d_model,), "num": (24,), "den": (24,), "exponent": (24,)}
    summary = specformer.summarize(tiny_spec(block={"mixer": MIXER}, positional={"kind": "none"}, n_layers=3))
    assert summary.total == sum(p.numel() for p in tiny_model().parameters())


@pytest.mark.parametrize("chunked_on_cpu", [True, False])
def test_long_prefill_and_packed_documents_match_the_token_loop(chunked_on_cpu: bool, monkeypatch) -> None:
    """Through a model: the chunked form's prefill (and uncached forward) of 2C+3 tokens equals the token loop's,
    and packed documents longer than a chunk equal each document alone. A CPU runs the loop for every forward;
    the chunked form (what other devices run) is forced onto it here."""
    from specformer_layers.mixers import rwkv4

    assert rwkv4.LOOP_DEVICES == {"cpu"}
    if chunked_on_cpu:
        monkeypatch.setattr(rwkv4, "LOOP_DEVICES", frozenset())
    length = 2 * CHUNK + 3
    spec = tiny_spec(block={"mixer": MIXER}, positional={"kind": "none"}, n_layers=2, context_length=2 * length)
    model = specformer.build(spec, seed=0).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".mixer.time_" in name:
                p.copy_(torch.rand_like(p) if "time_mix" in name else torch.randn_like(p))
    torch.manual_seed(0)
    tokens = torch.randint(0, 97, (2, length))
    with torch.no_grad():
        whole = model(tokens)
        torch.testing.assert_close(decode(model, tokens, prefill=length - 2), whole, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(decode(model, tokens, prefill=1, steps=True), whole, rtol=1e-4, atol=1e-5)
        cut = CHUNK + 5
        documents = torch.tensor([[0] * cut + [1] * (length - cut), [4] * 3 + [6] * (length - 3)])
        packed = model(tokens, document_ids=documents)
        for row, at in ((0, cut), (1, 3)):
            for part in (slice(0, at), slice(at, length)):
                torch.testing.assert_close(packed[row, part], model(tokens[row:row + 1, part])[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("change", "message", "where"), [
    ({"width": 0}, "greater than 0", "model.block.mixer.width: "),
    ({"width": "wide"}, "valid integer", "model.block.mixer.width: "),
])
def test_bad_params_are_one_clear_line(change: dict, message: str, where: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Rwkv4Params(**{**{k: v for k, v in MIXER.items() if k != "kind"}, **change})
    with pytest.raises(Exception, match=message) as caught:
        specformer.build(tiny_spec(block={"mixer": {**MIXER, **change}}), seed=0)
    lines = [line for line in str(caught.value).splitlines() if re.search(message, line)]
    assert len(lines) == 1 and lines[0].strip().startswith(where)
