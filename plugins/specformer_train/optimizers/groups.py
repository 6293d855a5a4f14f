"""Parameter groups chosen by rules: every trainable parameter gets a role, rules may change its settings.

Each parameter has one *role*, decided by its shape and its name in the
:class:`~specformer.Decoder`:

- ``vector``: fewer than 2 dimensions (norm scales, biases, any scalar gain);
- ``embedding``: the token embedding (``embedding.*``, which is also the head when tied) and a
  learned position table (``positional.*``);
- ``head``: an untied LM head (``lm_head.*``);
- ``matrix``: every other matrix: the hidden layers' projections (attention, feed-forward).

An optimizer gives every role its default settings (its peak ``lr``, ``weight_decay`` and
what else it needs, e.g. whether Muon updates it). The spec's ``groups`` rules then change
them: the first rule whose ``match`` names the parameter's role, or a glob (``fnmatch``) on
its name, applies. Parameters with equal settings share one torch param group, groups in the
order of their first parameter, so AdamW's default is exactly the two groups it always had
(matrices with decay, vectors without).
"""

from __future__ import annotations

import fnmatch
from typing import Any, Callable, Literal

from torch import nn

from specformer_train.optimizers.params import GroupRule

Role = Literal["matrix", "embedding", "head", "vector"]
ROLES: tuple[str, ...] = ("matrix", "embedding", "head", "vector")


def role_of(name: str, param: nn.Parameter) -> str:
    """The role of a parameter named ``name`` (see the module docstring)."""
    if param.dim() < 2:
        return "vector"
    if name.startswith(("embedding.", "positional.")):
        return "embedding"
    if name.startswith("lm_head."):
        return "head"
    return "matrix"


def rule_matches(rule: GroupRule, *, name: str, role: str) -> bool:
    return any(pattern == role or fnmatch.fnmatchcase(name, pattern) for pattern in rule.match)


def check_rules(rules: list[GroupRule], model: nn.Module) -> None:
    """Refuse a rule that matches nothing: a typo in a glob must not silently change nothing."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    for index, rule in enumerate(rules):
        if not any(rule_matches(rule, name=n, role=role_of(n, p)) for n, p in named):
            raise ValueError(f"train.optimizer.groups[{index}].match {rule.match} matches no parameter of the "
                             f"model; a pattern is a role ({', '.join(ROLES)}) or a glob on parameter names "
                             f"such as 'blocks.*.mixer.*'")


def build_groups(model: nn.Module, rules: list[GroupRule], defaults: Callable[[str, str, nn.Parameter], dict[str, Any]],
                 *, lr: float, min_lr: float) -> list[dict[str, Any]]:
    """torch param groups: ``defaults(role, name, param)`` gives each parameter's settings, rules change them.

    ``lr`` and ``min_lr`` are the run's (``train.lr``, ``train.min_lr``): a group whose peak is
    not ``lr`` ends its decay at ``min_lr`` scaled like its peak, unless a rule says otherwise.

    Every group carries ``role`` (the roles of its parameters, joined by '+'), ``lr`` and
    ``peak_lr`` (its peak learning rate, which the schedule scales), ``min_lr`` and
    ``weight_decay``, plus whatever ``defaults`` adds.
    """
    check_rules(rules, model)
    groups: dict[tuple, dict[str, Any]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        role = role_of(name, param)
        settings = dict(defaults(role, name, param))
        peak = settings["lr"]
        rule = next((r for r in rules if rule_matches(r, name=name, role=role)), None)
        if rule is not None:
            if rule.lr is not None:
                peak = rule.lr
            elif rule.lr_scale is not None:
                peak = peak * rule.lr_scale
            if rule.weight_decay is not None:
                settings["weight_decay"] = rule.weight_decay
        settings["lr"] = settings["peak_lr"] = peak
        if rule is not None and rule.min_lr is not None:
            settings["min_lr"] = rule.min_lr
        else:
            # Exactly train.min_lr where the peak is train.lr: the default schedule stays bit-identical.
            settings["min_lr"] = min_lr if peak == lr else min_lr * peak / lr
        key = tuple(sorted((k, _hashable(v)) for k, v in settings.items()))
        group = groups.setdefault(key, {"params": [], "roles": [], **settings})
        group["params"].append(param)
        if role not in group["roles"]:
            group["roles"].append(role)
    out = []
    for group in groups.values():
        roles = group.pop("roles")
        out.append({"params": group.pop("params"), "role": "+".join(roles), **group})
    return out


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


__all__ = ["GroupRule", "ROLES", "build_groups", "check_rules", "role_of", "rule_matches"]
