"""Where ``hf import`` keeps a Hugging Face folder's JSON files in a checkpoint's header.

Written by the hf plugin's importer and read by tokenizer attachment, chat templates and
turn ends, so the keys live below all of them.
"""

from __future__ import annotations

#: The family's ``model_type`` the checkpoint was imported from (``hf export`` prefers it).
FAMILY_KEY = "hf.model_type"
#: config.json, as imported.
CONFIG_KEY = "hf.config"
#: generation_config.json (its ``eos_token_id`` ends a chat turn).
GENERATION_CONFIG_KEY = "hf.generation_config"
#: tokenizer_config.json (its ``chat_template``, special tokens, ``eos_token``).
TOKENIZER_CONFIG_KEY = "hf.tokenizer_config"
