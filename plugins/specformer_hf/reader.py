"""Reading a local Hugging Face model directory: config, safetensors weights (one file or shards), tokenizer.

Only local files are read; nothing here can reach the network. Pickled weights
(``pytorch_model.bin``) are refused: loading them runs arbitrary code.
"""

from __future__ import annotations

import json
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


@dataclass
class HFDirectory:
    """A model directory on disk: its parsed config and where each tensor lives."""

    path: Path
    config: dict[str, Any]
    files: dict[str, Path]  # tensor name -> the safetensors file holding it

    @property
    def tokenizer_path(self) -> Path | None:
        path = self.path / TOKENIZER
        return path if path.is_file() else None

    def names(self) -> list[str]:
        return sorted(self.files)

    def read(self, names: list[str]) -> dict[str, torch.Tensor]:
        """Load the named tensors, opening each shard once."""
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
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{config_path}: not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise UserError(f"{config_path}: expected a JSON object, got {type(config).__name__}")
    return HFDirectory(path=path, config=config, files=_index_weights(path))


def _index_weights(path: Path) -> dict[str, Path]:
    single, index = path / WEIGHTS, path / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise UserError(f"{index}: not a valid safetensors index (needs a 'weight_map' object): {exc}") from None
        files = {}
        for name, shard in weight_map.items():
            shard_path = path / shard
            if not shard_path.is_file():
                raise UserError(f"{index}: tensor {name!r} is in shard {shard!r}, which is missing from {path}")
            files[name] = shard_path
        return files
    if single.is_file():
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


__all__ = ["CONFIG", "HFDirectory", "INDEX", "TOKENIZER", "WEIGHTS", "open_directory"]
