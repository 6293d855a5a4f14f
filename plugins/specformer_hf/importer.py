"""Import: a Hugging Face model directory -> spec + Decoder (+ tokenizer), driven by a :class:`Family`."""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

import specformer
from specformer.checkpoint.save_load import load_weights
from specformer.errors import SpecError, UserError, excerpt
from specformer.tokenizers.tokenizer import METADATA_KEY, BPETokenizer, ByteTokenizer, NoTokenizer
from specformer_text import CONFIG_KEY, FAMILY_KEY, GENERATION_CONFIG_KEY, TOKENIZER_CONFIG_KEY, load_tokenizer_json, \
    no_tokenizer

from specformer_hf.config import ConfigReader, TooManyLayers
from specformer_hf.family import Families, Family, get_families
from specformer_hf.reader import CHAT_TEMPLATE, GENERATION_CONFIG, TOKENIZER_CONFIG, HFDirectory, open_directory
from specformer_hf.rules import Site, sites_of

# The checkpoint header keys written here (FAMILY_KEY, CONFIG_KEY, ...) are specformer_text's: tokenizer attachment,
# chat templates and turn ends read them too, and export reads them back.


@dataclass
class Imported:
    """What an import produced: the model, its family, the original config and the tokenizer if any."""

    model: specformer.Decoder
    family: Family
    config: dict[str, Any]
    spec: dict[str, Any]  # the spec as the family wrote it (compact; model.spec is the validated form)
    # ByteTokenizer: the folder held the byte tokenizer's own tokenizer.json; NoTokenizer: none (text is refused later)
    tokenizer: BPETokenizer | ByteTokenizer | NoTokenizer
    notes: list[str] = field(default_factory=list)
    generation_config: dict[str, Any] | None = None  # the folder's generation_config.json, exported back
    tokenizer_config: dict[str, Any] | None = None  # the folder's tokenizer_config.json, with its own tokenizer

    @property
    def has_tokenizer(self) -> bool:
        return not isinstance(self.tokenizer, NoTokenizer)

    def metadata(self) -> dict[str, str]:
        """Checkpoint header entries that let export reproduce the original config and tokenizer."""
        out = {FAMILY_KEY: self.family.model_type, CONFIG_KEY: json.dumps(self.config, sort_keys=True),
               METADATA_KEY: self.tokenizer.to_json()}
        if self.generation_config is not None:
            out[GENERATION_CONFIG_KEY] = json.dumps(self.generation_config, sort_keys=True)
        if self.tokenizer_config is not None:
            out[TOKENIZER_CONFIG_KEY] = json.dumps(self.tokenizer_config, sort_keys=True)
        return out


def spec_from_config(config: dict[str, Any], *, families: Families | None = None) -> tuple[Family, dict[str, Any]]:
    """The family of a parsed ``config.json`` and the spec (``{"model": ...}``) it maps to."""
    family, spec, _ = _read_config(config, families=families)
    return family, spec


