"""What the CLI shows people: plain-text docs, param types with bounds, counts that agree, one size style."""

from __future__ import annotations

import re
import types
from typing import Literal

import pytest
from pydantic import Field

import specformer
from specformer.registry import discovery
from specformer.cli.catalogue import components_json, format_components
from specformer.cli.main import main
from specformer.registry.hookspecs import hookimpl
from specformer.messages import format_bytes, join_path, parse_error_message, plain_text, plural, unknown_message
from specformer.registry.params import Params, SubComponent
from specformer.registry.components import Registry
from specformer.model.summary import format_summary, summarize

from conftest import SPECS

# -- the shared formatters ------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (1, "1 B"), (576, "576 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (37_786, "36.9 KiB"),
     (1_048_524, "1023.9 KiB"), (1_048_575, "1.0 MiB"), (36 * 2**20, "36.0 MiB"), (int(1.5 * 2**30), "1.5 GiB"),
     (3 * 2**40, "3.0 TiB")],
)
def test_format_bytes_uses_binary_units_with_one_decimal(n, text):
    assert format_bytes(n) == text


def test_plural_agrees_with_the_count():
    assert [plural(n, "component") for n in (0, 1, 2)] == ["0 components", "1 component", "2 components"]
    assert plural(1, "entry", "entries") == "1 entry" and plural(3, "entry", "entries") == "3 entries"
    assert plural(12_000, "token") == "12,000 tokens"


def test_join_path_writes_fields_with_dots_and_indices_in_brackets():
    assert join_path("", ["model", "layers", 0, "select"]) == "model.layers[0].select"
    assert join_path("generate", ["sampler", 1, "k"]) == "generate.sampler[1].k"
    assert join_path("generate.sampler", [1, "[0].p"]) == "generate.sampler[1][0].p"
    assert join_path("", [2, "k"]) == "[2].k"


def test_unknown_message_puts_the_guess_before_the_list():
    assert unknown_message("field", "lrr", ["lr", "steps"], quote_name=False) == \
        "unknown field; did you mean 'lr'? accepted: lr, steps"
    assert unknown_message("norm", "zzz", ["rmsnorm"], accepted="registered norm components") == \
        "unknown norm 'zzz'; registered norm components: rmsnorm"


def test_parse_error_message_never_shows_the_parsers_placeholder_name():
    import yaml

    with pytest.raises(yaml.YAMLError) as info:
        yaml.safe_load("a: [1,\nb: 2\n")
    assert parse_error_message(info.value, "YAML") == (
        "not valid YAML at line 3, column 1: expected ',' or ']', but got '<stream end>' "
        "(while parsing a flow sequence that starts at line 1, column 4)"
    )


@pytest.mark.parametrize(
    ("rst", "plain"),
    [
        ("Scale: ``x / rms(x) * weight``.", "Scale: x / rms(x) * weight."),
        ("See :class:`~specformer.registry.components.Registry` and :func:`specformer.build`.", "See Registry and specformer.build."),
        ("The :py:meth:`Decoder.forward <specformer.Decoder.forward>` pass.", "The Decoder.forward pass."),
        ("From `the paper <https://arxiv.org/abs/1910.07467>`_ (*Zhang* and **Sennrich**).",
         "From the paper (Zhang and Sennrich)."),
        ("Multiply a*b*c and 2 * 3 * 4.", "Multiply a*b*c and 2 * 3 * 4."),
        ("Example::\n\n    x = 1", "Example:\n\n    x = 1"),
        # Globs in Markdown code spans are not emphasis (found on the lora targets' description).
        ("Globs: `*` in a segment, `**` across (e.g. `blocks.*.ffn.*`), *really*.",
         "Globs: `*` in a segment, `**` across (e.g. `blocks.*.ffn.*`), really."),
    ],
)
def test_plain_text_removes_restructuredtext_markup(rst, plain):
    assert plain_text(rst) == plain


# -- specformer components ---------------------------------------------------------------


class FancyParams(Params):
    eps: float = Field(default=1e-6, gt=0, description="Added to ``rms(x)``.")
    share: float = Field(default=0.5, ge=0, le=1, description="How much of :class:`Thing` to keep.")
    mode: Literal["fast", "exact"] = Field(default="fast", description="Which kernel.")
    width: int | None = Field(default=None, gt=0, description="Inner width; default ``4 * dim``.")
    inner: SubComponent("norm") | None = Field(default=None, description="A norm inside.")  # type: ignore[valid-type]
    steps: list[int] = Field(default_factory=lambda: [1, 2], description="Steps.")
    n: int = Field(ge=1, description="Required count.")


def fancy(params: FancyParams, *, dim: int) -> object:
    """Normalise by ``x / rms(x)``, see :class:`~specformer.registry.components.Registry` and `RMSNorm <https://x.org>`_.

    The rest of the docstring is not part of the summary.
    """
    return None


