"""lm-evaluation-harness's ``local-completions`` and ``local-chat-completions`` against the server equal its ``hf`` model.

The way lm_eval's documentation runs an OpenAI-compatible server: ``local-completions``
with ``base_url`` the server's /v1/completions, a local Hugging Face tokenizer
(``tokenizer_backend=huggingface``, ``tokenizer=`` the exported folder, which holds the
byte tokenizer as tokenizer.json), and ``max_length`` the model's context. For every
log-likelihood it sends token ids with ``echo: true, logprobs: 1, max_tokens: 1`` and
reads the prompt's logprobs back. ``local-chat-completions`` asks for generations only (lm_eval
defines no log-likelihood over chat completions): a greedy generate_until task with the chat
template applied gives the hf model's replies under the same template. Everything is local:
tasks defined here, no download.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile

import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_CACHE", tempfile.mkdtemp(prefix="specformer-datasets-"))

lm_eval = pytest.importorskip(
    "lm_eval", reason="lm-evaluation-harness is not installed; it comes with the eval extra: pip install 'specformer[eval]'")
pytest.importorskip("transformers", reason="transformers is a test-only dependency")
if importlib.util.find_spec("tenacity") is None or importlib.util.find_spec("aiohttp") is None:
    pytest.skip("lm_eval's API models need its 'api' extra (tenacity, aiohttp): pip install 'specformer[eval]'",
                allow_module_level=True)

import specformer_hf  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402
from fixtures.lm_eval_tasks import write_choice_task  # noqa: E402

pytestmark = pytest.mark.slow  # loads lm_eval, transformers and a task: tens of seconds

TASK = "specformer_served_choice"
QUESTIONS = [
    ("2 + 2 =", [" 4", " 5", " 22"], 0),
    ("The sky is", [" blue", " green", " loud"], 0),
    ("Cats say", [" woof", " meow"], 1),
    ("Ice is", [" hot", " cold", " dry"], 1),
    ("One, two,", [" three", " ten"], 0),
    ("Fish live in", [" trees", " water", " fire"], 1),
]
CONTEXT = 96  # the served model's (conftest)


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    """The served model's Hugging Face export (byte tokenizer included) and a task folder."""
    root = tmp_path_factory.mktemp("lm-eval-client")
    hf_dir = specformer_hf.to_hf(model, root / "hf")
    tasks = write_choice_task(root / "tasks", TASK, QUESTIONS, metrics=("acc",))
    return hf_dir, tasks


@pytest.fixture(scope="module")
def served_lm(server, exported):
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    hf_dir, _ = exported
    # batch_size 3: several token-id prompts in one request, each echoed and scored.
    return LocalCompletionsAPI(model="tiny", base_url=f"{server.url}/v1/completions", tokenizer_backend="huggingface",
                               tokenizer=str(hf_dir), max_length=CONTEXT, batch_size=3, max_retries=1)


@pytest.fixture(scope="module")
def hf_lm(exported):
    from lm_eval.models.huggingface import HFLM

    hf_dir, _ = exported
    # local-completions keeps one token of max_length for the token it asks for and one for the context of each
    # rolling window: its windows are max_length - 2 tokens, which HFLM makes of its own max_length.
    return HFLM(pretrained=str(hf_dir), device="cpu", batch_size=4, dtype="float32", max_length=CONTEXT - 2)


def _evaluate(lm, tasks):
    return lm_eval.simple_evaluate(model=lm, tasks=[TASK], task_manager=TaskManager(include_path=str(tasks),
                                                                                    include_defaults=False),
                                   log_samples=True)


def _per_doc(result):
    samples = sorted(result["samples"][TASK], key=lambda s: s["doc_id"])
    return [[r[0] for r in s["resps"]] for s in samples]  # per choice: (loglikelihood, is_greedy)


def test_multiple_choice_through_the_server_scores_as_the_hf_model(served_lm, hf_lm, exported):
    _, tasks = exported
    ours, theirs = _evaluate(served_lm, tasks), _evaluate(hf_lm, tasks)
    assert ours["results"][TASK]["acc,none"] == theirs["results"][TASK]["acc,none"]
    ours_docs, theirs_docs = _per_doc(ours), _per_doc(theirs)
    assert len(ours_docs) == len(QUESTIONS)
    for a, b in zip(ours_docs, theirs_docs):
        assert [ll for ll, _ in a] == pytest.approx([ll for ll, _ in b], abs=1e-4)
        assert [greedy for _, greedy in a] == [greedy for _, greedy in b]
    assert all(max(ll for ll, _ in doc) - min(ll for ll, _ in doc) > 0.1 for doc in ours_docs)  # it has opinions


