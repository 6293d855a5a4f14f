"""Slow: the nanoGPT Tiny Shakespeare recipe learns the text (the full comparison is benchmarks/shakespeare_char.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specformer_train import train

REPO = Path(__file__).resolve().parents[3]
CORPUS = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"


@pytest.mark.slow
@pytest.mark.skipif(not CORPUS.is_file(), reason=f"Tiny Shakespeare is not at {CORPUS} (../shared/data next to the repo)")
def test_shakespeare_char_recipe_converges(tmp_path: Path) -> None:
    # Half of the recipe's 2000 steps, the cosine schedule compressed to match.
    result = train(REPO / "specs" / "shakespeare-char.yaml", data=str(CORPUS), out_dir=str(tmp_path / "run"),
                   steps=1000, overrides=["train.eval_every=0", "train.sample_tokens=0", "train.progress=false",
                                         "train.save_every=0"])
    # Uniform over 259 byte ids is 5.56 nats, a unigram model of the text about 3.3; nanoGPT's full
    # 2000-step run reaches 1.88.
    assert result.val_loss is not None and result.val_loss < 2.1, result.val_loss
    assert result.loss < 2.1
