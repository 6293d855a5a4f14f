"""Griffin's recurrent block: the RG-LRU between a convolved ``x`` branch and a GeLU ``y`` branch (:class:`RGLRUParams`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specformer.model.state import StateSlots

from specformer_layers.ffn.activations import ACTIVATIONS
from specformer_layers.mixers.conv import causal_conv
from specformer_layers.mixers.recurrent import MixerRun, RecurrentMixer
from specformer_layers.mixers.rglru_params import RGLRUParams
from specformer_layers.mixers.selective_scan import linear_recurrence
from specformer_layers.mixers.ssd import working_dtype

#: Griffin's c: the decay is sigmoid(Λ)^(c r), so that r in (0, 1) spans decays from 1 to sigmoid(Λ)^8.
DECAY_POWER = 8.0
#: RecurrentGemma's initialisation: u uniform in this range and softplus(a_param) = -log(u) / 2 (a = u^(4 r)).
A_SQUARED_INIT = (0.9 ** 2 + 1e-8, 0.999 ** 2 + 1e-8)


class RGLRU(RecurrentMixer):
    """Griffin's recurrent block (:class:`RGLRUParams`), written for the model's mixer slot.

    Parameters, by name (weight conversions rely on them): ``x_proj`` and ``y_proj`` (Linear
    ``d_model -> W``), ``conv_weight`` ``(W, K)`` and ``conv_bias`` ``(W,)`` (or None) of the
    depthwise causal convolution over ``x``, ``input_gate_weight`` and ``recurrent_gate_weight``
    ``(G, W/G, W/G)`` (block ``g`` maps the channels ``g*W/G ...`` of ``x``, input rows, as
    ``x_g @ weight[g]``), their biases ``(G, W/G)``, ``a_param`` ``(W,)`` and ``out`` (Linear
    ``W -> d_model``).

    It has no heads (the gates' blocks mix channels within a block, the recurrence none), keeps
    nothing per token and reads no positions. Per sequence it keeps ``conv`` ``(W, K - 1)``,
    ``rglru`` ``(W,)`` (the states) and ``begun`` ``(1,)`` (1 once the sequence has a token:
    its first token resets the recurrence): its :attr:`state_slots`.
    """

    Params = RGLRUParams

    def __init__(self, params: RGLRUParams, *, d_model: int, layer_index: int = 0) -> None:
        super().__init__()
        width, blocks = params.width, params.gate_blocks
        self.width = width
        self.gate_blocks = blocks
        self.scan_chunk = params.chunk  # not "chunk": that names chunked attention's reach (reach_of)
        self.act = ACTIVATIONS[params.activation]
        # The public facts others read (specformer.model.state): its layer and its state.
        self.layer_index = layer_index
        # Per token and channel beyond the projections: the gates' sigmoids, the decay's softplus, product and exp,
        # the input scale's square root, the state's product and sum, the output's gating product.
        self.recurrent_flops_per_token = 10 * width
        self.state_slots = StateSlots((("conv", (width, params.conv_kernel - 1)), ("rglru", (width,)), ("begun", (1,))))

        self.x_proj = nn.Linear(d_model, width, bias=params.bias)
        self.y_proj = nn.Linear(d_model, width, bias=params.bias)
        self.conv_weight = nn.Parameter(torch.empty(width, params.conv_kernel))
        self.conv_bias = nn.Parameter(torch.zeros(width)) if params.bias else None
        block = width // blocks
        self.input_gate_weight = nn.Parameter(torch.empty(blocks, block, block))
        self.input_gate_bias = nn.Parameter(torch.zeros(blocks, block))
        self.recurrent_gate_weight = nn.Parameter(torch.empty(blocks, block, block))
        self.recurrent_gate_bias = nn.Parameter(torch.zeros(blocks, block))
        self.a_param = nn.Parameter(torch.empty(width))
        self.out = nn.Linear(width, d_model, bias=params.bias)
        self._init_recurrence()

    # -- forward -----------------------------------------------------------------------------------

    def run(self, x: Tensor, *, state: dict[str, Tensor] | None = None, padding: Tensor | None = None,
            steps: bool = False) -> MixerRun:
        """The block on ``x`` ``(B, T, D)`` from ``state`` (None: fresh rows); output, state after, steps if asked."""
        batch, length, _ = x.shape
        y = self.act(self.y_proj(x))  # (B, T, W)
        conv = causal_conv(self.x_proj(x), self.conv_weight, self.conv_bias,
                           window=None if state is None else state["conv"], padding=padding, steps=steps)
        u = conv.out  # (B, T, W)
        work = working_dtype(x.dtype)
        input_gate, recurrent_gate = (self._gate(u, w, b).to(work) for w, b in (
            (self.input_gate_weight, self.input_gate_bias), (self.recurrent_gate_weight, self.recurrent_gate_bias)))
        log_a = -DECAY_POWER * recurrent_gate * F.softplus(self.a_param.to(work))  # (B, T, W)
        a = torch.exp(log_a)
        scale = torch.sqrt(-torch.expm1(2 * log_a))  # sqrt(1 - a²), exact near a = 1
        # A sequence's first token resets the recurrence (a = 0, no input scale); padding leaves it as it was.
        index = torch.arange(length, device=x.device)[None, :]  # (1, T)
        first = torch.zeros(batch, 1, dtype=torch.long, device=x.device) if padding is None else padding[:, None]
        begun = (torch.zeros(batch, 1, dtype=work, device=x.device) if state is None
                 else state["begun"].to(work))  # (B, 1)
        resets = (index == first) & (begun == 0)  # (B, T)
        real = index >= first  # (B, T)
        scale = torch.where(resets[..., None], 1.0, scale)
        a = torch.where(resets[..., None], 0.0, torch.where(real[..., None], a, 1.0))
        b = torch.where(real[..., None], u.to(work) * input_gate * scale, 0.0)
        h = x.new_zeros((batch, self.width), dtype=work) if state is None else state["rglru"].to(work)
        kept = []
        for start in range(0, length, self.scan_chunk):
            states = linear_recurrence(a[:, start:start + self.scan_chunk], b[:, start:start + self.scan_chunk], h)  # (B, l, W)
            kept.append(states)
            h = states[:, -1]
        hs = torch.cat(kept, dim=1) if kept else u.new_zeros(u.shape, dtype=work)  # (B, T, W)
        out = self.out(hs.to(x.dtype) * y)
        begun_steps = torch.maximum(begun[:, None, :], real[..., None].to(work))  # (B, T, 1)
        begun_after = torch.maximum(begun, real.any(dim=1, keepdim=True).to(work))  # (B, 1)
        return MixerRun(out=out, state={"conv": conv.window, "rglru": h, "begun": begun_after},
                        steps={"conv": conv.steps, "rglru": hs, "begun": begun_steps} if steps else None)

    def _gate(self, u: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        """``sigmoid`` of the block-diagonal map of ``u`` ``(B, T, W)``: ``(B, T, W)``."""
        blocks = u.unflatten(-1, (self.gate_blocks, -1))  # (B, T, G, W/G)
        return torch.sigmoid(torch.einsum("btgi,gij->btgj", blocks, weight) + bias).flatten(-2)

    # -- description and initialisation -----------------------------------------------------------

    def describe_kernel(self, *, bias: bool = False) -> str:
        """What runs, in words (``specformer summary``)."""
        return f"torch linear recurrence, parallel by chunks (chunk {self.scan_chunk}) and token by token when decoding"

    def extra_repr(self) -> str:
        return (f"width={self.width}, gate_blocks={self.gate_blocks}, conv_kernel={self.conv_weight.shape[1]}, "
                f"chunk={self.scan_chunk}")

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.normal_(self.x_proj.weight, std=std)
        nn.init.normal_(self.y_proj.weight, std=std)
        nn.init.normal_(self.out.weight, std=residual_std)  # feeds the residual stream
        for bias in (self.x_proj.bias, self.y_proj.bias, self.out.bias):
            if bias is not None:
                nn.init.zeros_(bias)
        self._init_recurrence()

    @torch.no_grad()
    def _init_recurrence(self) -> None:
        kernel = self.conv_weight.shape[1]
        bound = 1.0 / math.sqrt(kernel)  # PyTorch's default for a depthwise conv
        nn.init.uniform_(self.conv_weight, -bound, bound)
        if self.conv_bias is not None:
            nn.init.zeros_(self.conv_bias)
        block_std = (self.width // self.gate_blocks) ** -0.5
        for weight, bias in ((self.input_gate_weight, self.input_gate_bias),
                             (self.recurrent_gate_weight, self.recurrent_gate_bias)):
            nn.init.normal_(weight, std=block_std)
            nn.init.zeros_(bias)
        # RecurrentGemma's: u drawn uniform in A_SQUARED_INIT, a_param = softplus's inverse of -log(u) / 2.
        squared = torch.empty(self.width).uniform_(*A_SQUARED_INIT)
        self.a_param.copy_(torch.log(torch.expm1(-0.5 * torch.log(squared))))


__all__ = ["RGLRU"]
