"""IQuest-Coder (``model_type: iquestcoder``): transformers runs it as Llama; the original code's clip_qkv and
sliding window, which no released checkpoint enables, are refused as transformers refuses them."""

from __future__ import annotations

from specformer_hf.families import llama
from specformer_hf.parts.base import Refuse, Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family

#: transformers' IQuestCoderConfig defaults: LlamaConfig's, with these changed.
DEFAULTS = {
    **llama.DEFAULTS, "vocab_size": 76800, "hidden_size": 5120, "intermediate_size": 27648, "num_hidden_layers": 80,
    "num_attention_heads": 40, "num_key_value_heads": 8, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "head_dim": 128,
}

FAMILY = decoder_family(
    name="IQuest-Coder",
    model_type="iquestcoder",
    architecture="LlamaForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *LLAMA_PARTS,
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        Switch("mlp_bias", ("ffn.bias",)),
        # Fields of the original code's configs that IQuestCoderConfig lacks: absent or off, or transformers refuses.
        # specformer's attention clamps (clip_qkv), but with transformers refusing the field there is no reference
        # for where the original code clamps, nor a model to export it to.
        Refuse("clip_qkv", (None,), optional=True, why="transformers' IQuest-Coder refuses clip_qkv (its config raises "
                                                       "'IQuestCoder does not support clip_qkv'), so no checkpoint it "
                                                       "loads clamps q, k and v"),
        Refuse("use_sliding_window", (None, False), optional=True,
               why="transformers' IQuest-Coder refuses sliding windows"),
    ],
    ignore_tensors=(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),
    maps="as Llama (transformers builds LlamaForCausalLM): rope, GQA, head_dim (default 128), attention_bias, mlp_bias",
    caveats="clip_qkv must be null and use_sliding_window false or absent, as transformers requires",
)
