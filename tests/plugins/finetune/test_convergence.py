"""A real behaviour change: LoRA on an imported tiny model learns to answer its training prompts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import specformer
from specformer.cli.main import main
from specformer.tokenizers.tokenizer import tokenizer_from_metadata
from specformer_text.chat_template import render, template_from_metadata

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
FACTS = {"color of the sky": "blue", "color of grass": "green", "color of snow": "white", "color of coal": "black",
         "sound of a cat": "meow", "sound of a dog": "woof", "sound of a cow": "moo", "sound of a duck": "quack"}
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _imported(tmp_path: Path) -> Path:
    """A random tiny Llama with a BPE tokenizer and a ChatML template, saved by transformers, then imported."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    inner = tokenizers.Tokenizer(models.BPE())
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = decoders.ByteLevel()
    texts = [f"What is the {q}? {a}. user assistant" for q, a in FACTS.items()] * 4
    inner.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIAL,
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf_tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=inner, eos_token="<|im_end|>",
                                                        chat_template=CHATML)
    vocab = inner.get_vocab_size()
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      eos_token_id=inner.token_to_id("<|endoftext|>"), tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "hf")
    hf_tokenizer.save_pretrained(tmp_path / "hf")
    assert main(["hf", "import", str(tmp_path / "hf"), str(tmp_path / "base.safetensors")]) == 0
    return tmp_path / "base.safetensors"


def _answer(model: torch.nn.Module, tokenizer, template, question: str) -> str:
    prompt = render(template[0], [{"role": "user", "content": question}], add_generation_prompt=True, **template[1])
    ids = tokenizer.inner.encode(prompt, add_special_tokens=False).ids
    end = tokenizer.inner.token_to_id("<|im_end|>")
    out: list[int] = []
    with torch.no_grad():
        for _ in range(8):
            next_id = int(model(torch.tensor([ids + out]))[0, -1].argmax())
            if next_id == end:
                break
            out.append(next_id)
    return tokenizer.decode(out)


@pytest.mark.slow
def test_lora_learns_to_answer_its_training_prompts(tmp_path: Path) -> None:
    base = _imported(tmp_path)
    metadata = specformer.checkpoint.save_load.read_metadata(base)
    tokenizer, template = tokenizer_from_metadata(metadata), template_from_metadata(metadata)
    assert template is not None and template[0] == CHATML
    data = tmp_path / "facts.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"What is the {q}?"},
                                                     {"role": "assistant", "content": f"{a}."}]}) + "\n"
                            for q, a in list(FACTS.items()) * 16))
    before = specformer.load(base).eval()
    assert sum(_answer(before, tokenizer, template, f"What is the {q}?") == f"{a}." for q, a in FACTS.items()) <= 1

    spec = tmp_path / "spec.yaml"
    spec.write_text(base.with_suffix(".yaml").read_text() + "\ntrain:\n" + "".join(f"  {k}: {v}\n" for k, v in {
        "steps": 300, "batch_size": 8, "seq_len": 64, "lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 20,
        "eval_every": 0, "save_every": 0, "val_fraction": 0, "sample_tokens": 0, "progress": "false",
        "plot": "false", "tensorboard": "false", "threads": 2, "weight_decay": 0.0}.items())
        + "  adapter: {kind: lora, rank: 8, alpha: 16, targets: ['blocks.*.mixer.*', 'blocks.*.ffn.*']}\n")
    assert main(["train", str(spec), "--init", str(base), "--data", str(data), "--out", str(tmp_path / "run")]) == 0

    tuned = specformer.load(tmp_path / "run" / "model.safetensors").eval()
    answers = {q: _answer(tuned, tokenizer, template, f"What is the {q}?") for q in FACTS}
    assert answers == {q: f"{a}." for q, a in FACTS.items()}
