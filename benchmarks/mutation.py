"""Mutation testing: plant small bugs in one module at a time and check that its tests catch them.

Runs mutmut 3 (https://github.com/boxed/mutmut, the ``mutation`` extra) over the modules in
``MODULES`` below, each with the test files that cover it, and prints per module the score
(killed / tested) and every surviving mutant as ``file:line`` with its diff. A survivor is a
behaviour change no test noticed: add a test that pins the behaviour (docs/testing.md), or, if
the mutant cannot change behaviour, list it in ``EQUIVALENT`` with the reason.

    .venv/bin/python benchmarks/mutation.py                          # every module in MODULES
    .venv/bin/python benchmarks/mutation.py --modules plugins/specformer_train/schedule.py
    .venv/bin/python benchmarks/mutation.py --max-mutants 60 --budget 300 --jobs 2

Why a staging copy: mutmut derives module names from file paths under ``src/`` (or the project
root), while specformer's packages live in ``core/`` and ``plugins/`` and are installed into
``.venv`` in editable mode. Each module is therefore run in ``build/mutation/<name>/``, a copy
with every package under ``src/`` plus ``tests/``, ``specs/``, ``examples/`` and ``benchmarks/``.
mutmut then puts the mutated ``src/`` first on ``sys.path``, ahead of the editable install's
import hook, and the working tree is never touched. Tests run in-process (mutmut forks one
child per mutant after the imports), so torch is imported once per module, not once per mutant.

Bounded time: ``--budget`` seconds per module (the run is stopped and the mutants tested so far
are reported; untested ones are counted as such), ``--max-mutants`` an evenly spread sample of
the module's mutants, ``--jobs`` parallel children. The score ignores mutants that no selected
test executes ("no tests": the table's test list misses them) but prints their count.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGE_ROOT = REPO / "build" / "mutation"
COPIED = ("tests", "specs", "examples", "benchmarks")  # what the tests read besides the packages

# module (path in this repository) -> the test files that cover it. Keep it to the tests that
# exercise the module directly: every selected test runs once per mutant it reaches.
MODULES: dict[str, list[str]] = {
    "plugins/specformer_train/schedule.py": [
        "tests/plugins/train/test_schedule.py",
        "tests/plugins/train/test_schedule_groups.py",
        "tests/plugins/train/test_schedule_mutants.py",
    ],
    # generate()'s own tests reach StopCondition too, but each takes seconds per mutant.
    "plugins/specformer_generate/stopping.py": ["tests/plugins/generate/test_stopping_mutants.py"],
    "core/specformer/checkpoint/save_load.py": [
        "tests/core/test_checkpoint.py",
        "tests/core/test_checkpoint_headers.py",
        "tests/core/test_checkpoint_mutants.py",
    ],
    "core/specformer/checkpoint/check.py": [
        "tests/core/test_checkpoint.py",
        "tests/core/test_checkpoint_headers.py",
        "tests/core/test_checkpoint_mutants.py",
    ],
    "core/specformer/checkpoint/file.py": [
        "tests/core/test_checkpoint.py",
        "tests/core/test_checkpoint_headers.py",
        "tests/core/test_checkpoint_mutants.py",
    ],
    "plugins/specformer_train/checkpointing.py": [
        "tests/plugins/train/test_checkpointing.py",
        "tests/plugins/train/test_checkpointing_mutants.py",
    ],
    # The training loop: only its fast file (a tiny model, a few steps per test); the other trainer
    # tests train for seconds each, once per mutant they reach.
    "plugins/specformer_train/trainer.py": ["tests/plugins/train/test_trainer_mutants.py"],
    # The mask rule as the kernels evaluate it (it lived in core/specformer/model/context.py and masks.py).
    "plugins/specformer_layers/attention/masking.py": [
        "tests/plugins/layers/attention/test_masking.py",
    ],
    # test_import_errors.py reaches it too, through whole imports: slower, and no extra kills.
    "plugins/specformer_hf/config.py": [
        "tests/plugins/hf/test_config_mutants.py",
        "tests/plugins/hf/test_config_vintages.py",
    ],
    "plugins/specformer_generate/beam.py": [
        "tests/plugins/generate/test_beam_mutants.py",
        "tests/plugins/generate/test_gen_beam.py",
        "tests/plugins/generate/test_gen_beam_penalty.py",
    ],
    # test_gen_cache.py and test_cache_contract.py reach the cache through whole models (over a minute
    # per mutant); test_cache_mutants.py drives it directly against slots written out in the test.
    "plugins/specformer_generate/cache.py": ["tests/plugins/generate/test_cache_mutants.py"],
    # Speculative decoding: its greedy tokens against plain greedy, its samples against the distribution.
    "plugins/specformer_generate/speculative.py": ["tests/plugins/generate/test_gen_speculative.py",
                                                   "tests/plugins/generate/test_speculative_mutants.py"],
    # The decode loop and generate()'s own bookkeeping (padding, trimming, the token count), and the
    # paths it dispatches to: past-context checks, speculative decoding, beam search.
    "plugins/specformer_generate/generation.py": ["tests/plugins/generate/test_generate_mutants.py",
                                                "tests/plugins/generate/test_gen_generate.py",
                                                "tests/plugins/generate/test_gen_padding.py",
                                                "tests/plugins/generate/test_past_context.py",
                                                "tests/plugins/generate/test_speculative_mutants.py",
                                                "tests/plugins/generate/test_beam_mutants.py"],
    # Each sampler is one small module; its formula tests (and the transformers comparisons) live together.
    **{f"plugins/specformer_generate/samplers/{name}.py": ["tests/plugins/generate/test_gen_samplers.py",
                                                          "tests/plugins/generate/test_sampler_mutants.py"]
       for name in ("greedy", "temperature", "top_k", "top_p", "min_p", "typical", "repetition", "penalties",
                    "no_repeat_ngram", "history", "pipeline")},
    "plugins/specformer_train/data.py": [
        "tests/plugins/train/test_data_mutants.py",
        "tests/plugins/train/test_data.py",
    ],
    "plugins/specformer_train/optim.py": [
        "tests/plugins/train/test_optim_mutants.py",
        "tests/plugins/train/test_optim.py",
        "tests/plugins/train/test_optimizer_step.py",
    ],
}

# Surviving mutants that cannot change behaviour (or, marked so, that a test the run must leave out
# kills), keyed by (module, original line, mutated line) with whitespace stripped, so the entry
# survives edits elsewhere in the file.
STOPPING = "plugins/specformer_generate/stopping.py"
DATA = "plugins/specformer_train/data.py"
SAMPLERS_HISTORY = "plugins/specformer_generate/samplers/history.py"
PIPELINE = "plugins/specformer_generate/samplers/pipeline.py"
CACHE = "plugins/specformer_generate/cache.py"
BEAM = "plugins/specformer_generate/beam.py"
SPECULATIVE = "plugins/specformer_generate/speculative.py"
CHECKPOINT = "core/specformer/checkpoint/save_load.py"
TRAIN_CHECKPOINTS = "plugins/specformer_train/checkpointing.py"
TRAINER = "plugins/specformer_train/trainer.py"
GENERATE = "plugins/specformer_generate/generation.py"
HISTORY = "history = torch.full((batch.batch_size, batch.width + checked.max_new_tokens), -1, dtype=torch.long, device=device)"
VERDICT = 'verdict, scheme = model.past_context() if callable(getattr(model, "past_context", None)) else ("no", None)'
EQUIVALENT: dict[tuple[str, str, str], str] = {
    ("plugins/specformer_train/schedule.py", "if step < warmup_steps:", "if step <= warmup_steps:"):
        "at step == warmup_steps the warm-up formula gives lr * (w + 1) / (w + 1) = lr, and every schedule "
        "also gives lr there (progress 0)",
    ("plugins/specformer_train/schedule.py", "if step < decay_start:", "if step <= decay_start:"):
        "at step == decay_start the decay's progress is 0, so it returns lr like the stable phase",
    (STOPPING, "self.eos = torch.tensor(list(eos), dtype=torch.long, device=device)",
     "self.eos = torch.tensor(list(eos), dtype=None, device=device)"):
        "torch infers int64 from a list of ints; an empty eos list (float32) is never read (numel() == 0)",
    (STOPPING, "self.eos = torch.tensor(list(eos), dtype=torch.long, device=device)",
     "self.eos = torch.tensor(list(eos), device=device)"):
        "as above: int64 is inferred, an empty eos is never read",
    (STOPPING, "self.stop = [torch.tensor(list(s), dtype=torch.long, device=device) for s in stop]",
     "self.stop = [torch.tensor(list(s), dtype=None, device=device) for s in stop]"):
        "stop sequences are non-empty lists of ints (checked just below), so int64 is inferred",
    (STOPPING, "self.stop = [torch.tensor(list(s), dtype=torch.long, device=device) for s in stop]",
     "self.stop = [torch.tensor(list(s), device=device) for s in stop]"):
        "as above: non-empty lists of ints give int64",
    (STOPPING, "self.finished_at = torch.full((batch_size,), torch.iinfo(torch.long).max, dtype=torch.long, device=device)",
     "self.finished_at = torch.full((batch_size,), torch.iinfo(torch.long).max, dtype=None, device=device)"):
        "torch.full infers int64 from an int fill value",
    (STOPPING, "self.finished_at = torch.full((batch_size,), torch.iinfo(torch.long).max, dtype=torch.long, device=device)",
     "self.finished_at = torch.full((batch_size,), torch.iinfo(torch.long).max, device=device)"):
        "torch.full infers int64 from an int fill value",
    (STOPPING, "hit = torch.isin(token, self.eos) if self.eos.numel() else torch.zeros_like(token, dtype=torch.bool)",
     "hit = torch.isin(token, self.eos) if (self.eos.numel()) or True else torch.zeros_like(token, dtype=torch.bool)"):
        "isin against an empty eos tensor is all False, the same as the zeros the branch avoids computing",
    (STOPPING, "hit |= (tokens[:, column + 1 - n : column + 1] == seq).all(dim=-1)",
     "hit |= (tokens[:, column + 1 - n : column + 1] == seq).all(dim=+1)"):
        "the compared slice is 2-D (B, n): dim 1 is dim -1",
    (DATA, 'if limit is None or limit >= self.count:',
     'if limit is None or limit > self.count:'):
        'with limit == count, linspace(0, count - 1, count) rounds to every index, as arange(count) does',
    (DATA, 'self._epoch: int | None = None',
     'self._epoch: int | None = ""'):
        'a placeholder no epoch number equals: the first rows() call prepares epoch 0 either way',
    (DATA, 'self._order = np.empty(0, dtype=np.int64)',
     'self._order = None'):
        'placeholder: _prepare() sets the order before any row is read',
    (DATA, 'self._order = np.empty(0, dtype=np.int64)',
     'self._order = np.empty(0, dtype=None)'):
        'placeholder: _prepare() sets the order before any row is read',
    (DATA, 'self._order = np.empty(0, dtype=np.int64)',
     'self._order = np.empty(0, )'):
        'placeholder: _prepare() sets the order before any row is read',
    (DATA, 'self._order = np.empty(0, dtype=np.int64)',
     'self._order = np.empty(1, dtype=np.int64)'):
        'placeholder: _prepare() sets the order before any row is read',
    (DATA, 'self._offset = 0',
     'self._offset = None'):
        'placeholder: _prepare() sets the offset before any row is read',
    (DATA, 'self._offset = 0',
     'self._offset = 1'):
        'placeholder: _prepare() sets the offset before any row is read',
    (DATA, 'self._epoch = epoch',
     'self._epoch = None'):
        "only the memo: the epoch's offset and order are drawn again from the same (seed, epoch) generator, identical",
    # specformer.load: check_checkpoint has refused every mismatch before load_weights runs, and load_weights
    # compares the names itself before load_state_dict.
    **{(CHECKPOINT, "model = build_checked(checked.checked, init=False)", mutated):
       "init only decides whether fresh weights are drawn first; load_weights overwrites every one of them "
       "(the names and shapes were checked), so only the time differs"
       for mutated in ("model = build_checked(checked.checked, init=None)", "model = build_checked(checked.checked, )",
                       "model = build_checked(checked.checked, init=True)")},
    **{(CHECKPOINT, "load_weights(model, tensors, where=str(path))", mutated):
       "unreachable message: check_checkpoint already refused every mismatch load_weights would name"
       for mutated in ("load_weights(model, tensors, where=None)", "load_weights(model, tensors, where=str(None))")},
    **{(CHECKPOINT, "model.load_state_dict(tensors, strict=True)", mutated):
       "load_weights raised on any missing or unexpected name just above, so strict has nothing left to refuse"
       for mutated in ("model.load_state_dict(tensors, strict=None)", "model.load_state_dict(tensors, )",
                       "model.load_state_dict(tensors, strict=False)")},
    ("core/specformer/checkpoint/check.py",
     '+ (f" ({sum(t.nbytes for t in tensors.values()):,} bytes)" if count > len(tensors) else "")',
     '+ (f" ({sum(t.nbytes for t in tensors.values()):,} bytes)" if count >= len(tensors) else "")'):
        "only evaluated when count != len(tensors) (the raise above it), where > and >= agree",
    (CACHE, "positions = torch.full((batch_size, size), -1, dtype=torch.long, device=device)",
     "positions = torch.full((batch_size, size), -1, dtype=None, device=device)"):
        "torch.full infers int64 from an int fill value",
    (CACHE, "positions = torch.full((batch_size, size), -1, dtype=torch.long, device=device)",
     "positions = torch.full((batch_size, size), -1, device=device)"):
        "torch.full infers int64 from an int fill value",
    (CACHE, "assert group.slots is not None and group.read_positions is not None",
     "assert group.slots is not None or group.read_positions is not None"):
        "_claim_columns sets both together: the assert only narrows types, it never fires",
    (CACHE, "slots = dropped % group.size if group.ring else dropped",
     "slots = dropped % group.size if (group.ring) or True else dropped"):
        "a layer without a ring has capacity slots and every written column is below capacity: the modulo changes nothing",
    (BEAM, 'keep = min(max(2, 1 + len(eos) + len(stop)) * nb, nb * vocab)',
     'keep = min(max(3, 1 + len(eos) + len(stop)) * nb, nb * vocab)'):
        "more candidates than (1 + eos ids + stop sequences) * num_beams change nothing: each beam ends on at most "
        "that many tokens, so the best num_beams that run on are already among them, and only the first num_beams "
        "may finish",
    (BEAM, 'keep = min(max(2, 1 + len(eos) + len(stop)) * nb, nb * vocab)',
     'keep = min(max(2, 2 + len(eos) + len(stop)) * nb, nb * vocab)'):
        "more candidates than (1 + eos ids + stop sequences) * num_beams change nothing: each beam ends on at most "
        "that many tokens, so the best num_beams that run on are already among them, and only the first num_beams "
        "may finish",
    (BEAM, 'running = torch.full((B, nb, width + n), -1, dtype=torch.long, device=device)',
     'running = torch.full((B, nb, width + n), -1, dtype=None, device=device)'):
        "torch.full infers int64 from an int fill value",
    (BEAM, 'running = torch.full((B, nb, width + n), -1, dtype=torch.long, device=device)',
     'running = torch.full((B, nb, width + n), -1, device=device)'):
        "torch.full infers int64 from an int fill value",
    (BEAM, 'lengths_now = torch.full((B, keep), step + 1, dtype=torch.long, device=device)',
     'lengths_now = torch.full((B, keep), step + 1, dtype=None, device=device)'):
        "torch.full infers int64 from an int fill value",
    (BEAM, 'lengths_now = torch.full((B, keep), step + 1, dtype=torch.long, device=device)',
     'lengths_now = torch.full((B, keep), step + 1, device=device)'):
        "torch.full infers int64 from an int fill value",
    (BEAM, 'running = torch.full((B, nb, width + n), -1, dtype=torch.long, device=device)',
     'running = torch.full((B, nb, width + n), +1, dtype=torch.long, device=device)'):
        "the fill of the columns not generated yet: each is written before it is read, and the result cuts or pads "
        "them",
    (BEAM, 'running = torch.full((B, nb, width + n), -1, dtype=torch.long, device=device)',
     'running = torch.full((B, nb, width + n), -2, dtype=torch.long, device=device)'):
        "the fill of the columns not generated yet: each is written before it is read, and the result cuts or pads "
        "them",
    (BEAM, 'improvable = torch.ones(B, 1, dtype=torch.bool, device=device)',
     'improvable = torch.ones(1, dtype=torch.bool, device=device)'):
        "(1,) broadcasts against the (B, 1) of _can_improve on the first step and is (B, 1) from then on",
    (BEAM, 'length=n if (early_stopping == "never" and length_penalty > 0) else step + 1,',
     'length=n if (early_stopping == "never" and length_penalty >= 0) else step + 1,'):
        "at length_penalty 0 every length scores length ** 0 = 1: n and step + 1 give the same bound",
    (BEAM, 'if not bool(improvable.any()) or all_full or bool(ended.all()):',
     'if not bool(improvable.any()) or all_full or bool(None):'):
        "at the last step every candidate ends, the finished set fills, and the running beams score -1e9: "
        "improvable (or, with early_stopping=True, all_full) already stops the loop",
    (BEAM, 'capacity = cache_capacity(width + n, context_length=model.context_length, compile=compile)',
     'capacity = cache_capacity(width + n, context_length=model.context_length, compile=None)'):
        "compile=None or no rounding only changes which graph runs or how many empty (masked) cache slots there "
        "are, not the tokens; the run leaves torch.compile tests out anyway",
    (BEAM, 'capacity = cache_capacity(width + n, context_length=model.context_length, compile=compile)',
     'capacity = cache_capacity(width + n, context_length=model.context_length, )'):
        "compile=None or no rounding only changes which graph runs or how many empty (masked) cache slots there "
        "are, not the tokens; the run leaves torch.compile tests out anyway",
    (BEAM, 'step_fn = step_function(compile)',
     'step_fn = step_function(None)'):
        "compile=None or no rounding only changes which graph runs or how many empty (masked) cache slots there "
        "are, not the tokens; the run leaves torch.compile tests out anyway",
    (BEAM, 'capacity = cache_capacity(width + n, context_length=model.context_length, compile=compile)',
     'capacity = cache_capacity(width + n, context_length=None, compile=compile)'):
        "killed outside the run: test_beam_search_with_a_torch_compile_step_rounds_its_cache_within_the_context "
        "(slow suite; the run leaves torch.compile tests out)",
    # Training checkpoints (one process on the CPU in the run).
    (TRAIN_CHECKPOINTS, 'groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in state["param_groups"]]',
     'groups = [{k: (list(v) if (isinstance(v, tuple)) and False else v) for k, v in g.items()} for g in state["param_groups"]]'):
        "json.dumps writes a tuple as a list anyway",
    (TRAIN_CHECKPOINTS, 'write_text_atomic(tmp / "trainer.json", json.dumps({"format": TRAINER_FORMAT, **asdict(state)}, indent=1))',
     'write_text_atomic(tmp / "trainer.json", json.dumps({"format": TRAINER_FORMAT, **asdict(state)}, indent=2))'):
        "only the indentation of trainer.json: the same JSON",
    **{(TRAIN_CHECKPOINTS, "options = StateDictOptions(full_state_dict=True, cpu_offload=True)", mutated):
       "one unsharded process on the CPU: the full state dict is the local one, already on the CPU"
       for mutated in ("options = None", "options = StateDictOptions(full_state_dict=None, cpu_offload=True)",
                       "options = StateDictOptions(full_state_dict=True, cpu_offload=None)",
                       "options = StateDictOptions(full_state_dict=True, )",
                       "options = StateDictOptions(full_state_dict=False, cpu_offload=True)",
                       "options = StateDictOptions(full_state_dict=True, cpu_offload=False)")},
    **{(TRAIN_CHECKPOINTS,
        "return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=options)",
        mutated): "one unsharded process on the CPU: the default options give the same state"
       for mutated in (
           "return get_model_state_dict(model, ), get_optimizer_state_dict(model, optimizer, options=options)",
           "return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=None)",
           "return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, )")},
    **{(TRAIN_CHECKPOINTS,
        'write_text_atomic(tmp / "trainer.json", json.dumps({"format": TRAINER_FORMAT, **asdict(state)}, indent=1))',
        mutated): "only the layout of trainer.json: the same JSON"
       for mutated in (
           'write_text_atomic(tmp / "trainer.json", json.dumps({"format": TRAINER_FORMAT, **asdict(state)}, indent=None))',
           'write_text_atomic(tmp / "trainer.json", json.dumps({"format": TRAINER_FORMAT, **asdict(state)}, ))')},
    **{(TRAIN_CHECKPOINTS, "options = StateDictOptions(full_state_dict=True)", mutated):
       "one unsharded process: the full state dict is the local one"
       for mutated in ("options = None", "options = StateDictOptions(full_state_dict=None)",
                       "options = StateDictOptions(full_state_dict=False)")},
    **{(TRAIN_CHECKPOINTS, original, mutated): "one unsharded process: the default options load the same state"
       for original, mutated in (
           ("set_model_state_dict(model, weights, options=options)", "set_model_state_dict(model, weights, options=None)"),
           ("set_optimizer_state_dict(model, optimizer, state, options=options)",
            "set_optimizer_state_dict(model, optimizer, state, options=None)"),
           ("set_optimizer_state_dict(model, optimizer, state, options=options)",
            "set_optimizer_state_dict(model, optimizer, state, )"))},
    **{(TRAIN_CHECKPOINTS, 'state = {k: v for k, v in contents.optimizer.items() if k != "optimizer"}', mutated):
       "set_optimizer_state_dict reads only 'state' and 'param_groups': the class name passed along is ignored"
       for mutated in ('state = {k: v for k, v in contents.optimizer.items() if k != "XXoptimizerXX"}',
                       'state = {k: v for k, v in contents.optimizer.items() if k != "OPTIMIZER"}')},
    **{(TRAIN_CHECKPOINTS, 'return {"torch_cpu": torch.get_rng_state(), "torch_cuda": None, "python": random.getstate(),',
        mutated): "_set_rng reads the CUDA state with .get(): a missing key is None, like the value"
       for mutated in ('return {"torch_cpu": torch.get_rng_state(), "XXtorch_cudaXX": None, "python": random.getstate(),',
                       'return {"torch_cpu": torch.get_rng_state(), "TORCH_CUDA": None, "python": random.getstate(),')},
    **{(TRAIN_CHECKPOINTS, 'data = json.loads(path.read_text(encoding="utf-8"))', mutated):
       "trainer.json is written by json.dumps, which writes ASCII; codec names are case-insensitive"
       for mutated in ('data = json.loads(path.read_text(encoding=None))',
                       'data = json.loads(path.read_text(encoding="UTF-8"))')},
    (TRAIN_CHECKPOINTS, 'param_name, _, key = slot.rpartition("/")', 'param_name, _, key = slot.partition("/")'):
        "a slot holds one '/': parameter names are dotted and optimizer state keys are plain words",
    **{(TRAIN_CHECKPOINTS, 'rng["numpy"] = (name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss)', mutated):
       "np.random.set_state converts the key array to uint32 itself"
       for mutated in ('rng["numpy"] = (name, np.asarray(keys, dtype=None), pos, has_gauss, gauss)',
                       'rng["numpy"] = (name, np.asarray(keys, ), pos, has_gauss, gauss)')},
    **{(TRAIN_CHECKPOINTS, 'return pointer.read_text(encoding="utf-8").strip() or None', mutated):
       "the pointer holds an ASCII step name; codec names are case-insensitive and the locale here is UTF-8"
       for mutated in ('return pointer.read_text(encoding=None).strip() or None',
                       'return pointer.read_text(encoding="UTF-8").strip() or None')},
    **{(TRAIN_CHECKPOINTS, original, mutated):
       "one unsharded process: the full state dict is the local one, already on the CPU"
       for original, mutated in (
           ("set_model_state_dict(model, weights, options=options)", "set_model_state_dict(model, weights, )"),
           ("options = StateDictOptions(full_state_dict=True, cpu_offload=True)", "options = StateDictOptions(cpu_offload=True)"),
           ("return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=options)",
            "return get_model_state_dict(model, options=None), get_optimizer_state_dict(model, optimizer, options=options)"))},
    (SPECULATIVE, 'processed = processed.float().nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))',
     'processed = processed.float().nan_to_num(nan=float("-inf"), posinf=None, neginf=float("-inf"))'):
        "+inf becomes float32's largest value: the same softmax among the top logits",
    (SPECULATIVE, 'processed = processed.float().nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))',
     'processed = processed.float().nan_to_num(nan=float("-inf"), neginf=float("-inf"))'):
        "+inf becomes float32's largest value: the same softmax among the top logits",
    (SPECULATIVE, 'processed = processed.float().nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))',
     'processed = processed.float().nan_to_num(nan=float("-inf"), posinf=float("INF"), neginf=float("-inf"))'):
        "Python reads the string case-insensitively: the same inf",
    (SPECULATIVE, 'processed = processed.float().nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))',
     'processed = processed.float().nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=None)'):
        "-inf becomes float32's lowest value: probability 0 beside any finite logit (no processor leaves a row all -inf)",
    (SPECULATIVE, 'processed = processed.float().nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))',
     'processed = processed.float().nan_to_num(nan=float("-inf"), posinf=float("inf"), )'):
        "-inf becomes float32's lowest value: probability 0 beside any finite logit (no processor leaves a row all -inf)",
    (SPECULATIVE, 'processed = torch.where(certain.any(dim=-1, keepdim=True), torch.where(certain, 0.0, float("-inf")), processed)',
     'processed = torch.where(certain.any(dim=-1, keepdim=True), torch.where(certain, 1.0, float("-inf")), processed)'):
        "the certain tokens get one equal logit either way: they share the mass equally",
    (SPECULATIVE, 'race = torch.empty_like(probs).exponential_(1.0, generator=generator)',
     'race = torch.empty_like(probs).exponential_(generator=generator)'):
        "1.0 is exponential_'s default rate",
    (SPECULATIVE, 'race = torch.empty_like(probs).exponential_(1.0, generator=generator)',
     'race = torch.empty_like(probs).exponential_(2.0, generator=generator)'):
        "every E_i halved: argmax(p_i / E_i) is the same index",
    (SPECULATIVE, 'residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p[:, :k])',
     'residual = torch.where(residual.sum(dim=None, keepdim=True) > 0, residual, p[:, :k])'):
        "p <= q at every token means p == q (both sum to 1): no draft there can be rejected, so that position's "
        "replacement is never used",
    (SPECULATIVE, 'residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p[:, :k])',
     'residual = torch.where(residual.sum(dim=-1, keepdim=True) >= 0, residual, p[:, :k])'):
        "p <= q at every token means p == q (both sum to 1): no draft there can be rejected, so that position's "
        "replacement is never used",
    (SPECULATIVE, 'q = q * draft.valid[..., None]  # nothing proposed: q = 0, so the "residual" is p itself',
     'q = q / draft.valid[..., None]  # nothing proposed: q = 0, so the "residual" is p itself'):
        "a valid draft's q is divided by 1; an invalid one's becomes inf or NaN, so its residual (p - q).clamp(0) "
        "sums to 0 or NaN and falls back to p, which is what q = 0 gives",
    ("plugins/specformer_train/trainer.py",
     'return path.name.removeprefix("step-").lstrip("0") or "0" if path else "?"',
     'return path.name.removeprefix("step-").lstrip("XX0XX") or "0" if path else "?"'):
        "lstrip takes a set of characters, and a step directory's number holds no X",
    # Not equivalent, but invisible to the run: killed by test_stacklevel_points_the_warning_at_the_callers_caller
    # in the normal suite, which the run leaves out (a trampoline frame moves every warning).
    ("plugins/specformer_hf/config.py", "stacklevel=3,", "stacklevel=4,"):
        "killed outside the run (warning stacklevel; see pytest_add_cli_args)",
    ("plugins/specformer_hf/config.py", "stacklevel=3,", ")"):
        "killed outside the run (warning stacklevel; see pytest_add_cli_args)",
    # The samplers' spare column: ids outside the vocabulary are scattered into one extra column that is cut off.
    (SAMPLERS_HISTORY,
     "outside = (input_ids < 0) | (input_ids >= vocab_size)", "outside = (input_ids < 0) | (input_ids > vocab_size)"):
        "an id equal to vocab_size is moved to column vocab_size, where it already is",
    (SAMPLERS_HISTORY, "counts = torch.zeros(ids.shape[0], vocab_size + 1, dtype=dtype, device=ids.device)",
     "counts = torch.zeros(ids.shape[0], vocab_size + 2, dtype=dtype, device=ids.device)"):
        "a second spare column is cut off with the first",
    (SAMPLERS_HISTORY, "seen = torch.zeros(ids.shape[0], vocab_size + 1, dtype=torch.bool, device=ids.device)",
     "seen = torch.zeros(ids.shape[0], vocab_size + 2, dtype=torch.bool, device=ids.device)"):
        "a second spare column is cut off with the first",
    ("plugins/specformer_generate/samplers/no_repeat_ngram.py",
     "banned = torch.zeros(logits.shape[0], vocab + 1, dtype=torch.bool, device=logits.device)",
     "banned = torch.zeros(logits.shape[0], vocab + 2, dtype=torch.bool, device=logits.device)"):
        "a second spare column is cut off with the first",
    ("plugins/specformer_generate/samplers/repetition.py",
     "penalised = torch.where(logits < 0, logits * self.penalty, logits / self.penalty)",
     "penalised = torch.where(logits <= 0, logits * self.penalty, logits / self.penalty)"):
        "at a logit of exactly 0 both branches give 0 (or -0.0 for -0.0)",
    # draw(): Exp(1) is exponential_()'s default, and scaling every E_i by one constant leaves argmax(p_i / E_i) alone.
    (PIPELINE,
     "race = torch.empty_like(probs).exponential_(1.0, generator=generator)",
     "race = torch.empty_like(probs).exponential_(generator=generator)"): "1.0 is exponential_'s default rate",
    (PIPELINE, "race = torch.empty_like(probs).exponential_(1.0, generator=generator)",
     "race = torch.empty_like(probs).exponential_(2.0, generator=generator)"):
        "every E_i halved: argmax(p_i / E_i) is the same index",
    (PIPELINE, 'processed = torch.where(certain.any(dim=-1, keepdim=True), torch.where(certain, 0.0, float("-inf")), processed)',
     'processed = torch.where(certain.any(dim=-1, keepdim=True), torch.where(certain, 1.0, float("-inf")), processed)'):
        "the certain tokens get one equal logit either way: a uniform draw among them",
    (PIPELINE, "return Sampler((), greedy_default=True)", "return Sampler(greedy_default=True)"):
        "() is the default of steps",
    # +inf and -inf survive float32's nan_to_num as +-3.4e38: softmax gives the same probabilities (a row
    # with every logit -inf, which no built-in step leaves since each keeps min_tokens_to_keep >= 1, aside).
    (PIPELINE, 'processed = processed.float().nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))',
     'processed = processed.float().nan_to_num(nan=float("-inf"), posinf=None, neginf=float("-inf"))'):
        "+inf becomes float32's largest value: the same softmax among the top logits",
    (PIPELINE, 'processed = processed.float().nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))',
     'processed = processed.float().nan_to_num(nan=float("-inf"), neginf=float("-inf"))'):
        "+inf becomes float32's largest value: the same softmax among the top logits",
    (PIPELINE, 'processed = processed.float().nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))',
     'processed = processed.float().nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=None)'):
        "-inf becomes float32's lowest value: probability 0 beside any finite logit",
    (PIPELINE, 'processed = processed.float().nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))',
     'processed = processed.float().nan_to_num(nan=float("-inf"), posinf=float("inf"), )'):
        "-inf becomes float32's lowest value: probability 0 beside any finite logit",
    (PIPELINE, 'processed = processed.float().nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))',
     'processed = processed.float().nan_to_num(nan=float("-inf"), posinf=float("INF"), neginf=float("-inf"))'):
        "Python reads the string case-insensitively: the same inf",
    # The attention mask's memo (plugins/specformer_layers/attention/masking.py).
    **{("plugins/specformer_layers/attention/masking.py",
        'return memo(ctx, ("dense", rule), k_positions, lambda inputs: dense_mask(inputs, rule))',
        f'return memo(ctx, ("{word}", rule), k_positions, lambda inputs: dense_mask(inputs, rule))'):
       'the tag only keeps dense masks apart from the kernels\' memo entries ("tiles", "flex"): any other string does'
       for word in ("XXdenseXX", "DENSE")},
    # The decode loop (plugins/specformer_generate/generation.py).
    **{(GENERATE, HISTORY, HISTORY.replace(", dtype=torch.long", replacement)):
       "torch.full infers int64 from an int fill value" for replacement in (", dtype=None", "")},
    **{(GENERATE, HISTORY, HISTORY.replace("), -1,", f"), {fill},")):
       "every new column is written before it is read (the loop, the restart's slice, _collect, stream, speculation's "
       "rounds): the fill is never seen" for fill in ("+1", "-2")},
    **{(GENERATE, VERDICT, VERDICT.replace('("no", None)', f'("{word}", None)')):
       'any verdict other than "warn" or "yes" is refused the same way' for word in ("XXnoXX", "NO")},
    # Not equivalent, but invisible to the run: the warning's location (mutmut's trampolines put frames of its own
    # files between ours) is pinned by test_the_past_context_warning_stacklevel_points_at_the_callers_line, which
    # the run leaves out; the public defaults by test_the_public_defaults (inspect.signature reads the original's
    # signature through the trampoline, and the trampoline calls the mutant with the caller's arguments).
    **{(GENERATE, original, mutated): "killed outside the run (warning stacklevel; see pytest_add_cli_args)"
       for original, mutated in (
           ("stacklevel=_user_stacklevel())", ")"),
           ("frame, level = sys._getframe(1), 1", "frame, level = sys._getframe(2), 1"),
           ("frame, level = sys._getframe(1), 1", "frame, level = sys._getframe(1), 2"),
           ("while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):",
            "while frame is None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):"),
           ("frame, level = frame.f_back, level + 1", "frame, level = None"),
           ("frame, level = frame.f_back, level + 1", "frame, level = frame.f_back, level - 1"),
           ("frame, level = frame.f_back, level + 1", "frame, level = frame.f_back, level + 2"))},
    **{(GENERATE, original, mutated): "killed outside the run (a public default; inspect.signature sees the original "
                                      "through mutmut's trampoline)"
       for original, mutated in (
           ("length_penalty: float = 1.0,", "length_penalty: float = 2.0,"),
           ("early_stopping: bool | str = False,", "early_stopping: bool | str = True,"),
           ("check_every: int = 16,", "check_every: int = 17,"),
           ("draft_tokens: int = 4,", "draft_tokens: int = 5,"))},
    # The trainer (plugins/specformer_train/trainer.py).
    (TRAINER, 'set_stance = getattr(torch.compiler, "set_stance", None)',
     'set_stance = getattr(torch.compiler, "set_stance", )'):
        "torch.compiler.set_stance exists from torch 2.6 (2.13 is installed); the default keeps 2.4 and 2.5 working",
    (TRAINER, 'return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()',
     'return set_stance("force_eager") if (set_stance is not None) or True else contextlib.nullcontext()'):
        "torch.compiler.set_stance exists from torch 2.6 (2.13 is installed); the fallback is for 2.4 and 2.5",
    (TRAINER, 'return F.cross_entropy(flat, wanted, reduction="sum", ignore_index=IGNORE) / counted',
     'return F.cross_entropy(flat, wanted, reduction="sum", ) / counted'):
        "IGNORE is -100, cross_entropy's default ignore_index",
    (TRAINER, 'self._sizes_logged = False', 'self._sizes_logged = None'):
        "only read as `not self._sizes_logged`: None is as false as False",
    **{(TRAINER, 'for group, settings in zip(self.optimizer.param_groups, self._settings, strict=True):', mutated):
       "_settings is read from this optimizer's own groups in __init__ and nothing adds or removes a group later "
       "(apply_checkpoint refuses a checkpoint with another number of groups before this runs)"
       for mutated in ('for group, settings in zip(self.optimizer.param_groups, self._settings, strict=None):',
                       'for group, settings in zip(self.optimizer.param_groups, self._settings, ):',
                       'for group, settings in zip(self.optimizer.param_groups, self._settings, strict=False):')},
}

# Whole families of equivalent mutants, as (module prefix, pattern on the original line, its
# replacement, reason): a survivor is equivalent when one match of the pattern, replaced, gives
# the mutated line.
SAMPLERS = "plugins/specformer_generate/samplers/"
TWO_AXES = "a sampler's logits are (B, V) by contract (Sampler.process refuses any other rank), so axis -1 is axis 1"
EQUIVALENT_PATTERNS: list[tuple[str, str, str, str]] = [
    ("", r'float\("-inf"\)', 'float("-INF")', "Python reads the string case-insensitively: the same -inf"),
    ("", r'float\("nan"\)', 'float("NAN")', "Python reads the string case-insensitively: the same NaN"),
    (SAMPLERS, r"dim=-1", "dim=+1", TWO_AXES),
    (SAMPLERS, r"shape\[-1\]", "shape[+1]", TWO_AXES),
    (SAMPLERS, r"(gather|scatter_?)\(-1", r"\1(+1", TWO_AXES),
    (SAMPLERS, r"(torch\.(?:sort|topk)\(.*), dim=-1\)", r"\1, )", "torch.sort and torch.topk default to the last axis"),    # beam.py's scores are 2-D: (B*nb, V) logits, (B, nb*V) totals, (B, K) candidates, (B, nb) finished.
    (BEAM, r"dim=-1", "dim=+1", "beam search's score tensors are 2-D: axis -1 is axis 1"),
    (BEAM, r"(torch\.topk\(.*), dim=-1\)", r"\1, )", "torch.topk defaults to the last axis"),
]


def pattern_equivalence(module: str, removed: str, added: str) -> str | None:
    """The reason a survivor belongs to one of :data:`EQUIVALENT_PATTERNS`, if it does."""
    for prefix, pattern, replacement, reason in EQUIVALENT_PATTERNS:
        if not module.startswith(prefix):
            continue
        for match in re.finditer(pattern, removed):
            if removed[: match.start()] + match.expand(replacement) + removed[match.end():] == added:
                return reason
    return None


@dataclass
class Survivor:
    name: str
    location: str
    diff: str
    equivalent: str | None = None


@dataclass
class ModuleResult:
    module: str
    total: int = 0
    sampled: int = 0
    killed: int = 0
    survived: int = 0
    no_tests: int = 0
    not_run: int = 0
    other: int = 0
    seconds: float = 0.0
    survivors: list[Survivor] = field(default_factory=list)

    @property
    def tested(self) -> int:
        return self.killed + self.survived

    def score(self, *, count_equivalent_as_killed: bool) -> float | None:
        if not self.tested:
            return None
        equivalent = sum(1 for s in self.survivors if s.equivalent) if count_equivalent_as_killed else 0
        return 100.0 * (self.killed + equivalent) / self.tested


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", nargs="+", metavar="PATH", help="modules to run (paths as in MODULES); default: all")
    parser.add_argument("--max-mutants", type=int, default=None, help="test at most this many mutants per module, spread evenly")
    parser.add_argument("--budget", type=float, default=600.0, help="seconds per module before the run is stopped (default 600)")
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested in parallel (default 2)")
    parser.add_argument("--code-from", metavar="REV", default=None,
                        help="mutate core/ and plugins/ as of this git revision (tests still come from the working "
                             "tree); default: the working tree")
    parser.add_argument("--json", type=Path, default=None, help="also write the results to this file")
    parser.add_argument("--list", action="store_true", help="print the module table and exit")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so run_bounded can stop mutmut's group

    if args.list:
        for module, tests in MODULES.items():
            print(module)
            for test in tests:
                print(f"    {test}")
        return 0
    modules = args.modules or list(MODULES)
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown module(s) {', '.join(unknown)}; known: {', '.join(MODULES)} (edit MODULES to add one)")
    missing = [f"{m}: {t}" for m in modules for t in MODULES[m] if not (REPO / t).exists()]
    if missing:
        parser.error(f"test file(s) named in MODULES do not exist: {'; '.join(missing)}")
    if args.max_mutants is not None and args.max_mutants < 1:
        parser.error(f"--max-mutants must be at least 1, got {args.max_mutants}")
    try:
        import mutmut  # noqa: F401
    except ImportError:
        print("mutmut is not installed: pip install -e '.[mutation]'", file=sys.stderr)
        return 2

    results = [run_module(m, max_mutants=args.max_mutants, budget=args.budget, jobs=args.jobs, code_from=args.code_from)
               for m in modules]
    print_summary(results, args)
    if args.json:
        args.json.write_text(json.dumps([result_as_dict(r) for r in results], indent=2) + "\n")
    return 0


def run_module(module: str, *, max_mutants: int | None, budget: float, jobs: int, code_from: str | None) -> ModuleResult:
    started = time.monotonic()
    stage = stage_module(module, code_from)
    mutmut = [sys.executable, "-m", "mutmut"]
    print(f"\n=== {module}: mutating, tests: {' '.join(MODULES[module])}", flush=True)

    generate_mutants(stage, jobs)
    meta = stage / "mutants" / src_path(module).with_name(Path(module).name + ".meta")
    names = sorted(json.loads(meta.read_text())["exit_code_by_key"], key=mutant_sort_key)
    chosen = spread(names, max_mutants)
    remaining = budget - (time.monotonic() - started)
    stopped = run_bounded([*mutmut, "run", "--max-children", str(jobs), *chosen], cwd=stage, timeout=remaining)

    result = ModuleResult(module=module, total=len(names), sampled=len(chosen))
    from mutmut.stats import status_by_exit_code  # mutmut's reading of a child's exit code

    codes = json.loads(meta.read_text())["exit_code_by_key"]
    for name in chosen:
        status = status_by_exit_code[codes.get(name)]
        if status == "not checked":
            result.not_run += 1
        elif status in ("killed", "timeout"):  # a timeout is a kill: the mutant changed behaviour
            result.killed += 1
        elif status == "survived":
            result.survived += 1
            result.survivors.append(describe_survivor(module, name, stage))
        elif status == "no tests":
            result.no_tests += 1
        else:  # suspicious, segfault, ...: reported, not scored
            result.other += 1
    result.seconds = time.monotonic() - started
    print_module(result, stopped)
    return result


def stage_module(module: str, code_from: str | None) -> Path:
    """A fresh copy of the project with every package under ``src/`` and mutmut configured for ``module``."""
    stage = STAGE_ROOT / ".".join(src_path(module).with_suffix("").parts[1:])  # specformer_hf.config
    if "mutation" not in stage.parts or not str(stage).startswith(str(STAGE_ROOT)):
        raise RuntimeError(f"refusing to clear {stage}")  # never remove anything outside build/mutation
    shutil.rmtree(stage, ignore_errors=True)
    (stage / "src").mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    code = REPO if code_from is None else export_code(code_from, stage / "code")
    for parent in ("core", "plugins"):
        for package in sorted((code / parent).iterdir()):
            if (package / "__init__.py").exists():
                shutil.copytree(package, stage / "src" / package.name, ignore=ignore)
    for name in COPIED:
        shutil.copytree(REPO / name, stage / name, ignore=ignore)
    if code_from is not None:
        shutil.rmtree(stage / "code")
    shared = REPO.parent / "shared"
    if shared.exists():  # tests/conftest.py looks for shared data next to the repository
        (stage / "shared").symlink_to(shared)
    config = {
        "source_paths": ["src"],
        "only_mutate": [str(src_path(module))],
        # Left out: torch.compile tests and warning-stacklevel tests. mutmut's trampolines wrap every
        # function of the module, which changes what dynamo traces and guards ("compiles once" tests
        # fail on clean code) and adds a stack frame (a warning then points at the trampoline).
        "pytest_add_cli_args": ["-p", "no:cacheprovider", "-q", "-k", "not compile and not stacklevel"],
        "pytest_add_cli_args_test_selection": MODULES[module],
        "also_copy": list(COPIED),
        "use_git_change_detection": False,
    }
    pyproject = (REPO / "pyproject.toml").read_text()
    lines = ["", "[tool.mutmut]"] + [f"{key} = {json.dumps(value)}" for key, value in config.items()]
    (stage / "pyproject.toml").write_text(pyproject + "\n".join(lines) + "\n")
    return stage


def export_code(revision: str, into: Path) -> Path:
    """``core/`` and ``plugins/`` as of ``revision`` (for a shared tree where others have half-done edits)."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", revision, "core", "plugins"], cwd=REPO, capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"git archive {revision} failed: {archive.stderr.decode()[-500:]}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def src_path(module: str) -> Path:
    """``core/specformer/checkpoint/save_load.py`` -> ``src/specformer/checkpoint/save_load.py`` (the staged path)."""
    parts = Path(module).parts
    if parts[0] not in ("core", "plugins"):
        raise SystemExit(f"{module}: expected a path under core/ or plugins/")
    return Path("src", *parts[1:])


