"""Issue 44: every causal-LM model type of the installed transformers is sorted (a family, a missing one with what it
lacks, a multimodal checkpoint of a text family, or no decoder-only text model), and docs/interop.md lists each."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from safetensors.torch import save_file
import torch
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from specformer.cli.main import main
from specformer_hf.coverage import MAPPING_ONLY, MISSING, NOT_DECODERS, WRAPPERS, decoder_text_families, text_model_type
from specformer_hf.families import builtin_families

PAGE = Path(__file__).resolve().parents[3] / "docs" / "interop.md"


def _supported() -> set[str]:
    return {text_model_type(f.model_type) for f in builtin_families()}


def _table(heading: str, column: int) -> dict[str, str]:
    """The page's table under ``## heading``: each row's `model_type`s (column 1, comma-separated) -> column ``column``."""
    section = PAGE.read_text(encoding="utf-8").split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if len(cells) > column and cells[1].startswith("`") and cells[1] != "`model_type`":  # not the header
            for model_type in re.findall(r"`([^`]+)`", cells[1]):
                assert model_type not in rows, f"docs/interop.md, {heading}: {model_type} has two rows"
                rows[model_type] = cells[column]
    return rows


def test_every_causal_lm_model_type_of_transformers_is_sorted():
    """A model type transformers adds is in none of the tables until someone decides what it is."""
    families = set(decoder_text_families())
    supported, missing = _supported(), set(MISSING)
    assert not supported & missing, f"both a family and in coverage.MISSING: {sorted(supported & missing)}"
    assert not families - supported - missing, (
        f"transformers {__import__('transformers').__version__} has decoder-only text families in no table: "
        f"{sorted(families - supported - missing)}; add each to specformer_hf.coverage (MISSING, NOT_DECODERS or "
        "WRAPPERS) or give it a family")
    extra = sorted((supported | missing) - families)
    assert not extra, f"not a family of this transformers: {extra}"
    stale = sorted((set(NOT_DECODERS) | set(WRAPPERS)) - set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))
    assert not stale, f"coverage tables name model types this transformers does not register for causal LM: {stale}"
    assert not set(NOT_DECODERS) & set(WRAPPERS)


def test_the_folding_puts_each_multimodal_checkpoint_on_its_text_model():
    assert decoder_text_families(["gemma3", "gemma3_text", "bert", "bloom"]) == ["bloom", "gemma3_text"]
    assert all(text in decoder_text_families() for text in WRAPPERS.values())


def test_the_docs_tables_list_every_family_once():
    """One row for each decoder-only text family: in the families table when supported, else with what it lacks."""
    documented = {text_model_type(t) for t in _table("Families", 2)}
    lacking = _table("Families not yet supported", 2)
    assert documented == _supported()
    assert not documented & set(lacking), f"both supported and not in docs/interop.md: {sorted(documented & set(lacking))}"
    assert set(lacking) <= set(decoder_text_families()), \
        f"docs/interop.md lists what is no family of transformers: {sorted(set(lacking) - set(decoder_text_families()))}"
    assert documented | set(lacking) == set(decoder_text_families()), \
        f"no row in docs/interop.md: {sorted(set(decoder_text_families()) - documented - set(lacking))}"
    assert lacking == MISSING, \
        "docs/interop.md's 'Families not yet supported' must say what specformer_hf.coverage.MISSING says"


def _folder(tmp_path: Path, model_type: str) -> Path:
    folder = tmp_path / model_type
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": model_type, "vocab_size": 8}))
    save_file({"lm_head.weight": torch.zeros(8, 4)}, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize(("model_type", "needles"), [
    ("zamba", ["model_type 'zamba' is not supported yet; it lacks: multi-head Mamba-1 (n_mamba_heads",
              "Families not yet supported"]),
    # CPM-Ant's attention, feed-forward and bucketed relative bias exist; its bidirectional full forward does not.
    ("cpmant", ["model_type 'cpmant' is not supported yet; it lacks: a full forward attending in both directions"]),
    ("fuyu", ["model_type 'fuyu' is a multimodal checkpoint whose language model ('persimmon') is supported, but not "
              f"read out of this checkpoint yet; it lacks: {MAPPING_ONLY}"]),
    ("gemma3", ["multimodal checkpoint whose language model ('gemma3_text') is supported, but not read out of this "
                f"checkpoint yet; it lacks: {MAPPING_ONLY}"]),
    ("gemma3n", ["whose language model is 'gemma3n_text'", "AltUp and LAuReL residuals (issue 47)"]),
    ("bert", ["model_type 'bert' is not a decoder-only text model (an encoder (BERT-like)"]),
    ("whisper", ["is not a decoder-only text model (a speech recognition"]),
])
def test_hf_import_names_what_an_unsupported_family_lacks(tmp_path, capsys, model_type, needles):
    assert main(["hf", "import", str(_folder(tmp_path, model_type)), str(tmp_path / "out.safetensors")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err
    assert not (tmp_path / "out.safetensors").exists()


def test_every_missing_family_is_refused_with_its_own_mechanism():
    from specformer.errors import UserError
    from specformer_hf import get_families

    families = get_families()
    for model_type, lacks in MISSING.items():
        with pytest.raises(UserError, match=re.escape(f"it lacks: {lacks}")):
            families.get(model_type)


def test_the_docs_count_what_the_tables_hold():
    section = " ".join(PAGE.read_text(encoding="utf-8").split("\n## Families not yet supported\n", 1)[1]
                       .split("\n| ", 1)[0].split())
    said = re.search(r"registers (\d+) model types .* Of those, (\d+) are no decoder-only text model .* and (\d+) are "
                     r"multimodal checkpoints .* which leaves (\d+) decoder-only text families: the families above, and "
                     r"the (\d+) below\. .* (\d+) needs? only a family table", section)
    assert said, "docs/interop.md's 'Families not yet supported' no longer says the counts this test checks"
    mapping_only = sum(lacks == MAPPING_ONLY for lacks in MISSING.values())
    assert tuple(int(n) for n in said.groups()) == (
        len(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES), len(NOT_DECODERS), len(WRAPPERS), len(decoder_text_families()),
        len(MISSING), mapping_only)
