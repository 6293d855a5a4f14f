"""specformer's eval plugin: perplexity over a corpus (``specformer eval``), and looking inside a
model: the residual stream, attention probabilities and the logit lens.

::

    from specformer_eval import capture, evaluate_documents, logit_lens
    result = evaluate_documents(model, tokenizer, ["some text", "another document"], context=128, stride=64)
    result.loss, result.perplexity, result.bits_per_byte

    with capture(model, attention=True) as cap:
        model(input_ids)
    cap.residual, cap.attention              # per layer
    lens = logit_lens(model, cap, k=5)       # top-5 tokens per layer and position

Names are imported on first use, so loading the plugin (which every ``specformer``
command does) imports nothing heavy.
"""

from __future__ import annotations

from specformer.lazy import lazy_exports

_EXPORTS = {
    "Capture": "specformer_eval.capturing",
    "capture": "specformer_eval.capturing",
    "Lens": "specformer_eval.lens",
    "lens_agreement": "specformer_eval.lens",
    "lens_of": "specformer_eval.lens",
    "logit_lens": "specformer_eval.lens",
    "EvalResult": "specformer_eval.perplexity",
    "evaluate_documents": "specformer_eval.perplexity",
    "evaluate_tokens": "specformer_eval.perplexity",
    "Scored": "specformer_eval.scoring",
    "score_windows": "specformer_eval.scoring",
    "Window": "specformer_eval.windows",
    "sliding_windows": "specformer_eval.windows",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
