"""Shared fixtures: a tiny random byte-level model saved as a checkpoint, and a server on a free localhost port."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

import specformer
from specformer.tokenizers.tokenizer import ByteTokenizer
from specformer_serve.app import ServeConfig
from specformer_serve.chat_template import PLAIN, renderer_for
from specformer_serve.engine import Engine
from specformer_serve.server import Server
from fixtures.tiny import tiny_spec

BYTES = ByteTokenizer()
EOT = BYTES.eot_id
MODEL_ID = "tiny"

#: Untied head and a wide init, so continuations vary with what the model reads (a token
#: comparison on a model that repeats its last token would pass for wrong code).
SERVED_MODEL: dict[str, Any] = {"vocab_size": 259, "context_length": 96, "tie_embeddings": False, "init_std": 0.4}
SERVED_BLOCK: dict[str, Any] = {"ffn": {"kind": "swiglu", "hidden": 64}}


def served_spec(**model_changes: Any) -> dict[str, Any]:
    """The served model's spec (the shared tiny spec, byte ids); ``model_changes`` replace model fields."""
    return tiny_spec(block=SERVED_BLOCK, **{**SERVED_MODEL, **model_changes})


SPEC: dict[str, Any] = served_spec()


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
