"""Where a chat turn ends: markers from the template, the tokenizer_config's eos_token, the generation_config's ids;
one-token markers as ids, others as text."""

from __future__ import annotations

import json

from specformer.tokenizers.tokenizer import ByteTokenizer, NoTokenizer
from specformer_text import BUILTIN, TurnEnd, turn_end
from specformer_text.end_of_turn import template_markers

BYTES = ByteTokenizer()
LLAMA3 = ("{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>"
          "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
GEMMA = ("{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
         "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def test_the_known_markers_a_template_writes_are_found() -> None:
    assert template_markers(BUILTIN["chatml"]) == ["<|im_end|>"]
    assert template_markers(LLAMA3) == ["<|eot_id|>"]
    assert template_markers(GEMMA) == ["<end_of_turn>"]
    assert template_markers("{{ messages[0]['content'] }}") == []


def test_the_headers_eos_token_and_generation_config_ids_count_too() -> None:
    metadata = {"hf.tokenizer_config": json.dumps({"eos_token": {"content": "</s>"}}),
                "hf.generation_config": json.dumps({"eos_token_id": [7, 300, True]})}
    end = turn_end(GEMMA, tokenizer=BYTES, metadata=metadata)
    assert end.strings == ("<end_of_turn>", "</s>")
    assert end.ids == {7}  # 300 is outside the byte tokenizer's vocabulary, True is no id
    single = {"hf.generation_config": json.dumps({"eos_token_id": 9})}
    assert turn_end("", tokenizer=BYTES, metadata=single).ids == {9}
    damaged = {"hf.tokenizer_config": "{not json", "hf.generation_config": "[1, 2]"}
    assert turn_end(BUILTIN["chatml"], tokenizer=BYTES, metadata=damaged) == TurnEnd(strings=("<|im_end|>",))


def test_the_end_of_text_marker_is_the_byte_tokenizers_special_id_not_its_spelling() -> None:
    end = turn_end("{{ m }}<|endoftext|>", tokenizer=BYTES)
    assert end.ids == {BYTES.eot_id} and end.strings == ()


def test_a_tokenizer_without_text_keeps_only_the_headers_ids() -> None:
    metadata = {"hf.generation_config": json.dumps({"eos_token_id": [3]})}
    end = turn_end(BUILTIN["chatml"], tokenizer=NoTokenizer(vocab_size=10), metadata=metadata)
    assert end == TurnEnd(ids=frozenset({3}))


def test_cut_settled_and_visible() -> None:
    end = TurnEnd(ids=frozenset({5}), strings=("<|im_end|>", "</s>"))
    assert end.cut("ok</s> more <|im_end|>") == ("ok", True)
    assert end.cut("ok") == ("ok", False)
    assert end.settled("ok <|im_") == "ok "  # may still become the marker
    assert end.settled("ok <") == "ok "
    assert end.settled("ok <|x") == "ok <|x"  # can no longer be one
    assert end.visible([1, 2, 5]) == [1, 2] and end.visible([5, 1]) == [5, 1]
