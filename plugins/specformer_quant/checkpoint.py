"""Quantized checkpoints: one safetensors file, the recipe in its header, read back by ``specformer.load``.

The file holds the quantized module's buffers (``blocks.0.ffn.down.qweight.q`` and
``.scale`` for an int8 matrix) beside the float tensors left as they were, and the
header entry ``quantization`` lists the scheme and which layers it replaced. Core asks
this plugin, through two hooks, which float layout the stored tensors stand for (so the
spec is checked against its weights as for any checkpoint) and to load the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from specformer.model.builder import build_checked
from specformer.checkpoint.check import TensorInfo, first_bad_module_path
from specformer.checkpoint.file import read_tensors
from specformer.errors import CheckpointError, SpecError, excerpt, problems_line
from specformer.renamed import current_name
from specformer_quant.apply import RECIPE_KEY, rebuild, schemes_of


def read_recipe(metadata: dict[str, str], where: str) -> dict[str, Any] | None:
    """The header's recipe (None when the checkpoint is not quantized); CheckpointError when it is unusable."""
    text = metadata.get(RECIPE_KEY)
    if text is None:
        return None
    try:
        recipe = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise CheckpointError(f"{where}: the quantization recipe in the header is not valid JSON") from None
    if not isinstance(recipe, dict) or not all(isinstance(recipe.get(k, []), list) for k in ("linears", "stacks")):
        raise CheckpointError(f"{where}: the quantization recipe must be a mapping with 'scheme', 'linears' and "
                              f"'stacks', got {excerpt(recipe)}")
    for key in ("linears", "stacks"):
        bad = first_bad_module_path(recipe.get(key, []))
        if bad is not None:
            raise CheckpointError(f"{where}: the quantization recipe's {key!r} lists {excerpt(bad)}, which is not a "
                                  f"layer name (dotted names of letters, digits and _, as blocks.0.ffn.down)")
    try:
        schemes_of(recipe)
    except SpecError as exc:
        raise CheckpointError(f"{where}: the quantization recipe in the header is not one this installation can "
                              f"read: {problems_line(exc.problems)}") from None
    # Layers named before a rename (blocks.0.attention.qkv), as the file's tensors are read: as they are now.
    return {**recipe, **{k: [current_name(n) if isinstance(n, str) else n for n in recipe[k]]
                         for k in ("linears", "stacks") if k in recipe}}


def float_layout(metadata: dict[str, str], tensors: dict[str, TensorInfo], where: str) -> dict[str, TensorInfo] | None:
    """The float layout a quantized checkpoint's tensors stand for; every stored shape checked against the scheme."""
    recipe = read_recipe(metadata, where)
    if recipe is None:
        return None
    layer_scheme, head_scheme = schemes_of(recipe)
    layout = dict(tensors)
    entries = [(f"{n}.qweight", f"{n}.weight") for n in recipe.get("linears", [])]
    entries += [(n, n) for n in recipe.get("stacks", [])]
    if recipe.get("tied_head"):  # a quantized copy of the tied embedding: no float tensor stands behind it
        entries.append(("lm_head.qweight", None))
    for prefix, logical in entries:
        label = logical or "lm_head (a quantized copy of the tied embedding)"
        scheme = head_scheme if prefix == "lm_head.qweight" else layer_scheme
        primary = tensors.get(f"{prefix}.{scheme.primary}")
        if primary is None:
            raise CheckpointError(f"{where}: the quantization recipe lists {label}, but the file has no "
                                  f"{prefix}.{scheme.primary}")
        if len(primary.shape) < 2:
            raise CheckpointError(f"{where}: {prefix}.{scheme.primary} has shape {primary.shape}; a quantized weight "
                                  f"has at least 2 dimensions (mismatched quantization shapes)")
        shape = scheme.shape_from_stored(primary.shape)
        try:
            with torch.device("meta"):  # shapes only
                expected = {name: tuple(b.shape) for name, b in scheme.empty(shape).named_buffers()}
        except ValueError as exc:
            raise CheckpointError(f"{where}: {label}: {exc}") from None
        for name, dims in expected.items():
            stored = layout.pop(f"{prefix}.{name}", None)
            if stored is None:
                raise CheckpointError(f"{where}: {label} is quantized ({scheme.name}) but {prefix}.{name} is missing")
            if stored.shape != dims:
                raise CheckpointError(f"{where}: {prefix}.{name} has shape {stored.shape}, but a {scheme.name} weight "
                                      f"of shape {shape} stores it as {dims} (mismatched quantization shapes)")
        if logical is None:
            embedding = tensors.get("embedding.weight")
            if embedding is None or tuple(embedding.shape) != tuple(shape):
                raise CheckpointError(f"{where}: the quantized copy of the tied LM head has shape {shape}, but the "
                                      f"embedding is {None if embedding is None else embedding.shape} (mismatched "
                                      f"quantization shapes)")
            continue
        layout[logical] = TensorInfo(dtype="F32", shape=shape)
    return layout


def load_quantized(checked: Any, device: Any) -> Any:
    """The model of a quantized checkpoint (already checked), on ``device``; None for any other checkpoint."""
    where = str(checked.path)
    recipe = read_recipe(checked.metadata, where)
    if recipe is None:
        return None
    model = build_checked(checked.checked, init=False)
    try:
        rebuild(model, recipe)
    except SpecError as exc:
        raise CheckpointError(f"{where}: the quantization recipe does not fit the model: {problems_line(exc.problems)}") from None
    except (ValueError, AttributeError) as exc:  # get_submodule: AttributeError for a missing name
        raise CheckpointError(f"{where}: the quantization recipe does not fit the model: {exc}") from None
    tensors = read_tensors(Path(checked.path))
    _check_finite(tensors, recipe, where)
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{where}: the quantized tensors do not fit the model ({excerpt(str(exc), 300)})") from None
    return model.to(device)


def _check_finite(tensors: dict[str, torch.Tensor], recipe: dict[str, Any], where: str) -> None:
    """CheckpointError naming the first quantized weight's float part (a scale, a minimum) that is NaN or infinite.

    One such number turns a whole group of weights into NaN: int4 then prints ``perplexity
    inf`` or empty text, int8's packed kernel fails deep inside PyTorch. The codes are
    integers and cannot be non-finite; a bf16 weight is a model's own weight, as unchecked
    as a float checkpoint's, and a pass over it would cost a pass over the model.
    """
    layer_scheme, head_scheme = schemes_of(recipe)
    primary = {f"{n}.qweight": layer_scheme.primary for n in recipe.get("linears", [])}
    primary.update({n: layer_scheme.primary for n in recipe.get("stacks", [])})
    if recipe.get("tied_head"):
        primary["lm_head.qweight"] = head_scheme.primary
    for key, tensor in tensors.items():
        owner, _, leaf = key.rpartition(".")
        if owner not in primary or leaf == primary[owner] or not tensor.is_floating_point():
            continue
        finite = torch.isfinite(tensor)
        if not bool(finite.all()):
            bad = int((~finite).sum())
            kinds = " and ".join(k for k, present in (("NaN", bool(tensor.isnan().any())),
                                                      ("infinite", bool(tensor.isinf().any()))) if present)
            raise CheckpointError(f"{where}: {key} holds {bad:,} {kinds} value{'s' if bad != 1 else ''}; a quantized "
                                  f"weight's scales must be finite (the file is damaged, or was quantized from "
                                  f"weights that were not finite)")
