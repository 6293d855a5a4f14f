"""Import: a Hugging Face model directory -> spec + Decoder (+ tokenizer), driven by a :class:`Family`."""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

import specformer
from specformer.checkpoint import load_weights
from specformer.errors import SpecError, UserError
from specformer.tokenizer import END_OF_TEXT, METADATA_KEY, BPETokenizer

from specformer_hf.config import ConfigReader
from specformer_hf.family import Families, Family, get_families
from specformer_hf.reader import HFDirectory, open_directory
from specformer_hf.rules import Site

#: Checkpoint header keys written by ``specformer hf import``; export reads them back.
FAMILY_KEY = "hf.model_type"
CONFIG_KEY = "hf.config"


@dataclass
class Imported:
    """What an import produced: the model, its family, the original config and the tokenizer if any."""

    model: specformer.Decoder
    family: Family
    config: dict[str, Any]
    spec: dict[str, Any]  # the spec as the family wrote it (compact; model.spec is the validated form)
    tokenizer: BPETokenizer | None = None
    notes: list[str] = field(default_factory=list)

    def metadata(self) -> dict[str, str]:
        """Checkpoint header entries that let export reproduce the original config and tokenizer."""
        out = {FAMILY_KEY: self.family.model_type, CONFIG_KEY: json.dumps(self.config, sort_keys=True)}
        if self.tokenizer is not None:
            out[METADATA_KEY] = self.tokenizer.to_json()
        return out


def spec_from_config(config: dict[str, Any], *, families: Families | None = None) -> tuple[Family, dict[str, Any]]:
    """The family of a parsed ``config.json`` and the spec (``{"model": ...}``) it maps to."""
    families = families or get_families()
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise UserError(f"config.json has no 'model_type' string (got {model_type!r}); cannot tell which family it is")
    family = families.get(model_type)
    reader = ConfigReader(config, defaults=family.defaults, family=family.name)
    model = family.to_spec(reader)
    reader.warn_unread(also_harmless=family.non_math_fields)
    return family, {"model": model}


def import_hf(path: str | Path, *, families: Families | None = None, dtype: torch.dtype | None = None) -> Imported:
    """Read a local Hugging Face model directory into a specformer Decoder (weights converted exactly)."""
    directory = open_directory(path)
    family, spec = spec_from_config(directory.config, families=families)
    try:
        model = specformer.build(spec)
    except SpecError as exc:
        raise UserError(
            f"{directory.path}: the {family.name} config maps to a spec specformer rejects:\n{exc}"
        ) from None
    tensors = convert_weights(family, directory, model)
    load_weights(model, tensors, where=str(directory.path))
    if dtype is not None:
        model = model.to(dtype=dtype)
    model.eval()
    # For export: write the model back as the family it came from (when it still fits), with its token ids.
    model.hf_config = directory.config
    tokenizer, notes = _tokenizer(directory)
    return Imported(model=model, family=family, config=directory.config, spec=spec, tokenizer=tokenizer, notes=notes)


def from_hf(path: str | Path, *, dtype: torch.dtype | None = None) -> specformer.Decoder:
    """The Decoder of a local Hugging Face model directory (``config.json`` + safetensors weights)."""
    return import_hf(path, dtype=dtype).model


# -- weights --------------------------------------------------------------------------------


