"""Which of transformers' causal-LM model types are decoder-only text families, and what each unsupported one lacks.

transformers registers about 200 model types for causal language modelling
(``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``). Not all of them are decoder-only text models: BERT-likes
run as decoders with ``is_decoder``, the decoder halves of encoder-decoders and speech, audio and
image models are there too, and a multimodal checkpoint sits beside its own text model. The tables
below sort every one of them, so that the count of families cannot drift:

* :data:`NOT_DECODERS`: model types that are no decoder-only text family, and why;
* :data:`WRAPPERS`: multimodal checkpoints, each counted as the text model it holds;
* :data:`MISSING`: decoder-only text families with no family here yet, each with the one mechanism it lacks.

Every other model type of the mapping must be a built-in family. ``hf import`` names the mechanism
in its refusal (:meth:`specformer_hf.Families.get`), docs/interop.md's "Families not yet
supported" table repeats :data:`MISSING`, and ``tests/plugins/hf/test_coverage.py`` fails when the
installed transformers holds a model type that is in none of them. The tables import nothing: the
refusal reads them without transformers installed.
"""

from __future__ import annotations

from collections.abc import Iterable

#: What a family lacks when specformer has every part it uses and only its family table is missing.
MAPPING_ONLY = "a mapping only (issue 44)"

#: Model types registered for causal LM that are not decoder-only text families -> why.
NOT_DECODERS: dict[str, str] = {
    # Encoders (masked-LM pre-training, bidirectional attention), registered for causal LM through `is_decoder`.
    **{model_type: "an encoder (BERT-like) that runs as a decoder only with is_decoder" for model_type in (
        "bert", "big_bird", "camembert", "data2vec-text", "electra", "ernie", "megatron-bert", "rembert", "roberta",
        "roberta-prelayernorm", "roc_bert", "roformer", "xlm-roberta", "xlm-roberta-xl", "xmod")},
    "bert-generation": "the BERT encoder reused as the decoder of an encoder-decoder",
    "xlm": "a cross-lingual encoder (masked LM first; causal only as an option of the same model)",
    "xlnet": "a permutation language model: two-stream attention over bidirectional context, not a causal decoder",
    # The decoder halves of encoder-decoders: each layer cross-attends to an encoder's output.
    **{model_type: "the decoder half of an encoder-decoder" for model_type in (
        "bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "marian", "mbart", "mvp", "pegasus", "plbart",
        "prophetnet")},
    "trocr": "the text decoder of an image-to-text encoder-decoder",
    # Not text: speech, audio and image models whose outputs or inputs are not text tokens alone.
    "whisper": "a speech recognition encoder-decoder's decoder",
    "moshi": "a speech-to-speech model (audio codec tokens)",
    "moss_transcribe_diarize": "a speech transcription model",
    "musicgen": "a music generator (audio codec tokens)",
    "musicgen_melody": "a music generator (audio codec tokens)",
    "git": "an image-to-text model (a vision encoder's tokens in the decoder's input)",
    "got_ocr2": "an OCR model (a vision encoder's tokens in the decoder's input)",
    "phi4_multimodal": "a vision and speech model (its encoders and LoRA adapters live inside the causal LM)",
}

#: Multimodal checkpoints -> the text model_type of their language model: one family, counted once.
WRAPPERS: dict[str, str] = {
    "dots3_note": "dots3_note_text",
    "fuyu": "persimmon",  # Fuyu's decoder is a Persimmon fed image patches
    "gemma3": "gemma3_text",
    "gemma3n": "gemma3n_text",
    "gemma4": "gemma4_text",
    "gemma4_unified": "gemma4_unified_text",
    "llama4": "llama4_text",
    "qwen3_5": "qwen3_5_text",
    "qwen3_5_moe": "qwen3_5_moe_text",
    "qwen4_exp": "qwen4_exp_text",
}

#: Model types that classes save under names transformers' causal-LM mapping does not hold -> the family they are
#: read as: Emu3ForCausalLM saves its flat Emu3TextConfig as ``emu3_text_model`` (the mapping names ``emu3``), and
#: the multimodal Cohere Compass checkpoint (``cohere_compass``, registered for image-text-to-text only) holds
#: ``cohere_compass_text``.
SAVED_AS: dict[str, str] = {
    "emu3_text_model": "emu3",
    "cohere_compass": "cohere_compass_text",
}

