"""Recurrent token mixers: what fills a block's mixer slot (``attention:``) instead of softmax attention.

Each mixer keeps a fixed-size state per sequence (:class:`~specformer.model.state.StateSlots`)
instead of keys and values per token. What they share, and what a third-party mixer may
use so it treats padding, documents and cached states exactly as the built-ins do:

- :class:`RecurrentMixer` : the forward every recurrent mixer runs (documents apart, padding
  out of the state, the cache's state read before and written after); a subclass writes only
  its ``run``, returning a :class:`MixerRun`;
- :func:`with_state` : that read and write alone, around any computation;
- :func:`causal_conv` : the short depthwise causal convolution, with its window of past inputs;
- :func:`by_document` : run a mixer on each document of packed rows separately (training with
  ``train.document_mask``);
- :func:`leading_padding` : how many padding tokens open each row of a cached forward.

Each mixer's settings are a torch-free module of their own, ``<mixer>_params`` (``mamba2_params``,
``gated_deltanet_params``, ...; the convolution's width, shared, in ``conv_params``): listing
components reads those only, and everything here is imported on first use.
"""

from specformer.lazy import lazy_exports

_EXPORTS = {
    "ConvOutput": "specformer_layers.mixers.conv",
    "causal_conv": "specformer_layers.mixers.conv",
    "by_document": "specformer_layers.mixers.documents",
    "leading_padding": "specformer_layers.mixers.documents",
    "MixerRun": "specformer_layers.mixers.recurrent",
    "RecurrentMixer": "specformer_layers.mixers.recurrent",
    "with_state": "specformer_layers.mixers.recurrent",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
