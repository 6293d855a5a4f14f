"""Tokenizers stored with a checkpoint, and the one rule for which tokenizer a checkpoint uses.

- :mod:`specformer.tokenizers.tokenizer`: the byte tokenizer and tokenizers stored in a checkpoint;
- :mod:`specformer.tokenizers.byte_file`: the byte tokenizer as a Hugging Face ``tokenizer.json``;
- :mod:`specformer.tokenizers.choice`: which tokenizer a checkpoint's text goes through.
"""
