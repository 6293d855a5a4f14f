"""Chat templates render as transformers' apply_chat_template does; chat rows mask everything but the replies."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import specformer
from specformer.errors import UserError
from specformer.tokenizers.tokenizer import ByteTokenizer
from specformer_finetune.chat_data import ChatRows, encode_file, encode_record, looks_like_chat
from specformer_text.chat_template import BUILTIN, TemplateError, render, special_tokens, template_from_metadata
from specformer_train.config import TrainSpec
from specformer_train.trainer import Trainer

from .conftest import TINY_MODEL, TINY_TRAIN

# In the style of Llama 3's tokenizer_config.json: bos_token, loop.index0, trim, a generation prompt.
LLAMA3_STYLE = (
    "{% set loop_messages = messages %}"
    "{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# In the style of Qwen 2.5's: a default system message, tools through tojson, a namespace, whitespace control.
QWEN_STYLE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- elif messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(turns=0) %}
{%- for message in messages %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) or message.role == "assistant" %}
        {%- set ns.turns = ns.turns + 1 %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role != "system" %}
        {{- raise_exception('unknown role ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

CONVERSATION = [
    {"role": "system", "content": "Answer in one word. \u00e9t\u00e9 \u2713"},
    {"role": "user", "content": "  Capital of France?  "},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
]


def _hf_tokenizer(template: str, **tokens: str):
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from tokenizers import models, pre_tokenizers

    inner = tokenizers.Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "<s>": 2, "</s>": 3}, merges=[]))
    inner.pre_tokenizer = pre_tokenizers.ByteLevel()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=inner, chat_template=template, **tokens)


@pytest.mark.parametrize("template", [LLAMA3_STYLE, QWEN_STYLE, BUILTIN["chatml"]], ids=["llama3", "qwen", "chatml"])
@pytest.mark.parametrize("generation_prompt", [False, True])
def test_template_renders_as_transformers_does(template: str, generation_prompt: bool) -> None:
    settings = {"bos_token": "<s>", "eos_token": "</s>"}
    tokenizer = _hf_tokenizer(template, **settings)
    expected = tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=generation_prompt)
    ours = render(template, CONVERSATION, add_generation_prompt=generation_prompt, **special_tokens(settings))
    assert ours == expected


def test_tools_render_through_tojson_as_transformers_does() -> None:
    tools = [{"type": "function", "function": {"name": "add", "description": "x < y & \u00e9",
                                               "parameters": {"type": "object", "properties": {}}}}]
    tokenizer = _hf_tokenizer(QWEN_STYLE, bos_token="<s>", eos_token="</s>")
    expected = tokenizer.apply_chat_template(CONVERSATION[1:], tools=tools, tokenize=False)
    assert render(QWEN_STYLE, CONVERSATION[1:], tools=tools) == expected


def test_raise_exception_and_the_sandbox_are_clear_errors() -> None:
    with pytest.raises(TemplateError, match="unknown role tool"):
        render(QWEN_STYLE, [{"role": "tool", "content": "x"}])
    with pytest.raises(TemplateError, match="refused|not"):
        render("{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}", [])
    with pytest.raises(TemplateError, match="does not compile"):
        render("{% for m in messages %}", [])


def test_template_from_an_imported_checkpoint_header() -> None:
    header = {"hf.tokenizer_config": json.dumps({"chat_template": LLAMA3_STYLE, "bos_token": {"content": "<s>"},
                                                 "eos_token": "</s>"})}
    template, tokens = template_from_metadata(header)
    assert template == LLAMA3_STYLE and tokens == {"bos_token": "<s>", "eos_token": "</s>"}
    assert template_from_metadata({}) is None


def test_mask_covers_exactly_the_replies() -> None:
    tokenizer = ByteTokenizer()
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    ids, mask = encode_record({"messages": messages}, tokenizer, (BUILTIN["chatml"], {}))
    assert tokenizer.decode(ids) == render(BUILTIN["chatml"], messages)
    assert tokenizer.decode([t for t, m in zip(ids, mask) if m]) == "yo<|im_end|>\n4<|im_end|>\n"
    ids, mask = encode_record({"prompt": "Q: 1+1\nA: ", "completion": "2"}, tokenizer, None)
    assert tokenizer.decode([t for t, m in zip(ids, mask) if m]) == "2"
    assert tokenizer.decode(ids) == "Q: 1+1\nA: 2"


class _OneConversation:
    """The same packed row every time, and its mask: what ChatRows gives, without the shuffling."""

    def __init__(self, ids: list[int], mask: list[bool]) -> None:
        self.ids, self.mask = np.asarray([ids], dtype=np.int64), np.asarray([mask], dtype=bool)
        self.seq_len, self.rows_per_epoch = len(ids) - 1, 1

    def check_fits(self, global_batch: int) -> None:
        pass

    def rows(self, first: int, count: int) -> np.ndarray:
        return np.repeat(self.ids, count, axis=0)

    def loss_mask(self, first: int, count: int) -> np.ndarray:
        return np.repeat(self.mask, count, axis=0)


def test_loss_of_a_two_turn_conversation_counts_only_the_assistant_tokens(tmp_path: Path) -> None:
    tokenizer = ByteTokenizer()
    messages = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi!"},
                {"role": "user", "content": "name?"}, {"role": "assistant", "content": "Ada"}]
    ids, mask = encode_record({"messages": messages}, tokenizer, (BUILTIN["chatml"], {}))
    ids, mask = [tokenizer.eot_id, *ids], [False, *mask]
    model_spec = {**copy.deepcopy(TINY_MODEL), "context_length": 256}
    model = specformer.build({"model": model_spec}, seed=5)
    reference = copy.deepcopy(model).eval()
    config = TrainSpec(**{**TINY_TRAIN, "batch_size": 1, "seq_len": len(ids) - 1, "grad_clip": None})
    trainer = Trainer(model=model, config=config, train_rows=_OneConversation(ids, mask), val_rows=None,
                      tokenizer=tokenizer, out_dir=tmp_path, device="cpu")
    loss, _ = trainer._train_step(0.0)

    # By hand: mean of -log p(target) over the positions whose target is an assistant token.
    x = torch.tensor([ids])
    with torch.no_grad():
        logp = F.log_softmax(reference(x[:, :-1]).float(), dim=-1)[0]  # (T, vocab)
    counted = [t for t in range(len(ids) - 1) if mask[t + 1]]
    expected = -torch.stack([logp[t, ids[t + 1]] for t in counted]).mean()
    assert len(counted) == len("hi!<|im_end|>\nAda<|im_end|>\n")
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    everything = F.cross_entropy(logp, x[0, 1:])
    assert not torch.allclose(loss, everything)  # the mask made a difference


def test_chat_rows_cut_the_mask_beside_the_tokens(tmp_path: Path, chat_file: Path) -> None:
    assert looks_like_chat(str(chat_file)) and not looks_like_chat(str(tmp_path / "none.jsonl"))
    corpus = encode_file(str(chat_file), ByteTokenizer(), (BUILTIN["chatml"], {}))
    rows = ChatRows(corpus.tokens, corpus.mask, seq_len=31, seed=0)
    tokens, mask = rows.rows(40, 8), rows.loss_mask(40, 8)
    for row, row_mask in zip(tokens, mask):
        text = ByteTokenizer().decode([int(t) for t, m in zip(row, row_mask) if m])
        assert set(text) <= set("0123456789.<|im_end>\n")  # replies only: digits, dots and end markers


def test_bad_records_name_the_line_and_what_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "x"}]}) + "\n")
    with pytest.raises(UserError, match=r"line 1: the conversation has no assistant message"):
        encode_file(str(path), ByteTokenizer(), (BUILTIN["chatml"], {}))
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "x"},
                                             {"role": "assistant", "content": "y"}]}) + "\n" + "{\"prompt\": 3}\n")
    with pytest.raises(UserError, match=r"line 2: neither 'messages' nor 'prompt' and 'completion'.*accepted"):
        encode_file(str(path), ByteTokenizer(), (BUILTIN["chatml"], {}))
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "x"},
                                             {"role": "assistant", "content": "y"}]}) + "\n")
    with pytest.raises(UserError, match="need a chat template"):
        encode_file(str(path), ByteTokenizer(), None)
