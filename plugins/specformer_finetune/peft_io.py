"""PEFT interop: an adapter checkpoint as a PEFT LoRA folder, and a PEFT LoRA folder as an adapter checkpoint.

specformer and Hugging Face name and lay out the same layers differently (one fused QKV
projection here, ``q_proj``/``k_proj``/``v_proj`` there; split, concatenated or
head-interleaved rows depending on the family). Rather than knowing every layout, both
directions go through the family's own weight rules (:mod:`specformer_hf`'s :class:`~specformer_hf.Rule`), which
are linear in the weights: each adapted layer's update ``delta = B @ A * scaling`` is
converted like a weight (other parts of a fused tensor as zeros), and each converted
update is factored back into ``B @ A`` by an SVD, truncated to the rank the update can
have. That is exact up to float rounding: a part of ``B @ A`` has rank at most ``r``, and
a fused update of ``k`` parts at most ``k * r``.

- Export writes ``adapter_config.json`` (LoRA, rank ``r``, ``lora_alpha = r`` so the
  scaling is 1, the Hugging Face module names as ``target_modules``) and
  ``adapter_model.safetensors`` (``base_model.model.<module>.lora_A.weight`` / ``lora_B``),
  which ``peft.PeftModel.from_pretrained`` loads onto the base exported by ``hf export``
  (the ``specformer peft export`` command, :mod:`.peft_cli`).
- Import reads such a folder (plain LoRA: no DoRA, no ``fan_in_fan_out``; rsLoRA and
  per-module rank/alpha patterns are honoured) onto a specformer base checkpoint and
  writes an adapter checkpoint whose rank is the largest any layer needs (``specformer peft import``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors.torch import load_file

import specformer
from specformer.checkpoint.save_load import read_metadata, write_safetensors_atomic
from specformer.errors import UserError
from specformer.files.outputs import check_folder_output, staged_folder
from specformer_hf import SpecView, Site, Transposed, choose_family, get_families
from specformer_text import FAMILY_KEY

from specformer_finetune.adapter_file import base_reference, save_adapter
from specformer_finetune.apply import adapter_of, apply_adapter

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."

_V = TypeVar("_V", int, float)


def _family(model: Any, family: str | None, prefer: str | None) -> Any:
    chosen, _ = choose_family(SpecView.of(model.spec), get_families(), prefer=prefer, only=family)
    return chosen


def _factor(delta: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, A)`` with ``B @ A == delta`` for a ``delta`` of rank at most ``rank``: ``B (out, r)``, ``A (r, in)``."""
    u, s, vh = torch.linalg.svd(delta.double(), full_matrices=False)
    rank = min(rank, s.shape[0])
    return (u[:, :rank] * s[:rank]).float().contiguous(), vh[:rank].float().contiguous()


# -- export -------------------------------------------------------------------------------------


def hf_deltas(model: Any, family: Any) -> dict[str, torch.Tensor]:
    """Each Hugging Face module's update (``module name -> (out, in)``) from the adapter on ``model``."""


    info = adapter_of(model)
    deltas = {f"{name}.weight": model.get_submodule(name).delta_weight().detach().float() for name in info.targets}
    out: dict[str, torch.Tensor] = {}
    done: set[str] = set()
    for rule in family.weights:
        for layer in range(len(model.blocks)) if rule.per_layer else [None]:
            hf_names, our_names = rule.expand_at(Site(model, layer))
            touched = [n for n in our_names if n in deltas]
            if not touched:
                continue
            if isinstance(rule, Transposed) or len(touched) != len(our_names):
                raise UserError(f"Hugging Face {family.name} stores {', '.join(our_names)} in a layout PEFT's LoRA "
                                f"cannot express; adapt other layers or merge the adapter (specformer merge)")
            converted = rule.to_hf([deltas[n] for n in our_names], Site(model, layer))
            for name, tensor in zip(hf_names, converted):
                if not name.endswith(".weight") or tensor.dim() != 2:
                    raise UserError(f"{name}: not a linear layer's weight in Hugging Face {family.name}")
                out[name.removesuffix(".weight")] = tensor
            done.update(touched)
    missing = sorted(set(deltas) - done)
    if missing:
        raise UserError(f"Hugging Face {family.name} has no place for the adapted layers {', '.join(missing)}")
    return out


