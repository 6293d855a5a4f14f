"""``specformer export gguf CKPT OUT.gguf [--type f32|f16|bf16|q8_0]``: a checkpoint as a GGUF file.

Its flags: :mod:`specformer_gguf.cli`. Every check (the output path, the spec's mapping onto
llama.cpp's llama architecture, the tokenizer) runs before anything is written; the file is
written atomically, an existing one replaced only with ``--force``, the input never.
"""

from __future__ import annotations

import argparse
import sys

import specformer
from specformer.checkpoint.locate import resolve_checkpoint
from specformer.checkpoint.save_load import read_metadata
from specformer.errors import UserError
from specformer.files.outputs import check_file_output, writing
from specformer.tokenizers.choice import checkpoint_tokenizer
from specformer_text import special_token_ids, template_from_metadata

from specformer_gguf.llama import llama_layout
from specformer_gguf.vocab import gguf_vocab, tokenizer_json
from specformer_gguf.writer import to_gguf


def run(args: argparse.Namespace) -> int:
    args.checkpoint = str(resolve_checkpoint(args.checkpoint))  # a step-N or run directory: its checkpoint file
    check_file_output(args.output, inputs=[args.checkpoint], force=args.force)  # before the work: a refusal is free
    metadata = read_metadata(args.checkpoint)
    if "adapter" in metadata:
        raise UserError(f"{args.checkpoint} is an adapter checkpoint: fold it into its base with `specformer merge "
                        f"{args.checkpoint} -o MERGED.safetensors` and export that")
    if "quantization" in metadata:  # specformer_quant's recipe key: its int8/int4 layouts are not llama.cpp's
        raise UserError(f"{args.checkpoint} is quantized; export the float checkpoint it came from "
                        f"(--type q8_0 quantizes for llama.cpp)")
    model = specformer.load(args.checkpoint).eval()
    layout = llama_layout(model.spec)  # NoGgufMapping (a UserError: exit 2) naming the part llama.cpp lacks
    tokenizer = checkpoint_tokenizer(metadata, vocab_size=model.vocab_size, where=args.checkpoint, ids_only=True)
    vocab = gguf_vocab(tokenizer_json(tokenizer), n_rows=model.vocab_size)
    chat = template_from_metadata(metadata)
    with writing(args.output):
        to_gguf(model, args.output, tensor_type=args.tensor_type, vocab=vocab,
                special_ids=special_token_ids(tokenizer, vocab_size=model.vocab_size),
                chat_template=chat[0] if chat is not None else None)
    print(f"wrote {args.output}: llama.cpp llama architecture, {layout.n_layers} layers, {args.tensor_type} matrices, "
          f"{len(vocab.tokens)} tokens{', chat template' if chat is not None else ''}", file=sys.stderr)
    return 0
