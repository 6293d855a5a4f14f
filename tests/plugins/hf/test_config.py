"""ConfigReader, activations and rope parameters on hand-written config.json contents."""

from __future__ import annotations

import warnings

import pytest

from specformer.errors import UserError
from specformer_hf.config import (
    ConfigReader,
    TooManyLayers,
    UnreadConfigWarning,
    activation_from_hf,
    rope_parameters,
)


def reader(data: dict, defaults: dict | None = None, **kw) -> ConfigReader:
    return ConfigReader(data, defaults=defaults or {}, family="llama", **kw)


def test_get_prefers_the_file_then_the_family_default_then_the_callers() -> None:
    cfg = reader({"a": 1, "n": None}, {"a": 2, "b": 3})
    assert cfg.get("a") == 1
    assert cfg.get("b") == 3
    assert cfg.get("c", 4) == 4
    assert cfg.get("c", None) is None  # None is a default like any other
    assert cfg.get("n") is None and cfg.has("n")
    assert not cfg.has("b")  # a family default is not in the file


def test_a_field_without_a_default_is_named() -> None:
    with pytest.raises(UserError, match=r"^llama: config.json has no 'rope_theta' field and it has no default; the file looks incomplete$"):
        reader({}).get("rope_theta")


def test_integers_and_sizes() -> None:
    cfg = reader({"i": 3, "zero": 0, "neg": -2, "t": True, "f": 2.0, "s": "4"})
    assert cfg.get_int("i") == 3
    assert cfg.get_int("zero") == 0
    assert cfg.get_int("missing", 7) == 7
    assert cfg.get_size("i") == 3
    assert cfg.get_size("missing", 1) == 1  # 1 is the smallest size
    for key in ("t", "f", "s"):
        with pytest.raises(UserError, match=rf"^llama: config field '{key}' must be an integer, got "):
            cfg.get_int(key)
    for key, value in (("zero", "0"), ("neg", "-2")):
        with pytest.raises(UserError, match=rf"^llama: config field '{key}' must be a positive integer, got {value}$"):
            cfg.get_size(key)


def test_a_width_the_heads_do_not_divide_is_named_with_both_fields() -> None:
    assert reader({"n_embd": 12, "n_head": 3}).get_width_and_heads("n_embd", "n_head", model="GPT-1") == (12, 3)
    with pytest.raises(UserError, match=r"^llama: config field 'n_embd' = 12 is not a multiple of 'n_head' = 5; "
                                        r"GPT-1's heads split the model width evenly$"):
        reader({"n_embd": 12, "n_head": 5}).get_width_and_heads("n_embd", "n_head", model="GPT-1")
    with pytest.raises(UserError, match=r"'n_head' must be a positive integer, got 0$"):
        reader({"n_embd": 12, "n_head": 0}).get_width_and_heads("n_embd", "n_head", model="GPT-1")


def test_the_layer_count_is_bounded_by_the_tensors() -> None:
    assert reader({"num_hidden_layers": 4}, max_layers=4).get_layers("num_hidden_layers") == 4
    assert reader({"num_hidden_layers": 10**18}).get_layers("num_hidden_layers") == 10**18  # no folder: no bound
    with pytest.raises(TooManyLayers, match=r"^llama: config.json describes 5 layers \(num_hidden_layers\), "
                                            r"but the weights hold only 4 tensors$"):
        reader({"num_hidden_layers": 5}, max_layers=4).get_layers("num_hidden_layers")
    with pytest.raises(UserError, match="must be a positive integer, got 0"):
        reader({"num_hidden_layers": 0}, max_layers=4).get_layers("num_hidden_layers")


def test_floats() -> None:
    cfg = reader({"x": 2, "y": 0.5, "t": False, "s": "1e-5"})
    assert cfg.get_float("x") == 2.0 and isinstance(cfg.get_float("x"), float)
    assert cfg.get_float("y") == 0.5
    assert cfg.get_float("missing", 3) == 3.0
    for key in ("t", "s"):
        with pytest.raises(UserError, match=rf"^llama: config field '{key}' must be a number, got "):
            cfg.get_float(key)


def test_require_accepts_the_listed_values_and_names_them_otherwise() -> None:
    cfg = reader({"bias": False, "act": "tanh"})
    assert cfg.require("bias", [False], why="biases") is False
    assert cfg.require("absent", [None, 0], why="x", default=None) is None
    with pytest.raises(UserError, match="config.json has no 'absent' field and it has no default"):
        cfg.require("absent", [None], why="x")  # no default: missing, not "None is not supported"
    with pytest.raises(UserError) as one:
        cfg.require("bias", [True], why="specformer always adds biases")
    assert str(one.value) == ("llama: config field 'bias' = False is not supported: specformer always adds biases. "
                              "Supported value: True")
    with pytest.raises(UserError) as two:
        cfg.require("act", iter(["a", "b"]), why="no tanh")
    assert str(two.value).endswith("Supported values: 'a', 'b'")


