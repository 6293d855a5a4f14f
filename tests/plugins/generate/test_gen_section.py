"""The ``generate`` spec section: validated with the spec, paths in errors, kept in checkpoints."""

from __future__ import annotations

import pytest

import specformer
from specformer.errors import SpecError
from specformer_generate import GenerateSpec

from .specs_for_tests import tiny_with


def spec_with(section: dict) -> dict:
    data = tiny_with()
    data["generate"] = section
    return data


def test_a_valid_section_is_reachable_from_the_spec() -> None:
    spec = specformer.load_spec(spec_with({
        "sampler": [{"kind": "repetition_penalty", "penalty": 1.1}, {"kind": "top_k", "k": 40},
                    {"kind": "temperature", "value": 0.8}],
        "max_new_tokens": 50, "num_beams": 1, "seed": 3, "eos": [1, 2],
    }))
    section = spec.section("generate")
    assert isinstance(section, GenerateSpec)
    assert section.max_new_tokens == 50 and section.eos_ids() == [1, 2] and section.seed == 3
    sampler = section.build_sampler()
    assert [type(s).__name__ for s in sampler.steps] == ["RepetitionPenalty", "TopK", "Temperature"]
    assert not sampler.is_greedy


def test_defaults_are_greedy_decoding() -> None:
    section = GenerateSpec()
    assert section.build_sampler().is_greedy
    assert section.num_beams == 1 and section.eos_ids() is None and section.early_stopping is False


def test_every_problem_in_the_section_is_reported_with_its_path() -> None:
    with pytest.raises(SpecError) as info:
        specformer.load_spec(spec_with({
            "sampler": [{"kind": "top_p", "p": 1.5}, {"kind": "top_k", "k": 0}, {"kind": "temperature", "value": -1},
                        {"kind": "nope"}],
            "num_beams": 0,
            "max_new_tokens": -3,
            "early_stopping": "sometimes",
            "colour": "red",
        }))
    paths = sorted({p.path for p in info.value.problems})
    assert paths == sorted({
        "generate.sampler[0].p", "generate.sampler[1].k", "generate.sampler[2].value", "generate.sampler[3].kind",
        "generate.num_beams", "generate.max_new_tokens", "generate.early_stopping", "generate.colour",
    })
    text = str(info.value)
    assert "top_p" in text and "less than or equal to 1" in text and "unknown sampler 'nope'" in text


def test_greedy_must_come_last_in_the_section() -> None:
    with pytest.raises(SpecError, match="generate.sampler: .*must be the last entry"):
        specformer.load_spec(spec_with({"sampler": ["greedy", {"kind": "top_k", "k": 3}]}))


def test_the_section_survives_a_checkpoint_round_trip(tmp_path) -> None:
    data = spec_with({"sampler": [{"kind": "min_p", "p": 0.1}, "greedy"], "max_new_tokens": 9, "length_penalty": 0.5})
    path = specformer.save(specformer.build(data, seed=0), tmp_path / "m.safetensors")
    section = specformer.load(path).spec.section("generate")
    assert section.max_new_tokens == 9 and section.length_penalty == 0.5
    assert [s.to_dict() for s in section.sampler] == [{"kind": "min_p", "p": 0.1, "min_tokens_to_keep": 1},
                                                      {"kind": "greedy"}]
