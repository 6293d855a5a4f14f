"""Quantized checkpoints: `specformer quantize`, reading them back everywhere, `generate --quantize`, and bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import specformer
from specformer.checkpoint.save_load import read_metadata
from specformer.cli.main import main
from specformer.errors import CheckpointError
from specformer_generate import generate
from specformer_quant import quantize

from fixtures.tiny import tiny_spec

MOE = {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 64}


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is fastest (tests/conftest.py)


def moe_spec() -> dict:
    return tiny_spec(vocab_size=259, d_model=64, context_length=64, tie_embeddings=False, init_std=0.02,
                     block={"ffn": MOE})


@pytest.fixture(scope="module")
def float_checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("quant") / "float.safetensors"
    specformer.save(specformer.build(moe_spec(), seed=0), path, metadata={"tokenizer": json.dumps({"kind": "byte"})})
    return path


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([*map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("method, extra", [("int8", ()), ("int4", ("--group-size", 64)), ("bf16", ())])
def test_quantize_writes_one_file_that_load_generate_and_summary_read(capsys, float_checkpoint, tmp_path, method,
                                                                      extra) -> None:
    out = tmp_path / f"{method}.safetensors"
    code, _, err = cli(capsys, "quantize", float_checkpoint, "--method", method, *extra, "-o", out)
    assert code == 0, err
    header = read_metadata(out)
    recipe = json.loads(header["quantization"])
    assert recipe["scheme"]["kind"] == method and header["tokenizer"] and "spec" in header
    assert any(s.endswith("experts_in") for s in recipe["stacks"])  # MoE experts are quantized too

    expected = specformer.load(float_checkpoint).eval()
    quantize(expected, {"kind": method, **({"group_size": 64} if extra else {})})
    loaded = specformer.load(out).eval()
    ids = torch.randint(0, 259, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(ids), expected(ids))  # the file holds exactly the quantized weights

    code, text, err = cli(capsys, "summary", out)
    assert code == 0, err
    stored = int(text.split("weights in the file: ")[1].split(" bytes")[0].replace(",", ""))
    assert stored == out.stat().st_size - 8 - _header_length(out)
    float_bytes = float_checkpoint.stat().st_size
    # The embedding and LM head stay float32 and are a large share of so small a model.
    assert stored < {"int8": 0.45, "int4": 0.4, "bf16": 0.65}[method] * float_bytes

    code, text, err = cli(capsys, "generate", out, "--prompt", "ab", "--max-new-tokens", 6, "--ignore-eos",
                          "--threads", 1)
    assert code == 0, err
    ids = generate(loaded, [list(b"ab")], max_new_tokens=6)[0]
    assert text == bytes(ids).decode("utf-8", "replace") + "\n"

    held_out = tmp_path / "held_out.txt"
    held_out.write_text("To be, or not to be, that is the question. " * 4)
    code, text, err = cli(capsys, "eval", out, "--data", held_out)
    assert code == 0, err
    assert "perplexity" in (text + err).lower()


def _header_length(path: Path) -> int:
    return int.from_bytes(path.read_bytes()[:8], "little")


def test_generate_quantize_on_load_matches_the_quantized_file(capsys, float_checkpoint, tmp_path) -> None:
    out = tmp_path / "int8.safetensors"
    assert cli(capsys, "quantize", float_checkpoint, "--method", "int8", "-o", out)[0] == 0
    args = ("--prompt", "hello", "--max-new-tokens", 8, "--ignore-eos", "--threads", 1)
    code, on_load, err = cli(capsys, "generate", float_checkpoint, "--quantize", "int8", *args)
    assert code == 0, err
    assert on_load == cli(capsys, "generate", out, *args)[1]


def test_an_untied_head_is_quantized_by_default_and_kept_float_on_request(capsys, float_checkpoint, tmp_path) -> None:
    """The default quantizes an untied LM head with the layers' scheme (the recipe lists it); quantize_lm_head=False,
    `quantize --keep-lm-head-float` and `generate --quantize int8 --keep-lm-head-float` keep it float."""
    from specformer_quant.int8 import Int8Weight
    from specformer_quant.weights import QuantizedLinear

    default = specformer.load(float_checkpoint).eval()
    assert "lm_head" in quantize(default, "int8")["linears"]
    assert isinstance(default.lm_head, QuantizedLinear) and isinstance(default.lm_head.qweight, Int8Weight)
    kept = specformer.load(float_checkpoint).eval()
    assert "lm_head" not in quantize(kept, "int8", quantize_lm_head=False)["linears"]
    assert isinstance(kept.lm_head, torch.nn.Linear)
    with pytest.raises(ValueError, match="quantize_lm_head must be True, False or None"):
        quantize(specformer.load(float_checkpoint), "int8", quantize_lm_head="yes")

    out = tmp_path / "int8-float-head.safetensors"
    code, _, err = cli(capsys, "quantize", float_checkpoint, "--method", "int8", "--keep-lm-head-float", "-o", out)
    assert code == 0, err
    assert "lm_head" not in json.loads(read_metadata(out)["quantization"])["linears"]
    with safe_open(str(out), framework="pt") as f:
        assert "lm_head.weight" in f.keys() and f.get_tensor("lm_head.weight").dtype == torch.float32
    loaded = specformer.load(out).eval()
    ids = torch.randint(0, 259, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(ids), kept(ids))
        assert not torch.equal(loaded(ids), default(ids))  # the head's quantization shows in the logits
    args = ("--prompt", "hello", "--max-new-tokens", 8, "--ignore-eos", "--threads", 1)
    code, on_load, err = cli(capsys, "generate", float_checkpoint, "--quantize", "int8", "--keep-lm-head-float", *args)
    assert code == 0, err
    assert on_load == cli(capsys, "generate", out, *args)[1]
    code, _, err = cli(capsys, "generate", float_checkpoint, "--keep-lm-head-float", *args)
    assert code == 2 and "--quantize" in err and "Traceback" not in err

    tied = moe_spec()
    tied["model"]["tie_embeddings"] = True
    recipe = quantize(specformer.build(tied, seed=0), "int8")  # a tied head stays float unless asked
    assert "tied_head" not in recipe and "lm_head" not in recipe["linears"]


def test_a_checkpoint_quantized_before_the_head_default_loads_as_before(float_checkpoint, tmp_path) -> None:
    """A header written the old way (an untied model, int8, the recipe listing every linear but lm_head, no word
    about the head) loads with its float head: the logits of the layers quantized and the head left as it was."""
    model = specformer.load(float_checkpoint).eval()
    layers = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"
              and n.rsplit(".", 1)[-1] not in ("router", "shared_gate")]
    stacks = [n for n, p in model.named_parameters() if p.dim() == 3]
    expected = specformer.load(float_checkpoint).eval()
    quantize(expected, "int8", quantize_lm_head=False)
    old_recipe = json.dumps({"scheme": {"kind": "int8"}, "linears": layers, "stacks": stacks})  # the old writer's form
    old = tmp_path / "old-int8.safetensors"
    specformer.save(expected, old, metadata={"tokenizer": json.dumps({"kind": "byte"}), "quantization": old_recipe})
    loaded = specformer.load(old).eval()
    assert isinstance(loaded.lm_head, torch.nn.Linear)
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)
    ids = torch.randint(0, 259, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(ids), expected(ids))


def _forge(source: Path, target: Path, *, recipe=None, tensors=None) -> None:
    with safe_open(str(source), framework="pt") as f:
        stored = {k: f.get_tensor(k) for k in f.keys()}
        header = dict(f.metadata())
    if recipe is not None:
        header["quantization"] = recipe if isinstance(recipe, str) else json.dumps(recipe)
    stored.update(tensors or {})
    save_file(stored, str(target), metadata=header)


def test_bad_quantized_checkpoints_are_one_clear_error(capsys, float_checkpoint, tmp_path) -> None:
    good = tmp_path / "int8.safetensors"
    assert cli(capsys, "quantize", float_checkpoint, "--method", "int8", "-o", good)[0] == 0
    recipe = json.loads(read_metadata(good)["quantization"])
    name = recipe["linears"][0]
    cases = {
        "unknown scheme": ({**recipe, "scheme": {"kind": "int3"}}, None, "unknown quantization 'int3'"),
        "not json": ("{int8", None, "not valid JSON"),
        "scale shape": (None, {f"{name}.qweight.scale": torch.ones(3)}, "mismatched quantization shapes"),
        "scalar codes": (None, {f"{name}.qweight.q": torch.tensor(3, dtype=torch.int8)}, "at least 2 dimensions"),
        "not a linear": ({**recipe, "linears": [*recipe["linears"], "embedding"]}, None, "embedding.qweight.q"),
    }
    for label, (bad_recipe, tensors, message) in cases.items():
        path = tmp_path / f"{label}.safetensors"
        _forge(good, path, recipe=bad_recipe, tensors=tensors)
        with pytest.raises(CheckpointError, match=message):
            specformer.load(path)
        for command in (("generate", path, "--prompt", "a"), ("summary", path)):
            code, out, err = cli(capsys, *command)
            assert code == 2 and message in err and "Traceback" not in err, (label, command, err)


def test_bad_methods_write_nothing(capsys, float_checkpoint, tmp_path) -> None:
    out = tmp_path / "never.safetensors"
    for args, message in ((("--method", "int3"), "unknown quantization 'int3'"),
                          (("--method", "int4", "--group-size", 48), "group_size"),
                          (("--method", "int8", "--group-size", 32), "group_size")):
        code, _, err = cli(capsys, "quantize", float_checkpoint, *args, "-o", out)
        assert code == 2 and message in err and "Traceback" not in err, err
        assert not out.exists()
    quantized = tmp_path / "q.safetensors"
    assert cli(capsys, "quantize", float_checkpoint, "--method", "bf16", "-o", quantized)[0] == 0
    code, _, err = cli(capsys, "quantize", quantized, "--method", "int8", "-o", out)
    assert code == 2 and "already quantized" in err and not out.exists()
    code, _, err = cli(capsys, "generate", float_checkpoint, "--quantize", "int5", "--prompt", "a")
    assert code == 2 and "unknown quantization 'int5'" in err
    narrow = tmp_path / "narrow.safetensors"  # d_model 48: int4's group of 32 does not divide it
    data = moe_spec()
    data["model"].update(d_model=48)
    data["model"]["block"]["mixer"].update(n_heads=4, n_kv_heads=2)
    specformer.save(specformer.build(data, seed=0), narrow)
    for command in (("quantize", narrow, "--method", "int4", "-o", out), ("generate", narrow, "--quantize", "int4",
                                                                        "--prompt", "a")):
        code, _, err = cli(capsys, *command)
        assert code == 2 and "multiple of it" in err and "Traceback" not in err, err
        assert not out.exists()


def test_a_tied_lm_head_is_quantized_as_a_copy_and_read_back(capsys, tmp_path) -> None:
    """--quantize-lm-head on a tied model: the head becomes a quantized copy of the embedding (the embedding stays
    float for lookups), the file stores it as lm_head.qweight.*, and load gives the same logits."""
    data = moe_spec()
    data["model"]["tie_embeddings"] = True
    source = tmp_path / "tied.safetensors"
    float_model = specformer.build(data, seed=0).eval()
    specformer.save(float_model, source, metadata={"tokenizer": json.dumps({"kind": "byte"})})
    out = tmp_path / "tied-int8.safetensors"
    code, _, err = cli(capsys, "quantize", source, "--method", "int8", "--quantize-lm-head", "-o", out)
    assert code == 0, err
    recipe = json.loads(read_metadata(out)["quantization"])
    assert recipe["tied_head"] is True
    with safe_open(str(out), framework="pt") as f:
        assert {"lm_head.qweight.q", "lm_head.qweight.scale", "embedding.weight"} <= set(f.keys())

    loaded = specformer.load(out).eval()
    expected = specformer.load(source).eval()
    quantize(expected, "int8", quantize_lm_head=True)
    ids = torch.randint(0, 259, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, reference = loaded(ids), float_model(ids)
        assert torch.equal(got, expected(ids))
        # The head is int8 now: the logits moved a little, and only a little.
        error = float((got - reference).abs().max()) / float(reference.abs().max())
        assert 0 < error < 0.05
    assert torch.equal(loaded.embedding.weight, float_model.embedding.weight)

    forged = tmp_path / "forged.safetensors"
    _forge(out, forged, tensors={"lm_head.qweight.q": torch.zeros(7, 64, dtype=torch.int8),
                                 "lm_head.qweight.scale": torch.ones(7)})
    with pytest.raises(CheckpointError, match="tied LM head"):
        specformer.load(forged)


@pytest.mark.parametrize("tied", [True, False])
def test_the_lm_head_can_have_its_own_scheme(capsys, tmp_path, tied) -> None:
    """--method int4 --lm-head-method int8: the layers int4, the head (tied copy or its own linear) int8; the
    recipe says so, load rebuilds each with its scheme and gives the same logits; a bad head scheme is exit 2."""
    from specformer_quant.int4 import Int4Weight
    from specformer_quant.int8 import Int8Weight

    data = moe_spec()
    data["model"]["tie_embeddings"] = tied
    data["model"]["block"]["ffn"] = {"kind": "swiglu", "hidden": 128}
    source = tmp_path / "float.safetensors"
    specformer.save(specformer.build(data, seed=0).eval(), source, metadata={"tokenizer": json.dumps({"kind": "byte"})})
    out = tmp_path / "mixed.safetensors"
    code, _, err = cli(capsys, "quantize", source, "--method", "int4", "--lm-head-method", "int8", "-o", out)
    assert code == 0, err
    recipe = json.loads(read_metadata(out)["quantization"])
    assert recipe["scheme"] == {"kind": "int4"} and recipe["lm_head_scheme"] == {"kind": "int8"}
    loaded = specformer.load(out).eval()
    assert isinstance(loaded.lm_head.qweight, Int8Weight)
    assert isinstance(loaded.blocks[0].mixer.qkv.qweight, Int4Weight)
    expected = specformer.load(source).eval()
    quantize(expected, "int4", quantize_lm_head=True, lm_head_scheme="int8")
    ids = torch.randint(0, 259, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(ids), expected(ids))

    bad = tmp_path / "bad.safetensors"
    code, _, err = cli(capsys, "quantize", source, "--method", "int4", "--lm-head-method", "int3", "-o", bad)
    assert code == 2 and "--lm-head-method int3" in err and not bad.exists()
    with pytest.raises(ValueError, match="quantize_lm_head=False"):
        quantize(specformer.build(data, seed=0), "int4", quantize_lm_head=False, lm_head_scheme="int8")
    code, _, err = cli(capsys, "quantize", source, "--method", "int4", "--lm-head-method", "int8",
                       "--keep-lm-head-float", "-o", bad)
    assert code == 2 and "--keep-lm-head-float" in err and not bad.exists()


@pytest.mark.parametrize("method, extra, part", [("int8", (), "scale"), ("int4", ("--group-size", 64), "scale"),
                                                 ("int4", ("--group-size", 64), "minimum")])
@pytest.mark.parametrize("value, kind", [(float("nan"), "NaN"), (float("inf"), "infinite"),
                                         (float("-inf"), "infinite")])
def test_a_scale_that_is_not_finite_is_refused_on_load(capsys, float_checkpoint, tmp_path, method, extra, part, value,
                                                       kind) -> None:
    good = tmp_path / f"{method}.safetensors"
    assert cli(capsys, "quantize", float_checkpoint, "--method", method, *extra, "-o", good)[0] == 0
    recipe = json.loads(read_metadata(good)["quantization"])
    for key in (f"{recipe['linears'][1]}.qweight.{part}", f"{recipe['stacks'][0]}.{part}"):  # a linear, an expert stack
        with safe_open(str(good), framework="pt") as f:
            scales = f.get_tensor(key).clone()
        scales.view(-1)[3] = value
        bad = tmp_path / "bad.safetensors"
        _forge(good, bad, tensors={key: scales})
        message = f"{bad}: {key} holds 1 {kind} value; a quantized weight's scales must be finite"
        with pytest.raises(CheckpointError, match=message.replace(".", r"\.")):
            specformer.load(bad)
        data = tmp_path / "text.txt"
        data.write_text("some text to score, long enough for a window or two " * 4)
        for command in (("generate", bad, "--prompt", "a", "--max-new-tokens", 2), ("eval", bad, "--data", data)):
            code, out, err = cli(capsys, *command)
            assert code == 2 and message in err, (command, err)
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_a_quantized_tied_head_keeps_its_own_bias(capsys, tmp_path) -> None:
    """CTRL's tied head with a bias: the int8 copy of the table replaces the matmul, the bias is still added, and the
    quantized file loads with both."""
    data = moe_spec()
    data["model"].update(tie_embeddings=True, lm_head_bias=True)
    float_model = specformer.build(data, seed=0).eval()
    with torch.no_grad():
        float_model.head_bias.bias.uniform_(-3, 3)
    source = tmp_path / "tied-bias.safetensors"
    specformer.save(float_model, source, metadata={"tokenizer": json.dumps({"kind": "byte"})})
    out = tmp_path / "tied-bias-int8.safetensors"
    code, _, err = cli(capsys, "quantize", source, "--method", "int8", "--quantize-lm-head", "-o", out)
    assert code == 0, err
    loaded = specformer.load(out).eval()
    expected = specformer.load(source).eval()
    quantize(expected, "int8", quantize_lm_head=True)
    ids = torch.randint(0, 259, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, reference = loaded(ids), float_model(ids)
        assert torch.equal(got, expected(ids))
        assert torch.equal(loaded.head_bias.bias, float_model.head_bias.bias)
        # int8 moves the logits a little; the bias (up to 3) is still in them
        assert float((got - reference).abs().max()) < 0.05 * float(reference.abs().max())
        assert float((got - loaded.head_bias.bias - reference).abs().max()) > 1.0
