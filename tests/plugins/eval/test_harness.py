"""The lm-evaluation-harness model ``specformer``: a multiple-choice task defined here (a jsonl file and a
task YAML, nothing downloaded) scores exactly as lm_eval's own ``hf`` model scores the Hugging Face export
of the same checkpoint; rolling log-likelihoods and greedy generations agree too."""

from __future__ import annotations

import json
import os
import tempfile

import pytest
import torch

# Everything is local: no dataset or model may come from the network.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_CACHE", tempfile.mkdtemp(prefix="specformer-datasets-"))

lm_eval = pytest.importorskip(
    "lm_eval", reason="lm-evaluation-harness is not installed; it comes with the eval extra: pip install 'specformer[eval]'")
transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency")

import specformer  # noqa: E402
import specformer_hf  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402
from specformer.cli.main import main  # noqa: E402
from specformer.tokenizers.tokenizer import METADATA_KEY  # noqa: E402
from specformer_eval.harness import SpecformerLM  # noqa: E402
from specformer_text.tokenization import train_bpe  # noqa: E402
from fixtures.lm_eval_tasks import write_choice_task  # noqa: E402
from fixtures.tiny import tiny_spec  # noqa: E402

TASK = "specformer_tiny_choice"
WORDS = ("the cat sat on a mat while the dog ran to the park and a bird sang in the old tree near "
         "the river where children play ball every sunny day after school ends").split()
QUESTIONS = [
    ("The cat sat on the", [" mat", " river", " sang", " school"], 0),
    ("The dog ran to the", [" park", " bird", " day"], 0),
    ("A bird sang in the old", [" tree", " ball", " cat"], 0),
    ("Children play", [" ball", " mat", " every", " tree"], 0),
    ("Every sunny day after", [" school", " dog"], 1),
    ("Near the river where", [" children", " sat", " the old tree"], 2),
]


def corpus(n: int = 300) -> list[str]:
    g = torch.Generator().manual_seed(0)
    return [" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (12,), generator=g)) for _ in range(n)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A checkpoint with a BPE tokenizer, its Hugging Face export, and a task folder."""
    root = tmp_path_factory.mktemp("harness")
    tokenizer = train_bpe(corpus(), vocab_size=300)
    spec = tiny_spec(
        vocab_size=tokenizer.vocab_size, d_model=64, context_length=64, tie_embeddings=False,
        positional={"kind": "rope", "theta": 10000.0},
        block={"norm": {"kind": "rmsnorm", "eps": 1e-5}, "ffn": {"kind": "swiglu", "hidden": 96}},
    )
    model = specformer.build(spec, seed=0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)  # a random model with opinions: choices differ clearly
    checkpoint = specformer.save(model, root / "model.safetensors", metadata={METADATA_KEY: tokenizer.to_json()})
    hf_dir = specformer_hf.to_hf(model.eval(), root / "hf", tokenizer=tokenizer)
    tasks = write_choice_task(root / "tasks", TASK, QUESTIONS, metrics=("acc", "acc_norm"))
    return checkpoint, hf_dir, tasks


@pytest.fixture(scope="module")
def hf_lm(exported):
    from lm_eval.models.huggingface import HFLM

    _, hf_dir, _ = exported
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(hf_dir / "tokenizer.json"),
                                                     eos_token="<|endoftext|>")
    return HFLM(pretrained=str(hf_dir), tokenizer=tokenizer, device="cpu", batch_size=4, dtype="float32")


@pytest.fixture(scope="module")
def our_lm(exported):
    checkpoint, _, _ = exported
    return SpecformerLM(checkpoint=str(checkpoint), batch_size=3)


def _evaluate(model, tasks_dir, **kwargs):
    return lm_eval.simple_evaluate(model=model, tasks=[TASK], task_manager=TaskManager(include_path=str(tasks_dir), include_defaults=False),
                                   log_samples=True, **kwargs)


def test_multiple_choice_scores_equal_the_hf_model_on_the_export(exported, hf_lm):
    import specformer_eval.harness  # noqa: F401  (registers "specformer" with lm_eval)

    checkpoint, _, tasks = exported
    ours = _evaluate("specformer", tasks, model_args={"checkpoint": str(checkpoint)}, batch_size=2)
    theirs = _evaluate(hf_lm, tasks)
    for metric in ("acc,none", "acc_norm,none"):
        assert ours["results"][TASK][metric] == theirs["results"][TASK][metric], metric
    ours_ll = [[r[0][0] for r in s["resps"]] for s in sorted(ours["samples"][TASK], key=lambda s: s["doc_id"])]
    theirs_ll = [[r[0][0] for r in s["resps"]] for s in sorted(theirs["samples"][TASK], key=lambda s: s["doc_id"])]
    assert len(ours_ll) == len(QUESTIONS)
    for a, b in zip(ours_ll, theirs_ll):
        assert a == pytest.approx(b, abs=1e-4)
    # The model has opinions: the choices of a question do not all score the same.
    assert all(max(row) - min(row) > 0.1 for row in ours_ll)


def test_rolling_loglikelihood_equals_the_hf_model(our_lm, hf_lm):
    texts = [" ".join(corpus(40)[i::7]) for i in range(3)]  # long enough for several 64-token windows
    requests = [Instance(request_type="loglikelihood_rolling", doc={}, arguments=(t,), idx=i) for i, t in enumerate(texts)]
    assert len(our_lm.tok_encode(texts[0])) > 2 * our_lm.max_length
    ours = our_lm.loglikelihood_rolling(requests, disable_tqdm=True)
    theirs = hf_lm.loglikelihood_rolling(requests, disable_tqdm=True)
    assert ours == pytest.approx(theirs, abs=1e-3)


def test_greedy_generation_equals_the_hf_model(our_lm, hf_lm):
    settings = {"until": ["park"], "max_gen_toks": 12, "do_sample": False}
    prompts = ["the cat sat on", "a bird sang in the old tree near the", "children"]
    requests = [Instance(request_type="generate_until", doc={}, arguments=(p, dict(settings)), idx=i)
                for i, p in enumerate(prompts)]
    ours = our_lm.generate_until(requests, disable_tqdm=True)
    theirs = hf_lm.generate_until(requests, disable_tqdm=True)
    assert ours == theirs
    assert all("park" not in text for text in ours) and any(text for text in ours)


def test_sampling_uses_specformer_samplers(our_lm):
    assert our_lm._sampler({"do_sample": False}) is None
    sampler = our_lm._sampler({"do_sample": True, "temperature": 0.7, "top_k": 5, "top_p": 0.9})
    assert [type(s).__name__ for s in sampler.steps] == ["Temperature", "TopK", "TopP"]
    assert not our_lm._sampler({"do_sample": True}).is_greedy  # a plain draw when nothing is named


def test_specformer_eval_tasks_on_the_command_line(capsys, exported):
    checkpoint, _, tasks = exported
    code = main(["eval", str(checkpoint), "--tasks", TASK, "--include-path", str(tasks), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert 0.0 <= report["tasks"][TASK]["acc,none"] <= 1.0


@pytest.mark.slow  # an unknown name is looked for among lm_eval's thousands of built-in tasks too
def test_an_unknown_task_is_named_with_the_closest_ones(capsys, exported):
    checkpoint, _, tasks = exported
    code = main(["eval", str(checkpoint), "--tasks", "specformer_tiny_chioce", "--include-path", str(tasks)])
    _, err = capsys.readouterr()
    assert code == 2 and "unknown lm-evaluation-harness task 'specformer_tiny_chioce'" in err and TASK in err