#: Decoder-only text families with no family yet -> the one mechanism each lacks (the names of issues 44-47).
MISSING: dict[str, str] = {
    # Issue 44: every part exists; the family table (and here and there one flag on a part) is missing. None is left
    # (Laguna was the last); such an entry reads ``model_type: MAPPING_ONLY``.
    # Issue 45: recurrent and linear-attention mixers.
    # Issue 46: one new part each.
    "zaya": "an MLP router whose hidden state feeds the next layer's router, with a skip expert and balancing biases; a scale and bias on the embeddings and on both terms of each residual add (issue 46; its attention is the cca mixer)",
    "cpmant": ("a full forward attending in both directions (transformers' CPM-Ant masks no later key; only its "
               "cached steps are one-sided), learned prompt tokens prepended to every input and a score bias per pair "
               "of segments; its bidirectional bucketed relative position bias is positional relative_bias (issue 46)"),
    "inkling_text": "hidden-state-conditioned relative position bias (issue 46)",
    "minimax_m3_vl_text": "a learned block indexer (its own query heads and key, RMS-normed and rotated, token scores max-pooled per block, one selection per key/value head, local blocks forced), where indexer block_pooled mean-pools the attention's own keys, and gpt-oss's clamped SwiGLU on its dense MLPs and shared expert (the moe's experts have it) (issue 46)",
    "kolibri1_1": "NVFP4 rounding of its sparse layers' keys, values and routing queries and keys, a per-token stage (index_topk keys plus sink and local tokens) within the pool its block stage (indexer block_pooled) chooses, and that pool shared with its reindexer layers (issue 46)",
    "hy_v4": "hyper-connections without the Sinkhorn-mixed residual (each stream kept, post gates scaled by "
             "hc_magnitude), learnable sinks on latent attention, and an indexer with its rotary channels last and "
             "indexers shared across layers (indexer_types); its SwiGLU clamp reaches the routed experts only "
             "(issue 46)",
    "dots3_note_text": "MLA with a per-head sigmoid output gate, a norm on the shared rope key and rescaled latents "
                       "(issue 46)",
    # Issue 47: multi-token prediction, and shared, looped or cross-reading blocks.
    "gemma4_assistant": "multi-token prediction: a drafter fed the target model's hidden states (issue 47)",
    "gemma4_unified_assistant": "multi-token prediction: a drafter fed the target model's hidden states (issue 47)",
    "zamba": ("multi-head Mamba-1 (n_mamba_heads: the inner channels split in heads, each with its own x_proj and "
              "dt_proj; the shared block's concat input and per-use projection exist as model.shared_blocks options) "
              "(issue 47)"),
    "dory": "looped blocks (issue 47)",
    "hrm_text": "looped blocks (issue 47)",
    "inkling2_loop_text": "looped blocks (issue 47)",
    "inkling2_text": "block attention residuals (issue 47)",
    "gemma3n_text": "AltUp and LAuReL residuals (issue 47)",
    "longcat_flash": "zero-compute experts and a shortcut MoE path (issue 47)",
    "qwen4_exp_text": "hashed n-gram per-layer embeddings and low-rank hyper-connections (issue 47)",
    "doge": "dynamic mask attention (issue 47)",
    "blt": "byte latent transformer: entropy patcher and local byte encoder/decoder (issue 47)",
    # In no issue yet.
    # Its sinusoidal positions (split_halves) and embedding scale exist; a head tied to the embeddings has no bias.
    "mllama": "cross-attention layers (to image states)",
    "reformer": "LSH attention with reversible layers",
}


def text_model_type(model_type: str) -> str:
    """The family ``model_type`` counts as: its text model's for a multimodal checkpoint, the mapped one for a
    :data:`SAVED_AS` name, its own otherwise."""
    return WRAPPERS.get(model_type, SAVED_AS.get(model_type, model_type))


def decoder_text_families(model_types: Iterable[str] | None = None) -> list[str]:
    """The decoder-only text families among ``model_types`` (default: the installed transformers' causal-LM ones), sorted.

    Each multimodal checkpoint is folded into its text model; :data:`NOT_DECODERS` are left out.
    """
    if model_types is None:
        # late: transformers is a test-only dependency of this plugin, needed only to count
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        model_types = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    return sorted({text_model_type(t) for t in model_types if t not in NOT_DECODERS})


def refusal(model_type: str, *, supported: Iterable[str]) -> str | None:
    """One line saying why ``model_type`` (not among ``supported``) has no family, or None when no table knows it."""
    if model_type in NOT_DECODERS:
        return (f"Hugging Face model_type {model_type!r} is not a decoder-only text model ({NOT_DECODERS[model_type]}); "
                "specformer imports decoder-only language models")
    text = text_model_type(model_type)
    where = "docs/interop.md, 'Families not yet supported'"
    if text != model_type:
        if text in set(supported):  # the text family exists; reading it out of the wrapper's layout does not
            return (f"Hugging Face model_type {model_type!r} is a multimodal checkpoint whose language model "
                    f"({text!r}) is supported, but not read out of this checkpoint yet; it lacks: {MAPPING_ONLY} "
                    f"({where})")
        if text not in MISSING:
            return None
        return (f"Hugging Face model_type {model_type!r} is a multimodal checkpoint whose language model is "
                f"{text!r}, not supported yet; it lacks: {MISSING[text]} ({where})")
    if model_type in MISSING:
        return f"Hugging Face model_type {model_type!r} is not supported yet; it lacks: {MISSING[model_type]} ({where})"
    return None


__all__ = ["MAPPING_ONLY", "MISSING", "NOT_DECODERS", "WRAPPERS", "decoder_text_families", "refusal",
           "text_model_type"]
