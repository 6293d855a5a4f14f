"""Reading a Hugging Face ``config.json`` carefully.

A family reads the fields it understands through :class:`ConfigReader`, which fills
absent fields with the family's defaults (the defaults of the transformers config
class: ``save_pretrained`` may leave fields out), rejects values that would change
the model's maths in a way specformer does not reproduce, and remembers what was
read so that fields nobody looked at can be reported instead of silently ignored.
"""

from __future__ import annotations

import warnings
from typing import Any, Iterable, Mapping

from specformer.errors import UserError

_MISSING = object()

#: Fields of every transformers config that do not change what a forward pass computes:
#: token ids, training-only settings (dropout, init, auxiliary losses), bookkeeping.
NON_MATH_FIELDS = frozenset(
    {
        "_name_or_path", "architectures", "model_type", "transformers_version", "dtype", "torch_dtype",
        "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
        "initializer_range", "attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop",
        "classifier_dropout", "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
        "summary_first_dropout", "output_attentions", "output_hidden_states", "return_dict", "id2label",
        "label2id", "problem_type", "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder",
        "add_cross_attention", "tokenizer_class", "prefix", "task_specific_params", "finetuning_task",
        "pretraining_tp", "tie_encoder_decoder", "cross_attention_hidden_size", "output_router_logits",
        "router_aux_loss_coef", "router_jitter_noise", "reorder_and_upcast_attn", "use_bfloat16",
        "num_labels", "max_length", "min_length", "temperature", "top_k", "top_p", "repetition_penalty",
        "do_sample", "num_beams", "torchscript", "pruned_heads", "tf_legacy_loss", "use_return_dict",
    }
)


class TooManyLayers(UserError):
    """config.json describes more layers than the folder holds tensors (at least one per layer)."""


class UnreadConfigWarning(UserWarning):
    """A config.json field no family rule read: it is reported, never silently dropped."""


class ConfigReader:
    """The fields of one ``config.json``, read with the family's defaults and checks.

    ``get(key)`` returns the value (the default when the file leaves it out);
    ``require(key, allowed, why=...)`` refuses values specformer cannot reproduce.
    """

    def __init__(self, data: Mapping[str, Any], *, defaults: Mapping[str, Any], family: str,
                 max_layers: int | None = None) -> None:
        self.data = dict(data)
        self.defaults = dict(defaults)
        self.family = family
        self.max_layers = max_layers  # when reading a folder: its tensor count (every layer has at least one)
        self.read: set[str] = set()
        self.unused: list[str] = []

    def has(self, key: str) -> bool:
        """Whether the file itself sets ``key`` (to anything, None included)."""
        return key in self.data

    def get(self, key: str, default: Any = _MISSING) -> Any:
        self.read.add(key)
        if key in self.data:
            return self.data[key]
        if key in self.defaults:
            return self.defaults[key]
        if default is not _MISSING:
            return default
        raise UserError(f"{self.family}: config.json has no {key!r} field and it has no default; the file looks incomplete")

    def get_int(self, key: str, default: Any = _MISSING) -> int:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{self.family}: config field {key!r} must be an integer, got {value!r}")
        return value

    def get_size(self, key: str, default: Any = _MISSING) -> int:
        """``get_int`` for a count or width, which must be at least 1 (it is divided by, or sizes a tensor)."""
        value = self.get_int(key, default)
        if value < 1:
            raise UserError(f"{self.family}: config field {key!r} must be a positive integer, got {value!r}")
        return value

    def get_width_and_heads(self, width: str, heads: str, *, model: str) -> tuple[int, int]:
        """The model width and its head count, for a ``model`` whose heads split the width evenly."""
        d_model, n_heads = self.get_size(width), self.get_size(heads)
        if d_model % n_heads:
            raise UserError(f"{self.family}: config field {width!r} = {d_model} is not a multiple of {heads!r} = "
                            f"{n_heads}; {model}'s heads split the model width evenly")
        return d_model, n_heads

    def get_layers(self, key: str) -> int:
        """The layer count: a positive integer, and no more than the folder's tensors could hold.

        Checked here, before a family builds anything per layer, so that a forged count
        (``num_hidden_layers: 10**18``) costs nothing.
        """
        value = self.get_size(key)
        if self.max_layers is not None and value > self.max_layers:
            raise TooManyLayers(
                f"{self.family}: config.json describes {value} layers ({key}), but the weights hold only "
                f"{self.max_layers} tensors"
            )
        return value

    def get_float(self, key: str, default: Any = _MISSING) -> float:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{self.family}: config field {key!r} must be a number, got {value!r}")
        return float(value)

    def require(self, key: str, allowed: Iterable[Any], *, why: str, default: Any = _MISSING) -> Any:
        """``get(key)``, refusing any value outside ``allowed``; ``why`` says what the field does."""
        value = self.get(key, default)
        allowed = list(allowed)
        if value not in allowed:
            shown = ", ".join(repr(a) for a in allowed)
            raise UserError(
                f"{self.family}: config field {key!r} = {value!r} is not supported: {why}. "
                f"Supported value{'s' if len(allowed) > 1 else ''}: {shown}"
            )
        return value

    def mark_read(self, *keys: str) -> None:
        self.read.update(keys)

    def note_unused(self, what: str) -> None:
        """Report a setting inside a field (a rope parameter) that nothing reads."""
        self.unused.append(what)

    def unread(self, *, also_harmless: Iterable[str] = ()) -> list[str]:
        harmless = NON_MATH_FIELDS | set(also_harmless)
        return sorted(k for k in self.data if k not in self.read and k not in harmless) + self.unused

    def warn_unread(self, *, also_harmless: Iterable[str] = ()) -> list[str]:
        unread = self.unread(also_harmless=also_harmless)
        if unread:
            warnings.warn(
                f"{self.family}: config.json fields not understood by specformer and ignored: "
                f"{', '.join(unread)}. If any of them changes the model, the import is not faithful.",
                UnreadConfigWarning,
                stacklevel=3,
            )
        return unread


