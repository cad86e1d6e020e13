"""Split a model's trainable parameters into weight-decayed and not weight-decayed groups."""
from typing import Callable, Dict, List, Union

import torch.nn as nn
from torch.nn.modules.batchnorm import _NormBase

# BatchNorm*, SyncBatchNorm and InstanceNorm* derive from _NormBase.
NORM_LAYER_TYPES = (_NormBase, nn.GroupNorm, nn.LayerNorm) + ((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ())


def get_optimizer_param_groups(
    model: nn.Module, weight_decay: Union[float, Callable[[float], float]],
    regularize_bn: bool, regularize_bias: bool
) -> List[Dict]:
    """``[{"params", "weight_decay"}, ...]`` for the parameters that require gradients.

    Norm-layer parameters (unless ``regularize_bn``) and every parameter named ``bias`` (unless
    ``regularize_bias``) get weight decay 0; the rest get ``weight_decay``, a number or a
    param scheduler (``where -> value``) that the optimizer evaluates before every step.
    Empty groups are left out; a parameter shared by several modules is listed once.
    """
    regularized, unregularized, seen = [], [], set()
    for module in model.modules():
        is_norm = isinstance(module, NORM_LAYER_TYPES)
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            exempt = (is_norm and not regularize_bn) or (name == "bias" and not regularize_bias)
            (unregularized if exempt else regularized).append(param)
    if not regularized and not unregularized:
        raise ValueError("the model has no parameter that requires gradients: nothing to optimize")
    groups = [
        {"params": regularized,
         "weight_decay": weight_decay if callable(weight_decay) else float(weight_decay)},
        {"params": unregularized, "weight_decay": 0.0},
    ]
    return [group for group in groups if group["params"]]
