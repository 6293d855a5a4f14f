"""Multi-token prediction layers of DeepSeek-V3-layout checkpoints (issue 47): imported as ``model.mtp``, checked against
the depth written out with transformers' own decoder layer, exported back under the published names.

transformers builds no MTP module for its causal LM, so the test adds one depth to a saved tiny model the way the
published checkpoints store it: a decoder layer at index N (num_hidden_layers), built by transformers at that index so
its tensor names and shapes are exactly a decoder layer's, plus ``enorm``, ``hnorm``, ``eh_proj``,
``shared_head.norm`` and the copies of the embedding and head (``embed_tokens``, ``shared_head.head``).
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import warnings
from dataclasses import dataclass

import pytest
import torch
from hf_cases import BY_NAME
from safetensors.torch import load_file, save_file

import specformer
import specformer_hf
from specformer.errors import UserError

TOLERANCE = 1e-4


@dataclass(frozen=True)
class Published:
    """How a family's published checkpoints keep their MTP depth as layer N: the decoder layer class transformers runs
    it with, the name of its norm before the head, and whether it holds copies of the embedding and head."""

    layer_class: str
    final_norm: str = "shared_head.norm"
    copies: bool = True
    #: Name prefixes of the layer's tensors as transformers holds them -> as its save_pretrained writes the main
    #: layers' (Hunyuan 3's published names).
    saved: tuple[tuple[str, str], ...] = ()
    #: Qwen3-Next's layout instead: the depth beside the model under ``mtp.`` (``fc``, ``pre_fc_norm_embedding``,
    #: ``pre_fc_norm_hidden``, a full-attention layer ``mtp.layers.0``, ``norm``), counted by mtp_num_hidden_layers,
    #: its norms (1 + w).
    separate: bool = False
    #: The tiny case the file is made from (default: the layout's own name, the family's model type).
    case: str | None = None
    #: The config field counting the layer (default the layout's: num_nextn_predict_layers, mtp_num_hidden_layers).
    count: str | None = None
    #: The MTP layer's (attention type, MLP type), appended to layer_types / mlp_layer_types to build it; with
    #: ``written`` the config.json names them (mtp_layer_types, mtp_mlp_layer_types), else the family's defaults do.
    types: tuple[str, str] | None = None
    written: bool = False
    #: The norms as applied: w + offset (Qwen3-Next's (1 + w); None: 1 for the separate layout, 0 otherwise).
    offset: float | None = None

    def layer_at(self, n: int) -> str:
        return "mtp.layers.0." if self.separate else f"model.layers.{n}."

    def own_names(self, n: int) -> dict[str, str]:
        if self.separate:
            return {"enorm": "mtp.pre_fc_norm_embedding.weight", "hnorm": "mtp.pre_fc_norm_hidden.weight",
                    "eh_proj": "mtp.fc.weight", "final": "mtp.norm.weight"}
        at = self.layer_at(n)
        return {"enorm": f"{at}enorm.weight", "hnorm": f"{at}hnorm.weight", "eh_proj": f"{at}eh_proj.weight",
                "final": f"{at}{self.final_norm}.weight"}

    @property
    def count_key(self) -> str:
        return self.count or ("mtp_num_hidden_layers" if self.separate else "num_nextn_predict_layers")

    @property
    def norm_offset(self) -> float:
        return self.offset if self.offset is not None else 1.0 if self.separate else 0.0


LAYOUTS = {
    "deepseek_v3": Published("DeepseekV3DecoderLayer"), "deepseek_v32": Published("DeepseekV32DecoderLayer"),
    "glm4_moe": Published("Glm4MoeDecoderLayer"), "glm4_moe_lite": Published("Glm4MoeLiteDecoderLayer"),
    "glm_moe_dsa": Published("GlmMoeDsaDecoderLayer"),
    # Hunyuan 3 (vLLM's and LMDeploy's hy_v3_mtp loaders): final_layernorm, no copies of the embedding or head.
    "hy_v3": Published("HYV3DecoderLayer", final_norm="final_layernorm", copies=False,
                       saved=(("mlp.e_score_correction_bias", "mlp.expert_bias"), ("mlp.gate.", "mlp.router.gate."),
                              ("mlp.shared_experts.", "mlp.shared_mlp."))),
    # Qwen3-Next and Qwen3.5 (vLLM's qwen3_next_mtp: fc reads [embedding; hidden], the layer full attention). The
    # main block of the qwen3_next and qwen3_5_moe cases is a Gated DeltaNet, qwen3_5's is attention (a tie).
    "qwen3_next": Published("Qwen3NextDecoderLayer", copies=False, separate=True),
    "qwen3_5": Published("Qwen3_5DecoderLayer", copies=False, separate=True),
    "qwen3_5_moe": Published("Qwen3_5MoeDecoderLayer", copies=False, separate=True),
    # K-EXAONE (vLLM's exaone_moe_mtp): Qwen3-Next's layout, w norms, a global layer (no rope, no window) with a dense
    # MLP in a model with windows, as its config.json names them: the depth's own positional scheme is none.
    "exaone_moe": Published("ExaoneMoeDecoderLayer", copies=False, separate=True, offset=0.0,
                            count="num_nextn_predict_layers", types=("full_attention", "dense"), written=True),
    # Mellum: num_mtp_layers, a sliding layer with experts by default (the sliding layers' rope, the model's here);
    # and a full layer with a dense MLP by its lists: the full layers' rope theta, the depth's own.
    "mellum": Published("MellumDecoderLayer", copies=False, separate=True, offset=0.0, count="num_mtp_layers",
                        types=("sliding_attention", "sparse")),
    "mellum-full-dense": Published("MellumDecoderLayer", copies=False, separate=True, offset=0.0, case="mellum",
                                   count="num_mtp_layers", types=("full_attention", "dense"), written=True),
}


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _with_mtp(name: str, directory):
    """A saved tiny model of case ``name`` whose file also holds one MTP depth (layer N), and that depth's modules."""
    published = LAYOUTS[name]
    case = BY_NAME[published.case or name]
    hf = case.build()
    case.save(hf, directory)
    config = hf.config
    n, d = config.num_hidden_layers, config.hidden_size
    torch.manual_seed(7)
    module = published.case or name  # the family of the case (a text config may name another model type)
    modeling = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    at_n = copy.deepcopy(config)  # per-layer lists name N layers: the MTP layer is of the last one's kind, or its own
    for field in ("layer_types", "mlp_layer_types", "indexer_types"):
        if isinstance(getattr(at_n, field, None), list):
            kind = ("full_attention" if published.separate and field == "layer_types" else getattr(at_n, field)[-1])
            if published.types is not None and field != "indexer_types":
                kind = published.types[field == "mlp_layer_types"]
            setattr(at_n, field, [*getattr(at_n, field), kind])
    layer = getattr(modeling, published.layer_class)(at_n, layer_idx=n).eval()
    g = torch.Generator().manual_seed(8)
    with torch.no_grad():
        # A layer built outside a PreTrainedModel is not initialised (the router's weight is torch.empty): fill every
        # tensor, norms near 1, the rest small.
        for key, t in [*layer.named_parameters(), *layer.named_buffers()]:
            noise = torch.randn(t.shape, generator=g)
            t.copy_(1 + 0.1 * noise if "norm" in key else 0.1 * noise)
    near = 1 - published.norm_offset  # norm weights near 1 as applied: w, or 1 + w
    own = {"enorm": near + 0.1 * torch.randn(d, generator=g), "hnorm": near + 0.1 * torch.randn(d, generator=g),
           "eh_proj": 0.1 * torch.randn(d, 2 * d, generator=g), "final": near + 0.1 * torch.randn(d, generator=g)}
    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    at = published.layer_at(n)
    for key, value in layer.state_dict().items():
        value = value.detach().clone()
        for old, new in published.saved:
            key = new + key[len(old):] if key.startswith(old) else key
        if key == "mlp.experts.gate_up_proj":  # (E, 2H, D), gate rows first: saved per expert, as the main layers
            for j, (gate, up) in enumerate(zip(*value.chunk(2, dim=1))):
                tensors[f"{at}mlp.experts.{j}.gate_proj.weight"] = gate.contiguous()
                tensors[f"{at}mlp.experts.{j}.up_proj.weight"] = up.contiguous()
        elif key == "mlp.experts.down_proj":  # (E, D, H)
            for j, down in enumerate(value.unbind(0)):
                tensors[f"{at}mlp.experts.{j}.down_proj.weight"] = down.contiguous()
        else:
            tensors[at + key] = value.contiguous()
    names = published.own_names(n)
    tensors.update({names[k]: v for k, v in own.items()})
    if published.copies:
        tensors[at + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
        tensors[at + "shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    save_file(tensors, str(path), metadata={"format": "pt"})
    # The published config.json names the count num_nextn_predict_layers (transformers' num_mtp_layers), or
    # mtp_num_hidden_layers (Qwen3-Next's).
    saved = json.loads((directory / "config.json").read_text())
    saved.pop("num_mtp_layers", None)  # transformers may save it under either name
    lists = ({"mtp_layer_types": [published.types[0]], "mtp_mlp_layer_types": [published.types[1]]}
             if published.written else {})
    (directory / "config.json").write_text(json.dumps({**saved, published.count_key: 1, **lists}))
    return hf, layer, own


def _reference_depth1(hf, layer, own, ids: torch.Tensor, offset: float = 0.0,
                      layer_type: str | None = None) -> torch.Tensor:
    """Depth 1 written out: rmsnorm(emb(t_{i+1})) and rmsnorm(h_i) concatenated, eh_proj, the decoder layer over the
    sequence (causal, rope at positions 0..T-2), shared_head.norm, the LM head. ``offset``: 1 for (1 + w) norms.
    ``layer_type``: the MTP layer's, where the family has a rope per layer type (Mellum) or windows: a
    sliding_attention layer reads the keys within sliding_window of each query."""
    caught = {}
    hook = hf.model.layers[-1].register_forward_hook(lambda m, args, out: caught.update(h=out[0] if isinstance(out, tuple) else out))
    hf(ids)
    hook.remove()
    eps = hf.config.rms_norm_eps
    length = ids.shape[1] - 1
    hidden = caught["h"][:, :length]  # (B, T-1, D): the last layer's output, before the final norm
    embedded = hf.model.embed_tokens(ids[:, 1:])  # (B, T-1, D): the token one ahead
    joined = torch.cat([_rms(embedded, offset + own["enorm"], eps), _rms(hidden, offset + own["hnorm"], eps)], dim=-1)
    x = joined @ own["eh_proj"].T
    positions = torch.arange(length).unsqueeze(0).expand(ids.shape[0], -1)
    per_type = "layer_type" in inspect.signature(hf.model.rotary_emb.forward).parameters
    cos_sin = hf.model.rotary_emb(x, positions, layer_type) if per_type else hf.model.rotary_emb(x, positions)
    i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
    allowed = j <= i
    if layer_type == "sliding_attention":
        allowed = allowed & (i - j < hf.config.sliding_window)
    mask = torch.zeros(length, length).masked_fill(~allowed, torch.finfo(x.dtype).min)[None, None]  # (1, 1, T-1, T-1)
    x = layer(x, attention_mask=mask, position_ids=positions, position_embeddings=cos_sin)
    x = x[0] if isinstance(x, tuple) else x
    return hf.lm_head(_rms(x, offset + own["final"], eps))


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_mtp_depth_logits_match_the_written_out_depth(name, tmp_path):
    hf, layer, own = _with_mtp(name, tmp_path / "hf")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        imported = specformer_hf.import_hf(tmp_path / "hf")
    assert not [w for w in caught if "multi-token" in str(w.message)]  # a file with its MTP layer: no note about it
    model = imported.model
    assert imported.spec["model"]["mtp"]["depths"] == 1 and len(model.mtp) == 1
    # The depth runs a full-attention layer, even where the model's block is a Gated DeltaNet (Qwen3-Next).
    assert getattr(model.mtp[0].block.mixer, "state_slots", None) is None
    ids = torch.randint(0, hf.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits, (depth1,) = model(ids, with_mtp=True)
        types = LAYOUTS[name].types
        reference = _reference_depth1(hf, layer, own, ids, LAYOUTS[name].norm_offset, types[0] if types else None)
        main = hf(ids).logits
    assert depth1.shape == (2, 11, hf.config.vocab_size)
    assert (logits - main).abs().max().item() <= TOLERANCE
    assert (depth1 - reference).abs().max().item() <= TOLERANCE
    # The MTP weights change only the depth: a different eh_proj changes depth1, not the main logits.
    assert (depth1 - logits[:, :-1]).abs().max().item() > 100 * TOLERANCE


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_mtp_tensors_export_bit_exact_under_the_published_names(name, tmp_path):
    _with_mtp(name, tmp_path / "hf")
    imported = specformer_hf.import_hf(tmp_path / "hf")
    out = specformer_hf.to_hf(imported.model, tmp_path / "out")
    before, after = load_file(str(tmp_path / "hf" / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert sorted(before) == sorted(after)
    for key, tensor in before.items():
        assert torch.equal(tensor, after[key]), key
    config = json.loads((out / "config.json").read_text())
    assert config[LAYOUTS[name].count_key] == 1
    again = specformer_hf.import_hf(out)
    assert again.spec["model"]["mtp"] == imported.spec["model"]["mtp"]


def test_a_file_saved_by_transformers_imports_without_mtp_and_says_so(tmp_path):
    case = BY_NAME["deepseek_v3"]
    hf = case.build()
    case.save(hf, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved.get("num_nextn_predict_layers", saved.get("num_mtp_layers")) == 1  # counted, not saved
    with pytest.warns(UserWarning, match="multi-token prediction depth"):
        imported = specformer_hf.import_hf(tmp_path)
    assert "mtp" not in imported.spec["model"] and imported.model.mtp is None
    assert any("without model.mtp" in note for note in imported.notes)
    # Its export says there are none, so the file and its config agree.
    out = specformer_hf.to_hf(imported.model, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["num_nextn_predict_layers"] == 0


def test_a_copy_of_the_shared_head_that_differs_is_refused(tmp_path):
    hf, _, _ = _with_mtp("deepseek_v3", tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = load_file(str(path))
    n = hf.config.num_hidden_layers
    tensors[f"model.layers.{n}.shared_head.head.weight"] = tensors[f"model.layers.{n}.shared_head.head.weight"] + 1
    save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(UserError, match=f"hold one parameter twice but differ: model.layers.{n}.shared_head.head"):
        specformer_hf.import_hf(tmp_path)


def test_the_multimodal_qwen3_5_checkpoint_reads_its_top_level_mtp(tmp_path):
    """The published Qwen3.5 checkpoints (qwen3_5: text_config, model.language_model.*) keep the MTP layer at the top,
    ``mtp.*``, and count it in text_config: read as the text model's, the depth's logits are the same."""
    hf, _, _ = _with_mtp("qwen3_5", tmp_path / "text")
    text = json.loads((tmp_path / "text" / "config.json").read_text())
    tensors = load_file(str(tmp_path / "text" / "model.safetensors"))
    (tmp_path / "mm").mkdir()
    moved = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v for k, v in tensors.items()}
    save_file(moved, str(tmp_path / "mm" / "model.safetensors"), metadata={"format": "pt"})
    outer = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
             "tie_word_embeddings": text["tie_word_embeddings"], "text_config": {**text, "model_type": "qwen3_5_text"}}
    (tmp_path / "mm" / "config.json").write_text(json.dumps(outer))
    assert "mtp.fc.weight" in moved and "mtp.layers.0.self_attn.q_proj.weight" in moved
    as_text, as_multimodal = specformer_hf.import_hf(tmp_path / "text"), specformer_hf.import_hf(tmp_path / "mm")
    assert as_multimodal.spec["model"]["mtp"] == as_text.spec["model"]["mtp"]
    ids = torch.randint(0, hf.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        (_, (expected,)), (_, (got,)) = as_text.model(ids, with_mtp=True), as_multimodal.model(ids, with_mtp=True)
    assert torch.equal(expected, got)


def test_more_than_one_qwen3_next_mtp_layer_is_refused(tmp_path):
    _with_mtp("qwen3_next", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "mtp_num_hidden_layers": 2}))
    with pytest.raises(UserError, match="mtp_num_hidden_layers 2 is not supported: its MTP layers share one fc"):
        specformer_hf.import_hf(tmp_path)


@pytest.mark.parametrize("name, change, path", [
    ("exaone_moe", {"positional": {"kind": "rope", "theta": 123.0}}, "model.mtp.block.positional"),
    ("mellum-full-dense", {"positional": {"kind": "rope", "theta": 123.0}}, "model.mtp.block.positional"),
    ("mellum", {"norm": {"eps": 0.5}}, "model.mtp"),
])
def test_a_typed_mtp_layer_unlike_every_main_layer_kind_is_not_exported(name, change, path, tmp_path):
    """K-EXAONE's and Mellum's MTP layer is named by its layer types only: a depth whose block no layer type gives
    (another rope, another norm) is refused on export, at the field that differs."""
    _with_mtp(name, tmp_path / "hf")
    spec = copy.deepcopy(specformer_hf.import_hf(tmp_path / "hf").spec)
    spec["model"]["mtp"]["block"] = {**spec["model"]["mtp"].get("block", {}), **change}
    model = specformer.build(spec, seed=0)
    family = BY_NAME[LAYOUTS[name].case or name].build().config.model_type
    with pytest.raises(Exception, match="MTP layer") as caught:
        specformer_hf.to_hf(model, tmp_path / "out", family=family)
    assert path in str(caught.value)
