"""Training across devices: how the processes of a run are laid out and how the model is split over them.

One module per concept:

- :mod:`~specformer_train.parallel.layout`: ``ParallelLayout``, who this process is and how the
  run's processes are laid out (``[dp][cp][tp]``), its degrees checked once, its world mesh and
  sub-meshes built once; immutable.
- :mod:`~specformer_train.parallel.parallelize`: ``parallelize``, the one function that splits,
  recomputes, compiles and wraps (FSDP2 or DDP) a model for its layout, in a fixed order.
- :mod:`~specformer_train.parallel.distributed`: joining torchrun's process group, this process'
  device, and the collectives the trainer needs (gradient sync, means, stop flags, barriers).
- :mod:`~specformer_train.parallel.tensor`: tensor parallelism (``train.parallel.tp``), each block
  component split as its ``parallel_plan`` declares; the embedding and head by vocabulary.
- :mod:`~specformer_train.parallel.sequence`: sequence parallelism beside it, the stream cut by
  sequence between the split sublayers.
- :mod:`~specformer_train.parallel.context`: context parallelism (``train.parallel.cp``), each row's
  tokens split and every layer's keys and values gathered.
- :mod:`~specformer_train.parallel.expert`: expert parallelism (``train.parallel.ep``), each mixture's
  experts split across processes that read different rows.
- :mod:`~specformer_train.parallel.placement`: where a process' share of a split tensor lies in the
  whole (read by tensor parallelism and the sharded checkpoint).

The torch-free plan on paper (what ``specformer summary --parallel`` prints) is the core's:
:mod:`specformer.model.parallel_plan` (what each component declares) and
:mod:`specformer.model.device_plan` (memory and communication per device).
"""
