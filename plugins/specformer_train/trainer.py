"""The training loop: the spec's optimizer on packed rows, evaluation, checkpoints, metrics and hooks.

One optimizer step reads ``grad_accum`` micro-batches of ``batch_size`` rows on each
process, sums their gradients (each loss divided by ``grad_accum``; DDP/FSDP average
across processes; split experts are summed over their group: :mod:`specformer_train.parallel.expert`),
clips the global gradient norm, sets each param group's learning rate
from the schedule and steps the optimizer (``train.optimizer``, AdamW by default). On CPU everything is float32 and, seeded, bit-for-bit
repeatable; on CUDA the forward runs under bf16 autocast with TF32 matmuls, fused
AdamW and (by default) ``torch.compile``. A model with multi-token prediction depths adds their
weighted loss to the objective (:mod:`specformer_train.mtp_loss`); the reported loss stays the next-token one.

The loss is read back to the host every ``log_every`` steps and before every evaluation
and save; a non-finite loss stops the run there, naming the step, without saving the
broken state (the last good checkpoint stays the latest). Every ``eval_every`` steps the validation loss and
perplexity are computed and a short sample is printed; every ``save_every`` steps a
checkpoint is written (see :mod:`specformer_train.checkpointing`).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specformer.files.atomic import copy_file_atomic
from specformer.errors import UserError
from specformer.registry.discovery import get_plugin_manager
from specformer.model.summary import summarize
from specformer.tokenizers.tokenizer import Tokenizer

from specformer_train.checkpointing import (CheckpointContents, OutputError, TrainerState, apply_checkpoint,
                                            read_checkpoint, save_checkpoint)
from specformer_train.config import TrainSpec
from specformer_train.data import EvalRows, PackedRows, local_slice
from specformer_train.documents import document_layout, document_settings
from specformer_train.parallel.distributed import (all_reduce_mean, any_process, device_for, gradient_sync,
                                                   optimizer_step_scope, shared_tag)
from specformer_train.parallel.layout import ParallelLayout
from specformer_train.parallel.parallelize import parallelize
from specformer_train.interrupt import StopOnInterrupt
from specformer_train.router_balance import balance_routers
from specformer_train.loggers import RunLoggers
from specformer_train.mtp_loss import check_mtp_training, freeze_untrained_depths, mtp_losses, trained_depths
from specformer_train.optim import group_settings, make_optimizer
from specformer_train.progress import ProgressBar, peak_flops
from specformer_train.sharded_checkpoint import consolidate, is_sharded, use_sharded
from specformer_train.sampling import sample_text
from specformer_train.schedule import step_learning_rates
from specformer_train.threads import choose_threads


class TrainingDiverged(UserError):
    """The loss became NaN or infinite; the message names the step and the last good checkpoint."""


@dataclass
class TrainResult:
    """How a run ended."""

    status: str  # finished | interrupted
    step: int
    loss: float | None
    val_loss: float | None
    checkpoint: Path | None
    model_path: Path | None
    out_dir: Path
    generate_command: str | None = None  # a `specformer generate` line that works for model_path


class Trainer:
    """Trains a built :class:`~specformer.Decoder` on packed rows according to a :class:`TrainSpec`."""

    def __init__(
        self,
        *,
        model: nn.Module,
        config: TrainSpec,
        train_rows: PackedRows,
        val_rows: EvalRows | None,
        tokenizer: Tokenizer,
        out_dir: str | Path,
        ctx: ParallelLayout | None = None,
        device: torch.device | str | None = None,
        data_record: dict[str, Any] | None = None,
        chat: Any = None,
    ) -> None:
        self.config = config
        self.data_record = data_record  # recorded in every checkpoint (see specformer_train.datasource)
        self.ctx = ctx or ParallelLayout()
        self.device = torch.device(device) if device is not None else device_for(config.device, self.ctx)
        self.tokenizer = tokenizer
        self.chat = chat  # a chat run's prompting (see specformer_train.sampling.sample_text), else None
        self.out_dir = Path(out_dir)
        self.train_rows = train_rows
        self.val_rows = val_rows
        self.seq_len = train_rows.seq_len
        self.global_batch = config.batch_size * config.grad_accum * self.ctx.dp_size
        train_rows.check_fits(self.global_batch)
        if self.seq_len > model.context_length:
            raise UserError(f"train.seq_len {self.seq_len} is longer than model.context_length {model.context_length}")

        self.threads = _cpu_threads(config.threads, self.device)
        self.precision = _precision(config.precision, self.device)
        _allow_tf32(self.device)
        summary = summarize(model)
        self.flops_per_token = summary.train_flops_per_token
        self.n_params = summary.total
        freeze_untrained_depths(model)  # MTP depths no loss reaches (specformer_train.mtp_loss): frozen
        self.n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)  # an adapter run: a few %
        self._sizes_logged = False

        self.model = model.to(self.device)  # the Decoder: parameters by name, generation, saving
        self.model.train()
        # Document masking and restarting positions (specformer_train.documents), recorded in trainer.json.
        self.documents = document_settings(document_mask=config.document_mask, reset_positions=config.reset_positions)
        # Multi-token prediction (model.mtp): the depths up to the last weighted one reach the loss
        # (specformer_train.mtp_loss); none when the model has no depths or weights them all 0.
        check_mtp_training(model, seq_len=self.seq_len, tp=self.ctx.tp, ep=self.ctx.ep, cp=self.ctx.cp)
        self.ctx.check_model(model, seq_len=self.seq_len, documents=self.documents,
                             masked_loss=hasattr(train_rows, "loss_mask"))
        self.mtp_depths = trained_depths(model)
        self.mtp_weights = list(model.mtp_loss_weights[: self.mtp_depths]) if self.mtp_depths else []
        self.last_mtp: Tensor | None = None  # the last step's (L_MTP, CE_1, ..., CE_K), averaged as the loss is
        self.compiled = _compiles(config.compile, self.device)
        self.parallel = parallelize(self.model, self.ctx, device=self.device,
                                    activation_checkpointing=config.activation_checkpointing, compile=self.compiled)
        self.wrapped = self.parallel.wrapped  # what the loop calls
        self.optimizer = make_optimizer(self.model, config, device=self.device)
        self.parallel.check_optimizer(self.optimizer, self.ctx)
        self._settings = group_settings(self.optimizer)  # this run's; they win over a checkpoint's on resume
        self.hooks = get_plugin_manager().hook
        self.state = TrainerState(world_size=self.ctx.world_size, threads=self.threads, data=data_record)
        self.state.extra["documents"] = dict(self.documents)
        self.state.extra["mesh"] = self.ctx.mesh()
        self._tag = shared_tag(self.ctx, self.device)  # temporary names unique to this run
        self._sharded = use_sharded(config.checkpoint_format, mode=self.ctx.mode, tp=self.ctx.tp,
                                    adapter=config.adapter is not None, ep=self.ctx.ep)

    # -- the run ----------------------------------------------------------------------

    def fit(self, *, resume_from: str | Path | CheckpointContents | None = None) -> TrainResult:
        """Train to ``config.steps`` (continuing from a checkpoint, a directory or one already read, when given)."""
        config, ctx = self.config, self.ctx
        if resume_from is not None:
            if not isinstance(resume_from, CheckpointContents):
                resume_from = read_checkpoint(Path(resume_from), rank=ctx.rank, world_size=ctx.world_size)
            with optimizer_step_scope(ctx):  # loading the optimizer's state takes an empty step
                self.state = apply_checkpoint(resume_from, model=self.model, optimizer=self.optimizer,
                                              tokenizer=self.tokenizer)
            self.state.data = self.data_record if self.data_record is not None else self.state.data
            self.documents = document_settings(document_mask=config.document_mask,
                                               reset_positions=config.reset_positions,
                                               recorded=self.state.extra.get("documents"), resumed=True)
            self.state.extra["documents"] = dict(self.documents)
            self.state.extra["mesh"] = self.ctx.mesh()  # this run's: a checkpoint records the mesh that wrote it
            self.train_rows.restore(self.state.extra.get("stream"), sequences=self.state.sequences)
            self._apply_config_to_groups()
            if self.threads is not None:
                # The saved thread count (when auto) keeps the matmuls' rounding, so the curve matches.
                self.threads = choose_threads(config.threads, saved=self.state.threads)
                torch.set_num_threads(self.threads)
                self.state.threads = self.threads
            resume_step: int | None = self.state.step
        else:
            torch.manual_seed(config.seed + ctx.dp_rank)  # tensor-parallel processes draw alike
            resume_step = None
        started_at = last_saved = self.state.step  # nothing new to evaluate or save at the step a run starts from

        # Metrics reach the loggers (train.loggers) through the training hooks, on the main process only.
        loggers = RunLoggers(config.loggers if ctx.is_main else [], out_dir=self.out_dir, resume_step=resume_step,
                             plot=config.plot, tensorboard=config.tensorboard)
        if ctx.is_main:
            self.hooks.specformer_on_train_start(out_dir=str(self.out_dir))
        bar = ProgressBar(total=config.steps, initial=self.state.step, enabled=config.progress and ctx.is_main,
                          flops_per_token=self.flops_per_token, peak=peak_flops(self.device, precision=self.precision),
                          world_size=ctx.world_size)
        pending: list[tuple[int, Tensor, float, Tensor | None, Tensor | None]] = []
        window_start, window_tokens = time.perf_counter(), 0
        last_loss: float | None = None
        status = "finished"
        ended = "failed"  # what _end reports if an unexpected exception escapes
        checkpoint: Path | None = resume_from.path if isinstance(resume_from, CheckpointContents) else None
        try:
            with StopOnInterrupt() as interrupt:
                while self.state.step < config.steps:
                    step_index = self.state.step
                    # One evaluation of the schedule: the rate at train.lr (logged) and each group's (applied).
                    lr, group_lrs = step_learning_rates(step_index, config, self.optimizer.param_groups)
                    loss, grad_norm = self._train_step(group_lrs)
                    self.state.step += 1
                    self.state.sequences += self.global_batch
                    self.state.tokens += self.global_batch * self.seq_len
                    window_tokens += self.global_batch * self.seq_len
                    pending.append((self.state.step, loss, lr, grad_norm, self.last_mtp))
                    step = self.state.step
                    at_end = step == config.steps
                    evaluating = bool(config.eval_every) and step % config.eval_every == 0 and not at_end
                    saving = bool(config.save_every) and step % config.save_every == 0 and not at_end
                    # The losses are read before an evaluation or a save, so a non-finite one stops the run
                    # before a broken state is evaluated or checkpointed (log_every may be longer).
                    if len(pending) >= config.log_every or at_end or evaluating or saving:
                        elapsed = time.perf_counter() - window_start
                        self.state.elapsed_s += elapsed
                        last_loss = self._flush(pending, bar, tokens_per_s=window_tokens / max(elapsed, 1e-9),
                                                last_good=checkpoint)
                        pending, window_start, window_tokens = [], time.perf_counter(), 0
                    if evaluating:
                        self._evaluate_and_sample(step, bar)
                    if saving:
                        checkpoint = self._save()
                        last_saved = step
                    if any_process(interrupt.requested, ctx, self.device):
                        status = "interrupted"
                        break
                if pending:  # interrupted between log points: still account for those steps
                    last_loss = self._flush(pending, bar, tokens_per_s=window_tokens / max(
                        time.perf_counter() - window_start, 1e-9), last_good=checkpoint)
                step = self.state.step
                # The last step is never a periodic evaluation, so a finished run that took a step evaluates here.
                if status == "finished" and step != started_at:
                    self._evaluate_and_sample(step, bar)
                if last_saved != step:
                    checkpoint = self._save()
                model_path = self._export_final(checkpoint) if status == "finished" else None
            ended = status
        except TrainingDiverged:
            ended, last_loss = "diverged", float("nan")
            raise
        finally:
            self._end(loggers, bar, status=ended, loss=last_loss)
        return TrainResult(status=status, step=self.state.step, loss=last_loss, val_loss=self.state.last_val_loss,
                           checkpoint=checkpoint, model_path=model_path, out_dir=self.out_dir)

    def _train_step(self, lr: float | list[float]) -> tuple[Tensor, Tensor | None]:
        """One optimizer step at ``lr`` (one for every group, or one per group).

        Returns the mean LM loss (over micro-batches and processes) and the grad norm; with MTP depths,
        ``last_mtp`` holds the step's MTP loss and each depth's cross-entropy, averaged the same way.
        """
        config, ctx = self.config, self.ctx
        lrs = [lr] * len(self.optimizer.param_groups) if isinstance(lr, (int, float)) else lr
        for group, group_lr in zip(self.optimizer.param_groups, lrs, strict=True):
            group["lr"] = group_lr
        total = torch.zeros((), device=self.device)
        mtp_total = torch.zeros(1 + self.mtp_depths, device=self.device)  # (L_MTP, CE_1, ..., CE_K)
        masked = hasattr(self.train_rows, "loss_mask")
        for micro, (inputs, targets, layout) in enumerate(self._micro_batches()):
            last = micro == config.grad_accum - 1
            with self._loss_scope():  # forward and backward: a vocabulary-parallel loss needs both inside
                with gradient_sync(self.wrapped, ctx, sync=last), self._autocast():
                    if self.mtp_depths:
                        # (B, T, vocab) and depth k's (B, T - k, vocab)
                        logits, mtp_logits = self.wrapped(inputs, **layout, with_mtp=True)
                    else:
                        logits = self.wrapped(inputs, **layout)  # (B, T, vocab)
                    loss = lm_loss(logits, targets, masked=masked)
                    objective = loss  # the reported loss stays the next-token loss alone
                    if self.mtp_depths:
                        mtp, per_depth = mtp_losses(mtp_logits, targets, weights=self.mtp_weights, masked=masked,
                                                    lm_loss=lm_loss)
                        objective = objective + mtp
                        mtp_total += torch.stack([mtp, *per_depth]).detach()
                    aux = self.model.auxiliary_loss()
                    if aux is not None:
                        objective = objective + config.aux_loss_weight * aux.float()
                (objective / config.grad_accum).backward()
            total += loss.detach()
        row_weights = self._finish_split_gradients()
        grad_norm = None
        if config.clip_norm is not None:
            if ctx.tp > 1 or ctx.ep > 1:  # split and replicated gradients together: torch's norm refuses the mix
                # late: only model-parallel runs need these
                from specformer_train.parallel.expert import expert_groups_of
                from specformer_train.parallel.tensor import clip_grad_norm

                grad_norm = clip_grad_norm(list(self.model.parameters()), config.clip_norm,
                                           split_over=expert_groups_of(self.parallel.experts), row_weights=row_weights)
            else:
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.clip_norm)
            if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP: the norm over all shards
                grad_norm = grad_norm.full_tensor()
        with optimizer_step_scope(ctx):
            self.optimizer.step()
        balance_routers(self.model, ctx)  # MoE routers balanced by bias move it from this step's expert load
        self.optimizer.zero_grad(set_to_none=True)
        self.last_mtp = all_reduce_mean(mtp_total / config.grad_accum, ctx) if self.mtp_depths else None
        return all_reduce_mean(total / config.grad_accum, ctx), grad_norm

    def _finish_split_gradients(self) -> dict[int, Tensor]:
        """The sums model parallelism leaves to the end of the backward; returns the row weights of copied key/value
        heads for the gradient norm (empty without them)."""
        ctx, parallel = self.ctx, self.parallel
        if parallel.tp_summed:  # weights each process applied to its share only (parallel_plan.Shared, sequence parallel)
            from specformer_train.parallel.tensor import sum_shared_gradients  # late: only TP runs need it

            sum_shared_gradients(self.model, parallel.tp_summed, ctx.meshes.tp)
        if parallel.experts is not None:  # expert stacks: summed over their group by the all-to-all, not by DDP/FSDP
            from specformer_train.parallel.expert import finish_expert_gradients  # late: only EP runs need it

            finish_expert_gradients(parallel.experts, dp_size=ctx.dp_size)
        if parallel.tp_copies:  # key/value heads fewer than tp: each copy's gradient is a part
            from specformer_train.parallel.tensor import sum_copied_rows  # late: only TP runs need it

            return sum_copied_rows(self.model, parallel.tp_copies, ctx.meshes.tp)
        return {}

    def _micro_batches(self) -> Iterator[tuple[Tensor, Tensor, dict[str, Tensor]]]:
        """This process' rows of the current global batch, one micro-batch at a time, on the device."""
        config, ctx = self.config, self.ctx
        for micro in range(config.grad_accum):
            part = local_slice(self.global_batch, micro_batch=config.batch_size, micro_step=micro,
                               rank=ctx.dp_rank, world_size=ctx.dp_size)
            first = self.state.sequences + part.start
            rows = self.train_rows.rows(first, config.batch_size)
            batch = self._to_device(rows)
            # Chat data: rows may carry a loss mask (only the assistant's tokens count).
            mask = self.train_rows.loss_mask(first, config.batch_size) if hasattr(self.train_rows, "loss_mask") else None
            # inputs, next-token targets: (B, T) each (this process' tokens of them under context parallelism)
            yield self._my_tokens(batch[:, :-1], self._targets(batch, mask), self._layout(rows[:, :-1]))

    def _targets(self, batch: Tensor, mask: np.ndarray | None) -> Tensor:
        """Next-token targets ``(B, T)``; IGNORE where a loss mask ``(B, T + 1)`` (aligned with the row) is False."""
        if mask is None:
            return batch[:, 1:]
        return batch[:, 1:].masked_fill(~self._to_device(mask[:, 1:]), IGNORE)

    def _layout(self, inputs: np.ndarray) -> dict[str, Tensor]:
        """The forward's ``document_ids``/``positions`` for host ``inputs`` (B, T); empty when plain causal is exact."""
        layout = document_layout(inputs, eot_id=self.tokenizer.eot_id, **self.documents)
        given = {"document_ids": layout.document_ids, "positions": layout.positions}
        return {name: self._to_device(array) for name, array in given.items() if array is not None}

    def _my_tokens(self, inputs: Tensor, targets: Tensor,
                   layout: dict[str, Tensor]) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """The inputs, targets and forward layout of this process' tokens: all of them, or under context parallelism
        its two chunks of every row, with their positions and the cache that gathers the group's keys."""
        if self.ctx.cp == 1:
            return inputs, targets, layout
        from specformer_train.parallel.context import GatheredKeys, positions_of  # late: only cp runs need them

        mine = positions_of(inputs.shape[1], cp=self.ctx.cp, rank=self.ctx.cp_rank, device=inputs.device)
        positions = mine.expand(inputs.shape[0], -1)  # (B, T/cp); no document layout (check_context_parallel)
        cache = GatheredKeys(self.ctx.meshes.cp.get_group())
        return inputs[:, mine], targets[:, mine], {"positions": positions, "cache": cache}

    def _to_device(self, rows: np.ndarray) -> Tensor:
        batch = torch.from_numpy(rows)
        if self.device.type == "cuda":
            # Pinned host memory lets the copy run asynchronously with the GPU's work.
            return batch.pin_memory().to(self.device, non_blocking=True)
        return batch.to(self.device)

    @contextlib.contextmanager
    def _loss_scope(self) -> Iterator[None]:
        """Where the LM loss is taken (with its backward): under tensor parallelism, on logits split by vocabulary,
        and with sequence parallelism on a stream cut by sequence."""
        if self.ctx.tp == 1:
            yield
            return
        from specformer_train.parallel.tensor import vocabulary_parallel_loss  # late: only TP runs need DTensors

        sequence = self.parallel.sequence
        cut = sequence.active() if sequence is not None else contextlib.nullcontext()
        with vocabulary_parallel_loss(self.model), cut:
            yield

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # -- reading the loss back, metrics and hooks --------------------------------------

    def _flush(self, pending: list[tuple[int, Tensor, float, Tensor | None, Tensor | None]], bar: ProgressBar, *,
               tokens_per_s: float, last_good: Path | None) -> float:
        losses = torch.stack([loss for _, loss, _, _, _ in pending]).tolist()  # one host sync per window
        norms: list[float | None] = [None] * len(pending)
        if pending[0][3] is not None:
            norms = torch.stack([n for _, _, _, n, _ in pending]).tolist()
        mtps: list[list[float] | None] = [None] * len(pending)
        if pending[0][4] is not None:
            mtps = torch.stack([m for _, _, _, _, m in pending]).tolist()
        last_step, tokens_per_step = pending[-1][0], self.global_batch * self.seq_len
        for (step, _, lr, _, _), loss, norm, mtp in zip(pending, losses, norms, mtps):
            bad = [(name, value) for name, value in (("training loss", loss), ("MTP loss", mtp[0] if mtp else 0.0))
                   if not math.isfinite(value)]
            if bad:
                where = (f"the last good checkpoint is {last_good} (step {_step_of(last_good)})" if last_good
                         else "no checkpoint was saved before it")
                raise TrainingDiverged(
                    f"the {bad[0][0]} became {bad[0][1]} at step {step}; training stopped and {where}. "
                    f"Try a lower train.lr (now {self.config.lr:g}), more warm-up, or gradient clipping."
                )
            tokens = self.state.tokens - (last_step - step) * tokens_per_step
            record: dict[str, float] = {"loss": loss, "lr": lr, "tokens": tokens}
            if norm is not None:
                record["grad_norm"] = norm
            if mtp is not None:  # the weighted sum added to the objective, then each depth's own cross-entropy
                record["mtp_loss"] = mtp[0]
                record.update({f"mtp_loss_{k}": ce for k, ce in enumerate(mtp[1:], start=1)})
            if not self._sizes_logged:  # once per run (and per resume): what the optimizer moves, of what there is
                record.update(params=float(self.n_params), trainable_params=float(self.n_trainable))
                self._sizes_logged = True
            if step == last_step:
                record["tokens_per_s"] = tokens_per_s
                record.update(bar.update(len(pending), loss=loss, lr=lr, tokens_per_s=tokens_per_s,
                                         mtp_loss=mtp[0] if mtp is not None else None))
            if self.ctx.is_main:
                self.hooks.specformer_on_train_step(step=step, metrics=record)
        return losses[-1]

    # -- evaluation ---------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self) -> float | None:
        """Mean validation loss per token over ``eval_steps`` batches (the whole split when None)."""
        if self.val_rows is None or self.val_rows.count == 0:
            return None
        config, ctx = self.config, self.ctx
        limit = None if config.eval_steps is None else config.eval_steps * config.batch_size * ctx.dp_size
        chosen = self.val_rows.chosen(limit)
        chosen = chosen[: len(chosen) - len(chosen) % ctx.dp_size]  # equal work on every process
        mine = chosen[ctx.dp_rank :: ctx.dp_size]
        sums = torch.zeros(2, device=self.device, dtype=torch.float64)  # (loss sum, token count)
        self.wrapped.eval()
        try:
            for start in range(0, len(mine), config.batch_size):
                rows = self.val_rows.rows(mine[start : start + config.batch_size])
                batch = self._to_device(rows)
                mask = (self.val_rows.loss_mask(mine[start : start + config.batch_size])
                        if hasattr(self.val_rows, "loss_mask") else None)
                inputs, targets, layout = self._my_tokens(batch[:, :-1], self._targets(batch, mask),
                                                          self._layout(rows[:, :-1]))  # (B, T) each
                with self._loss_scope():
                    with self._autocast():
                        logits = self.wrapped(inputs, **layout)  # masked as in training
                    loss = whole(F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum",
                                                 ignore_index=IGNORE))
                sums[0] += loss.double()
                sums[1] += (targets != IGNORE).sum() if mask is not None else targets.numel()
        finally:
            self.wrapped.train()
        sums = all_reduce_mean(sums, ctx)
        return float(sums[0] / sums[1]) if sums[1] > 0 else None

    def _evaluate_and_sample(self, step: int, bar: ProgressBar) -> None:
        val_loss = self.evaluate()
        if val_loss is not None:
            self.state.last_val_loss = val_loss
            record = {"val_loss": val_loss, "val_perplexity": math.exp(min(val_loss, 700.0))}
            if self.ctx.is_main:
                self.hooks.specformer_on_eval(step=step, metrics=record)
                bar.write(f"step {step}: val loss {val_loss:.4f}, perplexity {record['val_perplexity']:.2f}")
        text = self.sample(step)
        if text is not None and self.ctx.is_main:
            bar.write(f"--- sample at step {step} ---\n{text}\n---")

    def sample(self, step: int) -> str | None:
        """A short continuation of ``sample_prompt`` (None without the generate plugin)."""
        config = self.config
        if config.sample_tokens <= 0:
            return None
        # Under FSDP, TP and EP every process must take part in each forward; otherwise rank 0 samples alone.
        if not (self.ctx.is_main or self.ctx.mode == "fsdp" or self.ctx.tp > 1 or self.ctx.ep > 1):
            return None
        with _eager():
            return sample_text(self.model, self.tokenizer, prompt=config.sample_prompt,
                               max_new_tokens=config.sample_tokens, temperature=config.sample_temperature,
                               top_k=config.sample_top_k, seed=config.seed + step, device=self.device, chat=self.chat)

    # -- checkpoints and the end of a run ---------------------------------------------

    def _save(self) -> Path:
        position = self.train_rows.position(self.state.sequences)  # a stream's place in its files (else None)
        if position is not None:
            self.state.extra["stream"] = position
        path = save_checkpoint(out_dir=self.out_dir, model=self.model, optimizer=self.optimizer, state=self.state,
                               tokenizer=self.tokenizer, ctx=self.ctx, keep_last=self.config.keep_last, tag=self._tag,
                               sharded=self._sharded)
        if self.ctx.is_main:
            self.hooks.specformer_on_checkpoint_saved(step=self.state.step, path=str(path))
        return path

    def _export_final(self, checkpoint: Path | None) -> Path | None:
        """Copy the final weights and tokenizer to ``<out_dir>/model.safetensors`` and ``tokenizer.json``.

        A sharded checkpoint's weights are consolidated from its files by the first process (on the CPU).
        """
        if checkpoint is None or not self.ctx.is_main:
            return None
        target = self.out_dir / "model.safetensors"
        for name, dest in (("model.safetensors", target), ("tokenizer.json", self.out_dir / "tokenizer.json")):
            try:
                if name == "model.safetensors" and is_sharded(checkpoint):
                    consolidate(checkpoint, dest)
                    continue
                copy_file_atomic(checkpoint / name, dest)
            except OSError as exc:
                raise OutputError(f"could not write {dest}: {exc.strerror or exc}; the final weights are in "
                                  f"{checkpoint}") from None
        return target

    def _end(self, loggers: RunLoggers, bar: ProgressBar, *, status: str, loss: float | None) -> None:
        """Close the bar; tell plugins the run ended (unless it crashed: then only clean up); close the loggers."""
        try:
            bar.close()
            if self.ctx.is_main:
                if status != "failed":
                    final = {"loss": float("nan") if loss is None else loss, "tokens": self.state.tokens,
                             "elapsed_s": self.state.elapsed_s}
                    if self.state.last_val_loss is not None:
                        final["val_loss"] = self.state.last_val_loss
                    self.hooks.specformer_on_train_end(step=self.state.step, metrics=final,
                                                       out_dir=str(self.out_dir))
        finally:
            loggers.close(status)  # files closed, loss.png drawn, hook implementations unregistered

    def _apply_config_to_groups(self) -> None:
        """After a resume, this run's settings (lr, betas, weight decay, ...) win over those saved with the optimizer."""
        for group, settings in zip(self.optimizer.param_groups, self._settings, strict=True):
            group.update(settings)


