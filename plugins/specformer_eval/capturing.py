"""Looking inside a forward pass: the residual stream between layers and each head's attention.

::

    with specformer_eval.capture(model, attention=True) as cap:
        model(input_ids)
    cap.residual[0]     # (B, T, d_model) the embeddings, the stream entering layer 0
    cap.residual[-1]    # (B, T, d_model) the stream after the last layer (before the final norm)
    cap.attention[3]    # (B, n_heads, T, T) layer 3's attention probabilities, float32 (None: a recurrent layer)

``residual`` has ``n_layers + 1`` entries: entry ``i`` is the stream entering layer
``i``, the last one the stream the final norm and LM head read. On several residual
streams (``residual: mhc``) each entry is ``(B, T, N, d_model)``, as the blocks pass it;
:meth:`specformer.Decoder.head_logits` collapses it as the model's head does. The stream is recorded
by forward hooks on the blocks, so it is the same for every block layout. Attention
probabilities come from the attention module itself: a module that can report them has
an ``observe_weights`` attribute, which the capture sets to a callable taking the
``(B, H, T, S)`` probabilities of each forward (the built-in attention then takes its
written-out softmax path). Nothing is hooked outside the ``with`` block, so a model
that is not being inspected runs exactly as before. Tensors are detached; a capture
holds the last forward run inside the block.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator

from torch import Tensor, nn

from specformer.model.state import state_slots_of, uses_positions


@dataclass
class Capture:
    """What one forward pass left behind (see the module doc)."""

    residual: list[Tensor] = field(default_factory=list)
    attention: list[Tensor | None] = field(default_factory=list)

    @property
    def n_layers(self) -> int:
        return max(len(self.residual) - 1, 0)


@contextlib.contextmanager
def capture(model: Any, *, attention: bool = False) -> Iterator[Capture]:
    """Record the residual stream (and with ``attention=True`` each layer's attention probabilities)
    of the forward passes run inside the block; everything is unhooked on exit."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList) or len(blocks) == 0 or not hasattr(model, "attention_modules"):
        raise ValueError(f"capture needs a specformer Decoder (with .blocks and .attention_modules()), "
                         f"got {type(model).__name__}")
    # A mixer without softmax attention (a recurrence, or none) has no probabilities: its entry stays None.
    modules = [(index, m) for index, m in enumerate(model.attention_modules()) if attends(m)] if attention else []
    for index, module in modules:
        if not hasattr(module, "observe_weights"):
            raise ValueError(
                f"layer {index}'s attention ({type(module).__name__}) cannot report its probabilities: it has no "
                "observe_weights attribute (see 'Looking inside a model' in the docs for the contract)"
            )
    cap = Capture()
    n_layers = len(blocks)

    def start(_module: nn.Module, args: tuple[Any, ...]) -> None:
        # A new forward begins at the first block: its input is the embedded tokens.
        cap.residual = [args[0].detach()]
        cap.attention = [None] * n_layers if attention else []

    def after_block(_module: nn.Module, _args: tuple[Any, ...], output: Tensor) -> None:
        cap.residual.append(output.detach())

    def observer(layer: int) -> Any:
        def observe(weights: Tensor) -> None:
            cap.attention[layer] = weights.detach()
        return observe

    handles = [blocks[0].register_forward_pre_hook(start)]
    handles += [block.register_forward_hook(after_block) for block in blocks]
    try:
        for index, module in modules:
            module.observe_weights = observer(index)
        yield cap
    finally:
        for handle in handles:
            handle.remove()
        for _, module in modules:
            module.observe_weights = None


def attends(mixer: Any) -> bool:
    """Whether a block's mixer is softmax attention, with probabilities to report: one that keeps a recurrent
    state (:mod:`specformer.model.state`) or reads no positions (a recurrence, or no mixer) has none."""
    return state_slots_of(mixer) is None and uses_positions(mixer)
