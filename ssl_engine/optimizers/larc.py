"""LARC: layer-wise adaptive learning rates around any torch optimizer."""
from typing import Callable, Optional

import torch
from torch.distributed.tensor import DTensor


def _whole_norm(tensor: torch.Tensor) -> torch.Tensor:
    """The 2-norm of the whole tensor, a sharded DTensor's included (a plain tensor)."""
    norm = torch.linalg.vector_norm(tensor)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``tensor`` (itself unless sharded), to update in place."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class LARC:
    """Rescales each parameter's gradient by its trust ratio, then steps the inner optimizer.

    For a parameter ``p`` with gradient ``g`` in a group with learning rate ``lr`` and weight
    decay ``wd``: ``local_lr = trust_coefficient * ||p|| / (||g|| + wd * ||p|| + eps)``. The
    weight decay is folded into the gradient, ``g <- (g + wd * p) * scale``, with
    ``scale = min(local_lr / lr, 1)`` when ``clip`` else ``local_lr``; the inner optimizer runs
    with weight decay 0 for that step. Parameters whose norm or gradient norm is 0 are left as
    they are (and then get no weight decay).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, trust_coefficient: float = 0.02,
                 clip: bool = True, eps: float = 1e-8):
        self.optim = optimizer
        self.trust_coefficient = float(trust_coefficient)
        self.clip = bool(clip)
        self.eps = float(eps)

    @property
    def param_groups(self):
        return self.optim.param_groups

    @property
    def state(self):
        return self.optim.state

    def state_dict(self):
        return self.optim.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.optim.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optim.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def _rescale_gradients(self, group) -> None:
        weight_decay, lr = group.get("weight_decay", 0.0), group["lr"]
        for param in group["params"]:
            if param.grad is None:
                continue
            param_norm, grad_norm = _whole_norm(param), _whole_norm(param.grad)
            # a zero norm leaves the gradient as it is: chosen on the device, since reading
            # the norms back would make the host wait at every parameter
            untouched = (param_norm == 0) | (grad_norm == 0)
            local_lr = self.trust_coefficient * param_norm / (grad_norm + weight_decay * param_norm + self.eps)
            if self.clip:
                local_lr = torch.clamp(local_lr / lr, max=1.0) if lr > 0 else torch.ones_like(local_lr)
            grad = _local(param.grad)
            rescaled = torch.add(grad, _local(param), alpha=weight_decay).mul_(local_lr)
            grad.copy_(torch.where(untouched, grad, rescaled))

    def step(self, closure: Optional[Callable] = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        weight_decays = []
        for group in self.optim.param_groups:
            self._rescale_gradients(group)
            weight_decays.append(group.get("weight_decay", 0.0))
            group["weight_decay"] = 0.0
        try:
            self.optim.step()
        finally:
            for group, weight_decay in zip(self.optim.param_groups, weight_decays):
                group["weight_decay"] = weight_decay
        return loss
