"""Compressed attention (``compressed``, DeepSeek-V4): the formula written out here, transformers' module, the cache.

The formula, for query t (positions from 0), one shared key/value head, rotary channels last:

    kv_s  = RoPE_s(norm(W_kv x_s))                         a token's key, which is also its value
    q_t,h = RoPE_t(rms(W_qb,h norm(W_qa x_t)))             rms: no weight, per head
    block b holds tokens b*m .. b*m + m - 1 (m = compress_rate); slot j of it:
    e_b   = RoPE_{b*m}(norm(sum_j softmax_j(Z_j + B_j) * C_j))     C = W_c x, Z = W_z x, per channel
            (overlap: the slots are block b-1's first half of [C | Z] and block b's second)
    keys  = {kv_s : t - W < s <= t}  +  {e_b : (b + 1) * m <= t + 1}
    o_t,h = RoPE_{-t}(sum_k softmax_k(q_t,h . k / sqrt(d), sink_h) k)
    out   = W_o o_t            (grouped: W_mix [W_down,g o_t,g for each group g])
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import specformer
from specformer.errors import SpecError
from specformer.model.context import ForwardContext
from specformer_layers.attention.compressed import CompressedAttention
from specformer_layers.attention.params import CompressedAttentionParams
from specformer_layers.positional.params import RotaryPositionsParams
from specformer_layers.positional.rope import RotaryPositions

D, H, HD, ROPE, QR = 32, 4, 16, 8, 8


def layer(**changes: Any) -> CompressedAttention:
    params = {"n_heads": H, "head_dim": HD, "q_lora_rank": QR, "rope_dim": ROPE, "window": 4, **changes}
    torch.manual_seed(0)
    attn = CompressedAttention(CompressedAttentionParams(**params), d_model=D, context_length=64).double()
    with torch.no_grad():
        for p in attn.parameters():  # every tensor random: a zero bias or sink would hide its handling
            p.normal_(0, 0.3)
    return attn


def context(T: int, theta: float = 10000.0, B: int = 2) -> ForwardContext:
    scheme = RotaryPositions(RotaryPositionsParams(theta=theta, interleaved=True), head_dim=ROPE, context_length=64).double()
    positions = torch.arange(T).expand(B, T)
    return ForwardContext(positions=positions, positional=scheme, positional_state=scheme.prepare(positions))


# -- the formula, token by token ---------------------------------------------------------------

def rope(v: torch.Tensor, position: float, theta: float = 10000.0) -> torch.Tensor:
    """Turn the last ROPE channels of ``v`` (..., HD) by ``position``, pairs (0,1), (2,3), ... as complex numbers."""
    freqs = theta ** (-torch.arange(0, ROPE, 2, dtype=torch.float64) / ROPE)
    pairs = torch.view_as_complex(v[..., -ROPE:].reshape(*v.shape[:-1], ROPE // 2, 2).contiguous())
    turned = torch.view_as_real(pairs * torch.polar(torch.ones_like(freqs), position * freqs)).flatten(-2)
    return torch.cat((v[..., :-ROPE], turned), dim=-1)


def rms(v: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
    out = v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6)
    return out if w is None else out * w


def reference(attn: CompressedAttention, x: torch.Tensor) -> torch.Tensor:
    """The formula above for one row ``x`` (T, D), no indexer."""
    T, m, W = x.shape[0], attn.compress_rate, attn.local_window
    kv = torch.stack([rope(rms(attn.kv.weight @ x[s], attn.kv_norm.weight), s) for s in range(T)])  # (T, HD)
    entries = []
    if m is not None:
        p = attn.pooler
        C, Z = x @ p.kv.weight.T, x @ p.gate.weight.T  # (T, series*HD)
        for b in range(T // m):
            if p.overlap:  # previous block's first half, then this block's second half
                slots = [(s, s - (b - 1) * m, slice(0, HD)) for s in range((b - 1) * m, b * m) if s >= 0]
                slots += [(s, s - b * m, slice(HD, 2 * HD)) for s in range(b * m, (b + 1) * m)]
            else:
                slots = [(s, s - b * m, slice(0, HD)) for s in range(b * m, (b + 1) * m)]
            c = torch.stack([C[s, part] for s, _, part in slots])  # (n, HD)
            z = torch.stack([Z[s, part] + p.slot_bias[j, part] for s, j, part in slots])
            entries.append(rope(rms((z.softmax(0) * c).sum(0), p.norm.weight), b * m))
    out = []
    for t in range(T):
        keys = [kv[s] for s in range(max(0, t - W + 1), t + 1)] + [entries[b] for b in range(len(entries)) if (b + 1) * m <= t + 1]
        keys = torch.stack(keys)  # (S, HD)
        q = (attn.q_b.weight @ rms(attn.q_a.weight @ x[t], attn.q_norm.weight)).view(H, HD)
        q = rope(rms(q), t)
        logits = q @ keys.T / HD ** 0.5  # (H, S)
        probs = torch.cat((logits, attn.sinks[:, None]), dim=1).softmax(-1)[:, :-1]
        o = rope(probs @ keys, -t).reshape(-1)  # (H*HD)
        if isinstance(attn.out, torch.nn.Linear):
            out.append(attn.out.weight @ o)
        else:  # each group of heads to its own rank channels, then the mix
            g, r = attn.out.groups, attn.out.rank
            narrowed = [attn.out.down[i * r:(i + 1) * r] @ part for i, part in enumerate(o.chunk(g))]
            out.append(attn.out.mix.weight @ torch.cat(narrowed))
    return torch.stack(out)


@pytest.mark.parametrize("changes", [
    {"compress_rate": 3},
    {"compress_rate": 2, "overlap": True},
    {"compress_rate": 2, "out_groups": 2, "out_rank": 4},
    {},
], ids=["pooled", "overlap", "grouped-output", "sliding-only"])
@torch.no_grad()
def test_matches_the_formula(changes: dict[str, Any]) -> None:
    attn, T = layer(**changes), 11
    x = torch.randn(2, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got = attn(x, context(T))
    for row in range(2):
        # The rope tables are float32 by design (angles of large positions), hence not 1e-12.
        torch.testing.assert_close(got[row], reference(attn, x[row]), rtol=1e-6, atol=1e-6)


# -- transformers' DeepSeek-V4 attention, the same weights --------------------------------------

def ties_at_the_top_k_boundary(attn: CompressedAttention, x: torch.Tensor, ctx: ForwardContext) -> bool:
    """Whether some query's k-th and (k+1)-th best index scores tie: there transformers' top-k picks either.

    Ours gives a tie to the earlier entry; ``torch.topk`` (transformers) picks as its kernel
    happens to, so a comparison is meaningful only where no tie straddles the cut.
    """
    seen: dict[str, torch.Tensor] = {}
    indexed = attn._indexed

    def spy(*args: Any) -> Any:
        chosen, total = indexed(*args)
        seen["total"] = total
        return chosen, total

    attn._indexed = spy  # type: ignore[method-assign]
    try:
        attn(x, ctx)
    finally:
        del attn._indexed
    total, k = seen["total"], attn.index_topk
    if total.shape[-1] <= k:
        return False
    best = total.sort(dim=-1, descending=True).values
    return bool(((torch.isfinite(total).sum(-1) > k) & (best[..., k - 1] == best[..., k])).any())


def hf_pair(layer_type: str, *, topk: int = 2) -> tuple[Any, CompressedAttention]:
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Attention

    config = DeepseekV4Config(
        hidden_size=D, num_attention_heads=H, head_dim=HD, q_lora_rank=QR, partial_rotary_factor=ROPE / HD,
        num_hidden_layers=1, layer_types=[layer_type], sliding_window=4, o_groups=2, o_lora_rank=4,
        compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 3},
        index_n_heads=4, index_head_dim=8, index_topk=topk, rope_theta=10000.0, compress_rope_theta=160000.0,
        vocab_size=16, n_routed_experts=2, num_experts_per_tok=1, moe_intermediate_size=8,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    theirs = DeepseekV4Attention(config, layer_idx=0).double().eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.3)
    rate = {"sliding_attention": None, "compressed_sparse_attention": 2, "heavily_compressed_attention": 3}[layer_type]
    csa = layer_type == "compressed_sparse_attention"
    ours = layer(compress_rate=rate, overlap=csa, out_groups=2, out_rank=4,
                 **({"index_heads": 4, "index_head_dim": 8, "index_topk": topk} if csa else {}))
    names = {"q_a": "q_a_proj", "q_norm": "q_a_norm", "q_b": "q_b_proj", "kv": "kv_proj", "kv_norm": "kv_norm",
             "out.down": "o_a_proj", "out.mix": "o_b_proj", "pooler.kv": "compressor.kv_proj",
             "pooler.gate": "compressor.gate_proj", "pooler.norm": "compressor.kv_norm",
             "index_pooler.kv": "compressor.indexer.kv_proj", "index_pooler.gate": "compressor.indexer.gate_proj",
             "index_pooler.norm": "compressor.indexer.kv_norm", "index_q": "compressor.indexer.q_b_proj",
             "index_weights": "compressor.indexer.scorer.weights_proj"}
    state = theirs.state_dict()
    mapped = {}
    for name in ours.state_dict():
        if name == "sinks":
            mapped[name] = state["sinks"]
        elif name.endswith("slot_bias"):
            mapped[name] = state[("compressor.indexer" if name.startswith("index") else "compressor") + ".position_bias"]
        else:
            prefix, leaf = name.rsplit(".", 1)
            mapped[name] = state[names[prefix] + "." + leaf] if prefix in names else state[names[name] + ".weight"]
    ours.load_state_dict(mapped)
    return theirs, ours


@pytest.mark.parametrize("layer_type,topk", [
    ("sliding_attention", 2), ("heavily_compressed_attention", 2),
    ("compressed_sparse_attention", 2), ("compressed_sparse_attention", 64),
], ids=["sliding", "hca", "csa-top2", "csa-all"])
@torch.no_grad()
def test_matches_transformers_deepseek_v4_attention(layer_type: str, topk: int) -> None:
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RotaryEmbedding

    theirs, ours = hf_pair(layer_type, topk=topk)
    B, T = 2, 13
    x = torch.randn(B, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    position_ids = torch.arange(T)[None].expand(B, T)
    rotary = DeepseekV4RotaryEmbedding(theirs.config)
    embeddings = {kind: rotary(x, position_ids, layer_type=kind) for kind in ("main", "compress")}
    i, j = torch.arange(T)[:, None], torch.arange(T)[None]
    mask = torch.zeros(T, T, dtype=torch.float64).masked_fill((j > i) | (i - j >= 4), float("-inf"))
    want, _ = theirs(x, position_embeddings=embeddings, position_ids=position_ids,
                     attention_mask=mask.expand(B, 1, T, T), cache=None)
    theta = 10000.0 if layer_type == "sliding_attention" else 160000.0
    if ours.index_heads is not None:
        assert not ties_at_the_top_k_boundary(ours, x, context(T, theta=theta))  # the case is chosen so
    torch.testing.assert_close(ours(x, context(T, theta=theta)), want, rtol=1e-5, atol=1e-6)


# -- through the caches ----------------------------------------------------------------------------

COMPRESSED = {"kind": "compressed", "n_heads": 4, "head_dim": 16, "q_lora_rank": 8, "rope_dim": 8, "window": 3,
              "compress_rate": 3, "overlap": True, "index_heads": 2, "index_head_dim": 8, "index_topk": 2,
              "out_groups": 2, "out_rank": 4}


def compressed_model(seed: int = 0, **changes: Any) -> Any:
    from fixtures.tiny import tiny_spec

    spec = tiny_spec(vocab_size=61, block={"mixer": {**COMPRESSED, **changes}},
                     positional={"kind": "rope", "interleaved": True, "theta": 160000.0})
    return specformer.build(spec, seed=seed).double().eval()


@torch.no_grad()
def test_left_padded_rows_in_uneven_chunks_through_the_cache_give_what_recompute_gives() -> None:
    """Chunks that start and end inside blocks, rows whose blocks start at different columns (left padding)."""
    from specformer_generate import StaticKVCache

    model = compressed_model()
    lengths, pad = [14, 9], [0, 5]
    ids = torch.randint(0, 61, (2, 14), generator=torch.Generator().manual_seed(0))
    positions = torch.stack([torch.arange(14) - p for p in pad]).clamp(min=-1)  # -1: padding
    cache = StaticKVCache.for_model(model, batch_size=2, capacity=14)
    chunks = [(0, 7), (7, 8), (8, 12), (12, 13), (13, 14)]
    got = torch.cat([model(ids[:, a:b], positions=positions[:, a:b], cache=cache) for a, b in chunks], dim=1)
    for row, (n, p) in enumerate(zip(lengths, pad)):
        alone = model(ids[row:row + 1, p:])  # the row by itself, no padding, no cache
        torch.testing.assert_close(got[row, p:], alone[0], rtol=1e-9, atol=1e-9)


@pytest.mark.slow  # an engine thread and five generations: about ten seconds on two loaded cores
@torch.no_grad()
def test_the_serve_engine_batches_compressed_attention_as_it_runs_each_request_alone() -> None:
    import random

    from specformer_generate import generate
    from specformer_generate.samplers.pipeline import build_sampler
    from specformer_serve.engine import Engine, SequenceRequest
    from tests.plugins.serve.test_engine import Collector

    model = compressed_model(seed=5).float()
    rng = random.Random(1)
    prompts = [[rng.randrange(61) for _ in range(rng.randrange(1, 9))] for _ in range(4)]
    engine = Engine(model, max_batch=3, num_blocks=64, block_size=4).start()
    collector = Collector()
    try:
        for i, prompt in enumerate(prompts):
            engine.submit(SequenceRequest(prompt=prompt, max_new_tokens=5, sampler=build_sampler(None), seed=None,
                                          eos=frozenset(), emit=collector.emit_for(i)))
        collector.wait(len(prompts))
    finally:
        engine.stop()
    for i, prompt in enumerate(prompts):
        assert collector.tokens[i] == generate(model, [prompt], max_new_tokens=5)[0][len(prompt):], f"request {i}"


def test_summary_counts_the_window_per_token_and_the_entries_per_sequence() -> None:
    """Per token: the window's keys; per sequence: one entry per block of the context (and the indexer's), the tails."""
    from specformer.model.summary import summarize
    from fixtures.tiny import tiny_spec

    spec = tiny_spec(block={"mixer": COMPRESSED}, positional={"kind": "rope", "interleaved": True})
    s = summarize(spec)  # two layers, context 32, window 3, compress_rate 3
    assert s.kv_elements_per_token == 2 * 16
    assert s.kv_elements_at_context == 2 * 16 * 3  # the window's ring
    entries = (32 // 3) * (16 + 8)  # one pooled key per block, and the indexer's
    tails = 2 * 3 * 2 * (2 * 16) + 2 * 3 * 2 * (2 * 8)  # two blocks of [C | Z], two series, pooler and indexer
    assert s.state_elements_per_sequence == 2 * (entries + tails)


@pytest.mark.parametrize("changes,message", [
    ({"overlap": True}, "need compress_rate"),
    ({"compress_rate": 4, "index_heads": 2, "index_head_dim": 4}, "at most index_head_dim"),
    ({"out_groups": 2}, "go together"),
    ({"out_groups": 3, "out_rank": 4}, "must divide n_heads"),
    ({"rope_dim": 7}, "must be even"),
])
def test_a_wrong_spec_is_refused_at_its_path(changes: dict[str, Any], message: str) -> None:
    from fixtures.tiny import tiny_spec

    base = {k: v for k, v in COMPRESSED.items() if k not in ("compress_rate", "overlap", "index_heads", "index_head_dim",
                                                           "index_topk", "out_groups", "out_rank")}
    with pytest.raises(SpecError) as info:
        specformer.build(tiny_spec(block={"mixer": {**base, **changes}}))
    assert "model.block.mixer" in str(info.value) and message in str(info.value)


@pytest.mark.parametrize("positional,message", [
    ({"kind": "alibi"}, "biases scores instead"),
    ({"kind": "rope", "interleaved": True, "scaling": {"kind": "dynamic", "factor": 2.0}}, "depend on the length"),
])
def test_a_positional_scheme_it_cannot_turn_with_is_refused(positional: dict[str, Any], message: str) -> None:
    from fixtures.tiny import tiny_spec

    model = specformer.build(tiny_spec(block={"mixer": {**COMPRESSED, "n_heads": 4}}, positional=positional))
    with pytest.raises(ValueError, match=message):
        model(torch.zeros((1, 4), dtype=torch.long))


@pytest.mark.parametrize("layer_type", ["heavily_compressed_attention", "compressed_sparse_attention"],
                         ids=["hca", "csa"])
@torch.no_grad()
def test_decoding_through_the_cache_matches_transformers_cached_decoding(layer_type: str) -> None:
    """A prefill inside a block, then one token at a time: ours through StaticKVCache, theirs through DynamicCache."""
    from transformers.cache_utils import DynamicCache
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RotaryEmbedding

    from specformer_generate.cache import LayerShape, StateShape, StaticKVCache

    theirs, ours = hf_pair(layer_type)
    T, prefill = 13, 5
    x = torch.randn(1, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    rotary = DeepseekV4RotaryEmbedding(theirs.config)
    their_cache = DynamicCache(config=theirs.config)
    cache = StaticKVCache(layers=[LayerShape.of(ours)], states=[StateShape.of(ours)], batch_size=1, capacity=T,
                          dtype=torch.float64)
    scheme = context(T, theta=160000.0).positional
    if ours.index_heads is not None:  # the case is chosen so (decoding scores each query as the full forward does)
        assert not ties_at_the_top_k_boundary(ours, x, context(T, theta=160000.0, B=1))
    steps = [(0, prefill)] + [(t, t + 1) for t in range(prefill, T)]
    for a, b in steps:
        positions = torch.arange(a, b)[None]
        embeddings = {kind: rotary(x, positions, layer_type=kind) for kind in ("main", "compress")}
        # Theirs: the window's cached keys and the new ones, causal among the new (4 = the window).
        held = their_cache.layers[0].keys.shape[-2] if their_cache.layers[0].is_initialized else 0
        i, j = torch.arange(b - a)[:, None] + held, torch.arange(held + b - a)[None]
        mask = torch.zeros(b - a, held + b - a, dtype=torch.float64).masked_fill((j > i) | (i - j >= 4), float("-inf"))
        want, _ = theirs(x[:, a:b], position_embeddings=embeddings, position_ids=positions, attention_mask=mask[None, None],
                         cache=their_cache)
        ctx = ForwardContext(positions=positions, positional=scheme, positional_state=scheme.prepare(positions), cache=cache)
        torch.testing.assert_close(ours(x[:, a:b], ctx), want, rtol=1e-5, atol=1e-6)


@torch.no_grad()
def test_a_cache_keeps_the_entries_its_length_needs_and_says_when_they_run_out() -> None:
    from specformer_generate import StaticKVCache

    model = compressed_model()  # context 32, compress_rate 3: 10 entries at most
    slots = model.blocks[0].mixer.state_slots
    assert slots.shapes_for(None)["entries"] == (10, 16) and slots.shapes_for(14)["entries"] == (5, 16)
    assert slots.shapes_for(14)["index_entries"] == (5, 8) and slots.shapes_for(14)["tail"] == slots.shapes["tail"]
    cache = StaticKVCache.for_model(model, batch_size=1, capacity=5)  # two entries; the window is a ring
    ids = torch.randint(0, 61, (1, 9), generator=torch.Generator().manual_seed(0))
    model(ids[:, :6], positions=torch.arange(6)[None], cache=cache)  # completes entries 0 and 1
    with pytest.raises(ValueError, match="keeps 2 compressed entries per sequence"):
        for t in range(6, 9):  # position 8 completes entry 2
            model(ids[:, t:t + 1], positions=torch.tensor([[t]]), cache=cache)


@torch.no_grad()
def test_a_sliding_only_layer_reports_its_probabilities_and_a_compressed_one_none() -> None:
    from specformer_eval import capture

    model = compressed_model()
    model_sliding = compressed_model(compress_rate=None, overlap=False, index_heads=None)
    ids = torch.randint(0, 61, (1, 7), generator=torch.Generator().manual_seed(0))
    with capture(model_sliding, attention=True) as cap:
        model_sliding(ids)
    probs = cap.attention[0]  # (B, H, T, T): each row sums to 1 less what the sink took
    assert probs.shape == (1, 4, 7, 7) and bool((probs.sum(-1) <= 1 + 1e-6).all())
    assert bool((probs[..., 3:, :1] == 0).all())  # the window of 3 has left token 0 behind
    with capture(model, attention=True) as cap:
        model(ids)
    assert cap.attention[0] is None


# -- the indexer: ties, and the loss it learns from -------------------------------------------------

def test_tied_index_scores_go_to_the_earlier_entries() -> None:
    attn = layer(compress_rate=2, overlap=True, index_heads=2, index_head_dim=8, index_topk=2)
    B, T, N = 1, 3, 5
    readable = torch.tensor([[True, True, True, True, False]]).expand(B, T, N)
    index_q = torch.zeros(B, 2, T, 8, dtype=torch.float64)  # every score 0: all tie
    chosen, total = attn._indexed(torch.zeros(B, T, D, dtype=torch.float64), index_q,
                                  torch.randn(B, N, 8, dtype=torch.float64), readable)
    assert chosen[0, 0].tolist() == [True, True, False, False, False]
    assert total[0, 0, 4] == float("-inf")


def test_the_indexer_learns_from_its_own_loss_only() -> None:
    """The LM loss reaches no indexer weight; the auxiliary loss is the KL written out, and reaches only them."""
    attn = layer(compress_rate=2, overlap=True, index_heads=2, index_head_dim=8, index_topk=2).train()
    T = 11
    x = torch.randn(2, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(5), requires_grad=True)
    out = attn(x, context(T))
    index_params = {n for n, _ in attn.named_parameters() if n.startswith("index")}
    out.square().sum().backward(retain_graph=True)
    assert all(p.grad is None for n, p in attn.named_parameters() if n in index_params)
    attn.zero_grad()
    assert attn.aux_loss is not None and attn.aux_loss > 0
    attn.aux_loss.backward()
    reached = {n for n, p in attn.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert reached == index_params

    # The KL written out for one query that chose two entries: target from the attention's weights.
    seen: dict[str, Any] = {}
    indexed, loss = attn._indexed, attn._index_loss
    attn._indexed = lambda *a: seen.setdefault("indexed", indexed(*a))  # type: ignore[method-assign]
    attn._index_loss = lambda *a: seen.setdefault("args", a) and loss(*a)  # type: ignore[method-assign]
    attn(x, context(T))  # training, with autograd: the loss is computed
    del attn._indexed, attn._index_loss
    on_entries, scores, chosen = seen["args"]
    b, t = 1, T - 1
    picked = chosen[b, t].nonzero().flatten()
    assert len(picked) == 2
    p = on_entries[b, :, t, picked].sum(0)
    p = p / p.sum()
    q = scores[b, t, picked].softmax(-1)
    want = (p * (p / q).log()).sum()
    per_query = [loss(on_entries[i:i + 1, :, j:j + 1], scores[i:i + 1, j:j + 1], chosen[i:i + 1, j:j + 1])
                 for i in range(2) for j in range(T)]
    torch.testing.assert_close(per_query[b * T + t], want.float())
