"""From a spec file to a finished run: what ``specformer train`` does, callable from Python.

::

    from specformer_train import train
    result = train("specs/tiny.yaml", data="notes/", overrides=["train.lr=3e-4"], steps=200)
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Sequence

import specformer
from specformer.errors import UserError
from specformer.plugins import get_registry
from specformer.spec import Spec, read_spec_file
from specformer.validate import validate_spec

from specformer_train.cache import tokenize_corpus
from specformer_train.checkpointing import clear_checkpoints, latest_checkpoint
from specformer_train.config import TrainConfig
from specformer_train.corpus import find_corpus
from specformer_train.data import EvalRows, PackedRows, split_tokens
from specformer_train.distributed import DistContext, barrier, init_distributed, resolve_mode, shutdown
from specformer_train.overrides import apply_overrides
from specformer_train.tokenization import make_tokenizer
from specformer_train.trainer import Trainer, TrainResult


SpecSource = str | Path | dict[str, Any] | Spec  # what train() accepts as a spec


def load_train_spec(spec: SpecSource, *, overrides: Sequence[str] = (), data: str | None = None,
                    out_dir: str | None = None, steps: int | None = None) -> Spec:
    """The spec with command-line overrides applied, validated again (a SpecError lists every problem)."""
    source = None if isinstance(spec, (dict, Spec)) else str(spec)
    if isinstance(spec, Spec):
        raw = spec.to_dict()
    else:
        raw = dict(spec) if isinstance(spec, dict) else read_spec_file(spec)
    changes = list(overrides)
    # The dedicated flags are spelled as overrides so they are validated the same way.
    changes += [f"train.steps={steps}"] if steps is not None else []
    raw = apply_overrides(raw, changes)
    if raw.get("train") is None:
        raw["train"] = {}
    if isinstance(raw["train"], dict):  # otherwise validation reports the malformed section
        # Paths are set as given, not read as YAML (a directory named "1e3" stays a string).
        raw["train"].update({k: v for k, v in (("data", data), ("out_dir", out_dir)) if v is not None})
    return validate_spec(raw, registry=get_registry(), source=source)


def default_out_dir(spec: SpecSource) -> Path:
    name = "run" if isinstance(spec, (dict, Spec)) else Path(spec).stem
    return Path("runs") / name


def train(spec: SpecSource, *, data: str | None = None, out_dir: str | None = None,
          resume: bool | str | Path = False, overrides: Sequence[str] = (), steps: int | None = None) -> TrainResult:
    """Train the model of ``spec`` (a file, a dict or a :class:`Spec`) on ``data``.

    ``resume`` is True (the run directory's latest checkpoint) or a checkpoint directory;
    ``overrides`` are ``--set`` items (``"train.lr=3e-4"``). Raises :class:`UserError` for
    bad input and :class:`~specformer_train.trainer.TrainingDiverged` on a non-finite loss.
    """
    loaded = load_train_spec(spec, overrides=overrides, data=data, out_dir=out_dir, steps=steps)
    config: TrainConfig = loaded.section("train") or TrainConfig()
    run_dir = Path(config.out_dir) if config.out_dir else default_out_dir(spec)
    ctx = init_distributed(resolve_mode(config.distributed))
    try:
        return _train(loaded, config, run_dir, ctx, resume)
    finally:
        shutdown(ctx)


def _train(spec: Spec, config: TrainConfig, run_dir: Path, ctx: DistContext, resume: bool | str | Path) -> TrainResult:
    say = print if ctx.is_main else (lambda *a, **k: None)
    resume_from = _resume_point(run_dir, resume) if resume else None

    # The first process fills the caches (tokenizer, tokens); the others then find them there.
    corpus = find_corpus(config.data)
    if not ctx.is_main:
        barrier(ctx)
    tokenizer = make_tokenizer(config.tokenizer, vocab_size=spec.model.vocab_size, corpus=corpus,
                               cache=config.cache_dir)
    tokens = tokenize_corpus(corpus, tokenizer, cache=config.cache_dir, progress=ctx.is_main)
    if ctx.is_main:
        barrier(ctx)

    seq_len = config.seq_len or spec.model.context_length
    split = split_tokens(tokens, val_fraction=config.val_fraction, seq_len=seq_len)
    train_rows = PackedRows(split.train, seq_len=seq_len, seed=config.seed)
    val_rows = EvalRows(split.val, seq_len=seq_len) if split.val is not None else None
    model = specformer.build(spec, seed=config.seed)
    trainer = Trainer(model=model, config=config, train_rows=train_rows, val_rows=val_rows, tokenizer=tokenizer,
                      out_dir=run_dir, ctx=ctx)

    # Only now that everything checked out: a fresh start replaces an earlier run's checkpoints.
    if resume_from is None and ctx.is_main:
        removed = clear_checkpoints(run_dir)
        if removed:
            say(f"note: {run_dir} held {removed} checkpoint(s) of an earlier run; starting afresh "
                "(pass --resume to continue it instead)")
        shutil.rmtree(run_dir / "tensorboard", ignore_errors=True)
    barrier(ctx)
    say(_header(spec, config, trainer, corpus_description=corpus.description, n_tokens=len(tokens),
                n_train=len(split.train), n_val=0 if split.val is None else len(split.val), run_dir=run_dir,
                resume_from=resume_from))
    return trainer.fit(resume_from=resume_from)


def _resume_point(run_dir: Path, resume: bool | str | Path) -> Path:
    if resume is True or resume == "latest":
        found = latest_checkpoint(run_dir)
        if found is None:
            raise UserError(f"--resume: {run_dir} has no checkpoint to resume from (looked for "
                            f"{run_dir / 'checkpoints' / 'latest'}); train without --resume first")
        return found
    path = Path(resume)
    if not (path / "trainer.json").is_file():
        raise UserError(f"--resume {str(path)!r}: not a checkpoint directory (no trainer.json); "
                        f"give a {run_dir}/checkpoints/step-N directory or no value for the latest")
    return path


def _header(spec: Spec, config: TrainConfig, trainer: Trainer, *, corpus_description: str, n_tokens: int,
            n_train: int, n_val: int, run_dir: Path, resume_from: Path | None) -> str:
    m = spec.model
    tokens_per_step = trainer.global_batch * trainer.seq_len
    epochs = config.steps * trainer.global_batch / max(1, trainer.train_rows.rows_per_epoch)
    mode = "compiled" if trainer.compiled else "eager"
    extras = [trainer.ctx.mode] if trainer.ctx.enabled else []
    extras += ["activation checkpointing"] if config.activation_checkpointing else []
    lines = [
        f"specformer train -> {run_dir}" + (f" (resuming {resume_from.name})" if resume_from else ""),
        f"  model   {trainer.n_params / 1e6:.2f}M parameters: {m.n_layers} layers, d_model {m.d_model}, "
        f"context {m.context_length}, vocab {m.vocab_size}; {trainer.flops_per_token / 1e6:.1f} MFLOP per trained token",
        f"  data    {corpus_description}: {n_tokens:,} tokens ({config.tokenizer} tokenizer), "
        f"{n_train:,} train / {n_val:,} validation",
        f"  batch   {config.batch_size} x {trainer.seq_len} tokens x {config.grad_accum} accumulation x "
        f"{trainer.ctx.world_size} process(es) = {tokens_per_step:,} tokens/step; {config.steps} steps "
        f"= {epochs:.2f} epochs",
        f"  device  {trainer.device}, {trainer.precision}, {mode}" + "".join(f", {e}" for e in extras)
        + (f"; {trainer.threads} CPU thread(s)" if trainer.threads else ""),
    ]
    return "\n".join(lines)
