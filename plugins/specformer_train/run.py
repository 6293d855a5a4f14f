"""From a spec file to a finished run: what ``specformer train`` does, callable from Python.

::

    from specformer_train import train
    result = train("specs/tiny.yaml", data="notes/", out_dir="runs/notes", overrides=["train.lr=3e-4"], steps=200)

The order is cheap checks first, so a run that cannot finish fails in a second: the spec
and overrides; the run directory (locked, repaired after an interrupted save, writable,
not holding an earlier run unless ``--resume``/``--overwrite``, room for the checkpoints);
the checkpoint to resume from and the data it recorded; then the corpus, tokenizer and
model; and only then are an earlier run's files replaced and training started.
"""

from __future__ import annotations

import contextlib
import glob
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

import specformer
from specformer.errors import UserError
from specformer.registry.discovery import get_plugin_manager, get_registry
from specformer.spec.check import check_spec
from specformer.spec import Spec, read_spec_file
from specformer.renamed import upgrade_spec
from specformer.model.summary import summarize
from specformer_text import Corpus, find_corpus, make_tokenizer, tokenize_corpus

from specformer_train.checkpointing import (CheckpointContents, check_tokenizer, clear_earlier_run,
                                            recover_interrupted_saves)
from specformer_train.config import TrainSpec
from specformer_train.data import EvalRows, PackedRows, split_tokens
from specformer_train.datasource import (absolute_source, check_same_data, data_record, describe, recorded_source,
                                         stream_record)
from specformer_train.parallel.distributed import any_process, barrier, device_for, init_distributed, shutdown
from specformer_train.parallel.layout import ParallelLayout
from specformer_train.hint import after_consolidating, generate_command
from specformer_train.init_weights import load_init
from specformer_train.lock import RunLock
from specformer_train.overrides import apply_overrides
from specformer_train.resume import find_resumable
from specformer_train.sharded_checkpoint import is_sharded
from specformer_train.stream import StreamRows
from specformer_train.rundir import check_space, check_writable, refuse_earlier_run, refuse_inputs_in_run
from specformer_train.trainer import Trainer, TrainResult


SpecSource = str | Path | dict[str, Any] | Spec  # what train() accepts as a spec


def load_train_spec(spec: SpecSource, *, overrides: Sequence[str] = (), data: str | None = None,
                    out_dir: str | None = None, steps: int | None = None, init: str | None = None) -> Spec:
    """The spec with command-line overrides applied, validated again (a SpecError lists every problem)."""
    source = None if isinstance(spec, (dict, Spec)) else str(spec)
    if isinstance(spec, Spec):
        raw = spec.to_dict()
    else:
        raw = dict(spec) if isinstance(spec, dict) else read_spec_file(spec)
    raw = upgrade_spec(raw, source=source)  # an old file's keys as they are now, so --set model.block.mixer... applies
    changes = list(overrides)
    # The dedicated flags are spelled as overrides so they are validated the same way.
    changes += [f"train.steps={steps}"] if steps is not None else []
    raw = apply_overrides(raw, changes)
    if raw.get("train") is None:
        raw["train"] = {}
    if isinstance(raw["train"], dict):  # otherwise validation reports the malformed section
        # Paths are set as given, not read as YAML (a directory named "1e3" stays a string).
        raw["train"].update({k: v for k, v in (("data", data), ("out_dir", out_dir), ("init", init)) if v is not None})
    return check_spec(raw, registry=get_registry(), source=source).spec


def default_out_dir(spec: SpecSource) -> Path:
    name = "run" if isinstance(spec, (dict, Spec)) else Path(spec).stem
    return Path("runs") / name