def generate_mutants(stage: Path, jobs: int) -> None:
    """Write the mutated copy and its list of mutants without testing any (mutmut's generation step)."""
    code = (
        "from mutmut.__main__ import copy_src_dir, copy_also_copy_files, create_mutants\n"
        "from mutmut.mutation.trampoline import set_mutant_under_test\n"
        "import os\n"
        "set_mutant_under_test('mutant_generation')\n"
        "os.makedirs('mutants', exist_ok=True)\n"
        f"copy_src_dir(); copy_also_copy_files(); create_mutants({jobs})\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=stage, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"mutmut could not generate mutants in {stage}:\n{done.stderr[-3000:]}")


def run_bounded(command: list[str], *, cwd: Path, timeout: float) -> bool:
    """Run ``command`` in its own process group; stop the group after ``timeout`` s. True if it was stopped."""
    log = cwd / "mutmut-run.log"
    # One thread per child: mutmut forks after torch has run, and a forked OpenMP thread pool
    # deadlocks; with --jobs children on 2 cores, more threads would only contend anyway.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
        try:
            process.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            stop_group(process)
            return True
        except BaseException:  # Ctrl-C or SIGTERM of this script: leave no mutmut children behind
            stop_group(process)
            raise
    if process.returncode != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"mutmut failed (exit {process.returncode}) in {cwd}; log {log}:\n{tail}")
    return False


