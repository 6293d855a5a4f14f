"""The forward every recurrent mixer shares (RecurrentMixer): documents apart, padding out, the cache read then written."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from specformer.model.context import ForwardContext
from specformer.model.attention import cache_slots_of, reach_of
from specformer.model.state import state_slots_of, uses_positions
from specformer.registry.discovery import get_registry
from specformer_layers.mixers import MixerRun, RecurrentMixer

#: Layers that keep a state but are no recurrent mixer themselves: the parallel mixer runs sub-mixers,
#: compressed attention attends over a window beside its pooled state (it shares with_state only).
NOT_RECURRENT = {"parallel", "compressed"}
SIZES = {"gated_deltanet": {"n_heads": 4}, "kda": {"n_heads": 4}, "mamba2": {"n_heads": 4, "head_dim": 8},
         "mamba": {"d_inner": 32}, "short_conv": {}, "rglru": {"width": 32}, "rwkv4": {},
         "lightning": {"n_heads": 4}, "mlstm": {"n_heads": 4}}


class Recorder(RecurrentMixer):
    """Returns its input plus one and the number of tokens as its state; records what each run was given."""

    def __init__(self) -> None:
        super().__init__()
        self.layer_index = 3
        self.calls: list[dict[str, Any]] = []

    def run(self, x: Tensor, *, state: dict[str, Tensor] | None = None, padding: Tensor | None = None,
            steps: bool = False) -> MixerRun:
        self.calls.append({"shape": tuple(x.shape), "state": state, "padding": padding, "steps": steps})
        count = torch.full((x.shape[0], 1), float(x.shape[1]))
        return MixerRun(out=x + 1, state={"s": count}, steps={"s": count[:, None].expand(-1, x.shape[1], 1)})


class Cache:
    def __init__(self, keep_steps: bool) -> None:
        self.keep_steps = keep_steps
        self.read: list[tuple[int, Tensor]] = []
        self.written: list[tuple[int, dict[str, Tensor], Any]] = []

    def read_state(self, layer_index: int, positions: Tensor) -> dict[str, Tensor]:
        self.read.append((layer_index, positions))
        return {"s": torch.zeros(positions.shape[0], 1)}

    def write_state(self, layer_index: int, states: dict[str, Tensor], *, steps: Any = None) -> None:
        self.written.append((layer_index, states, steps))


def _ctx(positions: Tensor, **more: Any) -> ForwardContext:
    return ForwardContext(positions=positions, positional=None, **more)  # type: ignore[arg-type]


def test_every_built_in_recurrent_mixer_runs_the_shared_forward() -> None:
    registry = get_registry()
    found = set()
    for name in registry.names("mixer"):
        component = registry.get("mixer", name)
        if name in NOT_RECURRENT or not component.factory_path.startswith("specformer_layers.mixers."):
            continue
        with torch.device("meta"):
            layer = registry.resolve("mixer", {"kind": name, **SIZES[name]}).make(d_model=32, layer_index=0)
        found.add(name)
        assert state_slots_of(layer) is not None, name
        assert isinstance(layer, RecurrentMixer) and type(layer).forward is RecurrentMixer.forward, name
        # It declares only what it has: the readers answer "none" for a window, cache slots and positions.
        assert not any(hasattr(layer, fact) for fact in ("window", "cache_slots", "uses_positions")), name
        assert (reach_of(layer), cache_slots_of(layer), uses_positions(layer)) == (None, None, False), name
    assert {"gated_deltanet", "kda", "mamba2", "short_conv"} <= found, found


def test_without_a_cache_plain_rows_run_without_padding_and_ragged_ones_count_it() -> None:
    mixer, x = Recorder(), torch.zeros(2, 4, 5)
    out = mixer(x, _ctx(torch.arange(4).expand(2, 4), plain_causal=True))
    torch.testing.assert_close(out, x + 1)
    positions = torch.tensor([[-2, -1, 0, 1], [0, 1, 2, 3]])
    mixer(x, _ctx(positions))
    assert mixer.calls[0]["padding"] is None and mixer.calls[0]["state"] is None
    assert mixer.calls[1]["padding"].tolist() == [2, 0] and mixer.calls[1]["state"] is None
    assert not any(call["steps"] for call in mixer.calls)


def test_packed_documents_run_as_fresh_rows() -> None:
    mixer, x = Recorder(), torch.zeros(1, 5, 3)
    out = mixer(x, _ctx(torch.arange(5)[None], document_ids=torch.tensor([[0, 0, 0, 1, 1]])))
    assert mixer.calls == [{"shape": (2, 3, 3), "state": None, "padding": None, "steps": False}]
    torch.testing.assert_close(out, x + 1)


@pytest.mark.parametrize("keep_steps", [False, True])
def test_a_cached_forward_reads_the_state_runs_from_it_and_writes_it_back(keep_steps: bool) -> None:
    mixer, cache, x = Recorder(), Cache(keep_steps), torch.zeros(2, 3, 4)
    positions = torch.tensor([[-1, 0, 1], [5, 6, 7]])
    out = mixer(x, _ctx(positions, cache=cache))
    torch.testing.assert_close(out, x + 1)
    assert [(i, p.tolist()) for i, p in cache.read] == [(3, positions.tolist())]
    (call,) = mixer.calls
    assert call["state"]["s"].shape == (2, 1) and call["padding"].tolist() == [1, 0] and call["steps"] is keep_steps
    (index, states, steps), = cache.written
    assert index == 3 and states["s"].tolist() == [[3.0], [3.0]]
    assert (steps is not None) is keep_steps  # steps reach the cache only while it keeps them


def test_a_cache_without_states_is_named() -> None:
    with pytest.raises(TypeError, match=r"layer 3 \(Recorder\) keeps a recurrent state"):
        Recorder()(torch.zeros(1, 2, 3), _ctx(torch.arange(2)[None], cache=object()))
