"""Zamba2 (``model_type: zamba2``, Zyphra's Zamba2-1.2B/2.7B/7B): Mamba-2 layers, some of them "hybrid": a shared
transformer block runs before their Mamba-2 mixer.

Every layer is a pre-norm Mamba-2 block ``x + mamba(rmsnorm(x))``. A hybrid layer first runs one of
``num_mem_blocks`` shared transformer blocks (the k-th hybrid layer block ``k % num_mem_blocks``) on
``rmsnorm(concat(x, embeddings))`` (2 x hidden_size wide): attention whose heads are ``2 hidden / heads`` wide with
scale ``(head_dim / 2)^-0.5``, then a pre-normed gated MLP, with no residual inside; a per-layer ``linear`` projects
the result, which joins the Mamba block's input before its norm (not its residual). Each use has low-rank adapters
of its own on gate_up, and on q, k and v with ``use_shared_attention_adapter``. In the spec: ``model.shared_blocks``
(``input: concat_embeddings``, ``output: mixer_input``, ``projection``, ``adapters``) and ``layers[].shared``.

Checkpoints keep a hybrid layer's Mamba block under ``mamba_decoder.``; the shared blocks' weights are tied, and
transformers saves each under the first layer that runs it (``model.layers.{first}.shared_transformer.*``),
adapters included: the k-th use's at slot k of that block's adapter lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader
from specformer_hf.parts.base import BLOCK_MIXER, FamilyView, Part, selection
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.feedforward import GATED_FFNS, gated_ffn
from specformer_hf.parts.mamba2 import Mamba2Fields, mamba2_rules
from specformer_hf.parts.positions import rope
from specformer_hf.rules import AtLayers, Copy, Fused, Rule, Site, renamed
from specformer_hf.specview import NotExpressible

#: transformers' Zamba2Config defaults (Zamba2-2.7B's sizes; layers_block_type None is its 54-layer pattern).
DEFAULTS = {
    "vocab_size": 32000, "max_position_embeddings": 4096, "hidden_size": 2560, "num_hidden_layers": 54,
    "layers_block_type": None, "mamba_d_state": 64, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_ngroups": 1,
    "time_step_min": 0.001, "time_step_max": 0.1, "time_step_floor": 1e-4, "n_mamba_heads": 8, "use_conv_bias": True,
    "chunk_size": 256, "add_bias_linear": False, "intermediate_size": None, "hidden_act": "gelu",
    "num_attention_heads": 32, "num_key_value_heads": None, "num_mem_blocks": 1, "use_shared_attention_adapter": False,
    "adapter_rank": 128, "use_mem_rope": False, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "rms_norm_eps": 1e-5, "use_long_context": False, "tie_word_embeddings": True,
}
#: Zamba2Config's layer pattern when config.json gives none (Zamba2-2.7B's 54 layers, 9 of them hybrid).
DEFAULT_PATTERN = (["mamba"] + (["mamba"] * 5 + ["hybrid"]) * 7 + ["mamba"] * 4 + ["hybrid"] + ["mamba"] * 3
                   + ["hybrid"] + ["mamba"] * 2)
#: What transformers' Zamba2 mixer normalises with, whatever rms_norm_eps says.
MAMBA_NORM_EPS = 1e-5
#: max_position_embeddings with use_long_context (Zamba2Config sets it; the rope is unchanged).
LONG_CONTEXT = 16384
#: transformers 5 writes "linear_attention" for a Mamba layer; older files say "mamba".
MAMBA_NAMES = ("mamba", "linear_attention")

MIXER = Mamba2Fields(heads="n_mamba_heads", head_dim="mamba_headdim", state="mamba_d_state", groups="mamba_ngroups",
                     conv="mamba_d_conv", conv_bias="use_conv_bias", bias="add_bias_linear", eps="rms_norm_eps",
                     chunk="chunk_size", act=None, width="given", step="min")

LAYER = "model.layers.{i}"
HOME = "model.layers.{home}.shared_transformer"  # where the shared block a layer runs is saved
BLOCK = "shared_blocks.{b}"
USE = "shared_use_parts.{i}"


def block_name(index: int) -> str:
    return f"shared_{index}"


def layer_kinds(cfg: ConfigReader, n_layers: int) -> list[str]:
    """layers_block_type as ``"mamba"`` / ``"hybrid"`` per layer (Zamba2Config's pattern when absent)."""
    kinds = cfg.get("layers_block_type")
    if kinds is None:
        kinds = DEFAULT_PATTERN
    if not isinstance(kinds, list) or len(kinds) != n_layers or any(k not in (*MAMBA_NAMES, "hybrid") for k in kinds):
        raise UserError(f"{cfg.family}: layers_block_type must give 'mamba' (or 'linear_attention') or 'hybrid' for each "
                        f"of the {n_layers} layers, got {kinds!r}")
    if kinds and kinds[0] == "hybrid":
        raise UserError(f"{cfg.family}: layer 0 is 'hybrid'; specformer runs a shared block only after a Mamba layer "
                        "(a cache starts each forward at its first layer)")
    return ["hybrid" if k == "hybrid" else "mamba" for k in kinds]


def shared_uses_of(model: Any) -> list[str | None]:
    """The shared block each layer of a spec's model section runs (the last override naming one), None where none."""
    uses: list[str | None] = [None] * model.n_layers
    for override in model.layers:
        if override.shared is not None:
            for i in override.layer_indices(model.n_layers):
                uses[i] = override.shared
    return uses


@dataclass(frozen=True)
class Zamba2Model(Part):
    """The whole model: sizes, the Mamba-2 backbone, the shared transformer blocks and where they run."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        d = cfg.get_size("hidden_size")
        n_layers = cfg.get_layers("num_hidden_layers")
        kinds = layer_kinds(cfg, n_layers)
        eps = cfg.get_float("rms_norm_eps")
        mixer = MIXER.spec(cfg, d_inner=int(cfg.get("mamba_expand") * d))
        mixer["norm_eps"] = MAMBA_NORM_EPS
        context = LONG_CONTEXT if cfg.get("use_long_context") else cfg.get_size("max_position_embeddings")
        positional = rope(cfg, rope_types=("default",)) if cfg.get("use_mem_rope") else {"kind": "none"}
        if not cfg.get("use_mem_rope"):
            cfg.mark_read("rope_parameters", "rope_theta")
        model.update(
            vocab_size=cfg.get_int("vocab_size"), d_model=d, n_layers=n_layers, context_length=context,
            tie_embeddings=bool(cfg.get("tie_word_embeddings")), positional=positional,
            block={"layout": "prenorm", "norm": {"kind": "rmsnorm", "eps": eps}, "mixer": mixer, "ffn": "none"},
            final_norm={"kind": "rmsnorm", "eps": eps},
        )
        hybrid = [i for i, kind in enumerate(kinds) if kind == "hybrid"]
        n_blocks = min(cfg.get_size("num_mem_blocks"), len(hybrid))  # transformers builds no block that never runs
        if not hybrid:
            cfg.mark_read("num_attention_heads", "num_key_value_heads", "intermediate_size", "hidden_act",
                          "use_shared_attention_adapter", "adapter_rank")
            return
        block = self.shared_block(cfg, d=d, eps=eps)
        model["shared_blocks"] = {block_name(b): dict(block) for b in range(n_blocks)}
        model["layers"] = [{"select": selection(hybrid[b::n_blocks], n_layers), "shared": block_name(b)}
                           for b in range(n_blocks)]

    @staticmethod
    def shared_block(cfg: ConfigReader, *, d: int, eps: float) -> dict[str, Any]:
        heads = cfg.get_size("num_attention_heads")
        kv = cfg.get("num_key_value_heads")
        kv = heads if kv is None else cfg.get_size("num_key_value_heads")
        if (2 * d) % heads:
            raise UserError(f"{cfg.family}: num_attention_heads ({heads}) must divide 2 x hidden_size ({2 * d}), the "
                            "shared attention's width")
        head_dim = 2 * d // heads
        hidden = cfg.get("intermediate_size")
        if hidden is None:
            cfg.data["intermediate_size"] = 4 * d  # Zamba2Config's default
        ffn = gated_ffn(cfg, bias=bool(cfg.get("add_bias_linear")))
        rank = cfg.get_size("adapter_rank")
        targets: dict[str, Any] = {"ffn.gate_up": {"inputs": d, "outputs": [2 * ffn["hidden"]]}}
        if cfg.get("use_shared_attention_adapter"):
            if kv != heads:
                raise UserError(f"{cfg.family}: use_shared_attention_adapter needs num_key_value_heads == "
                                f"num_attention_heads (got {kv} and {heads}): transformers' k and v adapters are "
                                f"2 x hidden_size ({2 * d}) wide")
            targets = {"mixer.qkv": {"inputs": 2 * d, "outputs": [2 * d] * 3}, **targets}
        return {
            "input": "concat_embeddings", "output": "mixer_input", "projection": True,
            "layout": {"kind": "prenorm", "mixer_pre_norm": False, "residual_scales": [0.0, 0.0]},
            "norm": {"kind": "rmsnorm", "eps": eps},
            "mixer": {"kind": "attention", "n_heads": heads, "n_kv_heads": kv, "head_dim": head_dim,
                      "input_width": 2 * d, "scale": (head_dim / 2) ** -0.5},
            "ffn": ffn, "adapters": {"rank": rank, "targets": targets},
        }

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        m = view.model
        if m.lm_head_bias:
            raise NotExpressible("model.lm_head_bias", f"Hugging Face {view.name} has no LM head bias")
        positional = view.positional
        if positional["kind"] not in ("none", "rope"):
            raise NotExpressible("model.positional.kind", f"{positional['kind']!r}: Hugging Face {view.name}'s shared "
                                 "attention has RoPE (use_mem_rope) or no positions")
        config["use_mem_rope"] = positional["kind"] == "rope"
        if config["use_mem_rope"]:
            config["rope_parameters"] = {"rope_type": "default", "rope_theta": positional["theta"]}
        view.block_kind("layout", ("prenorm",))
        view.block_kind("norm", ("rmsnorm",))
        view.block_kind("mixer", ("mamba2",))
        view.block_kind("ffn", ("none",))
        mixer = view.uniform("mixer")
        if mixer["norm_eps"] != MAMBA_NORM_EPS:
            raise NotExpressible("model.block.mixer.norm_eps", f"Hugging Face {view.name}'s Mamba-2 norm has eps "
                                 f"{MAMBA_NORM_EPS}")
        width = mixer["n_heads"] * mixer["head_dim"]
        if width % m.d_model:
            raise NotExpressible("model.block.mixer", f"Hugging Face {view.name}'s Mamba inner width is mamba_expand x "
                                 f"hidden_size; n_heads x head_dim ({width}) is not a multiple of d_model ({m.d_model})")
        config.update(vocab_size=m.vocab_size, hidden_size=m.d_model, num_hidden_layers=m.n_layers,
                      max_position_embeddings=m.context_length, tie_word_embeddings=m.tie_embeddings,
                      rms_norm_eps=view.uniform("norm", "eps"), mamba_expand=width // m.d_model,
                      **MIXER.config(mixer, d_model=m.d_model, family=view.name))
        uses = shared_uses_of(m)
        hybrid = [i for i, name in enumerate(uses) if name is not None]
        order = list(dict.fromkeys(name for name in uses if name is not None))
        if order and [uses[i] for i in hybrid] != [order[k % len(order)] for k in range(len(hybrid))]:
            raise NotExpressible("model.layers", f"Hugging Face {view.name} runs its shared blocks in turn (the k-th "
                                 f"hybrid layer runs block k mod num_mem_blocks); this spec runs {uses}")
        if order != [block_name(b) for b in range(len(order))]:
            raise NotExpressible("model.shared_blocks", f"Hugging Face {view.name}'s shared blocks are named "
                                 f"{[block_name(b) for b in range(len(order))]} in the order they first run, got {order}")
        config["layers_block_type"] = ["hybrid" if name is not None else "mamba" for name in uses]
        config["num_mem_blocks"] = max(len(order), 1)
        if not order:
            return  # no shared block: the attention and MLP settings are inert
        block = m.shared_blocks[order[0]]
        attention, ffn = block.mixer.as_dict(), block.ffn.as_dict()
        if ffn.get("kind") not in GATED_FFNS:
            raise NotExpressible(f"model.shared_blocks.{order[0]}.ffn.kind", f"Hugging Face {view.name}'s shared MLP "
                                 f"is gated ({', '.join(GATED_FFNS)})")
        adapters = block.adapters
        config.update(num_attention_heads=attention.get("n_heads"),
                      num_key_value_heads=attention.get("n_kv_heads") or attention.get("n_heads"),
                      intermediate_size=ffn.get("hidden"),
                      hidden_act=ACTIVATIONS_TO_HF.get(ffn.get("activation", "silu"), "silu"),
                      add_bias_linear=bool(ffn.get("bias")) or bool(mixer["bias"]),
                      adapter_rank=adapters.rank if adapters is not None else 1,
                      use_shared_attention_adapter=adapters is not None and "mixer.qkv" in adapters.targets)
        # The read-back comparison checks the rest (every block written alike, the adapters' widths, the scale).

    def rules(self) -> list[Rule]:
        def mamba_at(hybrid: bool) -> Any:
            return lambda site: (site.model.shared_uses[site.layer] is not None) == hybrid

        rules: list[Rule] = [
            Copy("model.embed_tokens.weight", "embedding.weight"),
            Copy("model.final_layernorm.weight", "final_norm.weight"),
            Copy("lm_head.weight", "lm_head.weight"),
        ]
        backbone = [Copy(f"{LAYER}.input_layernorm.weight", "blocks.{i}.attention_norm.weight"),
                    *mamba2_rules(f"{LAYER}.mamba", BLOCK_MIXER)]
        rules += [AtLayers(rule, where=mamba_at(False), layers="Mamba") for rule in backbone]
        rules += [AtLayers(renamed(rule, lambda n: n.replace(".layers.{i}.", ".layers.{i}.mamba_decoder.")),
                           where=mamba_at(True), layers="hybrid") for rule in backbone]
        attn, mlp = f"{HOME}.self_attn", f"{HOME}.feed_forward"
        block = [
            Copy(f"{HOME}.input_layernorm.weight", f"{BLOCK}.input_norm.weight"),
            Copy(f"{HOME}.pre_ff_layernorm.weight", f"{BLOCK}.ffn_norm.weight"),
            Fused([f"{attn}.{x}_proj.weight" for x in "qkv"], f"{BLOCK}.mixer.qkv.weight", sizes=shared_qkv_sizes),
            Copy(f"{attn}.o_proj.weight", f"{BLOCK}.mixer.out.weight"),
            Copy(f"{mlp}.gate_up_proj.weight", f"{BLOCK}.ffn.gate_up.weight"),
            Copy(f"{mlp}.gate_up_proj.bias", f"{BLOCK}.ffn.gate_up.bias"),
            Copy(f"{mlp}.down_proj.weight", f"{BLOCK}.ffn.down.weight"),
            Copy(f"{mlp}.down_proj.bias", f"{BLOCK}.ffn.down.bias"),
        ]
        rules += [AtUse(rule, first_only=True) for rule in block]
        per_use = [Copy(f"{LAYER}.linear.weight", f"{USE}.projection.weight")]
        for p, x in enumerate("qkv"):
            for j, half in enumerate(("down", "up")):
                per_use.append(Copy(f"{attn}.linear_{x}_adapter_list.{{k}}.{j}.weight",
                                    f"{USE}.adapters.mixer.qkv.{p}.{half}.weight"))
        for j, half in enumerate(("down", "up")):
            per_use.append(Copy(f"{mlp}.gate_up_proj_adapter_list.{{k}}.{j}.weight",
                                f"{USE}.adapters.ffn.gate_up.0.{half}.weight"))
        rules += [AtUse(rule) for rule in per_use]
        return rules


def shared_qkv_sizes(site: Site) -> tuple[int, int, int]:
    """Rows of q, k and v in the fused qkv of the shared block layer ``site`` runs."""
    a = site.model.shared_blocks[site.model.shared_uses[site.layer]].mixer
    return a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim, a.n_kv_heads * a.head_dim


class AtUse(Rule):
    """``rule`` at each layer that runs a shared block (``first_only``: at the first layer that runs it, where the
    block's own tensors are saved). Its names may hold ``{i}`` (the layer), ``{home}`` (the first layer running the
    same block), ``{k}`` (the use's adapter slot: how many hybrid layers come before) and ``{b}`` (the block's name)."""

    def __init__(self, rule: Rule, *, first_only: bool = False) -> None:
        self.rule, self.first_only = rule, first_only
        self.hf, self.ours = rule.hf, rule.ours

    @property
    def per_layer(self) -> bool:
        return True

    @property
    def per_depth(self) -> bool:
        return False

    def _fill(self, site: Site) -> dict[str, Any] | None:
        uses = site.model.shared_uses
        name = uses[site.layer]
        if name is None or (self.first_only and uses.index(name) != site.layer):
            return None
        slot = sum(1 for use in uses[:site.layer] if use is not None)
        return {"i": site.layer, "home": uses.index(name), "k": slot, "b": name}

    def expand_at(self, site: Site) -> tuple[tuple[str, ...], tuple[str, ...]]:
        keys = self._fill(site)
        if keys is None:
            return (), ()
        return tuple(n.format(**keys) for n in self.rule.hf), tuple(n.format(**keys) for n in self.rule.ours)

    def for_import(self, site: Site, present: Any) -> tuple[Rule, tuple[str, ...], tuple[str, ...]]:
        return (self, *self.expand_at(site))

    def to_ours(self, tensors: list[Any], site: Site) -> list[Any]:
        return self.rule.to_ours(tensors, site) if tensors else []

    def to_hf(self, tensors: list[Any], site: Site) -> list[Any]:
        return self.rule.to_hf(tensors, site) if tensors else []

    def describe(self) -> str:
        return f"{self.rule.describe()} ({'first use of each shared block' if self.first_only else 'each hybrid layer'})"


FAMILY = decoder_family(
    name="Zamba2",
    model_type="zamba2",
    architecture="Zamba2ForCausalLM",
    defaults=DEFAULTS,
    parts=[Zamba2Model()],
    # Initialisation only (time_step_max/floor), kernels, how many logits generation computes, and the fields
    # Zamba2Config derives from the others on load (saved with them, recomputed whatever they say).
    non_math_fields=("time_step_max", "time_step_floor", "use_mamba_kernels", "use_mem_eff_path", "num_logits_to_keep",
                     "attention_hidden_size", "attention_head_dim", "kv_channels", "num_query_groups",
                     "hybrid_layer_ids"),
    maps="prenorm RMSNorm blocks of mamba2 (n_mamba_heads, mamba_d_state, mamba_ngroups, mamba_d_conv, mamba_expand, "
         "use_conv_bias, add_bias_linear, chunk_size, time_step_min -> dt_min; its gated norm at eps 1e-5) with ffn "
         "none; layers_block_type 'hybrid' -> layers[].shared naming num_mem_blocks shared blocks in turn "
         "(input concat_embeddings, output mixer_input, projection: the per-layer linear; attention of "
         "2 x hidden_size / num_attention_heads heads, scale (head_dim/2)^-0.5, gated MLP of intermediate_size and "
         "hidden_act; adapters of adapter_rank on gate_up, and on q/k/v with use_shared_attention_adapter); "
         "use_mem_rope -> rope, else positional none; use_long_context -> context 16384",
    caveats="layer 0 must be a Mamba layer; the q/k/v adapters need num_key_value_heads == num_attention_heads "
            "(as transformers' own Zamba2 does); default rope only",
)
