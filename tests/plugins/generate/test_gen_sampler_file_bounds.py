"""--sampler files are untrusted input: read within the core's bounds (issue 14)."""

from __future__ import annotations

import pytest

from specformer.errors import UserError
from specformer_generate.generate_command import parse_sampler_option


def _bomb() -> str:
    lines = ['a0: &a0 ["x"]']
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\ngenerate: {sampler: *a9}\n"


def test_an_alias_bomb_sampler_file_is_refused_quickly(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb())
    with pytest.raises(UserError, match="aliases") as info:
        parse_sampler_option(str(path))
    assert len(str(info.value)) < 400


def test_an_inline_alias_bomb_is_refused_too():
    with pytest.raises(UserError, match="aliases"):
        parse_sampler_option(_bomb().replace("\n", "\n"))


def test_a_non_utf8_sampler_file_names_the_file(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_bytes(b"- {kind: top_k, k: 3}  # caf\xe9\n")
    with pytest.raises(UserError, match="not UTF-8") as info:
        parse_sampler_option(str(path))
    assert str(path) in str(info.value)


def test_a_good_sampler_file_still_works(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("[{kind: top_k, k: 3}, greedy]\n")
    assert parse_sampler_option(str(path)) is not None
    with pytest.raises(UserError, match="no such file"):
        parse_sampler_option(str(tmp_path / "missing.yaml"))
