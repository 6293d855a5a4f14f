"""DeepSeek-V4's expert scoring: sqrt(softplus(logit)), chosen with a selection-only balancing bias."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from specformer_layers.routers.params import SqrtSoftplusTopKParams
from specformer_layers.routers.sigmoid_topk import SigmoidTopK


class SqrtSoftplusTopK(SigmoidTopK):
    """``sigmoid_topk`` with scores ``sqrt(softplus(logits))`` (:class:`SqrtSoftplusTopKParams`)."""

    Params = SqrtSoftplusTopKParams

    def score(self, logits: Tensor) -> Tensor:
        return F.softplus(logits).sqrt()