def test_components_listing_is_plain_text_with_types_bounds_defaults_and_counts():
    registry = Registry()
    registry.add_kind("sampler", doc="A step that turns next-token logits into a choice.")  # a plugin's kind
    registry.for_plugin("acme").register("norm", "fancy", factory=fancy, params=FancyParams)
    registry.for_plugin("acme").register("sampler", "plain", factory=lambda params: None, params=Params)
    registry.for_plugin("other").register("sampler", "plainer", factory=lambda params: None, params=Params,
                                          doc="Does nothing.")
    assert format_components(registry) == "\n".join([
        "norm (1 component)",
        "  fancy  [acme] Normalise by x / rms(x), see Registry and RMSNorm.",
        "      eps    float > 0               default 1e-06   Added to rms(x).",
        "      share  float ≥ 0, ≤ 1          default 0.5     How much of Thing to keep.",
        '      mode   one of "fast", "exact"  default "fast"  Which kernel.',
        "      width  int > 0 or null         default null    Inner width; default 4 * dim.",
        "      inner  norm component or null  default null    A norm inside.",
        "      steps  list of int             default [1, 2]  Steps.",
        "      n      int ≥ 1                 required        Required count.",
        "",
        "sampler (2 components)",
        "  plain    [acme]",
        "  plainer  [other] Does nothing.",
    ])


def test_components_json_has_the_plain_summary_and_the_types():
    registry = Registry()
    registry.for_plugin("acme").register("norm", "fancy", factory=fancy, params=FancyParams)
    [entry] = components_json(registry)
    assert entry["doc"] == "Normalise by x / rms(x), see Registry and RMSNorm."
    assert entry["types"]["share"] == "float ≥ 0, ≤ 1" and entry["params"]["share"] == 0.5
    assert entry["required"] == ["n"] and entry["params"]["n"] is None


def test_the_cli_listing_has_no_restructuredtext_and_pluralises_every_kind(capsys):
    assert main(["components"]) == 0
    out = capsys.readouterr().out
    assert "``" not in out and ":class:`" not in out and ":func:`" not in out
    registry = specformer.get_registry()
    for kind in {c.kind for c in registry}:
        assert f"\n{kind} ({plural(len(registry.names(kind)), 'component')})\n" in f"\n{out}"
    # The name column is as wide as the kind's longest name (norm: prediction_head).
    assert re.search(r"\n  rmsnorm +\[layers\] Divide by the root mean square of the channels, then scale: x / sqrt\(", out)
    assert "\n      eps     float > 0  default 1e-06  Added to the mean square for stability.\n" in out


@pytest.fixture
def fresh_plugins():
    discovery.reset()
    yield
    discovery.reset()


def test_plugins_listing_pluralises_the_component_count(capsys, fresh_plugins):
    one = types.ModuleType("specformer_solo.plugin")
    one.specformer_register_components = hookimpl(
        lambda registry: registry.register("norm", "solo", factory=fancy, params=FancyParams))
    discovery.register_plugin(discovery.get_plugin_manager(), one, name="solo", distribution="specformer-solo",
                            version="0.3")
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "solo         specformer-solo 0.3  module specformer_solo.plugin  (1 component)\n" in out
    assert "(1 components)" not in out


# -- sizes in the summary ------------------------------------------------------------------


def test_summary_prints_kv_cache_sizes_in_the_one_size_style():
    text = format_summary(summarize(SPECS / "gpt2-124m.yaml"))
    # 2 (k and v) x 12 layers x 768 channels x 4 bytes = 73,728 B per token in fp32; 1024 tokens of bf16.
    assert "KV cache / token               72.0 KiB fp32, 36.0 KiB bf16\n" in text
    assert "KV cache at full context       36.0 MiB bf16 per sequence\n" in text


# -- the plugins print sizes and paths with the core's functions ---------------------------


def test_plugins_format_sizes_and_paths_with_the_core_functions():
    from specformer_hf.specview import differences
    from specformer_train.overrides import apply_overrides
    from specformer_train.rundir import _human

    assert [_human(n) for n in (576, 37_786, 3 * 2**30)] == ["576 B", "36.9 KiB", "3.0 GiB"]
    assert differences({"a": [1, {"b": 2}], "c": 1}, {"a": [1, {"b": 3}], "c": 1}) == [("a[1].b", 2, 3)]
    with pytest.raises(specformer.UserError, match=r"--set 'train.lr.x=1': train.lr is 0.1, not a section"):
        apply_overrides({"train": {"lr": 0.1}}, ["train.lr.x=1"])


def test_a_bad_sampler_given_outside_a_spec_uses_the_one_path_format():
    from specformer_generate.samplers.pipeline import build_sampler

    with pytest.raises(specformer.SpecError) as info:
        build_sampler([{"kind": "top_k", "k": 3}, {"kind": "topp"}, {"kind": "top_k", "kk": 1}])
    assert [str(p) for p in info.value.problems][1:] == ["sampler[2].kk: unknown field; did you mean 'k'? accepted: k, min_tokens_to_keep"]
    assert str(info.value.problems[0]).startswith("sampler[1].kind: unknown sampler 'topp'; did you mean 'top_p'? ")


def test_the_memory_limit_message_uses_the_one_size_style():
    from specformer.machine.memory import human_bytes

    assert [human_bytes(n) for n in (576, 37_786, 1_048_575, 5 * 2**30)] == ["576 B", "36.9 KiB", "1.0 MiB", "5.0 GiB"]


def test_the_json_schema_describes_components_in_plain_text():
    import json

    from specformer.registry.schema import spec_json_schema

    text = json.dumps(spec_json_schema(specformer.get_registry()))
    rmsnorm = specformer.get_registry().get("norm", "rmsnorm")
    assert "``" in rmsnorm.summary  # the docstring itself keeps its markup for the docs site
    assert json.dumps(plain_text(rmsnorm.summary)) in text and json.dumps(rmsnorm.summary) not in text
