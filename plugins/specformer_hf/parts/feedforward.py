"""The feed-forward: a gated MLP, a plain MLP with biases, a mixture of gated experts (its routers and expert
tensors), dense layers among them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError
from specformer_layers import default_gated_hidden  # the width a gated FFN with hidden: null builds

from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from specformer_hf.parts.base import LAYER, MLP, FamilyView, Part
from specformer_hf.rules import Copy, Fused, OneOf, PerExpert, Rule, Site, halves
from specformer_hf.specview import NotExpressible, SpecView

#: Our gated feed-forward kinds, and the one each activation makes.
GATED_FFNS = ("swiglu", "geglu", "reglu")
GATED_KIND = {"silu": "swiglu", "gelu": "geglu", "gelu_tanh": "geglu", "relu": "reglu"}


def gated_ffn(cfg: ConfigReader, *, act_key: str = "hidden_act", bias: bool = False) -> dict[str, Any]:
    activation = activation_from_hf(cfg, act_key)
    kind = GATED_KIND.get(activation, "swiglu")
    return {"kind": kind, "hidden": cfg.get_int("intermediate_size"), "activation": activation, "bias": bias}


def gated_ffn_config(view: SpecView, family: str, *, act_key: str = "hidden_act") -> dict[str, Any]:
    view.block_kind("ffn", GATED_FFNS, family=family)
    hidden = view.uniform("ffn", "hidden", family=family) or default_gated_hidden(view.model.d_model)
    return {"intermediate_size": hidden, act_key: ACTIVATIONS_TO_HF[view.uniform("ffn", "activation", family=family)]}


@dataclass(frozen=True)
class GatedFFN(Part):
    """intermediate_size and the activation (``act_key``) <-> a gated feed-forward; gate/up fused, down; ``bias_key`` switches biases."""

    act_key: str = "hidden_act"
    bias_key: str | None = None
    #: Gemma's configs say "gelu" for the tanh approximation, and may name the field hidden_activation.
    gemma_gelu: bool = False
    #: The checkpoint keeps gate and up as one ``gate_up_proj`` whose rows are [gate; up] (GLM, Phi-3's layout):
    #: our gate_up exactly, copied as it is.
    fused: bool = False

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        key = self.act_key
        if self.gemma_gelu:
            key = next((k for k in ("hidden_activation", self.act_key) if cfg.has(k) and cfg.data[k] is not None), self.act_key)
            cfg.mark_read("hidden_activation", self.act_key)
            if cfg.get(key) == "gelu":
                cfg.data[key] = "gelu_pytorch_tanh"
        bias = bool(cfg.get(self.bias_key)) if self.bias_key else False
        model.setdefault("block", {})["ffn"] = gated_ffn(cfg, act_key=key, bias=bias)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        config.update(gated_ffn_config(view.view, view.name, act_key=self.act_key))
        if self.bias_key:
            config[self.bias_key] = view.uniform("ffn", "bias")

    def rules(self) -> list[Rule]:
        if self.fused:
            return [Copy(f"{MLP}.gate_up_proj.weight", "blocks.{i}.ffn.gate_up.weight"),
                    Copy(f"{MLP}.down_proj.weight", "blocks.{i}.ffn.down.weight")]
        return [
            Fused([f"{MLP}.gate_proj.weight", f"{MLP}.up_proj.weight"], "blocks.{i}.ffn.gate_up.weight", sizes=halves),
            Fused([f"{MLP}.gate_proj.bias", f"{MLP}.up_proj.bias"], "blocks.{i}.ffn.gate_up.bias", sizes=halves),
            Copy(f"{MLP}.down_proj.weight", "blocks.{i}.ffn.down.weight"),
            Copy(f"{MLP}.down_proj.bias", "blocks.{i}.ffn.down.bias"),
        ]


@dataclass(frozen=True)
class PlainMLP(Part):
    """intermediate_size and the activation (``act_key``) <-> an ungated ``mlp``; ``fc_in``/``fc_out`` name the
    checkpoint's two projections under ``mlp.`` (StarCoder2's c_fc and c_proj, Phi's fc1 and fc2).

    ``always_biased``: the family's MLP has biases whatever its config says (Phi), so import turns them on and
    export refuses a spec without them; otherwise they are there or not as the spec's ``ffn.bias`` says, which
    the family's bias switch sets (StarCoder2's use_bias)."""

    fc_in: str = "c_fc"
    fc_out: str = "c_proj"
    act_key: str = "hidden_act"
    always_biased: bool = False

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        ffn = {"kind": "mlp", "hidden": cfg.get_int("intermediate_size"), "activation": activation_from_hf(cfg, self.act_key)}
        model.setdefault("block", {})["ffn"] = {**ffn, "bias": True} if self.always_biased else ffn

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("ffn", ("mlp",))
        if self.always_biased and not view.uniform("ffn", "bias"):
            raise NotExpressible("model.block.ffn.bias", f"Hugging Face {view.name}'s MLP always has biases")
        hidden = view.uniform("ffn", "hidden") or 4 * view.model.d_model  # MLPParams' default width
        activation = view.uniform("ffn", "activation")
        if not isinstance(activation, str):  # a learned activation component
            raise NotExpressible("model.block.ffn.activation", f"{activation.get('kind')!r}: Hugging Face {view.name}'s "
                                 "MLP has a fixed activation (hidden_act)")
        config.update({"intermediate_size": hidden, self.act_key: ACTIVATIONS_TO_HF[activation]})

    def rules(self) -> list[Rule]:
        return [Copy(f"{MLP}.{hf}.{p}", f"blocks.{{i}}.ffn.{ours}.{p}")
                for hf, ours in ((self.fc_in, "fc_in"), (self.fc_out, "fc_out")) for p in ("weight", "bias")]


# -- mixtures of experts ------------------------------------------------------------------------------


def _n_experts(site: Site) -> int:
    return getattr(site.ffn, "n_experts", 0)  # 0 in a dense layer: no expert tensors there


def expert_rules(*, saved: str, fused: str = MLP, gate: str = "gate_proj", up: str = "up_proj",
                 down: str = "down_proj", saves_fused: bool = False) -> list[Rule]:
    """Router and experts, read from either layout transformers uses, written per expert as it saves them.

    ``saved`` is the module that ``save_pretrained`` writes: ``{saved}.gate.weight`` (the
    router) and, per expert j, ``{saved}.experts.{j}.{gate|up|down}.weight``. ``fused`` is
    transformers 5's module as it is in memory (and in files saved from it as they are):
    ``{fused}.gate.weight``, ``{fused}.experts.gate_up_proj`` (n_experts, 2 * hidden, d_model)
    = [gate; up] per expert, exactly our ``experts_in``, and ``{fused}.experts.down_proj``
    (n_experts, d_model, hidden) = our ``experts_out``. ``saves_fused``: the family's checkpoints keep the
    fused tensors (no conversion splits them per expert on save: Lara-Mini), so export writes those.
    """
    router = Copy(f"{saved}.gate.weight", "blocks.{i}.ffn.router.weight")
    per_expert_in = PerExpert([f"{saved}.experts.{{j}}.{gate}.weight", f"{saved}.experts.{{j}}.{up}.weight"],
                              "blocks.{i}.ffn.experts_in", n_experts=_n_experts)
    per_expert_out = PerExpert([f"{saved}.experts.{{j}}.{down}.weight"], "blocks.{i}.ffn.experts_out",
                               n_experts=_n_experts)
    fused_in = Copy(f"{fused}.experts.gate_up_proj", "blocks.{i}.ffn.experts_in")
    fused_out = Copy(f"{fused}.experts.down_proj", "blocks.{i}.ffn.experts_out")
    first, second = ((fused_in, fused_out), (per_expert_in, per_expert_out)) if saves_fused else \
        ((per_expert_in, per_expert_out), (fused_in, fused_out))
    return [
        router if saved == fused else OneOf(router, Copy(f"{fused}.gate.weight", "blocks.{i}.ffn.router.weight")),
        OneOf(first[0], second[0]),
        OneOf(first[1], second[1]),
    ]


def shared_halves(site: Site) -> tuple[int, int]:
    hidden = site.ffn.shared.hidden
    return hidden, hidden


def plain_sigmoid_router(router: dict[str, Any] | None, family: str, *, always_normalize: bool,
                          selection_bias: bool = True, scaled: bool = False, softcapped: bool = False) -> bool:
    """The ``normalize`` of a sigmoid_topk router with no groups or score bias, a selection bias on the scores or none
    as ``selection_bias`` says, and no scaling_factor or logit_softcap unless ``scaled`` or ``softcapped`` lets the
    family's config carry them; NotExpressible otherwise."""
    plain: dict[str, Any] = {"n_group": 1, "topk_group": 1, "bias": False, "selection_bias": selection_bias,
                             "bias_on": "score"}
    if not scaled:
        plain["scaling_factor"] = 1.0
    if not softcapped:
        plain["logit_softcap"] = None
    if (router or {}).get("kind") != "sigmoid_topk" or any(router.get(k, v) != v for k, v in plain.items()) \
            or (always_normalize and not router.get("normalize", True)):
        raise NotExpressible("model.block.ffn.router", f"Hugging Face {family} routes with sigmoid_topk ("
                             + ("a selection bias on the scores" if selection_bias else "selection_bias: false")
                             + ", no groups" + ("" if scaled else ", scaling_factor 1") + ", no score bias"
                             + ("" if softcapped else ", no logit_softcap")
                             + (", normalize: true)" if always_normalize else ")"))
    return bool(router.get("normalize", True))


