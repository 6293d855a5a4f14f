"""The ``optimizer`` component kind and the built-in optimizers (adamw, muon, lion, sgd).

A spec picks one with ``train.optimizer: {kind: <name>, ...params}``; the train plugin adds
the kind in its ``specformer_add_kinds`` hook, so another plugin can add an optimizer from its
``specformer_register_components`` whatever order the plugins load in::

    registry.register("optimizer", "myopt", factory=make_myopt, params=MyOptParams)

where ``make_myopt(params, *, model, train, device)`` returns a ``torch.optim.Optimizer``.
Its param groups are best built with :func:`specformer_train.optimizers.groups.build_groups`,
so that the ``groups`` rules work and the schedule applies per group (each group's ``peak_lr``
and ``min_lr``).
"""

from __future__ import annotations

from typing import Any

KIND = "optimizer"
KIND_DOC = "How the trainer updates the weights from their gradients: a torch optimizer and its param groups."
SIZES = ("model", "train", "device")


def register_optimizers(registry: Any) -> None:
    """Register the built-in optimizers (the kind itself is added by the plugin's ``specformer_add_kinds``)."""
    from specformer_train.optimizers.adamw import AdamWParams, make_adamw
    from specformer_train.optimizers.lion import LionParams, make_lion
    from specformer_train.optimizers.muon import MuonParams, make_muon
    from specformer_train.optimizers.sgd import SGDParams, make_sgd

    registry.register(KIND, "adamw", factory=make_adamw, params=AdamWParams,
                      paper="Loshchilov & Hutter 2019, Decoupled Weight Decay Regularization")
    registry.register(KIND, "muon", factory=make_muon, params=MuonParams,
                      paper="Jordan et al. 2024, Muon: An optimizer for hidden layers in neural networks")
    registry.register(KIND, "lion", factory=make_lion, params=LionParams,
                      paper="Chen et al. 2023, Symbolic Discovery of Optimization Algorithms")
    registry.register(KIND, "sgd", factory=make_sgd, params=SGDParams)