def train(spec: SpecSource, *, data: str | None = None, out_dir: str | None = None,
          resume: bool | str | Path = False, overwrite: bool = False, new_data: bool = False,
          overrides: Sequence[str] = (), steps: int | None = None, init: str | None = None) -> TrainResult:
    """Train the model of ``spec`` (a file, a dict or a :class:`Spec`) on ``data``.

    ``resume`` is True (the run directory's latest intact checkpoint) or a checkpoint
    directory; without it, a run directory holding an earlier run is refused unless
    ``overwrite`` is True. ``new_data`` lets a resumed run continue on other data than it
    recorded. ``overrides`` are ``--set`` items (``"train.lr=3e-4"``); ``init`` is ``--init``. Raises
    :class:`UserError` for bad input (another run holding the directory included) and
    :class:`~specformer_train.trainer.TrainingDiverged` on a non-finite loss.
    """
    if resume and overwrite:
        raise UserError("--resume continues the run in the directory and --overwrite replaces it; give one of them")
    if new_data and not resume:
        raise UserError("--new-data only applies with --resume (a fresh run uses whatever --data says)")
    loaded = load_train_spec(spec, overrides=overrides, data=data, out_dir=out_dir, steps=steps, init=init)
    config: TrainSpec = loaded.section("train") or TrainSpec()
    if config.adapter is not None and config.init is None:  # a spec may name an adapter for --init to complete
        raise UserError("train.adapter trains on a base model's weights: set train.init (or --init) to its checkpoint")
    run_dir = Path(config.out_dir) if config.out_dir else default_out_dir(spec)
    parallel = config.parallel
    ctx = init_distributed(ParallelLayout.of_launch(distributed=config.distributed, tp=parallel.tp, ep=parallel.ep,
                                                    cp=parallel.cp, sequence_parallel=parallel.sequence_parallel),
                           device=config.device)
    say = print if ctx.is_main else (lambda *a, **k: None)
    try:
        with contextlib.ExitStack() as held:
            # Only the first process writes the run directory, so only it locks and checks it; the
            # others learn whether it may go on, so that none waits for a process that stopped.
            refused: UserError | None = None
            if ctx.is_main:
                try:
                    held.enter_context(RunLock(run_dir, say=say))
                    _check_run_dir(run_dir, loaded, config, resume=bool(resume), overwrite=overwrite, say=say,
                                   source=None if isinstance(spec, (dict, Spec)) else spec)
                except UserError as exc:
                    refused = exc
            if any_process(refused is not None, ctx, device_for(config.device, ctx)):
                raise refused or UserError(f"the first process could not start the run in {run_dir} (it says why)")
            return _train(loaded, config, run_dir, ctx, resume=resume, new_data=new_data,
                          data_given=data is not None, source=None if isinstance(spec, (dict, Spec)) else str(spec))
    finally:
        shutdown(ctx)


def _check_run_dir(run_dir: Path, spec: Spec, config: TrainSpec, *, resume: bool, overwrite: bool,
                   say: Callable[[str], None], source: str | Path | None) -> None:
    """Under the lock, before any data is read: check that no input lies where the run writes,
    finish interrupted saves, then check that the directory can be written, may be used, and
    has room for the run's checkpoints."""
    refuse_inputs_in_run(run_dir, _input_paths(config, source))
    for note in recover_interrupted_saves(run_dir):
        say(f"note: {note}")
    check_writable(run_dir)
    if not resume and not overwrite:
        refuse_earlier_run(run_dir)
    check_space(run_dir, n_params=summarize(spec).total, keep_last=config.keep_last)


def _input_paths(config: TrainSpec, source: str | Path | None) -> list[Path]:
    """The files and folders a run reads that exist: the spec file, train.init, the data (a glob's
    matches), and a tokenizer or chat template given as a file."""
    given = [source, config.init, config.tokenizer, config.chat_template]
    paths = [Path(p) for p in given if p is not None and Path(p).exists()]
    if config.data is not None:
        data = Path(config.data)
        paths += [data] if data.exists() else [Path(p) for p in glob.glob(config.data, recursive=True)]
    return paths


