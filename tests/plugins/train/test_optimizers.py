"""The optimizer kind: Muon, Lion, SGD and AdamW against references written here, and the group rules."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import specformer
from specformer.errors import SpecError, UserError
from specformer.registry.discovery import get_registry
from specformer.spec.validate import validate
from specformer_train.config import TrainSpec
from specformer_train.optim import make_optimizer
from specformer_train.optimizers.groups import role_of

from .conftest import tiny_train_spec

CPU = torch.device("cpu")


# -- Muon ---------------------------------------------------------------------------


def reference_newton_schulz(g: torch.Tensor, steps: int) -> torch.Tensor:
    """Keller Jordan's published zeropower_via_newtonschulz5, in float64, written out again."""
    x = g.double()
    transposed = x.shape[0] > x.shape[1]
    if transposed:
        x = x.T
    x = x / (torch.linalg.matrix_norm(x) + 1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = 3.4445 * x + (-4.7750 * gram + 2.0315 * gram @ gram) @ x
    return x.T if transposed else x


class OneMatrix(nn.Module):
    """A 'model' with one hidden matrix (role matrix) and one vector, named like a block's parts."""

    def __init__(self, rows: int, cols: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Module()])
        self.blocks[0].proj = nn.Linear(cols, rows, bias=True)


@pytest.mark.parametrize("rows, cols", [(6, 4), (4, 6)])
@pytest.mark.parametrize("ns_steps", [5, 3])
def test_muon_update_equals_the_published_algorithm(rows: int, cols: int, ns_steps: int) -> None:
    torch.manual_seed(0)
    model = OneMatrix(rows, cols)
    weight = model.blocks[0].proj.weight
    config = TrainSpec(lr=1e-3, min_lr=0.0, optimizer={"kind": "muon", "lr": 0.1, "momentum": 0.9,
                                                          "weight_decay": 0.5, "ns_steps": ns_steps})
    optimizer = make_optimizer(model, config, device=CPU)
    muon_group = next(g for g in optimizer.param_groups if g["use_muon"])
    assert [id(p) for p in muon_group["params"]] == [id(weight)] and muon_group["lr"] == 0.1

    w = weight.detach().double().clone()
    momentum = torch.zeros_like(w)
    grads = [torch.randn(rows, cols) for _ in range(3)]
    for grad in grads:
        weight.grad = grad.clone()
        model.blocks[0].proj.bias.grad = torch.zeros(rows)
        optimizer.step()
        # The reference: momentum by lerp, Nesterov mix, NS, shape scale, decoupled decay.
        momentum = 0.9 * momentum + 0.1 * grad.double()
        direction = 0.1 * grad.double() + 0.9 * momentum
        update = reference_newton_schulz(direction, ns_steps) * math.sqrt(max(1.0, rows / cols))
        w = w * (1 - 0.1 * 0.5) - 0.1 * update
        torch.testing.assert_close(weight.detach().double(), w, rtol=1e-4, atol=1e-5)


