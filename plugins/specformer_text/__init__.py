"""specformer_text: the text services several plugins share, below all of them.

A plain library package (it registers nothing): the train, eval, fine-tuning, generate,
hf and serve plugins import these names from here, never from another plugin.

- Corpora (:mod:`.sources`, :mod:`.corpus`): which files ``--data`` names and the
  documents in them (text, jsonl, parquet, arrow, saved datasets; the default corpus is
  the Python standard library's source).
- Tokens (:mod:`.tokenize_workers`, :mod:`.cache`, :mod:`.tokenization`): a corpus
  encoded in parallel worker processes, cached on disk by content, and the tokenizer a
  run asks for (byte, BPE trained on the corpus, or a tokenizer.json).
- Tokenizer files (:mod:`.tokenizer_file`): a Hugging Face ``tokenizer.json`` made into
  the tokenizer a checkpoint stores, and attaching one to a checkpoint.
- Chat templates (:mod:`.chat_template`, bounded by :mod:`.template_bounds` and
  :mod:`.template_sandbox`) and where a turn ends (:mod:`.end_of_turn`).
- :mod:`.header_keys`, where hf import keeps a model folder's JSON files in a checkpoint
  header; :class:`OutputError`, a file that could not be written.

::

    from specformer_text import find_corpus, make_tokenizer, tokenize_corpus
    corpus = find_corpus("data/*.txt")
    tokenizer = make_tokenizer("byte", vocab_size=259, corpus=corpus)
    tokens = tokenize_corpus(corpus, tokenizer)

    from specformer_text import render, resolve_template, turn_end
    source, special = resolve_template("chatml", metadata)
    text = render(source, messages, add_generation_prompt=True, **special)

Names are imported on first use, so a command that only builds its argument parser
imports neither torch nor jinja2 through this package.
"""

from __future__ import annotations

from specformer.lazy import lazy_exports

_EXPORTS = {
    "DEFAULT_CORPUS_BYTES": "specformer_text.corpus",
    "Corpus": "specformer_text.corpus",
    "default_corpus": "specformer_text.corpus",
    "find_corpus": "specformer_text.corpus",
    "read_documents": "specformer_text.sources",
    "choose_workers": "specformer_text.tokenize_workers",
    "encode_document": "specformer_text.tokenize_workers",
    "cache_dir": "specformer_text.cache",
    "load_tokenized": "specformer_text.cache",
    "tokenize_corpus": "specformer_text.cache",
    "load_tokenizer_file": "specformer_text.tokenization",
    "make_tokenizer": "specformer_text.tokenization",
    "train_bpe": "specformer_text.tokenization",
    "TOKEN_ID_FIELDS": "specformer_text.tokenizer_file",
    "attach_tokenizer": "specformer_text.tokenizer_file",
    "load_tokenizer_json": "specformer_text.tokenizer_file",
    "no_tokenizer": "specformer_text.tokenizer_file",
    "special_token_ids": "specformer_text.tokenizer_file",
    "tokenizer_config": "specformer_text.tokenizer_file",
    "BUILTIN": "specformer_text.chat_template",
    "TemplateError": "specformer_text.chat_template",
    "compile_template": "specformer_text.chat_template",
    "render": "specformer_text.chat_template",
    "resolve_template": "specformer_text.chat_template",
    "special_tokens": "specformer_text.chat_template",
    "template_from_metadata": "specformer_text.chat_template",
    "DEFAULT_MAX_OUTPUT": "specformer_text.template_bounds",
    "DEFAULT_TIMEOUT": "specformer_text.template_bounds",
    "KNOWN_MARKERS": "specformer_text.end_of_turn",
    "TurnEnd": "specformer_text.end_of_turn",
    "template_markers": "specformer_text.end_of_turn",
    "turn_end": "specformer_text.end_of_turn",
    "CONFIG_KEY": "specformer_text.header_keys",
    "FAMILY_KEY": "specformer_text.header_keys",
    "GENERATION_CONFIG_KEY": "specformer_text.header_keys",
    "TOKENIZER_CONFIG_KEY": "specformer_text.header_keys",
    "OutputError": "specformer_text.errors",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
