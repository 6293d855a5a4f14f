"""DeepSeek-V4 (``model_type: deepseek_v4``, ``DeepseekV4ForCausalLM``): compressed attention (a sliding window, and on
most layers entries pooled over blocks of tokens, sparse through a lightning indexer or heavily compressed), a grouped
low-rank output projection, manifold-constrained hyper-connections around every sublayer, and experts routed by a
fixed token-id table on the first layers and by sqrt(softplus) scores on the others."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader, activation_from_hf
from specformer_hf.parts.base import BLOCK_MIXER, LAYER, MLP, FamilyView, Part, per_layer_overrides, selection
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import expert_rules, shared_halves
from specformer_hf.parts.norms import Layout, RMSNorm
from specformer_hf.parts.positions import rope, rope_parameters_of
from specformer_hf.rules import Copy, Fused, Rule
from specformer_hf.specview import NotExpressible

#: transformers' DeepseekV4Config defaults (DeepSeek-V4-Flash).
DEFAULTS = {
    "vocab_size": 129280, "hidden_size": 4096, "moe_intermediate_size": 2048, "num_hidden_layers": 43,
    "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512, "q_lora_rank": 1024,
    "num_experts_per_tok": 6, "n_routed_experts": 256, "n_shared_experts": 1, "scoring_func": "sqrtsoftplus",
    "norm_topk_prob": True, "routed_scaling_factor": 1.5, "max_position_embeddings": 1048576, "rope_theta": 10000.0,
    "layer_types": None, "compress_rates": None, "compress_rope_theta": 160000.0, "hc_mult": 4,
    "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "mlp_layer_types": None, "swiglu_limit": 10.0, "sliding_window": 128,
    "o_groups": 8, "o_lora_rank": 1024, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
    "num_nextn_predict_layers": 1, "hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "partial_rotary_factor": None, "attention_bias": False, "mlp_bias": False,
}
#: Where transformers' save_pretrained writes each module (DeepSeek's own checkpoint names, its conversion mapping).
ATTN = f"{LAYER}.attn"
FFN = f"{LAYER}.ffn"
SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
RATES = {CSA: 4, HCA: 128}


def _layer_types(cfg: ConfigReader) -> list[str]:
    """layer_types, or the legacy compress_ratios (0 / 4 / 128 per layer), or transformers' default."""
    n = cfg.get_layers("num_hidden_layers")
    types = cfg.get("layer_types")
    ratios = cfg.get("compress_ratios", None)
    if types is None and ratios is not None:
        types = [{0: SLIDING, 4: CSA, 128: HCA}.get(r) for r in ratios]
    if types is None:  # two heavily compressed layers, then sparse and heavy in turn
        types = [HCA] * min(n, 2) + [CSA if i % 2 else HCA for i in range(max(n - 2, 0))]
    if len(types) < n or any(t not in (SLIDING, CSA, HCA) for t in types[:n]):
        raise UserError(f"{cfg.family}: layer_types must give each of the {n} layers one of {SLIDING}, {CSA}, {HCA}; "
                        f"got {types!r}")
    return list(types[:n])


def _rates(cfg: ConfigReader) -> dict[str, int]:
    rates = dict(RATES, **(cfg.get("compress_rates") or {}))
    for legacy, kind in (("compress_rate_csa", CSA), ("compress_rate_hca", HCA)):
        if cfg.get(legacy, None) is not None:
            rates[kind] = cfg.get_int(legacy)
    return rates


def _rope_dim(cfg: ConfigReader) -> int:
    head_dim = cfg.get_size("head_dim")
    if cfg.get("partial_rotary_factor") is None and cfg.get("qk_rope_head_dim", None) is not None:
        return cfg.get_int("qk_rope_head_dim")
    factor = cfg.get("partial_rotary_factor")
    return int(head_dim * (64 / 512 if factor is None else float(factor)))