def export_peft(model: Any, directory: str | Path, *, family: str | None = None, prefer: str | None = None,
                base_path: str | None = None, force: bool = False, inputs: Sequence[str | Path] = ()) -> Path:
    """Write ``model``'s adapter as a PEFT LoRA folder at ``directory``.

    The folder follows :mod:`specformer.files.outputs`: absent or empty, or with ``force`` replaced
    once the new one is complete; never one that is or holds any of ``inputs``.
    """
    info = adapter_of(model)
    if info is None:
        raise UserError("peft export writes an adapter, and this checkpoint has none")
    if info.ref.get("kind") != "lora":
        raise UserError(f"peft export writes LoRA adapters; this one is {info.ref.get('kind')!r}")
    directory = Path(directory)
    check_folder_output(directory, inputs=inputs, force=force)
    chosen = _family(model, family, prefer)
    deltas = hf_deltas(model, chosen)
    rank = int(info.ref["rank"])
    tensors: dict[str, torch.Tensor] = {}
    for module, delta in deltas.items():
        b, a = _factor(delta, rank)
        if b.shape[1] < rank:  # a layer narrower than the rank: pad with zero directions
            b = torch.cat([b, b.new_zeros(b.shape[0], rank - b.shape[1])], dim=1)
            a = torch.cat([a, a.new_zeros(rank - a.shape[0], a.shape[1])], dim=0)
        tensors[f"{PREFIX}{module}.lora_A.weight"] = a
        tensors[f"{PREFIX}{module}.lora_B.weight"] = b
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": rank, "lora_dropout": 0.0,
        "target_modules": sorted(deltas), "bias": "none", "fan_in_fan_out": False, "use_rslora": False,
        "use_dora": False, "init_lora_weights": True, "inference_mode": True, "modules_to_save": None,
        "rank_pattern": {}, "alpha_pattern": {}, "base_model_name_or_path": base_path,
    }
    with staged_folder(directory, inputs=inputs, force=force) as stage:
        write_safetensors_atomic(tensors, stage / WEIGHTS, {"format": "pt"})
        (stage / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return directory


# -- import -------------------------------------------------------------------------------------


def read_peft(directory: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A PEFT LoRA folder's config and each module's update ``B @ A * scaling``; UserError for what is not plain LoRA."""
    directory = Path(directory)
    try:
        config = json.loads((directory / CONFIG).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{directory}: no readable {CONFIG} ({exc})") from None
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        raise UserError(f"{directory}: {CONFIG} is not a LoRA adapter (peft_type {config.get('peft_type')!r})")
    for flag, why in (("use_dora", "DoRA"), ("fan_in_fan_out", "fan_in_fan_out (Conv1D layers)")):
        if config.get(flag):
            raise UserError(f"{directory}: {why} adapters are not read; plain LoRA is")
    if config.get("modules_to_save"):
        raise UserError(f"{directory}: modules_to_save ({config['modules_to_save']}) trains whole layers; only LoRA "
                        "updates are read")
    try:
        tensors = load_file(str(directory / WEIGHTS))
    except Exception as exc:  # safetensors' own error types
        raise UserError(f"{directory}: {WEIGHTS} cannot be read ({type(exc).__name__}: {exc})") from None
    config_file, weights_file = directory / CONFIG, directory / WEIGHTS
    r = _rank(config.get("r", 8), config_file, "r")
    alpha = _alpha(config.get("lora_alpha", 8), config_file, "lora_alpha")
    ranks = _pattern(config.get("rank_pattern"), config_file, "rank_pattern", _rank)
    alphas = _pattern(config.get("alpha_pattern"), config_file, "alpha_pattern", _alpha)
    deltas: dict[str, torch.Tensor] = {}
    for key in tensors:
        if key.endswith(".lora_B.weight") and f"{key.removesuffix('.lora_B.weight')}.lora_A.weight" not in tensors:
            raise UserError(f"{weights_file}: {key} has no matching lora_A")
        if not key.endswith(".lora_A.weight"):
            continue
        module = key.removesuffix(".lora_A.weight").removeprefix(PREFIX)
        b_key = f"{PREFIX}{module}.lora_B.weight"
        a, b = tensors[key], tensors.get(b_key)
        if b is None:
            raise UserError(f"{weights_file}: {key} has no matching lora_B")
        field, rank = next(((f"rank_pattern[{k!r}]", v) for k, v in ranks.items()
                            if module == k or module.endswith(f".{k}")), ("r", r))
        scale_alpha = next((v for k, v in alphas.items() if module == k or module.endswith(f".{k}")), alpha)
        for name, tensor in ((key, a), (b_key, b)):
            if tensor.dim() != 2 or not tensor.is_floating_point() or 0 in tensor.shape:
                raise UserError(f"{weights_file}: {name} must be a non-empty 2-d float matrix, got "
                                f"{tensor.dtype} of shape {tuple(tensor.shape)}")
        # The scale is alpha / r: an r the tensors do not have would scale the update by a wrong factor
        # (r: 1e12 on rank-8 tensors makes it vanish), so config and tensors must agree.
        if a.shape[0] != rank or b.shape[1] != rank:
            raise UserError(f"{weights_file}: {key} {tuple(a.shape)} and lora_B {tuple(b.shape)} have rank "
                            f"{a.shape[0] if a.shape[0] != rank else b.shape[1]}, but {config_file.name} says "
                            f"{field} = {rank}; lora_A must be (r, in) and lora_B (out, r)")
        scaling = scale_alpha / (rank ** 0.5 if config.get("use_rslora") else rank)
        delta = (b.float() @ a.float()) * scaling  # (out, in)
        if not torch.isfinite(delta).all():
            raise UserError(f"{weights_file}: {module}'s update lora_B @ lora_A holds NaN or infinite values")
        deltas[module] = delta
    if not deltas:
        raise UserError(f"{directory}: {WEIGHTS} holds no lora_A/lora_B pairs")
    return config, deltas


def _rank(value: Any, where: Path, field: str) -> int:
    # 8.0 is a whole number as JSON writes it; a string, a fraction or a bool is not.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value)
                                                                            and value == int(value) and value >= 1):
        raise UserError(f"{where}: {field} must be a whole number of at least 1 (the LoRA rank), got {value!r}")
    return int(value)


def _alpha(value: Any, where: Path, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise UserError(f"{where}: {field} must be a number above 0 (the LoRA scale is lora_alpha / r), got {value!r}")
    return float(value)


def _pattern(value: Any, where: Path, field: str, check: Callable[[Any, Path, str], _V]) -> dict[str, _V]:
    """``rank_pattern`` / ``alpha_pattern``: module name -> rank or alpha, each checked as ``r`` / ``lora_alpha`` are."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"{where}: {field} must be an object mapping module names to values, got {value!r}")
    return {str(k): check(v, where, f"{field}[{k!r}]") for k, v in value.items()}


def import_peft(directory: str | Path, base: str | Path, output: str | Path, *, family: str | None = None) -> Any:
    """Write an adapter checkpoint at ``output``: the PEFT LoRA folder ``directory`` on the checkpoint ``base``."""
    _, deltas = read_peft(directory)
    model = specformer.load(base)
    chosen = _family(model, family, read_metadata(base).get(FAMILY_KEY))
    state = model.state_dict()
    ours: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for rule in chosen.weights:
        for layer in range(len(model.blocks)) if rule.per_layer else [None]:
            site = Site(model, layer)
            hf_names, our_names = rule.expand_at(site)
            modules = [n.removesuffix(".weight") for n in hf_names]
            if not any(m in deltas for m in modules):
                continue
            if not all(n in state for n in our_names):
                continue
            # The HF shapes of every part, from the base's own weights converted (zeros where no update).
            shapes = [t.shape for t in rule.to_hf([state[n].float() for n in our_names], site)]
            for module, shape in zip(modules, shapes):
                if module in deltas and deltas[module].shape != shape:
                    raise UserError(f"{Path(directory) / WEIGHTS}: {module}'s update is {tuple(deltas[module].shape)} "
                                    f"(lora_B out x lora_A in), but the base's {module} is {tuple(shape)}; is "
                                    f"{base} the model this adapter was trained on?")
            parts = [deltas[m] if m in deltas else torch.zeros(shape) for m, shape in zip(modules, shapes)]
            for name, tensor in zip(our_names, rule.to_ours(parts, site)):
                ours[name.removesuffix(".weight")] = tensor
            used.update(m for m in modules if m in deltas)
    unplaced = sorted(set(deltas) - used)
    if unplaced:
        raise UserError(f"{directory}: the adapter updates {', '.join(unplaced[:4])}, which the base "
                        f"({chosen.name}) does not have")
    # The rank each update has (float32 products: singular values below 1e-5 of the largest are rounding).
    rank = max(1, max(int(torch.linalg.matrix_rank(d.double(), rtol=1e-5).item()) for d in ours.values()))
    model = specformer.load(base)
    info = apply_adapter(model, {"kind": "lora", "rank": rank, "alpha": float(rank), "targets": sorted(ours)})
    with torch.no_grad():
        for name, delta in ours.items():
            layer = model.get_submodule(name)
            b, a = _factor(delta, rank)
            layer.lora_A.zero_()
            layer.lora_B.zero_()
            layer.lora_A[: a.shape[0]].copy_(a)
            layer.lora_B[:, : b.shape[1]].copy_(b)
    info.base = base_reference(base)
    save_adapter(model, output)
    return model


__all__ = ["export_peft", "hf_deltas", "import_peft", "read_peft"]