def test_greedy_continuations_are_greedy_through_the_server(served_lm, hf_lm, model):
    """is_greedy, which lm_eval reads from the top logprob of every continuation token, agrees with the hf model."""
    from specformer_generate import generate

    requests = []
    for context in ["Once upon", "The answer is", "abc", "Hello", "0123", "x = ", "Why", "print(", "zz", "Q:"]:
        ids = list(context.encode())
        continuation = generate(model, [ids], max_new_tokens=3)[0][len(ids):]
        if all(32 <= t < 127 for t in continuation):  # text that is one token per character
            text = bytes(continuation).decode()
            requests.append(Instance(request_type="loglikelihood", doc={}, arguments=(context, text), idx=len(requests)))
            requests.append(Instance(request_type="loglikelihood", doc={}, arguments=(context, text[::-1] + "#"),
                                     idx=len(requests)))
    assert len(requests) >= 4, "too few printable greedy continuations to test with"
    ours = served_lm.loglikelihood(requests, disable_tqdm=True)
    theirs = hf_lm.loglikelihood(requests, disable_tqdm=True)
    assert [g for _, g in ours] == [g for _, g in theirs]
    assert any(g for _, g in ours) and not all(g for _, g in ours)
    assert [ll for ll, _ in ours] == pytest.approx([ll for ll, _ in theirs], abs=1e-4)


def test_rolling_loglikelihood_through_the_server_equals_the_hf_model(served_lm, hf_lm):
    """wikitext's kind of request: a text longer than the context, scored in windows."""
    texts = ["The quick brown fox jumps over the lazy dog. " * 6, "specformer serves what lm_eval asks for, " * 5]
    requests = [Instance(request_type="loglikelihood_rolling", doc={}, arguments=(t,), idx=i) for i, t in enumerate(texts)]
    assert len(texts[0]) > 2 * CONTEXT
    ours = served_lm.loglikelihood_rolling(requests, disable_tqdm=True)
    theirs = hf_lm.loglikelihood_rolling(requests, disable_tqdm=True)
    assert ours == pytest.approx(theirs, abs=1e-3)


CHAT_TASK = "specformer_served_chat"
PROMPTS = ["2 + 2 =", "The sky is", "Name a fruit:", "Once upon a time", "Q: hello\nA:", "abc"]


@pytest.fixture(scope="module")
def chat_exported(model, tmp_path_factory):
    """The export with ChatML as its tokenizer's chat template, and a greedy generate_until task."""
    from specformer_text.chat_template import BUILTIN

    root = tmp_path_factory.mktemp("lm-eval-chat")
    hf_dir = specformer_hf.to_hf(model, root / "hf")
    config_path = hf_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    config_path.write_text(json.dumps({**config, "chat_template": BUILTIN["chatml"]}))
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    (tasks / f"{CHAT_TASK}.yaml").write_text(f"""\
task: {CHAT_TASK}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {tasks / 'prompts.jsonl'}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: ""
generation_kwargs:
  until: ["\\n\\n"]
  max_gen_toks: 16
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
""")
    return hf_dir, tasks


def _generations(lm, tasks):
    result = lm_eval.simple_evaluate(model=lm, tasks=[CHAT_TASK], apply_chat_template=True, log_samples=True,
                                     task_manager=TaskManager(include_path=str(tasks), include_defaults=False))
    samples = sorted(result["samples"][CHAT_TASK], key=lambda s: s["doc_id"])
    return [s["resps"][0][0] for s in samples]


def test_chat_generation_through_the_server_equals_the_hf_model_with_the_same_template(model, chat_exported):
    """``local-chat-completions``: lm_eval sends the messages, the server renders them with ChatML; the hf model
    renders them with the same template from tokenizer_config.json. Greedy, so the replies are equal. (lm_eval's
    chat model asks for no log-likelihoods: OpenAI's chat API returns no prompt logprobs.)"""
    from lm_eval.models.huggingface import HFLM
    from lm_eval.models.openai_completions import LocalChatCompletion

    from specformer_serve.chat_template import chat_renderer

    from .conftest import BYTES, make_server

    hf_dir, tasks = chat_exported
    template = chat_renderer("chatml", {})
    with make_server(model, config={"render_chat": template.render, "turn_end": template.turn_end(BYTES, {})}) as server:
        served = LocalChatCompletion(model="tiny", base_url=f"{server.url}/v1/chat/completions", max_length=CONTEXT,
                                     max_retries=1)
        ours = _generations(served, tasks)
    theirs = _generations(HFLM(pretrained=str(hf_dir), device="cpu", batch_size=1, dtype="float32",
                               max_length=CONTEXT), tasks)
    assert len(ours) == len(PROMPTS)
    assert ours == theirs
    assert len(set(ours)) > 1 and any(ours), ours  # replies that depend on the prompt
