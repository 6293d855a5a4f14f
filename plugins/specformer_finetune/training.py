"""What the fine-tuning plugin does inside ``specformer train`` (through the train plugin's hooks).

- Before the optimizer is made, ``train.adapter`` is applied to the model loaded from
  ``train.init`` (the base is frozen, so the optimizer only sees the adapter's tensors)
  and the base checkpoint's path and SHA-256 are recorded.
- Each checkpoint's ``model.safetensors`` then stores the adapter's tensors only, with the
  adapter header (:mod:`specformer_finetune.adapter_file`): ``generate``, ``eval``,
  ``merge`` and ``hf export`` read it directly, and the run's final ``model.safetensors``
  is one too.
- On ``--resume`` the stored adapter tensors are completed with the base weights the run
  loaded again from ``train.init``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.checkpoint import read_metadata
from specformer.errors import CheckpointError, UserError
from specformer_finetune.adapter_file import adapter_metadata, base_reference
from specformer_finetune.apply import adapter_of, adapter_state, apply_adapter, is_adapter_tensor


def prepare_model(model: Any, config: Any, init: str | None) -> None:
    adapter = getattr(config, "adapter", None)
    if adapter is None:
        return
    if init is None:  # the config refuses it too; a direct caller may not have gone through it
        raise UserError("train.adapter trains on a base model's weights: set train.init (or --init)")
    try:
        info = apply_adapter(model, adapter)
    except ValueError as exc:  # a target matching no linear layer
        raise UserError(f"train.adapter: {exc}") from None
    info.base = base_reference(init)


def saved_weights(model: Any, weights: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, str]] | None:
    if adapter_of(model) is None:
        return None
    kept = {name: t for name, t in weights.items() if is_adapter_tensor(model, name)}
    base = adapter_of(model).base
    return kept, adapter_metadata(model, path, read_metadata(base["path"]) if base else None)


def resumed_weights(model: Any, weights: dict[str, Any]) -> dict[str, Any] | None:
    if adapter_of(model) is None:
        return None
    expected = set(adapter_state(model))
    if set(weights) != expected:
        other = sorted(set(weights) ^ expected)
        raise CheckpointError(f"the checkpoint does not hold this run's adapter (differs in {', '.join(other[:4])}"
                              f"{' ...' if len(other) > 4 else ''}); resume with the adapter the run started with")
    return {**model.state_dict(), **weights}


@dataclass
class ChatTraining:
    """The rows of a chat corpus as the train plugin's ``specformer_train_rows`` hook returns them."""

    tokenizer: Any
    train_rows: Any
    val_rows: Any
    description: str
    n_tokens: int | None  # None (and n_train) when streamed: unknown until the file is read
    n_train: int | None
    n_val: int
    record: dict[str, Any]


def chat_rows(config: Any, tokenizer: Any, *, seq_len: int, metadata: dict[str, str] | None,
              vocab_size: int) -> ChatTraining | None:
    """Rows with a loss mask when ``train.data`` is a chat jsonl (messages or prompt/completion); else None."""
    from specformer_train.datasource import data_record
    from specformer_train.tokenization import make_tokenizer

    from specformer_finetune.chat_data import chat_data, encode_file, looks_like_chat
    from specformer_finetune.chat_template import resolve_template

    if not looks_like_chat(config.data):
        if config.chat_template is not None and config.data is not None:
            raise UserError(f"train.chat_template is set but {config.data} is not chat data (a .jsonl file whose "
                            "records hold 'messages' or 'prompt' and 'completion')")
        return None
    if tokenizer is None:
        if config.tokenizer == "bpe":
            raise UserError("chat data needs a tokenizer that exists before the data is read: the train.init "
                            "checkpoint's, byte, or a tokenizer.json path (not bpe, which is trained on a corpus)")
        tokenizer = make_tokenizer(config.tokenizer, vocab_size=vocab_size, corpus=None, cache=config.cache_dir)
    template = resolve_template(config.chat_template, metadata)
    if config.streaming:
        return _streamed_chat(config, tokenizer, template, seq_len=seq_len)
    corpus = encode_file(config.data, tokenizer, template)
    data = chat_data(corpus, seq_len=seq_len, seed=config.seed, val_fraction=config.val_fraction)
    record = data_record(data=config.data, description=corpus.description, tokens=corpus.tokens)
    return ChatTraining(tokenizer=tokenizer, train_rows=data.train_rows, val_rows=data.val_rows,
                        description=data.description, n_tokens=data.n_tokens, n_train=data.n_train, n_val=data.n_val,
                        record=record)


def _streamed_chat(config: Any, tokenizer: Any, template: tuple[str, dict[str, str]] | None, *,
                   seq_len: int) -> ChatTraining:
    """Chat rows read lazily (``train.streaming``), the validation rows held out as for streamed text."""
    import hashlib

    from specformer_train.corpus import find_corpus
    from specformer_train.datasource import stream_record

    from specformer_finetune.chat_data import ChatEvalRows
    from specformer_finetune.chat_stream import ChatStreamRows

    corpus = find_corpus(config.data, text_field=config.text_field)
    holdout = 0 if config.val_fraction == 0 else (config.eval_steps or 0) * config.batch_size
    stream = ChatStreamRows(corpus, tokenizer, template, seq_len=seq_len, seed=config.seed, holdout_rows=holdout)
    val = None if stream.val_tokens is None else ChatEvalRows(stream.val_tokens, stream.val_mask, seq_len=seq_len)
    # The template decides the tokens and their mask as much as the files do: a resumed run must render alike.
    rendering = hashlib.sha256(repr(template).encode()).hexdigest()
    record = stream_record(data=config.data, description=corpus.description,
                           corpus_fingerprint=f"{corpus.fingerprint()}\ntemplate:{rendering}",
                           tokenizer_json=tokenizer.to_json())
    return ChatTraining(tokenizer=tokenizer, train_rows=stream, val_rows=val,
                        description=f"{corpus.description}, chat records (loss on replies only)", n_tokens=None,
                        n_train=None, n_val=0 if stream.val_tokens is None else len(stream.val_tokens), record=record)