def test_unread_fields_are_reported_except_harmless_ones() -> None:
    cfg = reader({"hidden_size": 8, "eos_token_id": 2, "mystery": 1, "also_ok": 0, "zeta": 1, "alpha": 2})
    cfg.get("hidden_size")
    cfg.mark_read("zeta")
    cfg.note_unused("rope_parameters.beta_fast")
    assert cfg.unread(also_harmless=["also_ok"]) == ["alpha", "mystery", "rope_parameters.beta_fast"]
    with pytest.warns(UnreadConfigWarning) as caught:
        assert cfg.warn_unread(also_harmless=["also_ok"]) == ["alpha", "mystery", "rope_parameters.beta_fast"]
    assert str(caught[0].message) == (
        "llama: config.json fields not understood by specformer and ignored: alpha, mystery, "
        "rope_parameters.beta_fast. If any of them changes the model, the import is not faithful.")
    quiet = reader({"hidden_size": 8})
    quiet.get("hidden_size")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert quiet.warn_unread() == []


@pytest.mark.mutation_exempt("mutmut's trampoline adds a stack frame, so the warning moves on unmutated code")
def test_an_unread_field_warning_points_at_the_code_that_called_the_family() -> None:
    def family_rule(cfg: ConfigReader) -> list[str]:  # stacklevel=3: the code that called the family
        return cfg.warn_unread()

    with pytest.warns(UnreadConfigWarning) as caught:
        family_rule(reader({"mystery": 1}))
    assert caught[0].filename == __file__


@pytest.mark.parametrize("hf, ours", [("gelu", "gelu"), ("gelu_new", "gelu_tanh"), ("gelu_fast", "gelu_tanh"),
                                      ("gelu_pytorch_tanh", "gelu_tanh"), ("gelu_python_tanh", "gelu_tanh"),
                                      ("relu", "relu"), ("relu2", "relu2"), ("silu", "silu"), ("swish", "silu")])
def test_activation_names(hf: str, ours: str) -> None:
    assert activation_from_hf(reader({"hidden_act": hf}), "hidden_act") == ours


@pytest.mark.parametrize("bad", ["tanh", 3, None])
def test_an_unknown_activation_lists_the_known_ones(bad) -> None:
    with pytest.raises(UserError) as caught:
        activation_from_hf(reader({"hidden_act": bad}), "hidden_act")
    assert str(caught.value) == (
        f"llama: config field 'hidden_act' = {bad!r} is an activation specformer does not implement; supported: "
        "gelu, gelu_fast, gelu_new, gelu_python_tanh, gelu_pytorch_tanh, relu, relu2, silu, swish")


def test_rope_parameters_of_each_vintage() -> None:
    # transformers 5: rope_parameters as written.
    new = reader({"rope_parameters": {"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0}})
    assert rope_parameters(new) == {"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0}
    assert new.unread() == []  # rope_parameters counts as read
    # Older: top-level rope_theta and rope_scaling with `type`.
    old = reader({"rope_theta": 1e4, "rope_scaling": {"type": "dynamic", "factor": 4.0}})
    assert rope_parameters(old) == {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 1e4}
    assert old.unread() == []  # rope_theta and rope_scaling count as read
    # Both type keys: rope_type wins and `type` is dropped.
    both = reader({"rope_scaling": {"type": "x", "rope_type": "linear", "factor": 2.0}})
    assert rope_parameters(both) == {"rope_type": "linear", "factor": 2.0}
    # Both forms: rope_scaling wins, as in transformers 5.
    mixed = reader({"rope_parameters": {"rope_type": "default", "rope_theta": 1.0},
                    "rope_scaling": {"rope_type": "linear", "factor": 3.0}})
    assert rope_parameters(mixed) == {"rope_type": "linear", "factor": 3.0}
    # Nothing at all: the family's defaults, then rope_type "default".
    bare = reader({}, {"rope_parameters": {"rope_theta": 10000.0}})
    assert rope_parameters(bare) == {"rope_theta": 10000.0, "rope_type": "default"}
    assert rope_parameters(reader({})) == {"rope_type": "default"}


def test_rope_parameters_file_values_beat_defaults_and_legacy_keys() -> None:
    cfg = reader({"rope_parameters": {"rope_theta": 5.0}, "rope_theta": 7.0, "rotary_pct": 0.25},
                 {"rope_parameters": {"rope_theta": 9.0, "partial_rotary_factor": 1.0}})
    got = rope_parameters(cfg, extra_legacy={"rotary_pct": "partial_rotary_factor"})
    assert got == {"rope_theta": 5.0, "partial_rotary_factor": 0.25, "rope_type": "default"}
    # A differently named theta field (GPT-NeoX's rotary_emb_base) and legacy keys are read from the file.
    neox = reader({"rotary_emb_base": 123.0, "rotary_pct": 0.5})
    got = rope_parameters(neox, theta_key="rotary_emb_base", extra_legacy={"rotary_pct": "partial_rotary_factor"})
    assert got == {"rope_theta": 123.0, "partial_rotary_factor": 0.5, "rope_type": "default"}
    assert neox.unread() == []  # every rope field counts as read


@pytest.mark.parametrize("data, message", [
    ({"rope_parameters": [1, 2]}, "^llama: config field 'rope_parameters' must be a mapping, got \\[1, 2\\]$"),
    ({"rope_scaling": "linear"}, "^llama: config field 'rope_scaling' must be a mapping or null, got 'linear'$"),
])
def test_rope_fields_of_the_wrong_type_are_refused(data: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        rope_parameters(reader(data))
