"""The ``train:`` section of a spec: every setting of a training run, validated and described.

Registered as a spec section by the plugin, so ``specformer validate`` checks it and
``specformer schema`` documents it. Every field has a default: a spec without a
``train:`` section trains with these.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, StrictBool, field_validator, model_validator

from specformer.registry.params import SubComponent
from specformer.spec.strict import StrictNumbers

Schedule = Literal["warmup_cosine", "linear", "constant", "wsd"]
DecayShape = Literal["linear", "cosine", "1-sqrt"]
Precision = Literal["auto", "fp32", "bf16"]
Distributed = Literal["auto", "none", "ddp", "fsdp"]


class ParallelConfig(StrictNumbers):
    """How the model is split across the processes of a run (``train.parallel``)."""

    model_config = ConfigDict(extra="forbid")

    tp: int = Field(
        default=1, ge=1,
        description="Tensor-parallel degree: each block component that declares a plan (attention by heads, FFNs "
                    "by hidden channels) is split across groups of this many processes, which read the same rows; "
                    "launch exactly tp processes (train.distributed auto), or a multiple with train.distributed "
                    "fsdp (FSDP2 across the groups).",
    )
    sequence_parallel: StrictBool = Field(
        default=False,
        description="With tp: cut the residual stream by sequence between the split sublayers, so norms and whole "
                    "feed-forwards compute on 1/tp of the tokens (the split sublayers gather them on entry and "
                    "reduce-scatter their outputs).",
    )
    ep: int = Field(
        default=1, ge=1,
        description="Expert-parallel degree: each mixture of experts keeps n_experts / ep whole experts on each of "
                    "ep processes, which read different rows and send each token to the processes of its experts "
                    "(all-to-all); the router, attention and shared experts stay whole. Launch a multiple of ep "
                    "processes (train.distributed auto or ddp, or fsdp); n_experts must divide by ep.",
    )
    cp: int = Field(
        default=1, ge=1,
        description="Context-parallel degree: groups of this many processes read the same rows, each taking 1/cp of "
                    "every row's tokens (two chunks: an early and a late one) and gathering the keys and values of "
                    "the others in every attention layer; gradients are averaged as in data parallelism (ddp or "
                    "fsdp). Launch a multiple of cp processes.",
    )

    @model_validator(mode="after")
    def _sequence_parallel_needs_tp(self) -> "ParallelConfig":
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel cuts the stream between tensor-parallel sublayers: set tp above 1 too")
        return self


class TrainSpec(StrictNumbers):
    """How to train the model: optimisation, data, evaluation, checkpoints and logging (the spec's ``train:``).

    Named as the ``generate:`` section's model (``specformer_generate.GenerateSpec``) is;
    ``TrainConfig`` is the same class under its earlier name.
    """

    model_config = ConfigDict(extra="forbid")

    # -- length and batch ------------------------------------------------------------
    steps: int = Field(default=1000, gt=0, description="Optimizer steps to train for.")
    batch_size: int = Field(
        default=16, gt=0,
        description="Sequences per micro-batch on each process; the global batch is "
                    "batch_size * grad_accum * number of processes (those reading different rows: "
                    "tensor-parallel processes read the same).",
    )
    grad_accum: int = Field(default=1, gt=0, description="Micro-batches whose gradients are summed before each step.")
    seq_len: int | None = Field(
        default=None, gt=0, description="Tokens per training row; default the model's context_length."
    )

    # -- optimiser and schedule ------------------------------------------------------
    lr: float = Field(
        default=1e-3, gt=0, le=10,
        description="Peak learning rate; at most 10 (AdamW moves each weight by about lr per step).",
    )
    min_lr: float = Field(default=1e-4, ge=0, description="Learning rate at the end of the decay.")
    warmup_steps: int = Field(default=100, ge=0, description="Steps of linear warm-up from ~0 to lr.")
    schedule: Schedule = Field(
        default="warmup_cosine",
        description="warmup_cosine: cosine decay to min_lr; linear: linear decay to min_lr; constant: lr after "
                    "warm-up; wsd: warm-up, stable at lr, linear decay to min_lr over the last decay_fraction.",
    )
    decay_fraction: float = Field(
        default=0.2, gt=0, le=1, description="wsd only: share of the steps spent in the final decay."
    )
    decay_shape: DecayShape = Field(
        default="linear",
        description="wsd only: how the final decay falls to min_lr: linear, cosine (half a cosine), or 1-sqrt "
                    "(1 - sqrt(progress), Hägele et al. 2024).",
    )
    optimizer: SubComponent("optimizer") = Field(  # type: ignore[valid-type]
        default="adamw", validate_default=True,
        description="The optimizer component ({kind: adamw|muon|lion|sgd|<a plugin's>, ...}) and its param-group "
                    "rules; lr, min_lr, betas, eps and weight_decay here are its defaults.",
    )
    betas: tuple[float, float] = Field(default=(0.9, 0.95), description="AdamW's (beta1, beta2) (Muon's AdamW part too).")
    eps: float = Field(default=1e-8, gt=0, description="AdamW's epsilon.")
    weight_decay: float = Field(
        default=0.1, ge=0, description="Decoupled weight decay, applied to matrices (>= 2-D parameters) only."
    )
    grad_clip: float | None = Field(
        default=1.0, ge=0, description="Clip the global gradient norm to this; null or 0 disables clipping."
    )
    aux_loss_weight: float = Field(
        default=1.0, ge=0, description="Multiplies the model's auxiliary loss (MoE load balancing) when it has one."
    )

    # -- data ------------------------------------------------------------------------
    data: str | None = Field(
        default=None,
        description="Corpus: a file, directory or glob of .txt/.md/.py/.jsonl, Hugging Face datasets files "
                    "(.parquet, .arrow, .json) or a save_to_disk directory, or a tokenized .bin/.npy; default the "
                    "Python standard library's own source. --data overrides it.",
    )
    text_field: str = Field(
        default="text", min_length=1,
        description="The field holding each document's text in .jsonl/.json/.parquet/.arrow records and "
                    "datasets directories. --text-field overrides it.",
    )
    streaming: StrictBool = Field(
        default=False,
        description="Read and tokenize the corpus lazily while training (no pre-pass, no token cache): files in a "
                    "seeded order each epoch, rows in stream order; the position is saved in checkpoints.",
    )
    tokenize_workers: int | Literal["auto"] = Field(
        default="auto",
        description="Processes tokenizing the corpus before training: auto (one per CPU core, up to 8, for "
                    "corpora over 4 MB) or a count (1: in this process).",
    )
    document_mask: StrictBool | None = Field(
        default=None,
        description="Attention stops at end-of-text tokens, so packed documents never see each other; "
                    "null: true for a new run, what the checkpoint recorded for a resumed one.",
    )
    reset_positions: StrictBool | None = Field(
        default=None,
        description="Positions restart at 0 at each document of a packed row; null: true for a new run, what "
                    "the checkpoint recorded for a resumed one.",
    )
    tokenizer: str = Field(
        default="byte",
        description="byte (UTF-8 bytes + special tokens), bpe (trained on the corpus at the model's "
                    "vocab_size), or a path to a tokenizer.json.",
    )
    val_fraction: float = Field(
        default=0.1, ge=0, lt=1, description="Share of the corpus' tokens held out (its end) for validation."
    )
    cache_dir: str | None = Field(
        default=None,
        description="Where tokenized corpora and trained tokenizers are cached; default $SPECFORMER_CACHE "
                    "or ~/.cache/specformer.",
    )
    seed: int = Field(default=1337, description="Seeds initialisation, data order and dropout.")

    # -- fine-tuning (the adapter kind and chat data come from the finetune plugin) -------
    init: str | None = Field(
        default=None,
        description="Start from this checkpoint's weights and tokenizer (fine-tuning); the spec's model must be the "
                    "checkpoint's. --init overrides it.",
    )
    adapter: SubComponent("adapter") | None = Field(  # type: ignore[valid-type]
        default=None,
        description="Train only an adapter ({kind: lora, rank: 8, alpha: 16, targets: [blocks.*.mixer.qkv]}) on "
                    "the frozen train.init weights; checkpoints then hold the adapter and a reference to the base.",
    )
    chat_template: str | None = Field(
        default=None,
        description="Chat data (.jsonl with messages or prompt/completion): a Jinja template file or a built-in name "
                    "(chatml); default the train.init checkpoint's own chat_template.",
    )

    # -- evaluation and samples ------------------------------------------------------
    eval_every: int = Field(default=100, ge=0, description="Evaluate every this many steps (0: only at the end).")
    eval_steps: int | None = Field(
        default=20, gt=0, description="Validation batches per evaluation; null evaluates the whole split."
    )
    sample_tokens: int = Field(default=200, ge=0, description="Length of the sample printed at each evaluation; 0 disables samples.")
    sample_prompt: str = Field(default="", description="Text the samples continue (after an end-of-text token); "
                                                       "a chat run's samples answer it as a user message.")
    sample_temperature: float = Field(default=0.8, gt=0, description="Sampling temperature of the samples.")
    sample_top_k: int | None = Field(default=50, gt=0, description="Keep the k most likely tokens when sampling; null keeps all.")

    # -- checkpoints -----------------------------------------------------------------
    out_dir: str | None = Field(default=None, description="Run directory; default runs/<spec file name>. --out overrides it.")
    save_every: int = Field(default=500, ge=0, description="Save a checkpoint every this many steps (0: only at the end).")
    keep_last: int = Field(default=2, gt=0, description="Checkpoints kept; older ones are deleted.")
    checkpoint_format: Literal["full", "sharded", "auto"] = Field(
        default="full",
        description="full: the weights and optimizer state gathered to the first process, one file each; sharded: "
                    "every process writes its own share (no gathering; resumable on any number of processes, "
                    "`specformer checkpoint consolidate` makes the single file); auto: sharded under FSDP or "
                    "tensor parallelism, full otherwise.",
    )

    # -- hardware --------------------------------------------------------------------
    device: str = Field(default="auto", description="auto (CUDA when available), cpu, cuda, cuda:N or mps.")
    precision: Precision = Field(
        default="auto", description="auto: bf16 autocast on CUDA, fp32 elsewhere; fp32; bf16 (autocast)."
    )
    compile: StrictBool | Literal["auto"] = Field(
        default="auto", description="torch.compile the model; auto compiles on CUDA only."
    )
    threads: int | Literal["auto"] = Field(
        default="auto",
        description="CPU threads (1 to 1024) or auto: one per core the load average shows idle (OMP_NUM_THREADS when set); "
                    "a resumed run keeps the count it was saved with.",
    )
    activation_checkpointing: StrictBool = Field(
        default=False, description="Recompute each block's activations in the backward pass to save memory."
    )
    distributed: Distributed = Field(
        default="auto",
        description="Under torchrun: ddp (replicated) or fsdp (FSDP2 fully_shard); auto picks ddp when "
                    "several processes run, none otherwise.",
    )
    parallel: ParallelConfig = Field(
        default_factory=ParallelConfig,
        description="Model parallelism under torchrun: {tp: N} splits the declared components N ways; {ep: N} the "
                    "experts of each mixture.",
    )

    # -- logging ---------------------------------------------------------------------
    log_every: int = Field(default=1, gt=0, description="Read the loss back, log metrics and update the bar every this "
                                                         "many steps (and before each evaluation and checkpoint).")
    progress: StrictBool = Field(default=True, description="Show a progress bar.")
    plot: StrictBool = Field(default=True, description="Write a loss-curve PNG at the end (needs matplotlib).")
    loggers: list[SubComponent("logger")] = Field(  # type: ignore[valid-type]
        default=["jsonl", "tensorboard"], validate_default=True,
        description="Where metrics go: logger components (jsonl: metrics.jsonl and loss.png; tensorboard: event "
                    "files when its package is installed; or a plugin's), each a name or {kind: <name>, ...}.",
    )
    tensorboard: StrictBool = Field(
        default=True, description="false turns the tensorboard logger off even when train.loggers lists it."
    )

    @field_validator("threads")
    @classmethod
    def _thread_count(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= 1024:
            raise ValueError("must be auto or a thread count from 1 to 1024")
        return value

    @field_validator("tokenize_workers")
    @classmethod
    def _worker_count(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= 256:
            raise ValueError("must be auto or a process count from 1 to 256")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "TrainSpec":
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) must not exceed lr ({self.lr})")
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must each be in [0, 1), got {list(self.betas)}")
        if self.streaming and self.eval_steps is None and self.val_fraction > 0:
            raise ValueError("streaming holds out eval_steps x batch_size rows for validation: give eval_steps a "
                             "number (null, the whole split, needs the whole corpus), or set val_fraction: 0")
        return self

    @property
    def clip_norm(self) -> float | None:
        return self.grad_clip if self.grad_clip else None


#: The earlier name of :class:`TrainSpec`, kept importable (``specformer_train.TrainConfig``).
TrainConfig = TrainSpec
