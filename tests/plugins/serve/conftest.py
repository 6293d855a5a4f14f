"""Shared fixtures: a tiny random byte-level model saved as a checkpoint, and a server on a free localhost port."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterator

import pytest

import specformer
from specformer.tokenizers.tokenizer import ByteTokenizer
from specformer_serve.app import ServeConfig
from specformer_serve.chat_template import PLAIN, renderer_for
from specformer_serve.engine import Engine
from specformer_serve.server import Server

BYTES = ByteTokenizer()
EOT = BYTES.eot_id
MODEL_ID = "tiny"

#: Untied head and a wide init, so continuations vary with what the model reads (a token
#: comparison on a model that repeats its last token would pass for wrong code).
SPEC: dict[str, Any] = {
    "model": {
        "vocab_size": 259,
        "d_model": 32,
        "n_layers": 2,
        "context_length": 96,
        "tie_embeddings": False,
        "init_std": 0.4,
        "positional": {"kind": "rope"},
        "block": {
            "layout": "prenorm",
            "norm": {"kind": "rmsnorm"},
            "attention": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2},
            "ffn": {"kind": "swiglu", "hidden": 64},
        },
    }
}


def tiny_spec(**model_changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(SPEC)
    data["model"].update(model_changes)
    return data


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("serve") / "tiny.safetensors"
    specformer.save(specformer.build(SPEC, seed=0), path)
    return path


@pytest.fixture(scope="session")
def model(checkpoint: Path) -> Any:
    return specformer.load(checkpoint).eval()


def make_server(model: Any, *, eos: bool = True, api_key: str | None = None, max_batch: int = 16,
                num_blocks: int = 256, block_size: int = 8, config: dict[str, Any] | None = None,
                **server_options: Any) -> Server:
    """A server for ``model``; ``config`` changes ServeConfig fields, ``server_options`` go to Server."""
    settings = dict(model_id=MODEL_ID, tokenizer=BYTES, render_chat=renderer_for(PLAIN),
                    eos=frozenset([EOT]) if eos else frozenset(), api_key=api_key)
    settings.update(config or {})
    engine = Engine(model, max_batch=max_batch, num_blocks=num_blocks, block_size=block_size)
    return Server(engine, ServeConfig(**settings), **server_options)


@pytest.fixture(scope="module")
def server(model: Any) -> Iterator[Server]:
    """One server for a test module (its engine's counters are shared: assert on differences)."""
    with make_server(model) as running:
        yield running
