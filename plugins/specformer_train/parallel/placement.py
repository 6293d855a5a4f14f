"""Where a process' share of a tensor lies in the whole tensor: the global index of each local position.

Read by the sharded checkpoint (which writes and reads each process' blocks in place) and by
tensor parallelism's copied key/value heads (whose gradients are summed by real row).
"""

from __future__ import annotations

import torch
from torch import Tensor

from specformer.errors import CheckpointError


def global_indices(tensor: Tensor, row_order: Tensor | None = None) -> tuple[list[Tensor], Tensor]:
    """Per dimension, the global index of each local position of ``tensor``, and its local data.

    A plain tensor is whole; a DTensor's ranges are split by its placements, in mesh order,
    as DTensor splits them. ``row_order`` (a fused projection's) maps rank-major rows to the module's.
    """
    # late: only distributed runs have DTensors; consolidation never asks
    from torch.distributed.tensor import DTensor

    indices = [torch.arange(n) for n in tensor.shape]
    if isinstance(tensor, DTensor):
        local = tensor.to_local()
        mesh, coordinate = tensor.device_mesh, tensor.device_mesh.get_coordinate()
        assert coordinate is not None, "this process is not in the tensor's mesh"
        for mesh_dim, placement in enumerate(tensor.placements):
            if placement.is_replicate() or placement.is_partial():
                continue
            dim = placement.dim
            # shaped (1, ..., 1, n) so that the placement splits its own dimension, with its own semantics
            shaped = indices[dim].view(*([1] * dim), -1)
            pieces, _ = placement._split_tensor(shaped, mesh.size(mesh_dim), with_padding=False, contiguous=False)
            indices[dim] = pieces[coordinate[mesh_dim]].reshape(-1)
        if [len(i) for i in indices] != list(local.shape):
            raise CheckpointError(f"cannot place a local shard {tuple(local.shape)} of a {tuple(tensor.shape)} tensor "
                                  f"with placements {tensor.placements}")
    else:
        local = tensor
    if row_order is not None:
        indices[0] = row_order[indices[0]]
    return indices, local