def test_muon_uses_five_steps_and_the_quintic_coefficients_by_default() -> None:
    torch.manual_seed(1)
    model = OneMatrix(5, 8)
    weight = model.blocks[0].proj.weight
    start = weight.detach().clone()
    optimizer = make_optimizer(model, TrainSpec(optimizer={"kind": "muon", "lr": 1.0, "nesterov": False}),
                               device=CPU)
    grad = torch.randn(5, 8)
    weight.grad = grad.clone()
    optimizer.step()
    update = (start - weight.detach()).double()  # lr 1, no decay: the update itself; momentum 0.05 * grad
    torch.testing.assert_close(update, reference_newton_schulz(0.05 * grad, 5), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(update, reference_newton_schulz(0.05 * grad, 4), rtol=1e-3, atol=1e-3)
    # What the quintic map is for: every singular value of the update lands near 1 (0.68 .. 1.13 for 5 steps).
    singular = torch.linalg.svdvals(update)
    assert singular.min() > 0.6 and singular.max() < 1.2


def test_muon_leaves_embeddings_head_and_vectors_to_adamw() -> None:
    spec = tiny_train_spec()
    spec["model"]["tie_embeddings"] = False
    model = specformer.build(spec, seed=0)
    reference = copy.deepcopy(model)
    config = TrainSpec(lr=1e-2, weight_decay=0.1, optimizer="muon")
    optimizer = make_optimizer(model, config, device=CPU)
    by_name = {n: p for n, p in model.named_parameters()}
    muon = {id(p) for g in optimizer.param_groups if g["use_muon"] for p in g["params"]}
    assert {n for n, p in by_name.items() if id(p) in muon} == {
        n for n, p in by_name.items() if p.dim() >= 2 and n.startswith("blocks.")}
    # The rest steps exactly like torch's AdamW (single-tensor) with decay on matrices only.
    others = [n for n, p in by_name.items() if id(p) not in muon]
    ref_params = dict(reference.named_parameters())
    torch_adamw = torch.optim.AdamW(
        [{"params": [ref_params[n] for n in others if ref_params[n].dim() >= 2], "weight_decay": 0.1},
         {"params": [ref_params[n] for n in others if ref_params[n].dim() < 2], "weight_decay": 0.0}],
        lr=1e-2, betas=config.betas, eps=config.eps, foreach=False)
    torch.manual_seed(2)
    for _ in range(3):
        for name, p in by_name.items():
            grad = torch.randn_like(p)
            p.grad = grad
            ref_params[name].grad = grad.clone()
        optimizer.step()
        torch_adamw.step()
    for name in others:
        torch.testing.assert_close(by_name[name], ref_params[name], rtol=1e-5, atol=1e-7, msg=name)


# -- Lion and SGD -----------------------------------------------------------------------


def test_lion_follows_its_formula() -> None:
    torch.manual_seed(3)
    model = OneMatrix(4, 3)
    config = TrainSpec(lr=0.01, weight_decay=0.2, optimizer={"kind": "lion", "betas": [0.8, 0.9]})
    optimizer = make_optimizer(model, config, device=CPU)
    params = dict(model.named_parameters())
    w = {n: p.detach().clone() for n, p in params.items()}
    m = {n: torch.zeros_like(p) for n, p in params.items()}
    for _ in range(3):
        grads = {n: torch.randn_like(p) for n, p in params.items()}
        for n, p in params.items():
            p.grad = grads[n].clone()
        optimizer.step()
        for n in params:
            wd = 0.2 if params[n].dim() >= 2 else 0.0
            w[n] = w[n] * (1 - 0.01 * wd) - 0.01 * torch.sign(0.8 * m[n] + 0.2 * grads[n])
            m[n] = 0.9 * m[n] + 0.1 * grads[n]
            torch.testing.assert_close(params[n].detach(), w[n], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_follows_its_formula(nesterov: bool) -> None:
    torch.manual_seed(4)
    model = OneMatrix(4, 3)
    config = TrainSpec(lr=0.1, weight_decay=0.01, optimizer={"kind": "sgd", "momentum": 0.5, "nesterov": nesterov})
    optimizer = make_optimizer(model, config, device=CPU)
    params = dict(model.named_parameters())
    w = {n: p.detach().clone() for n, p in params.items()}
    buf: dict[str, torch.Tensor] = {}
    for _ in range(3):
        grads = {n: torch.randn_like(p) for n, p in params.items()}
        for n, p in params.items():
            p.grad = grads[n].clone()
        optimizer.step()
        for n in params:
            g = grads[n] + (0.01 if params[n].dim() >= 2 else 0.0) * w[n]  # L2 decay, matrices only
            buf[n] = g if n not in buf else 0.5 * buf[n] + g
            w[n] = w[n] - 0.1 * (g + 0.5 * buf[n] if nesterov else buf[n])
            torch.testing.assert_close(params[n].detach(), w[n], rtol=1e-6, atol=1e-7)


def test_sgd_refuses_nesterov_without_momentum() -> None:
    config = TrainSpec(optimizer={"kind": "sgd", "momentum": 0, "nesterov": True})
    with pytest.raises(UserError, match="nesterov: true needs momentum > 0"):
        make_optimizer(OneMatrix(2, 2), config, device=CPU)


# -- groups and rules --------------------------------------------------------------------


def untied_model() -> nn.Module:
    spec = tiny_train_spec()
    spec["model"]["tie_embeddings"] = False
    spec["model"]["block"]["mixer"]["qkv_bias"] = True
    return specformer.build(spec, seed=0)


def test_roles_by_shape_and_name() -> None:
    model = untied_model()
    roles = {n: role_of(n, p) for n, p in model.named_parameters()}
    assert roles["embedding.weight"] == "embedding" and roles["lm_head.weight"] == "head"
    assert roles["blocks.0.mixer.qkv.weight"] == "matrix" and roles["blocks.1.ffn.down.weight"] == "matrix"
    assert roles["blocks.0.mixer.qkv.bias"] == "vector" and roles["final_norm.weight"] == "vector"


def test_rules_set_lr_and_decay_by_role_and_by_glob_first_match_wins() -> None:
    model = untied_model()
    config = TrainSpec(lr=1e-3, min_lr=1e-4, weight_decay=0.1, optimizer={"kind": "adamw", "groups": [
        {"match": ["blocks.1.*"], "lr_scale": 0.5},                     # before the role rule: wins for layer 1
        {"match": ["head", "embedding"], "lr": 4e-3, "weight_decay": 0.0},
        {"match": ["matrix"], "weight_decay": 0.3, "min_lr": 0.0},
    ]})
    optimizer = make_optimizer(model, config, device=CPU)
    setting = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            setting[names[id(p)]] = (group["peak_lr"], group["min_lr"], group["weight_decay"])
    assert setting["lm_head.weight"] == setting["embedding.weight"] == (4e-3, pytest.approx(4e-4), 0.0)
    assert setting["blocks.0.mixer.qkv.weight"] == (1e-3, 0.0, 0.3)
    assert setting["blocks.0.mixer.qkv.bias"] == (1e-3, 1e-4, 0.0)
    assert setting["blocks.1.mixer.qkv.weight"] == (5e-4, pytest.approx(5e-5), 0.1)
    assert setting["blocks.1.mixer.qkv.bias"] == (5e-4, pytest.approx(5e-5), 0.0)
    assert len(setting) == len(list(model.parameters()))


def test_a_rule_that_matches_nothing_is_refused() -> None:
    config = TrainSpec(optimizer={"kind": "muon", "groups": [{"match": ["head"], "lr": 0.01}]})
    model = specformer.build(tiny_train_spec(), seed=0)  # tied: there is no separate head
    with pytest.raises(UserError, match=r"groups\[0\]\.match \['head'\] matches no parameter"):
        make_optimizer(model, config, device=CPU)


@pytest.mark.parametrize("optimizer, message", [
    ({"kind": "adamm"}, "did you mean 'adamw'"),
    ({"kind": "muon", "ns_steps": 0}, "ns_steps"),
    ({"kind": "muon", "momentum": 1.0}, "momentum"),
    ({"kind": "lion", "betas": [0.9]}, "betas"),
    ({"kind": "adamw", "groups": [{"match": ["matrix"], "lr": 1e-3, "lr_scale": 2}]}, "lr or lr_scale, not both"),
    ({"kind": "adamw", "groups": [{"match": []}]}, "match"),
    ({"kind": "sgd", "momentun": 0.9}, "momentun"),
])
def test_bad_optimizer_settings_are_spec_errors(optimizer: dict, message: str) -> None:
    spec = tiny_train_spec()
    spec["train"]["optimizer"] = optimizer
    with pytest.raises(SpecError, match=message):
        validate(spec, registry=get_registry())


# -- a real comparison ----------------------------------------------------------------------


@pytest.mark.slow
def test_muon_trains_the_tiny_spec_to_a_lower_loss_than_adamw_at_equal_steps(tmp_path, corpus_dir) -> None:
    from specformer_train import train

    losses = {}
    for name, optimizer in (("adamw", "adamw"), ("muon", {"kind": "muon", "lr": 0.02})):
        # Each at its usual learning rate; the same model, data, schedule and steps.
        spec = tiny_train_spec(data=str(corpus_dir), steps=150, warmup_steps=10, eval_every=0, eval_steps=None,
                               save_every=0, optimizer=optimizer)
        losses[name] = train(spec, out_dir=str(tmp_path / name)).val_loss
    assert losses["muon"] < losses["adamw"] - 0.02, losses