def _train(spec: Spec, config: TrainSpec, run_dir: Path, ctx: ParallelLayout, *, resume: bool | str | Path,
           new_data: bool, data_given: bool, source: str | None) -> TrainResult:
    say: Callable[..., None] = print if ctx.is_main else (lambda *a, **k: None)
    resume_from = find_resumable(run_dir, resume, rank=ctx.rank, world_size=ctx.world_size, say=say) if resume else None
    recorded = resume_from.state.data if resume_from is not None else None
    if resume_from is not None:
        note = mesh_change(resume_from.state.extra.get("mesh"), ctx.mesh())
        if note:
            say(note)
    known, recorded_data = recorded_source(recorded)
    if known and not data_given and recorded_data != absolute_source(config.data):
        spec, config = _with_data(spec, recorded_data, source=source)
        say(f"note: resuming on the data the run was trained on: {describe(recorded or {})}")

    # Fine-tuning (train.init): the checkpoint's weights and its tokenizer, whatever train.tokenizer says.
    started = load_init(config.init, spec) if config.init else None
    seq_len = config.seq_len or spec.model.context_length
    # Chat data (a plugin's rows with a loss mask, e.g. the finetune plugin's conversations) instead of a corpus.
    chat = get_plugin_manager().hook.specformer_train_rows(
        config=config, tokenizer=started.tokenizer if started else None, seq_len=seq_len,
        metadata=started.metadata if started else None, vocab_size=spec.model.vocab_size)
    if chat is not None:
        if resume_from is not None:
            check_tokenizer(resume_from, chat.tokenizer)
        return _train_on(spec, config, run_dir, ctx, say=say, resume_from=resume_from, started=started, seq_len=seq_len,
                         tokenizer=chat.tokenizer, train_rows=chat.train_rows, val_rows=chat.val_rows,
                         description=chat.description, counts=(chat.n_tokens, chat.n_train, chat.n_val),
                         record=_checked_record(chat.record, recorded, resume_from, new_data=new_data, say=say),
                         chat=getattr(chat, "prompting", None))

    # The first process fills the caches (tokenizer, tokens); the others then find them there.
    corpus = _find_corpus(config.data, recorded_data if known and not data_given else None, text_field=config.text_field)
    if not ctx.is_main:
        barrier(ctx)
    tokenizer = started.tokenizer if started else make_tokenizer(config.tokenizer, vocab_size=spec.model.vocab_size,
                                                                 corpus=corpus, cache=config.cache_dir)
    if resume_from is not None:
        check_tokenizer(resume_from, tokenizer)
    if config.streaming:  # no pre-pass: documents are read and tokenized as rows need them
        if ctx.is_main:
            barrier(ctx)
        stream = StreamRows(corpus, tokenizer, seq_len=seq_len, seed=config.seed,
                            holdout_rows=0 if config.val_fraction == 0 else (config.eval_steps or 0) * config.batch_size)
        record = _checked_record(stream_record(data=config.data, description=corpus.description,
                                               corpus_fingerprint=corpus.fingerprint(),
                                               tokenizer_json=tokenizer.to_json()),
                                 recorded, resume_from, new_data=new_data, say=say)
        n_val = 0 if stream.val_tokens is None else len(stream.val_tokens)
        return _train_on(spec, config, run_dir, ctx, say=say, resume_from=resume_from, started=started,
                         seq_len=seq_len, tokenizer=tokenizer, train_rows=stream,
                         val_rows=EvalRows(stream.val_tokens, seq_len=seq_len) if n_val else None,
                         description=corpus.description, counts=(None, None, n_val), record=record)
    tokens = tokenize_corpus(corpus, tokenizer, cache=config.cache_dir, progress=ctx.is_main,
                             workers=config.tokenize_workers)
    if ctx.is_main:
        barrier(ctx)
    record = data_record(data=config.data, description=corpus.description, tokens=tokens)
    if resume_from is not None:
        note = check_same_data(recorded, record, new_data=new_data)
        if note:
            say(note)

    split = split_tokens(tokens, val_fraction=config.val_fraction, seq_len=seq_len)
    train_rows = PackedRows(split.train, seq_len=seq_len, seed=config.seed)
    val_rows = EvalRows(split.val, seq_len=seq_len) if split.val is not None else None
    return _train_on(spec, config, run_dir, ctx, say=say, resume_from=resume_from, started=started, seq_len=seq_len,
                     tokenizer=tokenizer, train_rows=train_rows, val_rows=val_rows, description=corpus.description,
                     counts=(len(tokens), len(split.train), 0 if split.val is None else len(split.val)), record=record)


def _groups_in_words(ctx: ParallelLayout) -> str:
    """How the processes of a model-parallel run share the rows, in words."""
    words = []
    if ctx.tp * ctx.cp > 1:
        words.append(f"each group of {ctx.tp * ctx.cp} processes reads the same rows")
    if ctx.ep > 1:
        words.append(f"groups of {ctx.ep} processes read different rows and send each token to its experts' processes")
    return "; ".join(words)


def mesh_change(recorded: Any, now: dict[str, Any]) -> str | None:
    """A note when a checkpoint resumes on another layout of processes than the one that wrote it (None: the same,
    or a checkpoint from before meshes were recorded)."""
    if not isinstance(recorded, dict) or recorded == now:
        return None

    def words(mesh: dict[str, Any]) -> str:
        return ", ".join(f"{key} {mesh.get(key)}" for key in now)

    return f"note: resuming a checkpoint written by {words(recorded)} onto {words(now)}"


def _checked_record(record: dict[str, Any], recorded: dict[str, Any] | None, resume_from: Any, *, new_data: bool,
                    say: Callable[..., None]) -> dict[str, Any]:
    if resume_from is not None:
        note = check_same_data(recorded, record, new_data=new_data)
        if note:
            say(note)
    return record