#: The target id a loss mask turns excluded targets into (``F.cross_entropy``'s ``ignore_index``).
IGNORE = -100


def lm_loss(logits: Tensor, targets: Tensor, *, masked: bool) -> Tensor:
    """Mean next-token cross-entropy over the targets that count (IGNORE marks those a loss mask excludes).

    Unmasked rows: plain ``F.cross_entropy``. Masked (``masked``, known on the host, so no
    device sync): the sum over the counted targets divided by their number, at least 1, so
    a micro-batch holding only prompt tokens contributes 0 rather than NaN.
    """
    flat, wanted = logits.float().flatten(0, 1), targets.flatten()  # (B*T, vocab), (B*T,)
    if not masked:
        return whole(F.cross_entropy(flat, wanted))
    counted = (wanted != IGNORE).sum().clamp(min=1)
    return whole(F.cross_entropy(flat, wanted, reduction="sum", ignore_index=IGNORE)) / counted


def whole(loss: Tensor) -> Tensor:
    """A loss as a plain tensor: the one a vocabulary-parallel cross-entropy gives is a (replicated) DTensor."""
    return loss.full_tensor() if hasattr(loss, "full_tensor") else loss


def _precision(requested: str, device: torch.device) -> str:
    if requested == "auto":
        return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    return requested


def _cpu_threads(setting: int | str, device: torch.device) -> int | None:
    """Set and return the thread count for a run on the CPU (None, and torch left alone, elsewhere)."""
    if device.type != "cpu":
        return None
    threads = choose_threads(setting)
    torch.set_num_threads(threads)
    return threads


def _allow_tf32(device: torch.device) -> None:
    """On CUDA, TF32 matmuls and convolutions: fp32's range at tensor-core speed."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def _compiles(setting: bool | str, device: torch.device) -> bool:
    """``compile: auto`` compiles on CUDA only: on the CPU compiling costs more than it saves in a short run."""
    return setting is True or (setting == "auto" and device.type == "cuda")


def _eager() -> contextlib.AbstractContextManager[Any]:
    """Run compiled modules eagerly (sampling feeds shapes compiling for would only slow down)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()


def _step_of(path: Path | None) -> str:
    return path.name.removeprefix("step-").lstrip("0") or "0" if path else "?"
