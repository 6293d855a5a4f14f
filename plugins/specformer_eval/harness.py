"""A model for EleutherAI's lm-evaluation-harness, registered as ``specformer``.

Needs the ``eval`` extra (``pip install 'specformer[eval]'``). Importing this module
registers the model with lm_eval::

    import lm_eval
    import specformer_eval.harness  # registers "specformer"

    results = lm_eval.simple_evaluate(model="specformer", model_args="checkpoint=runs/tiny/model.safetensors",
                                      tasks=["hellaswag"], batch_size=8)

or from the command line: ``specformer eval CHECKPOINT --tasks hellaswag``.

The three request types are answered as lm_eval's own ``hf`` model answers them, so a
checkpoint and its Hugging Face export score the same:

* ``loglikelihood``: context and continuation are encoded together (lm_eval's
  ``TemplateLM`` splits them), cut from the left to the context length plus one, and
  scored in batches of right-padded windows (:mod:`specformer_eval.scoring`);
* ``loglikelihood_rolling``: the document after the end-of-text token, in disjoint
  windows of the full context (:mod:`specformer_eval.windows` with ``stride = context``);
* ``generate_until``: batched :func:`specformer_generate.generate` with specformer's
  samplers (greedy, or temperature/top-k/top-p when a task samples; otherwise the
  checkpoint's ``generate.sampler``), stopping at the end-of-text token or a stop string.
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from typing import Any, Iterable

from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import normalize_gen_kwargs, postprocess_generated_text
from tqdm.auto import tqdm

from specformer.checkpoint.save_load import read_metadata
from specformer.errors import UserError
from specformer.tokenizers.tokenizer import Tokenizer
from specformer.tokenizers.choice import checkpoint_tokenizer
import specformer_generate
from specformer_generate import Sampler, build_sampler

from specformer_eval.loading import load_model
from specformer_eval.scoring import score_windows
from specformer_eval.windows import Window, sliding_windows

#: Tokens generated when a task does not say (lm_eval's own default).
DEFAULT_MAX_GEN_TOKS = 256


@register_model("specformer")
class SpecformerLM(TemplateLM):
    """lm_eval's view of a specformer model: give a ``checkpoint`` path, or a loaded ``model`` and
    its ``tokenizer``. ``batch_size`` is windows (or prompts) per forward; ``sampler`` is the
    default sampler list for tasks that sample without naming one."""

    def __init__(
        self,
        checkpoint: str | None = None,
        *,
        model: Any = None,
        tokenizer: Tokenizer | None = None,
        tokenizer_path: str | None = None,
        device: str | None = None,
        batch_size: int | str | None = 8,
        max_gen_toks: int | str = DEFAULT_MAX_GEN_TOKS,
        sampler: Any = None,
        seed: int | str | None = None,
        **unused: Any,
    ) -> None:
        super().__init__()
        if (checkpoint is None) == (model is None):
            raise ValueError("give either checkpoint= (a path) or model= (a loaded model with tokenizer=)")
        if model is None:
            model = load_model(checkpoint, device=device or "cpu")
            tokenizer = checkpoint_tokenizer(read_metadata(checkpoint), vocab_size=model.vocab_size,
                                             where=str(checkpoint), override=tokenizer_path)
        elif tokenizer is None:
            raise ValueError("a model= needs its tokenizer= too")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self._device = next(model.parameters()).device
        # lm_eval passes "auto" or a string from the command line; "auto" keeps the default.
        self.batch_size = 8 if batch_size in (None, "auto") or str(batch_size).startswith("auto") else int(batch_size)
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.max_gen_toks = int(max_gen_toks)
        self.seed = None if seed is None else int(seed)
        # For tasks that sample without saying how: this sampler list, else the checkpoint's own.
        section = model.spec.section("generate") if getattr(model, "spec", None) is not None else None
        if sampler is not None:
            self.default_sampler: Sampler | None = build_sampler(sampler)
        elif section is not None and section.sampler:
            self.default_sampler = section.build_sampler()
        else:
            self.default_sampler = None

    # -- what TemplateLM needs ------------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eot_id

    @property
    def max_length(self) -> int:
        return self.model.context_length

    @property
    def tokenizer_name(self) -> str:
        return f"specformer-{getattr(self.tokenizer, 'kind', 'tokenizer')}"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return self.tokenizer.encode(string)

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens)

    def _loglikelihood_tokens(self, requests: list[tuple[tuple[str, str], list[int], list[int]]],
                              disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        windows = []
        for index, (_, context, continuation) in enumerate(requests):
            if not continuation:
                raise ValueError(f"request {index} has an empty continuation; there is nothing to score")
            if len(continuation) > self.max_length:
                raise ValueError(f"request {index}: a continuation of {len(continuation)} tokens is longer than the "
                                 f"model's context length {self.max_length}")
            # As lm_eval's hf model: the last context + 1 tokens, of which the continuation is scored.
            tokens = (context + continuation)[-(self.max_length + 1):]
            windows.append(Window(tokens=tokens, scored=len(continuation), tag=index))
        answers: list[tuple[float, bool] | None] = [None] * len(requests)
        for result in self._score(windows, disable_tqdm, "loglikelihood"):
            answer = (-result.nll, result.greedy)
            answers[result.window.tag] = answer
            request_strings = requests[result.window.tag][0]
            if request_strings is not None:
                self.cache_hook.add_partial("loglikelihood", request_strings, answer)
        return answers  # type: ignore[return-value]

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        def windows() -> Iterable[Window]:
            for index, request in enumerate(requests):
                (text,) = request.args
                sequence = [self.prefix_token_id, *self.tok_encode(text)]
                yield from sliding_windows(sequence, context=self.max_length, stride=self.max_length, tag=index)

        totals = [0.0] * len(requests)
        for result in self._score(windows(), disable_tqdm, "loglikelihood_rolling"):
            totals[result.window.tag] -= result.nll
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        # Requests with the same settings are generated together, in batches.
        groups: dict[str, list[int]] = defaultdict(list)
        for index, request in enumerate(requests):
            groups[repr(sorted(request.args[1].items()))].append(index)
        outputs: list[str | None] = [None] * len(requests)
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="generate_until", leave=False)
        for indices in groups.values():
            settings = normalize_gen_kwargs(requests[indices[0]].args[1], self.max_gen_toks)
            until = settings.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = min(int(settings.pop("max_gen_toks")), self.max_length - 1)
            sampler = self._sampler(settings)
            stop = [ids for ids in (self.tok_encode(s) for s in until) if ids]
            for first in range(0, len(indices), self.batch_size):
                chunk = indices[first : first + self.batch_size]
                # Keep the end of each prompt, leaving room for the new tokens (as lm_eval's hf model does).
                prompts = [self.tok_encode(requests[i].args[0])[-(self.max_length - max_new):] or [self.eot_token_id]
                           for i in chunk]
                rows = specformer_generate.generate(self.model, prompts, max_new_tokens=max_new, sampler=sampler, seed=self.seed,
                                eos_token_id=self.eot_token_id, stop=stop)
                for i, prompt, row in zip(chunk, prompts, rows):
                    new = [t for t in row[len(prompt):] if t != self.eot_token_id]
                    text = postprocess_generated_text(self.tok_decode(new), stop=until, think_end_token=None)
                    outputs[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                bar.update(len(chunk))
        bar.close()
        return outputs  # type: ignore[return-value]

    # -- helpers ---------------------------------------------------------------------------

    def _score(self, windows: Iterable[Window], disable_tqdm: bool, what: str) -> Iterable[Any]:
        bar = tqdm(disable=disable_tqdm, desc=what, unit="window", leave=False)
        for result in score_windows(self.model, windows, batch_size=self.batch_size):
            bar.update(1)
            yield result
        bar.close()

    def _sampler(self, settings: dict[str, Any]) -> Sampler | None:
        """None (greedy) when the task does not sample. When it does: its temperature, top-k and top-p
        as specformer samplers, in transformers' order; if it names none of them, the default sampler
        (``sampler=``, else the checkpoint's ``generate.sampler``), else a plain draw."""
        if not settings.get("do_sample"):
            return None
        named = [key for key in ("temperature", "top_k", "top_p") if settings.get(key) is not None]
        if not named:
            return self.default_sampler or build_sampler([])
        steps: list[dict[str, Any]] = []
        temperature = float(settings.get("temperature") or 1.0)
        if temperature != 1.0:
            steps.append({"kind": "temperature", "value": temperature})
        if settings.get("top_k"):
            steps.append({"kind": "top_k", "k": int(settings["top_k"])})
        if settings.get("top_p") is not None and float(settings["top_p"]) < 1.0:
            steps.append({"kind": "top_p", "p": float(settings["top_p"])})
        return build_sampler(steps)


def run_tasks(lm: SpecformerLM, tasks: list[str], *, include_path: str | None = None, num_fewshot: int | None = None,
              limit: int | float | None = None, log_samples: bool = False) -> dict[str, Any]:
    """``lm_eval.simple_evaluate`` on ``tasks`` (names or glob patterns; ``include_path`` adds a folder of
    task YAMLs); a UserError names an unknown task with the closest known ones."""
    # late: simple_evaluate and the task manager load lm-eval's task machinery, which only running tasks needs
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    manager = None
    if include_path:
        # Indexing lm_eval's thousands of built-in tasks takes a while; tasks that are all in the
        # folder given do not need it.
        own = TaskManager(include_path=include_path, include_defaults=False)
        if all(own.match_tasks([task]) for task in tasks):
            manager = own
    manager = manager or TaskManager(include_path=include_path)
    for task in tasks:
        if not manager.match_tasks([task]):
            close = difflib.get_close_matches(task, manager.all_tasks, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UserError(f"--tasks: unknown lm-evaluation-harness task {task!r}{hint} "
                            "(`lm_eval ls tasks` lists them; --include-path adds a folder of task YAMLs)")
    results = simple_evaluate(model=lm, tasks=tasks, task_manager=manager, num_fewshot=num_fewshot, limit=limit,
                              log_samples=log_samples, batch_size=lm.batch_size)
    return dict(results or {})
