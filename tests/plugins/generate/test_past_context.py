"""Generation past ``context_length``, where the positions allow it.

RoPE with dynamic scaling keeps adapting (as transformers does); ALiBi and NoPE
extrapolate; plain RoPE warns once and continues; learned and sinusoidal positions
refuse, naming the limit. Phi-3's LongRoPE switches to its long factors when the sequence
passes ``original_context_length``, re-encoding the sequence there as transformers'
Phi-3 ``generate`` does, so both give the same tokens.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import specformer
from specformer_generate import generate

from .llama_reference import LLAMA_SPEC

CONTEXT = 16


def spec_with_positional(positional: Any, *, layers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    model = {**LLAMA_SPEC["model"], "context_length": CONTEXT, "positional": positional, "layers": layers or []}
    return {"model": model}


@pytest.mark.parametrize("positional", ["alibi", "none", {"kind": "rope", "scaling": {"kind": "dynamic", "factor": 2.0}}])
def test_schemes_that_extrapolate_go_past_the_context_silently_and_the_cache_equals_recompute(positional: Any) -> None:
    model = specformer.build(spec_with_positional(positional), seed=0).double().eval()
    prompt = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cached = generate(model, prompt, max_new_tokens=2 * CONTEXT)
    assert cached.shape == (2, 5 + 2 * CONTEXT)
    if positional in ("alibi", "none"):  # dynamic rope's cached keys keep their old rotation (checked below)
        assert torch.equal(cached, generate(model, prompt, max_new_tokens=2 * CONTEXT, use_cache=False))


def test_plain_rope_warns_once_and_continues() -> None:
    model = specformer.build(spec_with_positional("rope"), seed=0).eval()
    prompt = torch.zeros(1, 4, dtype=torch.long)
    with pytest.warns(UserWarning, match=rf"past the model's context length of {CONTEXT}: its positions \(RotaryPositions\)"):
        out = generate(model, prompt, max_new_tokens=CONTEXT)
    assert out.shape == (1, 4 + CONTEXT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        generate(model, prompt, max_new_tokens=CONTEXT)  # once per model
        generate(model, prompt, max_new_tokens=CONTEXT - 4)  # within the context: never


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_embedding_positions_refuse_naming_the_limit(positional: str) -> None:
    model = specformer.build(spec_with_positional(positional), seed=0).eval()
    with pytest.raises(ValueError, match=rf"more than the model's context length of {CONTEXT} \(its \w+Positions has no "
                                         rf"position past it\); use max_new_tokens=12 or less"):
        generate(model, torch.zeros(1, 4, dtype=torch.long), max_new_tokens=CONTEXT)
    with pytest.raises(ValueError, match=rf"the longest prompt is {CONTEXT} tokens, but the model's context length is "
                                         rf"{CONTEXT} tokens \(.*\) and at least one must be left for a new token; "
                                         rf"shorten the prompt to at most {CONTEXT - 1} tokens"):
        generate(model, torch.zeros(1, CONTEXT, dtype=torch.long), max_new_tokens=1)


def test_a_per_layer_mix_is_as_permissive_as_its_strictest_scheme() -> None:
    mix = [{"select": 0, "positional": "alibi"}]
    with pytest.warns(UserWarning, match="RotaryPositions"):  # layer 1 keeps plain rope
        generate(specformer.build(spec_with_positional("rope", layers=mix), seed=0).eval(),
                 torch.zeros(1, 4, dtype=torch.long), max_new_tokens=CONTEXT)
    everywhere = [{"select": "all", "positional": "alibi"}]
    model = specformer.build(spec_with_positional("learned", layers=everywhere), seed=0).eval()
    with pytest.raises(ValueError, match="LearnedPositions has no position past it"):
        generate(model, torch.zeros(1, 4, dtype=torch.long), max_new_tokens=CONTEXT)


# -- against transformers ----------------------------------------------------------------------------


def _imported(hf: Any, path: Path) -> specformer.Decoder:
    from specformer_hf import from_hf

    hf.save_pretrained(path)
    return from_hf(path).double().eval()


def _greedy(hf: Any, prompt: torch.Tensor, n: int) -> torch.Tensor:
    hf.generation_config.eos_token_id = None
    hf.generation_config.bos_token_id = None
    return hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=n,
                       min_new_tokens=n)


def test_llama_dynamic_rope_past_the_context_matches_transformers(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=12, max_position_embeddings=CONTEXT, initializer_range=0.3,
                         rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    hf = LlamaForCausalLM(config).double().eval()
    model = _imported(hf, tmp_path)
    assert model.positional.scaling.keeps_adapting and model.context_length == CONTEXT
    prompt = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = generate(model, prompt, max_new_tokens=3 * CONTEXT)
    assert torch.equal(ours, _greedy(hf, prompt, 3 * CONTEXT))


def test_phi3_longrope_switches_factors_as_transformers_generate_does(tmp_path: Path) -> None:
    from transformers import Phi3Config, Phi3ForCausalLM

    torch.manual_seed(0)
    pairs = 4  # head_dim 8
    config = Phi3Config(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=32, original_max_position_embeddings=8,
                        initializer_range=0.3, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                        pad_token_id=None,
                        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                         "short_factor": [1.0 + i / 4 for i in range(pairs)],
                                         "long_factor": [3.0 + 2 * i for i in range(pairs)],
                                         "original_max_position_embeddings": 8})
    hf = Phi3ForCausalLM(config).double().eval()
    model = _imported(hf, tmp_path)
    assert model.cache_restarts() == {8}
    for width in (5, 8):  # the switch while decoding; a prompt that fills the short context exactly
        prompt = torch.randint(0, 97, (1, width), generator=torch.Generator().manual_seed(width))
        ours = generate(model, prompt, max_new_tokens=14)
        assert torch.equal(ours, _greedy(hf, prompt, 14)), width
        assert torch.equal(ours, generate(model, prompt, max_new_tokens=14, use_cache=False))


def test_beam_search_and_speculation_refuse_to_cross_a_cache_restart() -> None:
    pairs = 4
    scaling = {"kind": "longrope", "short_factor": [1.0] * pairs, "long_factor": [4.0] * pairs,
               "original_context_length": 8, "reencode": True}
    spec = spec_with_positional({"kind": "rope", "scaling": scaling})
    spec["model"]["block"]["mixer"] = {"kind": "attention", "n_heads": 8, "n_kv_heads": 2}  # head_dim 8
    model = specformer.build(spec, seed=0).eval()
    prompt = torch.zeros(1, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="beam search would pass 8 tokens.*at most 4 new tokens"):
        generate(model, prompt, max_new_tokens=6, num_beams=2)
    with pytest.raises(ValueError, match="speculative decoding would pass 8 tokens"):
        generate(model, prompt, max_new_tokens=6, draft=model)
    assert generate(model, prompt, max_new_tokens=4, num_beams=2).shape == (1, 9)  # stops before the switch
    assert generate(model, prompt, max_new_tokens=6, num_beams=2, use_cache=False).shape == (1, 11)
