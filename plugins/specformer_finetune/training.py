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
- A chat run's rows come with :class:`ChatPrompting`: the run's samples are a user message
  (``train.sample_prompt``) rendered with the template and answered up to its end of turn,
  and the command suggested at the end is ``specformer chat`` with that template.
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specformer.checkpoint.save_load import read_metadata
from specformer.errors import CheckpointError, UserError
from specformer_text import BUILTIN, TurnEnd, find_corpus, make_tokenizer, render, resolve_template, turn_end
from specformer_train import data_record, stream_record

from specformer_finetune.adapter_file import adapter_metadata, base_reference
from specformer_finetune.apply import adapter_of, adapter_state, apply_adapter, is_adapter_tensor
from specformer_finetune.chat_data import ChatEvalRows, chat_data, encode_file, looks_like_chat
from specformer_finetune.chat_stream import ChatStreamRows


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


#: The user message of a chat run's samples when ``train.sample_prompt`` is empty.
FALLBACK_CHAT_PROMPT = "Hello!"


@dataclass(frozen=True)
class ChatPrompting:
    """How a chat run talks to its model: the template it trained on, where a reply ends, and how to name the
    template on the command line (empty when the run's model.safetensors carries it in its header)."""

    source: str
    tokens: dict[str, str]
    turn_end: TurnEnd
    option: str  # "--chat-template chatml", or "" when the checkpoint's own template is the one

    def prompt(self, text: str) -> str:
        """``text`` as the one user message of a conversation, with the assistant's turn opened."""
        return render(self.source, [{"role": "user", "content": text or FALLBACK_CHAT_PROMPT}],
                      add_generation_prompt=True, **self.tokens)

    def transcript(self, text: str, reply: str) -> str:
        """A sample as ``specformer chat`` writes a piped conversation."""
        return f"user: {text or FALLBACK_CHAT_PROMPT}\nassistant: {reply}"


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
    prompting: ChatPrompting | None = None  # None: the template could not be settled (no template: plain text)


def chat_rows(config: Any, tokenizer: Any, *, seq_len: int, metadata: dict[str, str] | None,
              vocab_size: int) -> ChatTraining | None:
    """Rows with a loss mask when ``train.data`` is a chat jsonl (messages or prompt/completion); else None."""
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
    prompting = _prompting(config, template, tokenizer, metadata)
    if config.streaming:
        streamed = _streamed_chat(config, tokenizer, template, seq_len=seq_len)
        streamed.prompting = prompting
        return streamed
    corpus = encode_file(config.data, tokenizer, template)
    data = chat_data(corpus, seq_len=seq_len, seed=config.seed, val_fraction=config.val_fraction)
    record = data_record(data=config.data, description=corpus.description, tokens=corpus.tokens)
    return ChatTraining(tokenizer=tokenizer, train_rows=data.train_rows, val_rows=data.val_rows,
                        description=data.description, n_tokens=data.n_tokens, n_train=data.n_train, n_val=data.n_val,
                        record=record, prompting=prompting)


def _prompting(config: Any, template: tuple[str, dict[str, str]] | None, tokenizer: Any,
               metadata: dict[str, str] | None) -> ChatPrompting | None:
    """The run's :class:`ChatPrompting`; None without a template (chat data rendered as plain text)."""
    if template is None:
        return None
    source, tokens = template
    choice = config.chat_template
    if choice is None:
        # The init checkpoint's own template: an adapter checkpoint copies its base's header (the template with
        # it); a full fine-tune's checkpoint does not, so the command reads it from the base checkpoint.
        init = str(Path(config.init).resolve()) if config.init else ""
        option = "" if config.adapter is not None or not init else f"--chat-template {shlex.quote(init)}"
    elif choice in BUILTIN:
        option = f"--chat-template {choice}"
    else:
        option = f"--chat-template {shlex.quote(str(Path(choice).resolve()))}"
    return ChatPrompting(source=source, tokens=tokens, option=option,
                         turn_end=turn_end(source, tokenizer=tokenizer, metadata=metadata))


def _streamed_chat(config: Any, tokenizer: Any, template: tuple[str, dict[str, str]] | None, *,
                   seq_len: int) -> ChatTraining:
    """Chat rows read lazily (``train.streaming``), the validation rows held out as for streamed text."""
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