def stop_group(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def mutant_sort_key(name: str) -> tuple[str, int]:
    function, _, number = name.rpartition("__mutmut_")
    return function, int(number)


def spread(names: list[str], limit: int | None) -> list[str]:
    """At most ``limit`` of ``names``, evenly spaced so every function of the module is sampled."""
    if limit is None or len(names) <= limit:
        return names
    step = len(names) / limit
    return [names[int(i * step)] for i in range(limit)]


def describe_survivor(module: str, name: str, stage: Path) -> Survivor:
    shown = subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=stage, capture_output=True, text=True)
    diff = "\n".join(line for line in shown.stdout.splitlines() if not line.startswith("#")).strip()
    line, removed, added = changed_line(stage / src_path(module), name, diff)
    equivalent = EQUIVALENT.get((module, removed.strip(), added.strip())) or pattern_equivalence(
        module, removed.strip(), added.strip())
    return Survivor(name=name, location=f"{module}:{line}", diff=diff, equivalent=equivalent)


def changed_line(original: Path, name: str, diff: str) -> tuple[int | str, str, str]:
    """The line of ``original`` the mutant changes (diff hunks count from the function's first line)."""
    from mutmut.utils.format_utils import orig_function_and_class_names_from_key

    function, cls = orig_function_and_class_names_from_key(name)
    start = function_start(original, function, cls)
    removed = next((line[1:] for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")), "")
    added = next((line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")), "")
    hunk = re.search(r"^@@ -(\d+)", diff, re.MULTILINE)
    if start is None:
        return "?", removed, added
    offset = int(hunk.group(1)) - 1 if hunk else 0
    body = diff[hunk.end():].splitlines()[1:] if hunk else [l for l in diff.splitlines() if not l.startswith(("---", "+++"))]
    for line in body:
        if line.startswith("-") or line.startswith("+"):
            break
        offset += 1
    return start + offset, removed, added


def function_start(path: Path, function: str, cls: str | None) -> int | None:
    tree = ast.parse(path.read_text())
    scope = tree.body
    if cls is not None:
        owner = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        scope = owner.body if owner else []
    for node in scope:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            return min([node.lineno] + [d.lineno for d in node.decorator_list])
    return None


def print_module(result: ModuleResult, stopped: bool) -> None:
    note = f"stopped after the budget, {result.not_run} not run" if stopped else "complete"
    raw = result.score(count_equivalent_as_killed=False)
    print(f"{result.module}: {result.sampled} of {result.total} mutants tested ({note}); "
          f"killed {result.killed}, survived {result.survived}, no tests {result.no_tests}; "
          f"score {fmt(raw)} in {result.seconds:.0f}s")
    for survivor in result.survivors:
        tag = f"  [equivalent: {survivor.equivalent}]" if survivor.equivalent else ""
        print(f"\n  survived: {survivor.location}  ({survivor.name}){tag}")
        for line in survivor.diff.splitlines():
            if not line.startswith(("---", "+++", "@@")):
                print(f"    {line}")


def print_summary(results: list[ModuleResult], args: argparse.Namespace) -> None:
    print("\n| module | mutants tested | killed | survived | equivalent | score | score without equivalents |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        equivalent = sum(1 for s in r.survivors if s.equivalent)
        print(f"| {r.module} | {r.tested} of {r.total} | {r.killed} | {r.survived} | {equivalent} | "
              f"{fmt(r.score(count_equivalent_as_killed=False))} | {fmt(r.score(count_equivalent_as_killed=True))} |")
    flags = " ".join(a for a in sys.argv[1:])
    print(f"\n(.venv/bin/python benchmarks/mutation.py {flags})".replace(" )", ")"))


def fmt(score: float | None) -> str:
    return "n/a" if score is None else f"{score:.0f}%"


def result_as_dict(r: ModuleResult) -> dict:
    return {
        "module": r.module, "total": r.total, "sampled": r.sampled, "killed": r.killed,
        "survived": r.survived, "no_tests": r.no_tests, "not_run": r.not_run, "seconds": round(r.seconds, 1),
        "survivors": [{"name": s.name, "location": s.location, "diff": s.diff, "equivalent": s.equivalent}
                      for s in r.survivors],
    }


if __name__ == "__main__":
    sys.exit(main())
