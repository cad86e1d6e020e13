"""VISSL's ``identity`` head: the trunk's output passed on as it is."""
from torch import nn

from ssl_engine.models.registry import register_model_head


@register_model_head("identity")
class IdentityHead(nn.Identity):
    """No parameters; the model's output is the (flattened) trunk output, e.g. for distilling
    a trunk's features with distillation_loss's mse."""
