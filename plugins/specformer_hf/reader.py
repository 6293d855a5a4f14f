"""Reading a local Hugging Face model directory: config, safetensors weights (one file or shards), tokenizer.

Only local files are read; nothing here can reach the network. Pickled weights
(``pytorch_model.bin``) are refused: loading them runs arbitrary code. Every file read
must lie inside the model folder: a shard index naming ``../x`` or ``/abs/x``, or a
symbolic link pointing elsewhere, is refused rather than followed. The one exception is
the Hugging Face cache's own layout, where ``snapshots/REV/NAME`` links to the same
repository's ``blobs/`` folder.

Each tensor's dtype and shape come from the safetensors headers alone, so a folder can
be checked against its config before any weights are read or any model is allocated.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from specformer.errors import UserError

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
TOKENIZER = "tokenizer.json"
GENERATION_CONFIG = "generation_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE = "chat_template.jinja"  # where transformers >= 4.50 saves the chat template
#: generation_config.json is a few hundred bytes, tokenizer_config.json rarely past 100 KB (chat templates).
MAX_SETTINGS_BYTES = 4 << 20


#: safetensors dtype names of floating-point tensors, the only kind a weight can be.
FLOAT_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
#: Integer tensors a checkpoint may hold where the model has an integer table (DeepSeek-V4's token-to-expert map).
INTEGER_DTYPES = {"I64": torch.int64, "I32": torch.int32}


@dataclass(frozen=True)
class Header:
    """What a safetensors header says about one tensor, before its data is read."""

    dtype: str  # the safetensors name: F32, BF16, I64, BOOL, ...
    shape: tuple[int, ...]


@dataclass
class HFDirectory:
    """A model directory on disk: its parsed config, where each tensor lives and what its header says."""

    path: Path
    config: dict[str, Any]
    files: dict[str, Path]  # tensor name -> the safetensors file holding it
    headers: dict[str, Header]

    @property
    def tokenizer_path(self) -> Path | None:
        path = self.path / TOKENIZER
        return inside(self.path, path, what=TOKENIZER) if path.is_file() else None

    def optional_text(self, name: str) -> str | None:
        """The folder's text file ``name`` (chat_template.jinja) if it has a readable one; else None, with a warning."""
        path = self.path / name
        if not path.is_file():
            return None
        try:
            resolved = inside(self.path, path, what=name)
            if resolved.stat().st_size > MAX_SETTINGS_BYTES:
                raise UserError(f"larger than {MAX_SETTINGS_BYTES} bytes")
            return resolved.read_text(encoding="utf-8")
        except (UserError, OSError, UnicodeDecodeError) as exc:
            warnings.warn(f"{path}: ignored, not a readable {name} ({str(exc)[:200]})", UserWarning, stacklevel=2)
            return None

    def optional_json(self, name: str) -> dict[str, Any] | None:
        """The folder's ``name`` (generation_config.json, tokenizer_config.json) if it has a usable one.

        These only carry settings to pass on at export, so a broken one is reported as a
        warning and left out rather than failing the import.
        """
        path = self.path / name
        if not path.is_file():
            return None
        try:
            resolved = inside(self.path, path, what=name)
            if resolved.stat().st_size > MAX_SETTINGS_BYTES:
                raise UserError(f"larger than {MAX_SETTINGS_BYTES} bytes")
            data = json.loads(resolved.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise UserError(f"expected a JSON object, got {type(data).__name__}")
        except (UserError, OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            warnings.warn(f"{path}: ignored, not a usable {name} ({str(exc)[:200]})", UserWarning, stacklevel=2)
            return None
        return data

    def names(self) -> list[str]:
        return sorted(self.files)

    def check_floating(self, names: list[str], *, integers: frozenset[str] = frozenset()) -> None:
        """UserError naming each tensor whose stored dtype is not floating point (ids, masks, packed integers).

        ``integers``: names that may be integer (they fill an integer table of the model).
        """
        bad = [f"{name} ({self.headers[name].dtype})" for name in names if self.headers[name].dtype not in FLOAT_DTYPES
               and not (name in integers and self.headers[name].dtype in INTEGER_DTYPES)]
        if bad:
            raise UserError(
                f"{self.path}: weights must be floating point ({', '.join(sorted(FLOAT_DTYPES))}), but these are not: "
                f"{', '.join(bad[:8])}{f' and {len(bad) - 8} more' if len(bad) > 8 else ''}; an integer or bool tensor "
                "here is a quantized or corrupted file, which specformer does not convert"
            )

    def placeholders(self, names: list[str], *, integers: frozenset[str] = frozenset()) -> dict[str, torch.Tensor]:
        """Meta tensors with the stored shapes and dtypes: for checking a mapping without reading any data."""
        self.check_floating(names, integers=integers)
        dtypes = {**FLOAT_DTYPES, **INTEGER_DTYPES}
        return {name: torch.empty(self.headers[name].shape, dtype=dtypes[self.headers[name].dtype], device="meta")
                for name in names}

    def read(self, names: list[str], *, integers: frozenset[str] = frozenset()) -> dict[str, torch.Tensor]:
        """Load the named tensors (floating point, or integer where ``integers`` allows), opening each shard once."""
        self.check_floating(names, integers=integers)
        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self.files[name], []).append(name)
        out = {}
        for file, wanted in by_file.items():
            try:
                with safe_open(str(file), framework="pt") as f:
                    for name in wanted:
                        out[name] = f.get_tensor(name)
            except Exception as exc:
                raise UserError(f"{file}: cannot read tensors ({type(exc).__name__}: {exc})") from None
        return out


def open_directory(path: str | Path) -> HFDirectory:
    """Parse ``path``'s config.json and index its safetensors weights; UserError naming what is missing."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path}: not a directory; expected a Hugging Face model directory with {CONFIG} and {WEIGHTS}")
    config_path = path / CONFIG
    if not config_path.is_file():
        raise UserError(f"{path}: no {CONFIG}; expected a Hugging Face model directory saved with save_pretrained()")
    try:
        config = json.loads(inside(path, config_path, what=CONFIG).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise UserError(f"{config_path}: not valid JSON ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(config, dict):
        raise UserError(f"{config_path}: expected a JSON object, got {type(config).__name__}")
    files = _index_weights(path)
    return HFDirectory(path=path, config=config, files=files, headers=_headers(files))


def inside(folder: Path, file: Path, *, what: str) -> Path:
    """``file`` resolved, if it stays inside ``folder`` (or the HF cache blobs of its repository); else UserError."""
    resolved, root = file.resolve(), folder.resolve()
    roots = [root]
    if root.parent.name == "snapshots":  # ~/.cache/huggingface/hub/models--org--name/snapshots/REV
        roots.append(root.parent.parent / "blobs")
    if not any(resolved.is_relative_to(r) for r in roots):
        raise UserError(f"{folder}: {what} leads outside the model folder (to {resolved}); refusing to read it")
    return resolved


def _headers(files: dict[str, Path]) -> dict[str, Header]:
    by_file: dict[Path, list[str]] = {}
    for name, file in files.items():
        by_file.setdefault(file, []).append(name)
    out = {}
    for file, names in by_file.items():
        try:
            with safe_open(str(file), framework="pt") as f:
                stored = set(f.keys())
                for name in names:
                    if name not in stored:
                        raise UserError(f"{file}: the index places tensor {name!r} in this file, but it is not there")
                    piece = f.get_slice(name)
                    out[name] = Header(dtype=piece.get_dtype(), shape=tuple(piece.get_shape()))
        except UserError:
            raise
        except Exception as exc:
            raise UserError(f"{file}: not a readable safetensors file ({type(exc).__name__}: {exc})") from None
    return out


def _index_weights(path: Path) -> dict[str, Path]:
    single, index = path / WEIGHTS, path / INDEX
    if index.is_file():
        return _shards(path, inside(path, index, what=INDEX))
    if single.is_file():
        single = inside(path, single, what=WEIGHTS)
        try:
            with safe_open(str(single), framework="pt") as f:
                return {name: single for name in f.keys()}
        except Exception as exc:
            raise UserError(f"{single}: not a readable safetensors file ({type(exc).__name__}: {exc})") from None
    shards = sorted(path.glob("*.safetensors"))
    if shards:
        raise UserError(
            f"{path}: has {', '.join(p.name for p in shards[:3])} but neither {WEIGHTS} nor {INDEX} saying which tensor is where"
        )
    if any(path.glob("*.bin")) or any(path.glob("*.pt")) or any(path.glob("*.pth")):
        raise UserError(
            f"{path}: only pickled PyTorch weights (*.bin/*.pt), which specformer never loads (unpickling runs code). "
            "Convert them to safetensors first, e.g. model.save_pretrained(dir, safe_serialization=True) in transformers."
        )
    raise UserError(f"{path}: no {WEIGHTS} (or sharded {INDEX}) found")


def _shards(path: Path, index: Path) -> dict[str, Path]:
    """Tensor name -> shard file from an index; each shard must be a plain file name inside ``path``."""
    expected = "an object {'weight_map': {tensor name: shard file name}}"
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise UserError(f"{index}: not valid JSON ({type(exc).__name__}: {str(exc)[:200]}); expected {expected}") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise UserError(f"{index}: 'weight_map' is missing or not an object (got {type(weight_map).__name__}); expected {expected}")
    files = {}
    resolved: dict[str, Path] = {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard:
            raise UserError(f"{index}: tensor {name!r} has shard {str(shard)[:80]!r}; expected a file name")
        if shard not in resolved:
            relative = Path(shard)
            if relative.is_absolute() or ".." in relative.parts or "\\" in shard:
                raise UserError(
                    f"{index}: tensor {name!r} is in shard {shard[:200]!r}, outside the model folder; "
                    "shards must be files of the folder itself, named relative to it"
                )
            shard_path = path / relative
            if not shard_path.is_file():
                raise UserError(f"{index}: tensor {name!r} is in shard {shard[:200]!r}, which is missing from {path}")
            resolved[shard] = inside(path, shard_path, what=f"shard {shard!r}")
        files[name] = resolved[shard]
    return files


__all__ = ["CONFIG", "FLOAT_DTYPES", "INTEGER_DTYPES", "CHAT_TEMPLATE", "GENERATION_CONFIG", "TOKENIZER_CONFIG", "HFDirectory", "Header", "INDEX", "TOKENIZER", "WEIGHTS", "inside", "open_directory"]