@dataclass(frozen=True)
class TwoRopes(Part):
    """rope_theta (sliding layers) and compress_rope_theta with rope_parameters' scaling (compressed layers), or
    rope_parameters {main, compress} <-> an interleaved rope on the compressed layers (the model's) and another on
    the sliding-window layers."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        cfg.mark_read("rope_parameters", "rope_theta", "compress_rope_theta", "rope_scaling")
        stored = cfg.data.get("rope_parameters") or {}
        if isinstance(stored.get("main"), dict) and isinstance(stored.get("compress"), dict):
            main, compress = dict(stored["main"]), dict(stored["compress"])
        else:
            scaling = {k: v for k, v in {**(cfg.data.get("rope_scaling") or {}), **stored}.items()
                       if k not in ("main", "compress")}
            main = {"rope_type": "default", "rope_theta": cfg.get_float("rope_theta")}
            compress = {"rope_type": "default", **scaling, "rope_theta": cfg.get_float("compress_rope_theta")}
            if compress.get("rope_type", compress.get("type")) == "yarn":
                compress.setdefault("attention_factor", 1.0)  # transformers' V4: no YaRN magnitude scaling
        schemes = {}
        for label, params in (("main", main), ("compress", compress)):
            params.pop("partial_rotary_factor", None)  # the attention's rope_dim: the scheme turns all it is given
            if params.get("rope_type") == "yarn":  # transformers' YaRN defaults, written out so an export reads back the same
                params.setdefault("beta_fast", 32.0)
                params.setdefault("beta_slow", 1.0)
            single = ConfigReader({"rope_parameters": params, "max_position_embeddings": cfg.get("max_position_embeddings")},
                                  defaults={}, family=f"{cfg.family} ({label} rope)")
            schemes[label] = {**rope(single), "interleaved": True}
            cfg.unused.extend(single.unused)
        types = _layer_types(cfg)
        model["positional"] = schemes["compress"] if any(t != SLIDING for t in types) else schemes["main"]
        sliding = [i for i, t in enumerate(types) if t == SLIDING]
        if sliding and model["positional"] != schemes["main"]:
            model.setdefault("layers", []).append({"select": selection(sliding, len(types)), "positional": schemes["main"]})

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        windows = view.per_layer("mixer", "compress_rate")
        schemes = [scheme or view.positional for scheme in view.per_layer("positional")]
        found: dict[str, tuple[int, dict[str, Any]]] = {}
        for i, (rate, scheme) in enumerate(zip(windows, schemes)):
            label = "main" if rate is None else "compress"
            if not scheme.get("interleaved") or scheme.get("kind") != "rope" or scheme.get("fraction", 1.0) != 1.0:
                raise NotExpressible(f"model.layers[{i}].positional", f"Hugging Face {view.name} turns the attention's "
                                     "rope_dim channels with an interleaved rope (fraction 1)")
            if label in found and found[label][1] != scheme:
                raise NotExpressible(f"model.layers[{i}].positional", f"differs from layer {found[label][0]}'s; Hugging "
                                     f"Face {view.name} has one rope for all {label} layers")
            found.setdefault(label, (i, scheme))
        params = {}
        for label, (i, scheme) in found.items():
            params[label] = rope_parameters_of({**scheme, "interleaved": False}, view.name,
                                               path=f"model.layers[{i}].positional", context_length=view.model.context_length)
        params.setdefault("main", {**params.get("compress", {}), "rope_type": "default"})
        params.setdefault("compress", params["main"])
        config.update(rope_theta=params["main"]["rope_theta"], compress_rope_theta=params["compress"]["rope_theta"],
                      rope_parameters=params)


@dataclass(frozen=True)
class CompressedAttention(Part):
    """num_attention_heads, head_dim, q_lora_rank, partial_rotary_factor, sliding_window, layer_types, compress_rates,
    o_groups, o_lora_rank, index_n_heads, index_head_dim, index_topk, rms_norm_eps <-> per-layer attention
    ``compressed`` (sliding only, CSA: rate 4 with overlap and the indexer, HCA: rate 128)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        if cfg.get_int("num_key_value_heads") != 1:
            raise UserError(f"{cfg.family}: num_key_value_heads must be 1 (one key/value head shared by all heads)")
        if cfg.get("attention_bias"):
            raise UserError(f"{cfg.family}: attention_bias is not supported (transformers' DeepSeek-V4 has no biases)")
        eps = cfg.get_float("rms_norm_eps")
        base = {"kind": "compressed", "n_heads": cfg.get_size("num_attention_heads"), "head_dim": cfg.get_size("head_dim"),
                "q_lora_rank": cfg.get_size("q_lora_rank"), "rope_dim": _rope_dim(cfg),
                "window": cfg.get_size("sliding_window"), "out_groups": cfg.get_size("o_groups"),
                "out_rank": cfg.get_size("o_lora_rank"), "norm": {"kind": "rmsnorm", "eps": eps}, "eps": eps}
        rates = _rates(cfg)
        index = {"index_heads": cfg.get_size("index_n_heads"), "index_head_dim": cfg.get_size("index_head_dim"),
                 "index_topk": cfg.get_size("index_topk"), "index_ties": "topk"}
        # Every layer names what it turns off too, so an override on the most common kind of layer undoes it.
        off = {"compress_rate": None, "overlap": False, "index_heads": None}
        per_layer = []
        for t in _layer_types(cfg):
            if t == SLIDING:
                per_layer.append({**base, **off})
            elif t == CSA:
                per_layer.append({**base, "compress_rate": rates[CSA], "overlap": True, **index})
            else:
                per_layer.append({**base, **off, "compress_rate": rates[HCA]})
        cfg.mark_read("compress_ratios", "compress_rate_csa", "compress_rate_hca", "qk_rope_head_dim", "attention_dropout")
        per_layer_overrides(model, "mixer", per_layer, len(per_layer))

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("mixer", ("compressed",))
        layers = view.per_layer("mixer")
        types, rates, index = [], {}, None
        first = layers[0]
        shared = ("n_heads", "head_dim", "q_lora_rank", "rope_dim", "window", "out_groups", "out_rank", "norm", "eps", "sinks")
        for i, a in enumerate(layers):
            if any(a[k] != first[k] for k in shared):
                raise NotExpressible(f"model.layers[{i}].mixer", f"Hugging Face {view.name} has one setting of "
                                     f"{', '.join(shared)} for every layer")
            if a["compress_rate"] is None:
                kind = SLIDING
            elif a["overlap"] and a["index_heads"] is not None:
                kind = CSA
                mine = (a["index_heads"], a["index_head_dim"], a["index_topk"])
                if index is not None and index != mine:
                    raise NotExpressible(f"model.layers[{i}].mixer", "the indexers differ; one setting in Hugging Face")
                index = mine
            elif not a["overlap"] and a["index_heads"] is None:
                kind = HCA
            else:
                raise NotExpressible(f"model.layers[{i}].mixer", f"Hugging Face {view.name} pools with overlap and "
                                     "an indexer (CSA) or with neither (HCA)")
            if kind != SLIDING and rates.setdefault(kind, a["compress_rate"]) != a["compress_rate"]:
                raise NotExpressible(f"model.layers[{i}].mixer.compress_rate", f"one rate per kind of layer in {view.name}")
            types.append(kind)
        norm = first["norm"]
        if norm.get("kind") != "rmsnorm" or norm.get("eps") != first["eps"] or not first["sinks"] or first["out_groups"] is None:
            raise NotExpressible("model.block.mixer", f"Hugging Face {view.name}'s attention has RMSNorms (eps as its "
                                 "query norm's), sinks and the grouped output projection")
        if view.model.block.norm.as_dict().get("eps", first["eps"]) != first["eps"]:
            pass  # the block norms' eps is checked by RMSNorm (rms_norm_eps): they must agree, one eps in the config
        heads, head_dim = first["n_heads"], first["head_dim"]
        index_heads, index_head_dim, index_topk = index or (DEFAULTS["index_n_heads"], DEFAULTS["index_head_dim"],
                                                            DEFAULTS["index_topk"])
        config.update(num_attention_heads=heads, num_key_value_heads=1, head_dim=head_dim, q_lora_rank=first["q_lora_rank"],
                      partial_rotary_factor=first["rope_dim"] / head_dim, sliding_window=first["window"],
                      o_groups=first["out_groups"], o_lora_rank=first["out_rank"], layer_types=types,
                      compress_rates={CSA: rates.get(CSA, RATES[CSA]), HCA: rates.get(HCA, RATES[HCA])},
                      index_n_heads=index_heads, index_head_dim=index_head_dim, index_topk=index_topk,
                      attention_bias=False)

    def rules(self) -> list[Rule]:
        pairs = [("wq_a", "q_a"), ("q_norm", "q_norm"), ("wq_b", "q_b"), ("wkv", "kv"), ("norm", "kv_norm"),
                 ("wo_b", "out.mix"), ("compressor.wkv", "pooler.kv"), ("compressor.wgate", "pooler.gate"),
                 ("compressor.norm", "pooler.norm"), ("indexer.compressor.wkv", "index_pooler.kv"),
                 ("indexer.compressor.wgate", "index_pooler.gate"), ("indexer.compressor.norm", "index_pooler.norm"),
                 ("indexer.wq_b", "index_q"), ("indexer.weights_proj", "index_weights")]
        rules: list[Rule] = [Copy(f"{ATTN}.{hf}.weight", f"{BLOCK_MIXER}.{ours}.weight") for hf, ours in pairs]
        return rules + [Copy(f"{ATTN}.wo_a.weight", f"{BLOCK_MIXER}.out.down"),
                        Copy(f"{ATTN}.attn_sink", f"{BLOCK_MIXER}.sinks"),
                        Copy(f"{ATTN}.compressor.ape", f"{BLOCK_MIXER}.pooler.slot_bias"),
                        Copy(f"{ATTN}.indexer.compressor.ape", f"{BLOCK_MIXER}.index_pooler.slot_bias")]


