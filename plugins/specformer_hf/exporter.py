"""Export: a Decoder -> a Hugging Face model directory.

It holds config.json, model.safetensors and generation_config.json, plus tokenizer.json
and tokenizer_config.json when the model has a tokenizer (a BPE one as it is; the byte
tokenizer as :mod:`specformer.tokenizers.byte_file` writes it): what transformers'
``pipeline("text-generation", DIR)`` needs as it is.

The family is chosen by trying each one: its ``to_config`` writes the config, which is
then read back with the same family and compared with the spec on everything that
changes the maths. Only a family that reproduces the spec exactly is used; when
none does, the error names, for each family, the part of the spec it cannot express.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from specformer.checkpoint.save_load import write_safetensors_atomic
from specformer.errors import SpecError, UserError
from specformer.tokenizers.byte_file import BYTE_TOKENIZER_SETTINGS, byte_tokenizer_json
from specformer.files.outputs import check_folder_output, staged_folder
from specformer.spec import load_spec
from specformer.tokenizers.tokenizer import SPECIAL_TOKENS
from specformer.tokenizers.choice import checkpoint_tokenizer
from specformer_text import TOKEN_ID_FIELDS, special_token_ids, tokenizer_config

from specformer_hf.config import NON_MATH_FIELDS, ConfigReader
from specformer_hf.family import Families, Family, get_families
from specformer_hf.reader import CONFIG, TOKENIZER, WEIGHTS
from specformer_hf.rules import sites_of

GENERATION_CONFIG = "generation_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
from specformer_hf.refusal import no_family
from specformer_hf.specview import ExportsAs, NotExpressible, SpecView, describe_differences, differences, math_view


def hf_config(family: Family, view: SpecView) -> dict[str, Any]:
    """The config.json fields of ``view`` in ``family``; NotExpressible naming the part it cannot hold."""
    fields = family.to_config(view)
    config = {"architectures": [family.architecture], "model_type": family.model_type, **fields}
    try:
        back = {"model": family.to_spec(ConfigReader(config, defaults=family.defaults, family=family.name))}
        back_spec = load_spec(back)
    except (UserError, SpecError) as exc:
        raise NotExpressible("", f"the {family.name} config made from this spec does not read back ({exc})") from None
    diffs = differences(math_view(view.spec), math_view(back_spec))
    if diffs:
        described = describe_differences(diffs, view.n_layers)
        raise NotExpressible("", "; ".join(line for _, line in described) + f": no equivalent in Hugging Face {family.name}",
                             parts=list(dict.fromkeys(path for path, _ in described)))
    return config


#: Fields of a source generation_config.json that describe the file, not the settings.
_NOT_KEPT_GENERATION = ("transformers_version", "_from_model_config")

#: Fields of the source config that describe the source file, not this export.
_NOT_KEPT = ("architectures", "model_type", "dtype", "torch_dtype", "transformers_version", "_name_or_path")


def choose_family(view: SpecView, families: Families, *, prefer: str | None = None, only: str | None = None) -> tuple[Family, dict[str, Any]]:
    """The first family (``only`` if given, else ``prefer`` then all) that expresses ``view`` exactly, and its config."""
    if only is not None:
        family = families.by_name(only)
        try:
            return family, hf_config(family, view)
        except NotExpressible as exc:
            raise UserError(f"this spec cannot be exported as Hugging Face {family.name} ({family.model_type}): {exc}") from None
    candidates = list(families)
    if prefer is not None and prefer in families.model_types():
        first = families.get(prefer)
        candidates = [first] + [f for f in candidates if f is not first]
    refused = []
    while candidates:
        family = candidates.pop(0)
        try:
            return family, hf_config(family, view)
        except ExportsAs as exc:
            # No reason of its own: the family it exports through is tried next, or was tried, or is among the rest.
            target = families.get(exc.target) if exc.target in families.model_types() else None
            if target is not None and any(f is target for f in candidates):
                candidates = [target] + [f for f in candidates if f is not target]
        except NotExpressible as exc:
            refused.append((family, exc))
    raise no_family(refused, view.spec.to_dict())


def to_hf(
    model: Any,
    path: str | Path,
    *,
    family: str | None = None,
    prefer: str | None = None,
    base_config: dict[str, Any] | None = None,
    tokenizer: Any = None,
    families: Families | None = None,
    force: bool = False,
    generation_config: dict[str, Any] | None = None,
    tokenizer_settings: dict[str, Any] | None = None,
    inputs: Sequence[str | Path] = (),
) -> Path:
    """Write ``model`` as a Hugging Face directory loadable by ``AutoModelForCausalLM.from_pretrained``.

    ``family`` forces a family (model_type or name); otherwise the first that expresses
    the spec exactly is used, trying ``prefer`` first. Non-architectural fields of
    ``base_config`` (token ids and the like) are kept. Both default to what a model made
    by :func:`~specformer_hf.import_hf` came from. A ``tokenizer`` wrapping a ``tokenizers``
    tokenizer (specformer's BPE tokenizer), or the byte tokenizer, is written as tokenizer.json
    with a tokenizer_config.json naming its special tokens; without one, the model's tokenizer
    is what :func:`~specformer.tokenizers.choice.checkpoint_tokenizer` decides for a checkpoint
    with no tokenizer entry (the byte tokenizer for its 259-token vocabulary, else none).
    generation_config.json is the
    source's ``generation_config`` (default: the one import_hf read) with the bos/eos/pad
    ids it leaves out filled in from the config (the source's, else the tokenizer's).
    ``tokenizer_settings`` is the source's tokenizer_config.json (default: the one import_hf
    read with the folder's own tokenizer): written with ``tokenizer``, its chat template,
    padding side and special tokens win over the ones made here.

    The folder is written complete or not at all (see :mod:`specformer.files.outputs`): one that
    already holds files is refused, or with ``force`` replaced once the new one is complete;
    one that is or holds any of ``inputs`` (the checkpoint ``model`` came from) is refused.
    """
    spec = getattr(model, "spec", None)
    if spec is None:
        raise UserError("the model has no .spec; build it with specformer.build() or load it with specformer.load()")
    view = SpecView.of(spec)
    if tokenizer is None:
        tokenizer = checkpoint_tokenizer({}, vocab_size=model.vocab_size, where="the model", ids_only=True)
    if base_config is None:
        base_config = getattr(model, "hf_config", None) or {}  # set by import_hf
    prefer = prefer or base_config.get("model_type")
    check_folder_output(path, inputs=inputs, force=force)  # before any work: a refusal here costs nothing
    chosen, config = choose_family(view, families or get_families(), prefer=prefer, only=family)

    # Token ids are not part of the spec: keep the source's, else say there are none, because a
    # family's defaults (Phi-3's pad id 32000, say) may not even exist in this vocabulary.
    # A nested source (a multimodal config.json, Emu3's) keeps its language model's ids in text_config.
    inner = base_config.get("text_config")
    nested = inner if isinstance(inner, dict) else {}
    kept = {k: v for k, v in {**nested, **base_config}.items() if k in NON_MATH_FIELDS and k not in _NOT_KEPT}
    # Where the source says nothing, the stored tokenizer's own end, start and padding tokens fill in.
    from_tokenizer = special_token_ids(tokenizer, vocab_size=model.vocab_size)
    kept = {**{k: from_tokenizer.get(k) for k in TOKEN_ID_FIELDS}, **{k: v for k, v in kept.items() if v is not None}}
    dtypes = {t.dtype for t in model.state_dict().values() if t.is_floating_point()}
    dtype = {"dtype": str(dtypes.pop()).removeprefix("torch.")} if len(dtypes) == 1 else {}
    config = {**kept, **config, **dtype}
    if isinstance(config.get("text_config"), dict):
        # A family that writes its language model nested (Emu3): the text model reads its token ids there.
        config["text_config"] = {**{k: v for k, v in kept.items() if k in TOKEN_ID_FIELDS and v is not None},
                                 **config["text_config"]}

    with staged_folder(path, inputs=inputs, force=force) as stage:
        write_safetensors_atomic(hf_tensors(chosen, model), stage / WEIGHTS, {"format": "pt"})
        (stage / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        if generation_config is None:
            generation_config = getattr(model, "hf_generation_config", None) or {}  # set by import_hf
        generation = {k: v for k, v in generation_config.items() if k not in _NOT_KEPT_GENERATION}
        for k in TOKEN_ID_FIELDS:
            if generation.get(k) is None and config.get(k) is not None:
                generation[k] = config[k]
        (stage / GENERATION_CONFIG).write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        files = _tokenizer_files(tokenizer)
        if files is not None:
            text, names, own = files
            (stage / TOKENIZER).write_text(text, encoding="utf-8")
            if tokenizer_settings is None:
                tokenizer_settings = getattr(model, "hf_tokenizer_config", None) or {}  # set by import_hf
            settings = {**tokenizer_config(names, config, context_length=spec.model.context_length), **own,
                        **tokenizer_settings}
            (stage / TOKENIZER_CONFIG).write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return Path(path)


class _ByteSpecials:
    """``id_to_token`` for the byte tokenizer's special tokens: the names tokenizer_config.json gives them."""

    def id_to_token(self, i: int) -> str | None:
        return SPECIAL_TOKENS[i - 256] if 256 <= i < 256 + len(SPECIAL_TOKENS) else None


def _tokenizer_files(tokenizer: Any) -> tuple[str, Any, dict[str, Any]] | None:
    """tokenizer.json's text, what names its ids, and tokenizer_config.json entries of its own; None: no tokenizer."""
    if getattr(tokenizer, "kind", None) == "byte":
        return json.dumps(byte_tokenizer_json(), ensure_ascii=False), _ByteSpecials(), dict(BYTE_TOKENIZER_SETTINGS)
    inner = getattr(tokenizer, "inner", None)
    if inner is not None and hasattr(inner, "to_str"):
        return inner.to_str(), inner, {}
    return None


def hf_tensors(family: Family, model: Any) -> dict[str, torch.Tensor]:
    """The model's weights under the family's Hugging Face names (padded vocabulary rows dropped)."""
    state = {name: t.detach().cpu() for name, t in model.state_dict().items()}
    vocab = model.vocab_size
    for name in ("embedding.weight", "lm_head.weight", "lm_head.bias"):
        if name in state and state[name].shape[0] > vocab:
            state[name] = state[name][:vocab]  # padding rows exist only for matmul speed; no logit reads them
    out: dict[str, torch.Tensor] = {}
    consumed: set[str] = set()
    for rule in family.weights:
        for site in sites_of(rule, model, depth_layer=family.mtp_layer):
            hf_names, our_names = rule.expand_at(site)
            if not all(name in state for name in our_names):
                continue
            out.update(zip(hf_names, rule.to_hf([state[name] for name in our_names], site)))
            consumed.update(our_names)
    leftover = sorted(set(state) - consumed)
    if leftover:
        raise UserError(f"Hugging Face {family.name} has no place for these parameters: {', '.join(leftover)}")
    return _unshared(out)


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share memory (the parts of a split): give each its own storage."""
    seen: set[int] = set()
    out = {}
    for name, t in tensors.items():
        t = t.contiguous()
        key = t.untyped_storage().data_ptr()
        partial = t.untyped_storage().nbytes() != t.numel() * t.element_size()
        out[name] = t.clone() if key in seen or partial else t
        seen.add(key)
    return out


__all__ = ["choose_family", "hf_config", "hf_tensors", "to_hf"]
