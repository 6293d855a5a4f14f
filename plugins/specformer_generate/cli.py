"""The flags of ``specformer generate CHECKPOINT --prompt TEXT`` and ``specformer chat CHECKPOINT``.

Only the parsers, built for every ``specformer --help``, so they import no torch;
:mod:`specformer_generate.generate_command` runs both commands.
"""

from __future__ import annotations

import argparse

def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a .safetensors checkpoint written by specformer, a run's checkpoints/step-N "
                                           "directory, or a run directory (its latest checkpoint)")
    _prompt_options(parser)
    parser.add_argument("--batch", action="store_true",
                        help="several prompts, one per line (blank lines skipped); each is printed with its "
                             "continuation, separated by a blank line")
    parser.add_argument("--stream", action="store_true", help="print tokens as they are generated (one prompt)")
    parser.add_argument("--interactive", action="store_true",
                        help="a session: each line read from standard input is a turn, answered in turn, with "
                             "the KV cache kept between turns (the same as `specformer chat`)")
    parser.add_argument("--num-beams", type=int, default=None, help="beam search with this many beams")
    parser.add_argument("--length-penalty", type=float, default=None, help="beam search length penalty")
    parser.add_argument("--draft", default=None, metavar="CKPT|ngram|mtp",
                        help="speculative decoding: a smaller checkpoint with the same tokenizer drafts tokens, "
                             "ngram (prompt lookup) copies them from earlier text, or mtp drafts with the model's "
                             "own multi-token prediction depths; the output is unchanged")
    parser.add_argument("--quantize", default=None, metavar="SCHEME",
                        help="quantize the weights on load, writing nothing: int8, int4 (group 32) or bf16 "
                             "(needs the specformer_quant plugin; `specformer quantize` writes a quantized file); an untied "
                             "LM head is quantized too")
    parser.add_argument("--keep-lm-head-float", action="store_true",
                        help="with --quantize: keep the LM head in float")
    parser.add_argument("--draft-tokens", type=int, default=4, metavar="K",
                        help="tokens drafted per round of speculative decoding (default 4)")
    _common_options(parser)


def configure_chat(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a .safetensors checkpoint written by specformer, a run's checkpoints/step-N "
                                           "directory, or a run directory (its latest checkpoint)")
    _prompt_options(parser, opening=True)
    _common_options(parser)
    parser.set_defaults(interactive=True, batch=False, stream=False, num_beams=None, length_penalty=None, draft=None,
                        draft_tokens=4, quantize=None, keep_lm_head_float=False)


def _prompt_options(parser: argparse.ArgumentParser, *, opening: bool = False) -> None:
    lead = "text the session starts from (not printed)" if opening else "the text to continue"
    parser.add_argument("--prompt", default=None, help=lead)
    parser.add_argument("--prompt-file", default=None, metavar="PATH",
                        help=f"read {lead} from a UTF-8 file; - reads standard input (one final newline is dropped)")
    parser.add_argument("--ids", action="store_true",
                        help="prompts are token ids written as numbers ('12 7 99'); the output is ids too "
                             "(works for a checkpoint without a tokenizer)")
    parser.add_argument("--tokenizer", default=None, metavar="FILE",
                        help="a tokenizer.json to encode and decode with, for a checkpoint that stores no tokenizer "
                             "(default: the checkpoint's own)")


def _common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="most tokens to generate (default: the spec's generate.max_new_tokens, else 128, "
                             "cut to what the context leaves after the prompt)")
    parser.add_argument("--sampler", default=None,
                        help="sampler list: a .yaml/.json file (a list, or a spec with generate.sampler) or inline "
                             "YAML/JSON such as '[{kind: top_k, k: 40}, {kind: temperature, value: 0.8}]' "
                             "(default: the spec's generate.sampler, else greedy)")
    parser.add_argument("--seed", type=int, default=None, help="seed for the sampling draws")
    constraint = parser.add_mutually_exclusive_group()
    constraint.add_argument("--json-schema", default=None, metavar="FILE",
                            help="the output is JSON that this JSON Schema file accepts (a json_schema sampler "
                                 "put first in the sampler list; needs llguidance: specformer[structured])")
    constraint.add_argument("--regex", default=None, metavar="PATTERN",
                            help="the output matches this regular expression whole (a regex sampler put first)")
    constraint.add_argument("--grammar", default=None, metavar="FILE",
                            help="the output is a sentence of the Lark grammar in this file (a grammar sampler "
                                 "put first)")
    constraint.add_argument("--choice", default=None, metavar="A,B,C",
                            help="the output is one of these comma-separated strings (a choice sampler put first)")
    parser.add_argument("--stop", action="append", default=[], metavar="STR",
                        help="end a continuation at this text (kept in the output); repeatable")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="do not stop at the end-of-text token, nor at the chat template's end of turn")
    parser.add_argument("--chat-template", default=None, metavar="NAME|FILE",
                        help="render the text as a chat with this template: a built-in name (chatml) or a Jinja "
                             "file; the reply ends at the template's end of turn (default: the checkpoint's own "
                             "template when it has one)")
    parser.add_argument("--no-chat-template", action="store_true",
                        help="plain text, even when the checkpoint has a chat template")
    parser.add_argument("--no-cache", action="store_true", help="recompute the whole sequence every token (slow)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the one-token decode step")
    parser.add_argument("--device", default="cpu", help="device to run on: cpu, cuda, cuda:1, mps (default cpu)")
    parser.add_argument("--threads", default="auto", metavar="N",
                        help="CPU threads: a number, or auto (default): one per core the load average shows idle, "
                             "as training does (OMP_NUM_THREADS when set)")
    parser.add_argument("--max-memory", default=None, metavar="SIZE",
                        help="most memory the call may need, e.g. 8GiB, 500MB or unlimited (default: "
                             "SPECFORMER_MAX_MEMORY, else the memory available)")

