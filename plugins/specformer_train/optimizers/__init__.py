"""The ``optimizer`` component kind and the built-in optimizers (adamw, muon, lion, sgd).

A spec picks one with ``train.optimizer: {kind: <name>, ...params}``; the train plugin adds
the kind in its ``specformer_add_kinds`` hook, so another plugin can add an optimizer from its
``specformer_register_components`` whatever order the plugins load in::

    registry.register("optimizer", "myopt", factory=make_myopt, params=MyOptParams)

where ``make_myopt(params, *, model, lr, min_lr, weight_decay, betas, eps, device)`` (naming
only the ones it uses) returns a ``torch.optim.Optimizer``: its own validated params, the model,
the run's ``train.lr``, ``train.min_lr``, ``train.weight_decay``, ``train.betas`` and
``train.eps``, and the device. Its param groups are best built with
:func:`specformer_train.optimizers.groups.build_groups`, so that the ``groups`` rules work and
the schedule applies per group (each group's ``peak_lr`` and ``min_lr``). The factory may be
registered by path (``factory="my_plugin.opt:make_myopt"``) so that registering imports no torch.
"""

from __future__ import annotations

from typing import Any

from specformer_train.optimizers.params import AdamWParams, LionParams, MuonParams, SGDParams

KIND = "optimizer"
KIND_DOC = "How the trainer updates the weights from their gradients: a torch optimizer and its param groups."
SIZES = ("model", "lr", "min_lr", "weight_decay", "betas", "eps", "device")


def register_optimizers(registry: Any) -> None:
    """Register the built-in optimizers by factory path (the kind itself is added by ``specformer_add_kinds``)."""
    def add(name: str, factory: str, params: type, paper: str | None = None) -> None:
        registry.register(KIND, name, factory=f"specformer_train.optimizers.{factory}", params=params, paper=paper)

    add("adamw", "adamw:make_adamw", AdamWParams, "Loshchilov & Hutter 2019, Decoupled Weight Decay Regularization")
    add("muon", "muon:make_muon", MuonParams, "Jordan et al. 2024, Muon: An optimizer for hidden layers in neural networks")
    add("lion", "lion:make_lion", LionParams, "Chen et al. 2023, Symbolic Discovery of Optimization Algorithms")
    add("sgd", "sgd:make_sgd", SGDParams)