@dataclass(frozen=True)
class HyperConnections(Part):
    """hc_mult, hc_sinkhorn_iters, hc_eps, rms_norm_eps <-> residual ``mhc``; attn_hc, ffn_hc and hc_head."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model.setdefault("block", {})["residual"] = {
            "kind": "mhc", "n_streams": cfg.get_int("hc_mult"), "sinkhorn_iterations": cfg.get_int("hc_sinkhorn_iters"),
            "eps": cfg.get_float("hc_eps"), "norm_eps": cfg.get_float("rms_norm_eps")}

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        r = view.view.residual
        if r.get("kind") != "mhc":
            raise NotExpressible("model.block.residual", f"Hugging Face {view.name} has hyper-connections (mhc)")
        if r["norm_eps"] != config.get("rms_norm_eps", r["norm_eps"]):
            raise NotExpressible("model.block.residual.norm_eps", f"Hugging Face {view.name} uses rms_norm_eps there too")
        config.update(hc_mult=r["n_streams"], hc_sinkhorn_iters=r["sinkhorn_iterations"], hc_eps=r["eps"])

    def rules(self) -> list[Rule]:
        rules: list[Rule] = [Copy(f"{LAYER}.hc_{hf}_{p}", f"blocks.{{i}}.{ours}.{p}") for hf, ours in
                             (("attn", "attention_residual"), ("ffn", "ffn_residual")) for p in ("fn", "base", "scale")]
        return rules + [Copy(f"model.hc_head.hc_{p}", f"residual.{p}") for p in ("fn", "base", "scale")]


@dataclass(frozen=True)
class HashAndScoredExperts(Part):
    """n_routed_experts, num_experts_per_tok, moe_intermediate_size, n_shared_experts, scoring_func,
    routed_scaling_factor, swiglu_limit, mlp_layer_types (or num_hash_layers) <-> ffn ``moe`` with DeepSeek-V4's
    clamped SwiGLU (``swiglu_style: silu``), router ``sqrtsoftplus_topk`` and ``hash`` on the hash layers."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n = cfg.get_layers("num_hidden_layers")
        if (cfg.get_int("n_shared_experts") or 0) != 1:
            raise UserError(f"{cfg.family}: transformers' DeepSeek-V4 has one shared expert (n_shared_experts 1)")
        scoring = cfg.require("scoring_func", ("sqrtsoftplus", "sigmoid"), why="the routers map sqrtsoftplus and sigmoid")
        scale = cfg.get_float("routed_scaling_factor")
        ffn = {"kind": "moe", "n_experts": cfg.get_int("n_routed_experts"), "top_k": cfg.get_int("num_experts_per_tok"),
               "hidden": cfg.get_int("moe_intermediate_size"), "activation": activation_from_hf(cfg, "hidden_act"),
               "swiglu_limit": cfg.get_float("swiglu_limit"), "swiglu_style": "silu", "n_shared_experts": 1,
               "aux_loss_coef": 0.0}
        scored = {**ffn, "router": {"kind": f"{scoring}_topk", "normalize": True, "scaling_factor": scale}}
        hashed = {**ffn, "router": {"kind": "hash", "scoring": scoring, "normalize": True, "scaling_factor": scale}}
        types = cfg.get("mlp_layer_types")
        if types is None:
            hash_layers = cfg.get("num_hash_layers", 3)
            types = ["hash_moe"] * min(n, hash_layers) + ["moe"] * max(0, n - hash_layers)
        if any(t not in ("hash_moe", "moe") for t in types[:n]):
            raise UserError(f"{cfg.family}: mlp_layer_types must be hash_moe or moe, got {types!r}")
        # transformers' routers always renormalise the chosen experts' weights, whatever norm_topk_prob says.
        cfg.mark_read("norm_topk_prob", "num_hash_layers", "mlp_bias", "output_router_logits", "router_aux_loss_coef",
                      "router_jitter_noise", "num_nextn_predict_layers")
        per_layer_overrides(model, "ffn", [hashed if t == "hash_moe" else scored for t in types[:n]], n)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        layers = view.per_layer("ffn")
        types, first = [], None
        for i, f in enumerate(layers):
            router = f.get("router") or {}
            if f["kind"] != "moe" or f.get("swiglu_style") != "silu" or f["n_shared_experts"] != 1 or f.get("shared_gate"):
                raise NotExpressible(f"model.layers[{i}].ffn", f"Hugging Face {view.name} has moe layers with one shared "
                                     "expert and the clamped SwiGLU (swiglu_style silu)")
            kind = router.get("kind")
            if kind not in ("hash", "sqrtsoftplus_topk", "sigmoid_topk") or not router.get("normalize", True):
                raise NotExpressible(f"model.layers[{i}].ffn.router", f"Hugging Face {view.name} routes by hash or "
                                     "sqrtsoftplus/sigmoid top-k, always renormalised")
            scoring = router["scoring"] if kind == "hash" else kind.removesuffix("_topk")
            mine = (f["n_experts"], f["top_k"], f["hidden"], f["swiglu_limit"], scoring, router["scaling_factor"],
                    f["activation"])
            if first is not None and mine != first:
                raise NotExpressible(f"model.layers[{i}].ffn", f"the moe layers differ; Hugging Face {view.name} has one setting")
            first = mine
            types.append("hash_moe" if kind == "hash" else "moe")
        assert first is not None
        n_experts, top_k, hidden, limit, scoring, scale, activation = first
        config.update(n_routed_experts=n_experts, num_experts_per_tok=top_k, moe_intermediate_size=hidden,
                      n_shared_experts=1, swiglu_limit=limit, scoring_func=scoring, routed_scaling_factor=scale,
                      norm_topk_prob=True, mlp_layer_types=types,
                      hidden_act={"silu": "silu"}.get(activation, activation))

    def rules(self) -> list[Rule]:
        return [
            *expert_rules(saved=FFN, fused=MLP, gate="w1", up="w3", down="w2"),
            Copy(f"{FFN}.gate.bias", "blocks.{i}.ffn.router.selection_bias"),
            Copy(f"{FFN}.gate.tid2eid", "blocks.{i}.ffn.router.token_experts"),
            Fused([f"{FFN}.shared_experts.w1.weight", f"{FFN}.shared_experts.w3.weight"],
                  "blocks.{i}.ffn.shared.gate_up.weight", sizes=shared_halves),
            Copy(f"{FFN}.shared_experts.w2.weight", "blocks.{i}.ffn.shared.down.weight"),
        ]


