"""Run by torchrun (tests/plugins/train/parallel/test_tensor.py): what the vocabulary-parallel head hands out.

Outside the loss the logits are whole on every process (sampling reads them so); inside
``vocabulary_parallel_loss`` each process holds only its rows of the vocabulary, and the
cross-entropy over them equals the one over the whole logits.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

import specformer
from specformer_train.parallel.tensor import apply_tensor_parallel, vocabulary_parallel_loss
from specformer_train.trainer import lm_loss

sys.path.insert(0, sys.argv[1])  # the tests folder, for the tiny spec
from fixtures.tiny import tiny_spec  # noqa: E402

dist.init_process_group("gloo")
torch.manual_seed(0)
model = specformer.build(tiny_spec(vocab_size=259, tie_embeddings=False))
ids = torch.randint(0, 259, (2, 9))
expected = lm_loss(model(ids[:, :-1]), ids[:, 1:], masked=False)
layout, _ = apply_tensor_parallel(model, mesh=init_device_mesh("cpu", (2,)))
assert "embedding and head by vocabulary" in layout, layout

whole = model(ids[:, :-1])
assert not isinstance(whole, DTensor) and whole.shape == (2, 8, 259), (type(whole), whole.shape)
with vocabulary_parallel_loss(model):
    split = model(ids[:, :-1])
    assert isinstance(split, DTensor), type(split)
    assert split.to_local().shape == (2, 8, 130 if dist.get_rank() == 0 else 129), split.to_local().shape
    loss = lm_loss(split, ids[:, 1:], masked=False)
    loss.backward()
assert not isinstance(loss, DTensor)
torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)
torch.testing.assert_close(lm_loss(whole, ids[:, 1:], masked=False), expected, atol=1e-5, rtol=1e-5)
assert model.lm_head.weight.grad is not None and model.embedding.weight.grad is not None
print(f"rank {dist.get_rank()}: ok")
dist.destroy_process_group()
