"""``muon``: Newton-Schulz orthogonalised momentum for the hidden matrices, AdamW for the rest.

Keller Jordan's Muon (https://kellerjordan.github.io/posts/muon/, the optimizer of the
modded-nanogpt speedruns), as published in its reference ``muon.py`` / ``MuonWithAuxAdam``:
for each hidden-layer matrix (role ``matrix``, see :mod:`.groups`)

1. momentum ``m = beta * m + (1 - beta) * g`` (``lerp``), and with Nesterov the update
   direction ``u = (1 - beta) * g + beta * m``, else ``u = m``;
2. ``u`` is orthogonalised by ``ns_steps`` (5) iterations of the quintic Newton-Schulz map
   ``X <- a X + (b A + c A^2) X`` with ``A = X X^T`` and ``(a, b, c) = (3.4445, -4.7750, 2.0315)``,
   starting from ``u / (||u||_F + 1e-7)`` (the wide orientation, transposed back after);
3. scaled by ``sqrt(max(1, rows / cols))`` (so a tall matrix's RMS update matches a wide one's);
4. ``p <- p * (1 - lr * weight_decay) - lr * update``.

Embeddings, the LM head and vectors (norms, biases) are updated by AdamW (bias-corrected,
decoupled decay), as Muon is only defined for hidden matrices. The Newton-Schulz iteration
runs in bfloat16 on CUDA (as published) and float32 elsewhere (CPUs have no fast bf16
matmul); ``ns_dtype`` chooses.

Under FSDP2 each process holds a shard of every matrix, but the orthogonalisation needs the
whole matrix: the update direction is gathered (``full_tensor``), orthogonalised identically on
every process, and each keeps its own shard of the result. That costs one all-gather per matrix
and step and the full matrix's memory on every process during its update.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from specformer_train.optimizers.groups import build_groups
from specformer_train.optimizers.params import MuonParams

#: The quintic Newton-Schulz coefficients of the published Muon.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def newton_schulz(g: Tensor, *, steps: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """The orthogonalisation of a matrix ``g`` (rows, cols): ``steps`` quintic Newton-Schulz iterations."""
    a, b, c = NS_COEFFICIENTS
    x = g.to(dtype)
    tall = g.size(-2) > g.size(-1)
    if tall:
        x = x.mT  # iterate on the wide orientation: A = X X^T is the smaller square
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        a_mat = x @ x.mT
        b_mat = b * a_mat + c * a_mat @ a_mat
        x = a * x + b_mat @ x
    if tall:
        x = x.mT
    return x


def muon_direction(update: Tensor, *, steps: int, dtype: torch.dtype) -> Tensor:
    """Orthogonalised and shape-scaled update of the same shape as ``update`` (matrices beyond 2-D flattened)."""
    matrix = update.reshape(update.size(0), -1)  # (rows, everything else)
    out = newton_schulz(matrix, steps=steps, dtype=dtype)
    out = out * max(1.0, matrix.size(0) / matrix.size(1)) ** 0.5
    return out.to(update.dtype).view(update.shape)


class Muon(torch.optim.Optimizer):
    """Muon for groups with ``use_muon``; AdamW for the others (one optimizer, one state dict)."""

    def __init__(self, groups: list[dict[str, Any]], *, lr: float, momentum: float, nesterov: bool, ns_steps: int,
                 ns_dtype: torch.dtype, betas: tuple[float, float], eps: float) -> None:
        defaults = dict(lr=lr, weight_decay=0.0, use_muon=False, momentum=momentum, nesterov=nesterov,
                        ns_steps=ns_steps, betas=betas, eps=eps)
        self.ns_dtype = ns_dtype
        super().__init__(groups, defaults)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["use_muon"]:
                self._muon_group(group)
            else:
                self._adamw_group(group)
        return loss

    def _muon_group(self, group: dict[str, Any]) -> None:
        lr, wd, beta = group["lr"], group["weight_decay"], group["momentum"]
        for p in group["params"]:
            if p.grad is None:
                continue
            grad = p.grad
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(grad)
            buf = state["momentum_buffer"]
            buf.lerp_(grad, 1 - beta)
            direction = grad.lerp(buf, beta) if group["nesterov"] else buf
            if hasattr(direction, "full_tensor"):  # an FSDP2 shard: orthogonalise the whole matrix
                # late: only FSDP2 shards reach here
                from torch.distributed.tensor import distribute_tensor

                whole = muon_direction(direction.full_tensor(), steps=group["ns_steps"], dtype=self.ns_dtype)
                # Every process computed the same whole update: each keeps its shard, no broadcast.
                update = distribute_tensor(whole, p.device_mesh, p.placements, src_data_rank=None)
            else:
                update = muon_direction(direction, steps=group["ns_steps"], dtype=self.ns_dtype)
            if wd:
                p.mul_(1 - lr * wd)
            p.add_(update, alpha=-lr)

    def _adamw_group(self, group: dict[str, Any]) -> None:
        # torch's single-tensor AdamW, written out: the same arithmetic as torch.optim.AdamW(foreach=False).
        lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            if p.grad is None:
                continue
            grad = p.grad
            state = self.state[p]
            if "step" not in state:
                state["step"] = torch.zeros((), dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            state["step"] += 1
            step = float(state["step"])
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            p.mul_(1 - lr * wd)
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            bias_correction1 = 1 - beta1 ** step
            bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
            p.addcdiv_(exp_avg, denom, value=-lr / bias_correction1)


def muon_roles(params: MuonParams, *, lr: float, weight_decay: float) -> Any:
    """Hidden matrices: Muon at params.lr; embeddings and head: AdamW at ``lr`` with decay; vectors: without."""

    def defaults(role: str, name: str, param: nn.Parameter) -> dict[str, Any]:
        if role == "matrix":
            return {"lr": params.lr, "weight_decay": params.weight_decay, "use_muon": True}
        return {"lr": lr, "weight_decay": 0.0 if role == "vector" else weight_decay, "use_muon": False}

    return defaults


def make_muon(params: MuonParams, *, model: nn.Module, lr: float, min_lr: float, weight_decay: float,
              betas: tuple[float, float], eps: float, device: torch.device) -> torch.optim.Optimizer:
    """Muon for hidden matrices, AdamW at the run's ``lr``, ``betas`` and ``eps`` (unless ``params`` say) for the rest."""
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}.get(
        params.ns_dtype, torch.bfloat16 if device.type == "cuda" else torch.float32)
    groups = build_groups(model, params.groups, muon_roles(params, lr=lr, weight_decay=weight_decay),
                          lr=lr, min_lr=min_lr)
    return Muon(groups, lr=params.lr, momentum=params.momentum, nesterov=params.nesterov, ns_steps=params.ns_steps,
                ns_dtype=dtype, betas=tuple(params.betas or betas), eps=params.eps or eps)
