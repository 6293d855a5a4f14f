"""The multi-token prediction loss (DeepSeek-V3, arXiv:2412.19437 section 2.2) of a model with ``model.mtp`` depths.

Depth k's logits at row i predict token ``i + k + 1`` of the row, the main next-token targets
shifted by k: ``targets[:, k:]``. Each depth's cross-entropy is the mean over its own counted
targets (those the loss mask keeps: a target IGNORE'd for the main loss is IGNORE'd at every
depth), and the loss added to the objective is

    L_MTP = sum_k w_k * CE_k

with ``w_k`` the spec's ``model.mtp.loss_weights[k-1]`` (the default ``0.3 / depths`` each is the
paper's ``lambda / D`` with ``lambda = 0.3``). A model with depths whose weights are all 0 trains
without running them. Depths after the last weighted one run (the forward runs every depth) but
reach no loss: the trainer freezes them.
"""

from __future__ import annotations

from typing import Any, Callable

from torch import Tensor

from specformer.errors import UserError


def trained_depths(model: Any) -> int:
    """How many MTP depths reach the loss: up to the last one with a nonzero weight (0 without depths)."""
    if getattr(model, "mtp", None) is None:
        return 0
    weights = model.mtp_loss_weights
    return max((k for k, w in enumerate(weights, start=1) if w != 0.0), default=0)


def freeze_untrained_depths(model: Any) -> None:
    """Freeze the depths after the last weighted one: no loss reaches them, so the optimizer holds no state for them
    (a resume then expects none), DDP waits for no gradient of theirs and weight decay leaves them as they are."""
    if getattr(model, "mtp", None) is None:
        return
    for depth in list(model.mtp)[trained_depths(model):]:
        depth.requires_grad_(False)


def check_mtp_training(model: Any, *, seq_len: int, tp: int, ep: int, cp: int) -> None:
    """One UserError for a run that trains MTP depths where their shifted targets or their weights cannot follow."""
    depths = trained_depths(model)
    if not depths:
        return
    if cp > 1:
        raise UserError(f"model.mtp with train.parallel.cp {cp}: depth k reads the token k positions ahead and predicts "
                        f"the one k + 1 ahead, which context parallelism puts on another process; train MTP without cp "
                        f"(or set model.mtp.loss_weights to 0)")
    if tp > 1 or ep > 1:
        which = f"train.parallel.tp {tp}" if tp > 1 else f"train.parallel.ep {ep}"
        raise UserError(f"model.mtp with {which}: the MTP depths' blocks are not split across processes yet; train "
                        f"MTP with ddp or fsdp (or set model.mtp.loss_weights to 0)")
    if seq_len <= depths:
        raise UserError(f"model.mtp: depth {depths} predicts the token {depths + 1} ahead, so train.seq_len must be "
                        f"greater than {depths}, got {seq_len}")


def mtp_losses(mtp_logits: list[Tensor], targets: Tensor, *, weights: list[float], masked: bool,
               lm_loss: Callable[..., Tensor]) -> tuple[Tensor, list[Tensor]]:
    """``(sum_k w_k * CE_k, [CE_1, ...])`` over the depths that reach the loss (``len(weights)`` of them).

    ``mtp_logits[k-1]`` ``(B, T - k, V)``; ``targets`` ``(B, T)`` the main next-token targets (IGNORE
    where masked); ``lm_loss`` the main loss' mean cross-entropy (the same masking and reduction).
    """
    per_depth = [lm_loss(mtp_logits[k - 1], targets[:, k:], masked=masked)  # (B, T - k) targets: token i + k + 1
                 for k in range(1, len(weights) + 1)]
    total = sum((w * ce for w, ce in zip(weights, per_depth) if w != 0.0), start=per_depth[0].new_zeros(()))
    return total, per_depth


__all__ = ["check_mtp_training", "freeze_untrained_depths", "mtp_losses", "trained_depths"]