PARTS = (Sizes(), TwoRopes(), Layout("prenorm"), RMSNorm(), HyperConnections(), CompressedAttention(),
         HashAndScoredExperts())

FAMILY = decoder_family(
    name="DeepSeek-V4",
    model_type="deepseek_v4",
    architecture="DeepseekV4ForCausalLM",
    defaults=DEFAULTS,
    parts=PARTS,
    rules=[Copy("model.embed_tokens.weight", "embedding.weight"), Copy("model.norm.weight", "final_norm.weight"),
           Copy("head.weight", "lm_head.weight"), Copy(f"{LAYER}.attn_norm.weight", "blocks.{i}.attention_norm.weight"),
           Copy(f"{LAYER}.ffn_norm.weight", "blocks.{i}.ffn_norm.weight"),
           # Sizes and Layout name transformers' in-memory tensors; the saved ones are DeepSeek's (above).
           *[rule for part in PARTS if not isinstance(part, (Sizes, Layout)) for rule in part.rules()]],
    maps="attention compressed per layer_types (sliding only; CSA: compress_rates' 4 with overlap and the lightning "
         "indexer; HCA: 128), o_groups/o_lora_rank -> out_groups/out_rank, partial_rotary_factor -> rope_dim, "
         "rope_theta / compress_rope_theta (+ YaRN) -> the sliding layers' and the compressed layers' interleaved "
         "ropes, hc_* -> residual mhc, ffn moe with swiglu_style silu, scoring_func -> sqrtsoftplus_topk (hash on "
         "mlp_layer_types' hash_moe layers, tid2eid -> token_experts)",
    caveats="the multi-token-prediction module (mtp.*) is skipped as transformers skips it; norm_topk_prob is read as "
            "true (transformers renormalises always); under left padding transformers pools padding into its "
            "compressed blocks, specformer pools each row from its own position 0",
    ignore_tensors=(r"(^|\.)mtp\..*",),
)