# -- activations ----------------------------------------------------------------------

#: transformers' ACT2FN names -> specformer activation names (same function up to rounding).
ACTIVATIONS_FROM_HF = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "relu": "relu",
    "relu2": "relu2",
    "silu": "silu",
    "swish": "silu",
}

#: specformer activation -> the name written to an exported config.json.
ACTIVATIONS_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu", "relu2": "relu2", "silu": "silu"}


def activation_from_hf(cfg: ConfigReader, key: str) -> str:
    name = cfg.get(key)
    if not isinstance(name, str) or name not in ACTIVATIONS_FROM_HF:
        raise UserError(
            f"{cfg.family}: config field {key!r} = {name!r} is an activation specformer does not implement; "
            f"supported: {', '.join(sorted(ACTIVATIONS_FROM_HF))}"
        )
    return ACTIVATIONS_FROM_HF[name]


# -- rope parameters ------------------------------------------------------------------


def rope_parameters(cfg: ConfigReader, *, theta_key: str = "rope_theta", extra_legacy: Mapping[str, str] = {}) -> dict[str, Any]:
    """The rope settings in transformers 5 form (``rope_type``, ``rope_theta``, ...), whatever the file's vintage.

    transformers 5 writes ``rope_parameters``; older files have a top-level
    ``rope_theta`` and a ``rope_scaling`` dict (whose type key may be ``type``).
    ``extra_legacy`` maps other legacy top-level keys to rope parameter names (GPT-NeoX's
    ``rotary_pct`` -> ``partial_rotary_factor``). When a file has both forms, transformers
    5 lets ``rope_scaling`` win, and so do we.
    """
    params: dict[str, Any] = {}
    cfg.mark_read("rope_parameters", "rope_scaling", theta_key, *extra_legacy)
    stored = cfg.data.get("rope_parameters")  # the family's defaults are applied last, below
    if stored is not None and not isinstance(stored, dict):
        raise UserError(f"{cfg.family}: config field 'rope_parameters' must be a mapping, got {stored!r}")
    legacy_scaling = cfg.data.get("rope_scaling")
    if legacy_scaling is not None and not isinstance(legacy_scaling, dict):
        raise UserError(f"{cfg.family}: config field 'rope_scaling' must be a mapping or null, got {legacy_scaling!r}")
    params.update(legacy_scaling or stored or {})
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    params.pop("type", None)
    if cfg.has(theta_key):
        params.setdefault("rope_theta", cfg.data[theta_key])
    for legacy, name in extra_legacy.items():
        if cfg.has(legacy):
            params.setdefault(name, cfg.data[legacy])
    for name, value in (cfg.defaults.get("rope_parameters") or {}).items():
        params.setdefault(name, value)
    params.setdefault("rope_type", "default")
    return params