def _train_on(spec: Spec, config: TrainSpec, run_dir: Path, ctx: ParallelLayout, *, say: Callable[..., None],
              resume_from: CheckpointContents | None, started: Any, seq_len: int, tokenizer: Any, train_rows: Any,
              val_rows: Any, description: str, counts: tuple[int | None, int | None, int], record: dict[str, Any],
              chat: Any = None) -> TrainResult:
    """Build (or take from train.init) the model, let plugins prepare it, and train on the rows; ``chat`` is a
    chat run's prompting (the template its samples and the suggested command use), else None."""
    model = started.model if started else specformer.build(spec, seed=config.seed)
    torch.manual_seed(config.seed)  # what a plugin adds to the model (an adapter) starts the same on every process
    get_plugin_manager().hook.specformer_train_prepare_model(model=model, config=config, init=config.init)
    trainer = Trainer(model=model, config=config, train_rows=train_rows, val_rows=val_rows, tokenizer=tokenizer,
                      out_dir=run_dir, ctx=ctx, data_record=record, chat=chat)

    # Only now that everything checked out: a fresh start clears what an earlier run left.
    if resume_from is None and ctx.is_main:
        removed = clear_earlier_run(run_dir)
        if removed:
            say(f"note: --overwrite: removed {removed} checkpoint(s) of the earlier run in {run_dir}")
    barrier(ctx)
    n_tokens, n_train, n_val = counts
    say(_header(spec, config, trainer, corpus_description=description, n_tokens=n_tokens, n_train=n_train,
                n_val=n_val, run_dir=run_dir, resume_from=resume_from))
    result = trainer.fit(resume_from=resume_from)
    # A finished run's final model, else (interrupted) the run directory: every command reads its latest checkpoint.
    target = result.model_path if result.model_path is not None else run_dir if result.checkpoint is not None else None
    if target is not None:
        result.generate_command = generate_command(target, prompt=config.sample_prompt, tokenizer=tokenizer,
                                                   context_length=spec.model.context_length, chat=chat)
        if result.model_path is None and is_sharded(result.checkpoint):
            result.generate_command = after_consolidating(result.checkpoint, result.generate_command)
    return result


def _with_data(spec: Spec, data: str | None, *, source: str | None) -> tuple[Spec, TrainSpec]:
    """``spec`` with ``train.data`` set to ``data`` (the recorded source of a resumed run)."""
    raw = spec.to_dict()
    raw["train"]["data"] = data
    updated = check_spec(raw, registry=get_registry(), source=source).spec
    return updated, updated.section("train")


def _find_corpus(data: str | None, recorded: str | None, *, text_field: str) -> Corpus:
    try:
        return find_corpus(data, text_field=text_field)
    except UserError as exc:
        if recorded is None:
            raise
        raise UserError(f"--resume: the run was trained on {recorded}, which cannot be read now ({exc}); give "
                        "its new place with --data PATH (and --new-data if its contents changed)") from None


def _header(spec: Spec, config: TrainSpec, trainer: Trainer, *, corpus_description: str, n_tokens: int | None,
            n_train: int | None, n_val: int, run_dir: Path, resume_from: CheckpointContents | None) -> str:
    m = spec.model
    tokens_per_step = trainer.global_batch * trainer.seq_len
    per_epoch = trainer.train_rows.rows_per_epoch  # None when streaming: unknown until the corpus is read
    epochs = f"= {config.steps * trainer.global_batch / max(1, per_epoch):.2f} epochs" if per_epoch is not None else "(streamed)"
    mode = "compiled" if trainer.compiled else "eager"
    extras = [trainer.ctx.mode] if trainer.ctx.enabled else []
    extras += ["activation checkpointing"] if config.activation_checkpointing else []
    tokenizer_name = "the --init checkpoint's" if config.init else config.tokenizer
    lines = [
        f"specformer train -> {run_dir}" + (f" (resuming {resume_from.path.name})" if resume_from else ""),
        f"  model   {trainer.n_params / 1e6:.2f}M parameters: {m.n_layers} layers, d_model {m.d_model}, "
        f"context {m.context_length}, vocab {m.vocab_size}; {trainer.flops_per_token / 1e6:.1f} MFLOP per trained token"
        + (f"\n  trains  {trainer.n_trainable:,} of {trainer.n_params:,} parameters "
           f"({100 * trainer.n_trainable / max(1, trainer.n_params):.2f}%)" if trainer.n_trainable != trainer.n_params else "")
        + (f"\n  init    {config.init}" if config.init else ""),
        f"  data    {corpus_description}: {n_tokens:,} tokens "
        f"({tokenizer_name} tokenizer), "
        f"{n_train:,} train / {n_val:,} validation" if n_tokens is not None else
        f"  data    {corpus_description}: streamed, tokenized while training ({tokenizer_name} tokenizer); "
        f"{n_val:,} validation tokens held out",
        f"  batch   {config.batch_size} x {trainer.seq_len} tokens x {config.grad_accum} accumulation x "
        f"{trainer.ctx.dp_size} process(es) = {tokens_per_step:,} tokens/step; {config.steps} steps "
        f"{epochs}",
        *([f"  split   {split} ({_groups_in_words(trainer.ctx)})"] if (split := trainer.parallel.description) else []),
        f"  device  {trainer.device}, {trainer.precision}, {mode}" + "".join(f", {e}" for e in extras)
        + (f"; {trainer.threads} CPU thread(s)" if trainer.threads else ""),
    ]
    return "\n".join(lines)
