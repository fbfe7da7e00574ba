"""torch ``delayed_scaling_update_bulk``: the per-tensor update in a loop (the split path
itself, so bit equality with ``delayed_scaling_update`` holds by construction)."""
from __future__ import annotations

import torch

from tealite.backends.torch import BACKEND
from tealite.backends.torch.quantize import delayed_scaling_update
from tealite.training_types import BulkScalingUpdate
from tealite.types import Op


@BACKEND.implements(Op.DELAYED_SCALING_UPDATE_BULK, dtypes=(torch.float32,))
def delayed_scaling_update_bulk(histories, scales, recipes):
    pairs = [delayed_scaling_update(h, s, r) for h, s, r in zip(histories, scales, recipes)]
    return BulkScalingUpdate([h for h, _ in pairs], [s for _, s in pairs])