def _read_config(config: dict[str, Any], *, families: Families | None,
                 max_layers: int | None = None) -> tuple[Family, dict[str, Any], ConfigReader]:
    families = families or get_families()
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise UserError(f"config.json has no 'model_type' string (got {excerpt(model_type)}); cannot tell which family it is")
    family = families.get(model_type)
    reader = ConfigReader(config, defaults=family.defaults, family=family.name, max_layers=max_layers)
    try:
        model = family.to_spec(reader)
    except TooManyLayers as exc:
        raise UserError(f"{exc}{_defaults_hint(family, reader)}") from None
    except (ArithmeticError, TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        # A value of the wrong type or range that the family's own checks did not name: still one clear line.
        raise UserError(f"{family.name}: config.json holds a value this family cannot read "
                        f"({type(exc).__name__}: {str(exc)[:200]}); check its sizes and types") from None
    reader.warn_unread(also_harmless=family.non_math_fields)
    return family, {"model": model}, reader


def _defaults_hint(family: Family, reader: ConfigReader) -> str:
    """Left-out size fields take transformers' defaults (a 7B model for Llama): say so when something does not fit."""
    defaulted = sorted(k for k in reader.read if not reader.has(k) and isinstance(reader.defaults.get(k), int)
                       and not isinstance(reader.defaults.get(k), bool))
    if not defaulted:
        return ""
    return (f"; config.json leaves out {', '.join(defaulted)}, so transformers' {family.name} defaults were "
            f"assumed ({', '.join(f'{k}={reader.defaults[k]}' for k in defaulted)}): set them to the model's sizes")


def import_hf(
    path: str | Path,
    *,
    families: Families | None = None,
    dtype: torch.dtype | None = None,
    tokenizer: str | Path | None = None,
    eos_token: str | None = None,
) -> Imported:
    """Read a local Hugging Face model directory into a specformer Decoder (weights converted exactly).

    The stored tensors' shapes and dtypes (from the safetensors headers) are checked against
    the config on a model skeleton that holds no memory, so a config that does not describe
    the weights is refused before anything of its size is allocated. ``tokenizer`` is a
    tokenizer.json (or a folder holding one) to use instead of the directory's own;
    ``eos_token`` names its end-of-text token (default: the config's ``eos_token_id``,
    else ``<|endoftext|>``). Without any, the result records that there is no tokenizer.
    """
    directory = open_directory(path)
    family, spec, reader = _read_config(directory.config, families=families, max_layers=len(directory.files))
    mtp_notes = _without_absent_mtp(family, directory, spec)
    # A bad --tokenizer fails here, before the weights are read.
    tokenizer_result = _tokenizer(directory, spec, override=tokenizer, eos_token=eos_token)
    _check_against_headers(family, directory, spec, reader)
    model = _build(family, directory, spec, init=False)  # allocated once: every tensor comes from the files
    tensors = convert_weights(family, directory, model)
    load_weights(model, tensors, where=str(directory.path))
    if dtype is not None:
        model = model.to(dtype=dtype)
    model.eval()
    # For export: write the model back as the family it came from (when it still fits), with its token ids.
    model.hf_config = directory.config
    generation = directory.optional_json(GENERATION_CONFIG)
    model.hf_generation_config = generation
    found, notes = tokenizer_result
    notes = mtp_notes + notes
    # Its chat template, padding side and special tokens belong to the folder's own tokenizer only.
    settings = _tokenizer_settings(directory) if tokenizer is None and not isinstance(found, NoTokenizer) else None
    model.hf_tokenizer_config = settings
    return Imported(model=model, family=family, config=directory.config, spec=spec, tokenizer=found, notes=notes,
                    generation_config=generation, tokenizer_config=settings)


def _without_absent_mtp(family: Family, directory: HFDirectory, spec: dict[str, Any]) -> list[str]:
    """Drop ``model.mtp`` (in place) when the config counts MTP depths but the file has none of their own tensors.

    transformers builds no MTP module, and its save_pretrained keeps the count in config.json while
    leaving the tensors out: such a folder imports as the model without its depths, with a note
    (a warning). A file with some of a depth's tensors is converted as usual, which names the missing ones.
    """
    model = spec["model"]
    mtp, n_layers = model.get("mtp"), model.get("n_layers")
    if mtp is None or not isinstance(n_layers, int):
        return []
    probe = Site(None, n_layers, 0, family.mtp_layer)  # the first depth's own tensors (its norms and projection) name no module
    own = [probe.hf_name(name) for rule in family.weights if rule.per_depth for name in rule.hf]
    available = set(directory.names())
    if any(name in available for name in own):
        return []
    del model["mtp"]
    note = (f"{directory.path}: config.json counts {mtp['depths']} multi-token prediction depth(s), but the weights "
            f"hold none of their tensors (e.g. {own[0] if own else '?'}; transformers' save_pretrained leaves them "
            "out), so the model is imported without model.mtp")
    warnings.warn(note, UserWarning, stacklevel=3)
    return [note]


def _tokenizer_settings(directory: HFDirectory) -> dict[str, Any] | None:
    """tokenizer_config.json, with the chat template newer transformers keep beside it in chat_template.jinja."""
    settings = directory.optional_json(TOKENIZER_CONFIG)
    template = directory.optional_text(CHAT_TEMPLATE)
    if template is not None:
        settings = settings or {}
        settings.setdefault("chat_template", template)  # transformers reads it from tokenizer_config.json too
    return settings


def _build(family: Family, directory: HFDirectory, spec: dict[str, Any], *, device: str | None = None,
           init: bool = True) -> Any:
    try:
        return specformer.build(spec, device=device, init=init)
    except SpecError as exc:
        raise UserError(
            f"{directory.path}: the {family.name} config maps to a spec specformer rejects:\n{exc}"
        ) from None


def _check_against_headers(family: Family, directory: HFDirectory, spec: dict[str, Any], reader: ConfigReader) -> None:
    """UserError unless the config describes the stored tensors: checked on the meta device (no memory)."""
    hint = _defaults_hint(family, reader)
    n_layers = spec["model"].get("n_layers")
    if isinstance(n_layers, int) and n_layers > len(directory.files):
        # Every family stores at least one tensor per layer; this also keeps a huge layer count off the builder.
        raise UserError(
            f"{directory.path}: config.json describes {n_layers} layers, but the weights hold only "
            f"{len(directory.files)} tensors{hint}"
        )
    skeleton = _build(family, directory, spec, device="meta")
    try:
        convert_weights(family, directory, skeleton, read=directory.placeholders)
    except UserError as exc:
        raise UserError(f"{exc}{hint}") from None


def from_hf(path: str | Path, *, dtype: torch.dtype | None = None) -> specformer.Decoder:
    """The Decoder of a local Hugging Face model directory (``config.json`` + safetensors weights)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*has no tokenizer.json")  # only the model is asked for
        return import_hf(path, dtype=dtype).model


# -- weights --------------------------------------------------------------------------------


def convert_weights(
    family: Family,
    directory: HFDirectory,
    model: Any,
    *,
    read: Callable[..., dict[str, torch.Tensor]] | None = None,
) -> dict[str, torch.Tensor]:
    """Our state dict from the directory's tensors; UserError naming every missing, extra or mis-shaped one.

    ``read`` loads tensors by name (default: their data); ``directory.placeholders`` checks the
    mapping on meta tensors with the stored shapes instead, reading no data.
    """
    read = read or directory.read
    expected = model.state_dict()
    available = set(directory.names())
    consumed: set[str] = set()
    missing: list[str] = []
    misshaped: list[str] = []
    differing: list[str] = []
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
        for site in sites_of(rule, model, depth_layer=family.mtp_layer):
            # A rule with several checkpoint layouts (per-expert or fused experts) reads the one the file has.
            chosen, hf_names, our_names = rule.for_import(site, lambda name: locate(name) is not None)
            if not all(name in expected for name in our_names):
                continue  # the spec has no such parameter (a bias it leaves out): nothing to fill
            jobs.append((chosen, site, hf_names, our_names))

    for rule, site, hf_names, our_names in tqdm(jobs, desc="converting weights", unit="rule", disable=None, leave=False):
        found = {name: locate(name) for name in hf_names}
        absent = [name for name, where in found.items() if where is None]
        if absent:
            missing += absent
            continue
        located = [found[name] for name in hf_names]
        # An integer table of ours (hash routing's token -> experts) is filled from an integer tensor.
        integers = frozenset(located) if not any(expected[n].is_floating_point() for n in our_names) else frozenset()
        tensors = read(located, integers=integers)
        consumed.update(located)
        try:
            converted = rule.to_ours([tensors[name] for name in located], site)
        except (RuntimeError, ValueError, IndexError):
            # Stored shapes the rule cannot even combine (a 0-d tensor to concatenate, a size to split unevenly).
            shapes = ", ".join(f"{n} {tuple(tensors[n].shape)}" for n in located)
            misshaped.append(f"{shapes} -> {', '.join(our_names)} needs {', '.join(str(tuple(expected[n].shape)) for n in our_names)}")
            continue
        for name, tensor in zip(our_names, converted):
            if tuple(tensor.shape) != tuple(expected[name].shape):
                shapes = ", ".join(f"{n} {tuple(tensors[n].shape)}" for n in located)
                misshaped.append(f"{shapes} -> {name} needs {tuple(expected[name].shape)}, got {tuple(tensor.shape)}")
            elif name in out and not tensor.is_meta and not torch.equal(out[name], tensor):
                # A checkpoint that stores one of ours twice (an MTP depth's copy of the shared head) must agree.
                differing.append(f"{', '.join(located)} and the tensor read before it for {name}")
            out[name] = tensor

    head = locate(family.head_tensor)
    if model.lm_head is None and head is not None and head not in consumed:
        embedding = out.get("embedding.weight")
        if embedding is not None:
            stored = read([head])[head]
            if stored.shape != embedding.shape or (not stored.is_meta and not torch.equal(stored, embedding)):
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
    if differing:
        problems.append("tensors that hold one parameter twice but differ: " + _listing(differing, sep="; "))
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


def _tokenizer(directory: HFDirectory, spec: dict[str, Any], *, override: str | Path | None,
               eos_token: str | None) -> tuple[BPETokenizer | ByteTokenizer | NoTokenizer, list[str]]:
    """The tokenizer to store: ``override``, else the folder's tokenizer.json, else the record of none (with a warning)."""
    vocab_size = spec["model"]["vocab_size"]
    if override is not None:
        return load_tokenizer_json(override, config=directory.config, vocab_size=vocab_size, eos_token=eos_token), []
    path = directory.tokenizer_path
    if path is None:
        note = (f"{directory.path}: has no tokenizer.json, so the checkpoint records that it has no tokenizer and "
                "works on token ids only (text prompts are refused); give one with --tokenizer PATH, or later with "
                "`specformer hf attach-tokenizer CHECKPOINT TOKENIZER.json`")
    else:
        try:
            return load_tokenizer_json(path, config=directory.config, vocab_size=vocab_size, eos_token=eos_token), []
        except UserError as exc:
            note = (f"{exc}; the checkpoint records that it has no tokenizer (give one with --tokenizer PATH, "
                    "or later with `specformer hf attach-tokenizer`)")
    warnings.warn(note, UserWarning, stacklevel=3)
    return no_tokenizer(directory.config, vocab_size=vocab_size), [note]


__all__ = ["Imported", "convert_weights", "from_hf", "import_hf", "spec_from_config"]