def convert_weights(family: Family, directory: HFDirectory, model: Any) -> dict[str, torch.Tensor]:
    """Our state dict from the directory's tensors; UserError naming every missing, extra or mis-shaped one."""
    expected = model.state_dict()
    available = set(directory.names())
    consumed: set[str] = set()
    missing: list[str] = []
    misshaped: list[str] = []
    out: dict[str, torch.Tensor] = {}

    def locate(name: str) -> str | None:
        if name in available:
            return name
        for prefix, replacement in family.aliases:
            if name.startswith(prefix) and replacement + name[len(prefix):] in available:
                return replacement + name[len(prefix):]
        return None

    jobs = []
    for rule in family.weights:
        layers = range(len(model.blocks)) if rule.per_layer else [None]
        for layer in layers:
            site = Site(model, layer)
            hf_names, our_names = rule.expand_at(site)
            if not all(name in expected for name in our_names):
                continue  # the spec has no such parameter (a bias it leaves out): nothing to fill
            jobs.append((rule, site, hf_names, our_names))

    for rule, site, hf_names, our_names in tqdm(jobs, desc="converting weights", unit="rule", disable=None, leave=False):
        found = {name: locate(name) for name in hf_names}
        absent = [name for name, where in found.items() if where is None]
        if absent:
            missing += absent
            continue
        located = [found[name] for name in hf_names]
        tensors = directory.read(located)
        converted = rule.to_ours([tensors[name] for name in located], site)
        consumed.update(located)
        for name, tensor in zip(our_names, converted):
            if tuple(tensor.shape) != tuple(expected[name].shape):
                shapes = ", ".join(f"{n} {tuple(tensors[n].shape)}" for n in located)
                misshaped.append(f"{shapes} -> {name} needs {tuple(expected[name].shape)}, got {tuple(tensor.shape)}")
            out[name] = tensor

    head = locate(family.head_tensor)
    if model.lm_head is None and head is not None and head not in consumed:
        embedding = out.get("embedding.weight")
        if embedding is not None:
            stored = directory.read([head])[head]
            if stored.shape != embedding.shape or not torch.equal(stored, embedding):
                raise UserError(
                    f"{directory.path}: config.json ties the LM head to the embeddings (tie_word_embeddings), but "
                    f"{head} differs from them; set tie_word_embeddings to false in config.json if the head is separate"
                )
        consumed.add(head)

    ignore = [re.compile(pattern) for pattern in family.ignore_tensors]
    extra = sorted(n for n in available - consumed if not any(p.fullmatch(n) for p in ignore))
    problems = []
    if missing:
        problems.append(f"missing tensors: {_listing(missing)}")
    if misshaped:
        problems.append("tensors whose shape does not match config.json: " + _listing(misshaped, sep="; "))
    if extra:
        problems.append(
            f"tensors the {family.name} mapping does not use (config.json describes a model without them, "
            f"or the file is a variant specformer does not support): {_listing(extra)}"
        )
    unfilled = sorted(set(expected) - set(out))
    if not problems and unfilled:
        problems.append(f"the {family.name} mapping fills no tensor for: {_listing(unfilled)}")
    if problems:
        raise UserError(f"{directory.path}: the weights do not match a {family.name} model of this config; " + "; ".join(problems))
    return out


def _listing(names: list[str], *, limit: int = 8, sep: str = ", ") -> str:
    shown = sep.join(names[:limit])
    return shown + (f"{sep}and {len(names) - limit} more" if len(names) > limit else "")


# -- tokenizer ------------------------------------------------------------------------------


def _tokenizer(directory: HFDirectory) -> tuple[BPETokenizer | None, list[str]]:
    path = directory.tokenizer_path
    if path is None:
        return None, []
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:
        raise UserError(f"{path}: reading tokenizer.json needs the tokenizers package (pip install tokenizers)") from None
    try:
        inner = HFTokenizer.from_file(str(path))
    except Exception as exc:
        raise UserError(f"{path}: not a readable tokenizer.json ({exc})") from None
    eos = _eos_token(directory.config, inner)
    if eos is None:
        note = (f"{path}: not stored with the checkpoint: it has no {END_OF_TEXT!r} token and config.json names no "
                "eos_token_id, so specformer cannot tell where documents end")
        warnings.warn(note, UserWarning, stacklevel=3)
        return None, [note]
    return BPETokenizer(inner, eot_token=eos), []


def _eos_token(config: dict[str, Any], inner: Any) -> str | None:
    eos_id = config.get("eos_token_id")
    if isinstance(eos_id, list):
        eos_id = eos_id[0] if eos_id else None
    if isinstance(eos_id, int) and not isinstance(eos_id, bool):
        token = inner.id_to_token(eos_id)
        if token is not None:
            return token
    return END_OF_TEXT if inner.token_to_id(END_OF_TEXT) is not None else None


__all__ = ["CONFIG_KEY", "FAMILY_KEY", "Imported", "convert_weights", "from_hf", "import_hf", "spec_from_config"]