def the_moe_setting(view: FamilyView) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The one moe ffn every moe layer of ``view`` has (aux_loss_coef aside), and the other layers' ffns, for a
    family whose config holds one expert setting for all its sparse layers; NotExpressible without a moe layer
    or with moe layers that differ."""
    ffns = view.per_layer("ffn")
    moe = [f for f in ffns if f["kind"] == "moe"]
    dense = [f for f in ffns if f["kind"] != "moe"]
    if not moe:
        raise NotExpressible("model.block.ffn", f"Hugging Face {view.name} needs at least one moe layer here "
                             "(its expert settings come from one)")
    strip = lambda f: {k: v for k, v in f.items() if k != "aux_loss_coef"}  # noqa: E731
    if any(strip(f) != strip(moe[0]) for f in moe[1:]):
        raise NotExpressible("model.layers[*].ffn", f"the moe layers differ; Hugging Face {view.name} has one setting")
    return moe[0], dense


@dataclass(frozen=True)
class MixtureOfExperts(Part):
    """A routed mixture of gated experts (softmax over all experts, then top-k), in place of the gated feed-forward.

    ``n_experts``, ``hidden`` and ``normalize`` name the family's config fields (``normalize``
    None: the top-k weights are always renormalised, as Mixtral's router does); ``saved``
    and the expert tensor names as in :func:`expert_rules`. ``shared``: one always-on gated
    expert of width shared_expert_intermediate_size scaled by sigmoid(shared_expert_gate . x)
    (Qwen2-MoE). ``dense``: decoder_sparse_step and mlp_only_layers make some layers a plain
    gated feed-forward of width intermediate_size (Qwen-MoE), written as ``layers:`` overrides.
    ``selection_bias``: the names (saved, in memory) of a per-expert bias that only picks experts; the
    router is then ``sigmoid_topk`` (sigmoid scores, the chosen ones renormalised; MiniMax-M2).
    ``sigmoid``: a ``sigmoid_topk`` router without such a bias (``selection_bias: false``; Flint).
    ``shared_gate``: whether the shared expert is scaled by its sigmoid gate (Qwen2-MoE) or added as it is
    (Flint, Lara-Mini). ``shared_names``: the shared expert's module under ``mlp.``, the first written (what
    save_pretrained writes), the others read too (Laguna saves ``shared_expert`` and holds ``shared_experts``).
    ``scaling`` and ``softcap``: the config fields of a sigmoid_topk router's ``scaling_factor`` and
    ``logit_softcap`` (0: none), where the family has them (Laguna).
    """

    n_experts: str = "num_experts"
    hidden: str = "intermediate_size"
    normalize: str | None = None
    saved: str = MLP
    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"
    shared: bool = False
    shared_gate: bool = True
    dense: bool = False
    #: Other names config.json may give the expert count (Qwen3-MoE saves num_local_experts, its hub files num_experts).
    n_experts_aliases: tuple[str, ...] = ()
    selection_bias: tuple[str, ...] = ()
    sigmoid: bool = False
    #: The checkpoints keep the experts fused (gate_up_proj, down_proj): export writes them so (Lara-Mini).
    saves_fused: bool = False
    shared_names: tuple[str, ...] = ("shared_expert",)
    scaling: str | None = None
    softcap: str | None = None

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        activation = activation_from_hf(cfg, "hidden_act")
        count_key = next((k for k in (self.n_experts, *self.n_experts_aliases) if cfg.has(k)), self.n_experts)
        cfg.mark_read(*self.n_experts_aliases)
        ffn: dict[str, Any] = {
            "kind": "moe",
            "n_experts": cfg.get_int(count_key),
            "top_k": cfg.get_int("num_experts_per_tok"),
            "hidden": cfg.get_int(self.hidden),
            "activation": activation,
            "gated": True,
            "routing": "softmax_then_topk",
            "normalize_topk": bool(cfg.get(self.normalize)) if self.normalize else True,
            "aux_loss_coef": cfg.get_float("router_aux_loss_coef"),
        }
        if self.selection_bias or self.sigmoid:
            ffn["router"] = {"kind": "sigmoid_topk", "normalize": ffn.pop("normalize_topk")}
            if not self.selection_bias:
                ffn["router"]["selection_bias"] = False
            if self.scaling:
                ffn["router"]["scaling_factor"] = cfg.get_float(self.scaling)
            if self.softcap and cfg.get_float(self.softcap) > 0:  # transformers caps only with a positive value
                ffn["router"]["logit_softcap"] = cfg.get_float(self.softcap)
            del ffn["routing"]
        if self.shared:
            ffn.update(n_shared_experts=1, shared_hidden=cfg.get_int("shared_expert_intermediate_size"),
                       shared_gate=self.shared_gate)
        model.setdefault("block", {})["ffn"] = ffn
        if self.dense:
            n_layers, step = cfg.get_layers("num_hidden_layers"), cfg.get_size("decoder_sparse_step")
            only = cfg.get("mlp_only_layers") or []
            if not isinstance(only, list) or not all(isinstance(i, int) and 0 <= i < n_layers for i in only):
                raise UserError(f"{cfg.family}: mlp_only_layers must list layer indices below {n_layers}, got {only!r}")
            dense = [i for i in range(n_layers) if i in only or (i + 1) % step != 0]
            if dense:
                swiglu = {"kind": GATED_KIND.get(activation, "swiglu"), "hidden": cfg.get_int("intermediate_size"),
                          "activation": activation}
                model.setdefault("layers", []).append({"select": dense[0] if len(dense) == 1 else dense, "ffn": swiglu})
            else:
                cfg.mark_read("intermediate_size")  # only dense layers use it: inert here, not worth a warning

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        kinds = view.per_layer("ffn", "kind")
        moe = [layer["ffn"] for layer in view.view.layers if layer["ffn"]["kind"] == "moe"]
        dense = [i for i, kind in enumerate(kinds) if kind != "moe"]
        if not moe:
            raise NotExpressible("model.block.ffn.kind", f"Hugging Face {view.name} needs mixture-of-experts layers (moe)")
        if dense and not self.dense:
            raise NotExpressible("model.layers[*].ffn.kind", f"Hugging Face {view.name} has experts in every layer")
        if any(f != moe[0] for f in moe[1:]):
            raise NotExpressible("model.layers[*].ffn", f"the moe layers differ; Hugging Face {view.name} has one expert setting")
        ffn = moe[0]
        normalize = ffn["normalize_topk"]
        if self.selection_bias or self.sigmoid:
            normalize = plain_sigmoid_router(ffn.get("router"), view.name, always_normalize=self.normalize is None,
                                              selection_bias=bool(self.selection_bias), scaled=bool(self.scaling),
                                              softcapped=bool(self.softcap))
            router = ffn["router"]
            if self.scaling:
                config[self.scaling] = router.get("scaling_factor", 1.0)
            if self.softcap:
                config[self.softcap] = router.get("logit_softcap") or 0.0
        elif ffn.get("router") is not None:
            raise NotExpressible("model.block.ffn.router", f"Hugging Face {view.name}'s router is the default softmax top-k "
                                 "(write it with routing and normalize_topk)")
        for key, wanted in (("expert_bias", False), ("swiglu_limit", None), ("routing", "softmax_then_topk"), ("gated", True)):
            if ffn.get(key, wanted) != wanted:
                raise NotExpressible(f"model.block.ffn.{key}", f"{ffn.get(key)!r}: Hugging Face {view.name} has {wanted!r}")
        hidden = ffn["hidden"] or default_gated_hidden(view.model.d_model)
        config.update({
            self.n_experts: ffn["n_experts"],
            "num_experts_per_tok": ffn["top_k"],
            self.hidden: hidden,
            "hidden_act": ACTIVATIONS_TO_HF[ffn["activation"]],
            "router_aux_loss_coef": ffn["aux_loss_coef"],
        })
        if self.normalize:
            config[self.normalize] = normalize
        if self.shared:
            if ffn.get("n_shared_experts") != 1 or bool(ffn.get("shared_gate")) != self.shared_gate:
                gated = "gated" if self.shared_gate else "ungated"
                raise NotExpressible("model.block.ffn.n_shared_experts", f"Hugging Face {view.name} has one {gated} "
                                     f"shared expert (n_shared_experts: 1, shared_gate: {str(self.shared_gate).lower()})")
            config["shared_expert_intermediate_size"] = ffn.get("shared_hidden") or hidden
        elif ffn.get("n_shared_experts"):
            raise NotExpressible("model.block.ffn.n_shared_experts", f"Hugging Face {view.name} has no shared experts")
        if self.dense:
            config.update(decoder_sparse_step=1, mlp_only_layers=dense)
            widths = {view.view.layers[i]["ffn"].get("hidden") or default_gated_hidden(view.model.d_model) for i in dense}
            if len(widths) > 1:
                raise NotExpressible("model.layers[*].ffn.hidden", f"dense layers of widths {sorted(widths)}; Hugging Face "
                                     f"{view.name} has one intermediate_size")
            if dense:
                config["intermediate_size"] = widths.pop()

    def rules(self) -> list[Rule]:
        rules = expert_rules(saved=self.saved, gate=self.gate, up=self.up, down=self.down, saves_fused=self.saves_fused)
        if self.selection_bias:
            rules.append(OneOf(*(Copy(name, "blocks.{i}.ffn.router.selection_bias") for name in self.selection_bias)))
        if self.shared:
            rules += [
                OneOf(*(Fused([f"{MLP}.{name}.gate_proj.weight", f"{MLP}.{name}.up_proj.weight"],
                              "blocks.{i}.ffn.shared.gate_up.weight", sizes=shared_halves) for name in self.shared_names)),
                OneOf(*(Copy(f"{MLP}.{name}.down_proj.weight", "blocks.{i}.ffn.shared.down.weight")
                        for name in self.shared_names)),
            ]
            if self.shared_gate:
                rules.append(Copy(f"{MLP}.shared_expert_gate.weight", "blocks.{i}.ffn.shared_gate.weight"))
        if self.dense:
            rules += GatedFFN().rules()  # the dense layers' mlp (a rule whose parameters a layer lacks is skipped)
        return rules


@dataclass(frozen=True)
class GroupedExperts(Part):
    """n_routed_experts, num_experts_per_tok, moe_intermediate_size, n_shared_experts, norm_topk_prob,
    routed_scaling_factor, n_group, topk_group, first_k_dense_replace <-> ffn moe with a sigmoid_topk router
    (e_score_correction_bias is its selection_bias) and ``layers:`` overrides for the dense first layers
    (DeepSeek-V3's experts, which GLM-4.5 shares field for field and tensor for tensor).

    ``softmax``: DeepSeek-V2's router instead, a ``softmax_topk`` whose weights transformers never renormalises
    (DeepseekV2TopkRouter has no norm_topk_prob) and whose groups count only with ``topk_method:
    group_limited_greedy`` (a group scored by its best expert); no selection bias."""

    softmax: bool = False

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        activation = activation_from_hf(cfg, "hidden_act")
        n_shared = cfg.get_int("n_shared_experts") or 0
        ffn: dict[str, Any] = {
            "kind": "moe",
            "n_experts": cfg.get_int("n_routed_experts"),
            "top_k": cfg.get_int("num_experts_per_tok"),
            "hidden": cfg.get_int("moe_intermediate_size"),
            "activation": activation,
            "router": self._read_router(cfg),
            "aux_loss_coef": 0.0,  # DeepSeek-V3 balances through the selection bias, not a loss; transformers' V2 has none
        }
        if n_shared:
            ffn["n_shared_experts"] = n_shared
        model.setdefault("block", {})["ffn"] = ffn
        dense = min(cfg.get_int("first_k_dense_replace") or 0, cfg.get_layers("num_hidden_layers"))
        if dense:
            model.setdefault("layers", []).append({"select": 0 if dense == 1 else f"0:{dense}", "ffn": {
                "kind": "swiglu" if activation == "silu" else "geglu", "hidden": cfg.get_int("intermediate_size"),
                "activation": activation}})
        # The multi-token prediction modules are not part of the causal LM; intermediate_size only sizes dense layers.
        cfg.mark_read("num_mtp_layers", "num_nextn_predict_layers", "intermediate_size")

    def _read_router(self, cfg: ConfigReader) -> dict[str, Any]:
        if not self.softmax:
            return {"kind": "sigmoid_topk", "normalize": bool(cfg.get("norm_topk_prob")),
                    "scaling_factor": cfg.get_float("routed_scaling_factor"),
                    "n_group": cfg.get("n_group") or 1, "topk_group": cfg.get("topk_group") or 1}
        method = cfg.require("topk_method", ("greedy", "group_limited_greedy"),
                             why="transformers' DeepSeek-V2 picks the top-k experts of all (greedy) or of the best groups")
        if cfg.get("norm_topk_prob"):
            cfg.note_unused("norm_topk_prob (transformers' DeepSeek-V2 never renormalises the chosen experts' weights)")
        grouped = method == "group_limited_greedy"
        if not grouped:
            cfg.mark_read("n_group", "topk_group")  # greedy routing ignores the groups
        return {"kind": "softmax_topk", "normalize": False, "scaling_factor": cfg.get_float("routed_scaling_factor"),
                "n_group": cfg.get_size("n_group") if grouped else 1,
                "topk_group": cfg.get_size("topk_group") if grouped else 1}

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        kinds = view.per_layer("ffn", "kind")
        dense = [i for i, k in enumerate(kinds) if k != "moe"]
        if dense != list(range(len(dense))) or len(dense) == len(kinds):
            raise NotExpressible("model.layers[*].ffn", f"Hugging Face {view.name} has dense layers first, then moe layers")
        moe = [layer["ffn"] for layer in view.view.layers if layer["ffn"]["kind"] == "moe"]
        strip = lambda f: {k: v for k, v in f.items() if k != "aux_loss_coef"}  # noqa: E731
        if any(strip(f) != strip(moe[0]) for f in moe[1:]):
            raise NotExpressible("model.layers[*].ffn", f"the moe layers differ; Hugging Face {view.name} has one setting")
        ffn, router = moe[0], moe[0].get("router") or {}
        if self.softmax:
            if router.get("kind") != "softmax_topk" or router.get("bias") or router.get("normalize", True):
                raise NotExpressible("model.block.ffn.router", f"Hugging Face {view.name} routes with softmax_topk "
                                     "(normalize: false, no score bias)")
        elif router.get("kind") != "sigmoid_topk" or router.get("bias") or not router.get("selection_bias", True):
            raise NotExpressible("model.block.ffn.router", f"Hugging Face {view.name} routes with sigmoid_topk (no score "
                                 "bias, a selection bias)")
        hidden = ffn["hidden"]
        if ffn["n_shared_experts"] and (ffn.get("shared_hidden") or hidden * ffn["n_shared_experts"]) != hidden * ffn["n_shared_experts"]:
            raise NotExpressible("model.block.ffn.shared_hidden", f"Hugging Face {view.name}'s shared experts are n_shared_experts * hidden wide")
        config.update(n_routed_experts=ffn["n_experts"], num_experts_per_tok=ffn["top_k"], moe_intermediate_size=hidden,
                      n_shared_experts=ffn["n_shared_experts"], norm_topk_prob=router["normalize"],
                      routed_scaling_factor=router["scaling_factor"], n_group=router["n_group"],
                      topk_group=router["topk_group"], first_k_dense_replace=len(dense),
                      hidden_act={"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh", "gelu": "gelu"}[ffn["activation"]])
        if self.softmax:
            config["topk_method"] = "group_limited_greedy" if router["n_group"] > 1 else "greedy"
        if dense:
            widths = {view.view.layers[i]["ffn"]["hidden"] for i in dense}
            if len(widths) > 1:
                raise NotExpressible("model.layers[*].ffn.hidden", f"dense layers of widths {sorted(widths)}; one intermediate_size")
            config["intermediate_size"] = widths.pop()

    def rules(self) -> list[Rule]:
        bias = [] if self.softmax else [Copy(f"{MLP}.gate.e_score_correction_bias", "blocks.{i}.ffn.router.selection_bias")]
        return [
            *expert_rules(saved=MLP),
            *bias,
            Fused([f"{MLP}.shared_experts.gate_proj.weight", f"{MLP}.shared_experts.up_proj.weight"],
                  "blocks.{i}.ffn.shared.gate_up.weight", sizes=shared_halves),
            Copy(f"{MLP}.shared_experts.down_proj.weight", "blocks.{i}.ffn.shared.down.weight"),
            *GatedFFN().rules(),  # the dense first layers
        ]


@dataclass(frozen=True)
class GraniteExperts(Part):
    """num_local_experts, num_experts_per_tok, intermediate_size (each expert's width), hidden_act, and
    shared_intermediate_size <-> ffn moe; Granite's fused expert layout (``block_sparse_moe``, ``shared_mlp``).

    The router keeps the top-k logits and softmaxes them: the same weights as a softmax over all
    experts renormalised over the kept ones (``normalize_topk``). ``shared`` says what the family
    does with an always-on SwiGLU expert of width shared_intermediate_size beside the mixture:
    ``always`` (Granite 4.0-H, whose config with no experts is the shared expert alone),
    ``optional`` (granitemoeshared: a width of 0 is none) or ``none`` (granitemoe, no such field).
    """

    shared: str = "always"
    #: Whether save_pretrained writes the checkpoint's names (input_linear, output_linear, router.layer: transformers'
    #: conversion mapping for granitemoe and the families mapped to it); False: the fused names the modules hold
    #: (granitemoe_swa, which has no conversion mapping). Import reads either.
    checkpoint_names: bool = True

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        activation = activation_from_hf(cfg, "hidden_act")
        n_experts = cfg.get_int("num_local_experts")
        shared = 0 if self.shared == "none" else cfg.get_int("shared_intermediate_size")
        if self.shared == "always":
            shared = cfg.get_size("shared_intermediate_size")
        if n_experts > 0:
            ffn: dict[str, Any] = {
                "kind": "moe", "n_experts": n_experts, "top_k": cfg.get_int("num_experts_per_tok"),
                "hidden": cfg.get_int("intermediate_size"), "activation": activation, "gated": True,
                "routing": "softmax_then_topk", "normalize_topk": True,
                "aux_loss_coef": cfg.get_float("router_aux_loss_coef"),
            }
            if shared:
                ffn.update(n_shared_experts=1, shared_hidden=shared)
        elif self.shared == "always":  # no experts: the shared expert alone
            cfg.mark_read("intermediate_size", "num_experts_per_tok", "router_aux_loss_coef")
            ffn = {"kind": GATED_KIND.get(activation, "swiglu"), "hidden": shared, "activation": activation}
        else:
            raise UserError(f"{cfg.family}: num_local_experts must be at least 1 (every layer is a mixture of experts), "
                            f"got {n_experts}")
        model.setdefault("block", {})["ffn"] = ffn

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        kind = view.block_kind("ffn", ("moe", *GATED_FFNS) if self.shared == "always" else ("moe",))
        ffn = view.uniform("ffn")
        config["hidden_act"] = ACTIVATIONS_TO_HF[ffn["activation"]]
        if kind != "moe":
            if ffn.get("bias"):
                raise NotExpressible("model.block.ffn.bias", f"Hugging Face {view.name}'s shared expert has no biases")
            config.update(num_local_experts=0,
                          shared_intermediate_size=ffn["hidden"] or default_gated_hidden(view.model.d_model))
            return
        shared = {"always": (1,), "optional": (0, 1), "none": (0,)}[self.shared]
        if ffn.get("n_shared_experts", 0) not in shared:
            raise NotExpressible("model.block.ffn.n_shared_experts", f"{ffn.get('n_shared_experts')!r}: Hugging Face "
                                 f"{view.name} has {' or '.join(map(str, shared))} shared experts")
        for key, wanted in (("router", None), ("expert_bias", False), ("swiglu_limit", None), ("gated", True),
                            ("normalize_topk", True), ("shared_gate", False)):
            if ffn.get(key, wanted) != wanted:
                raise NotExpressible(f"model.block.ffn.{key}",
                                     f"{ffn.get(key)!r}: Hugging Face {view.name} has {wanted!r}")
        hidden = ffn["hidden"] or default_gated_hidden(view.model.d_model)
        config.update(num_local_experts=ffn["n_experts"], num_experts_per_tok=ffn["top_k"], intermediate_size=hidden,
                      router_aux_loss_coef=ffn["aux_loss_coef"])
        if self.shared != "none":
            n_shared = ffn.get("n_shared_experts", 0)
            config["shared_intermediate_size"] = (ffn.get("shared_hidden") or hidden) if n_shared else 0

    def rules(self) -> list[Rule]:
        ffn, moe, shared = "blocks.{i}.ffn", f"{LAYER}.block_sparse_moe", f"{LAYER}.shared_mlp"

        def saved_or_fused(saved: str, fused: str, ours: str) -> Rule:
            # save_pretrained writes the checkpoint's names; transformers 5's modules hold the fused ones.
            options = (Copy(f"{moe}.{saved}", f"{ffn}.{ours}"), Copy(f"{moe}.{fused}", f"{ffn}.{ours}"))
            return OneOf(*(options if self.checkpoint_names else options[::-1]))

        rules = [
            saved_or_fused("router.layer.weight", "router.weight", "router.weight"),
            saved_or_fused("input_linear.weight", "experts.gate_up_proj", "experts_in"),
            saved_or_fused("output_linear.weight", "experts.down_proj", "experts_out"),
        ]
        if self.shared == "none":
            return rules
        return rules + [
            # The shared expert, [gate; up] in one matrix as ours: inside the mixture, or the whole feed-forward.
            Copy(f"{shared}.input_linear.weight", f"{ffn}.shared.gate_up.weight"),
            Copy(f"{shared}.output_linear.weight", f"{ffn}.shared.down.weight"),
            Copy(f"{shared}.input_linear.weight", f"{ffn}.gate_up.weight"),
            Copy(f"{shared}.output_linear.weight", f"{ffn}.down.weight"),
        ]


__all__ = [
    "GATED_FFNS", "GATED_KIND", "GatedFFN", "GraniteExperts", "GroupedExperts", "MixtureOfExperts", "PlainMLP",
    "expert_rules", "gated_ffn", "gated_ffn_config", "shared_halves",
]
