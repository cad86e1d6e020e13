"""Cross entropy of every model output against one shared target, summed over outputs."""
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from ssl_engine.losses.base import SSLLoss
from ssl_engine.losses.outputs import as_output_list
from ssl_engine.utils.classy import register_loss
from ssl_engine.utils.key_rules import refuse_key, refuse_name


refuse_key("config.LOSS.cross_entropy_multiple_output_single_target.reduction",
           "the loss is always the batch mean")
refuse_name("config.LOSS.name", "CrossEntropyLoss",
            "use cross_entropy_multiple_output_single_target (the same loss for one output)")

@register_loss("cross_entropy_multiple_output_single_target")
class CrossEntropyMultipleOutputSingleTargetLoss(SSLLoss):
    """``sum_i CE(output_i / temperature, target)``; used e.g. for linear heads on several layers.

    ``normalize_output`` l2-normalises each row of logits before the temperature is applied;
    targets equal to ``ignore_index`` contribute nothing; ``weight`` weighs the classes.
    A target ``[N, C]`` holds class probabilities (the soft labels of cutmixup_collator or
    label smoothing, or OneHotEncode's integer one-hot rows, as VISSL took any target of two
    dimensions): the loss is then ``-sum_c p_c log softmax_c``.
    """

    def __init__(
        self,
        weight: Optional[Sequence[float]] = None,
        ignore_index: int = -1,
        temperature: float = 1.0,
        normalize_output: bool = False,
    ):
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        class_weight = None if weight is None else torch.tensor(list(weight), dtype=torch.float)
        # From the config, not learned: kept out of checkpoints.
        self.register_buffer("weight", class_weight, persistent=False)
        self.ignore_index = int(ignore_index)
        self.temperature = float(temperature)
        self.normalize_output = bool(normalize_output)

    def forward(self, output, target: torch.Tensor) -> torch.Tensor:
        if target.ndim == 2 and target.shape[1] == 1:
            target = target[:, 0]
        soft = target.ndim == 2  # e.g. cutmixup_collator's, OneHotEncode's
        if target.ndim != 1 and not soft:
            raise ValueError(f"target must have shape [N] (classes) or [N, C] (class "
                             f"probabilities), got {tuple(target.shape)} {target.dtype}")
        total = 0.0
        for logits in as_output_list(output):
            if self.normalize_output:
                logits = F.normalize(logits, dim=1)
            weight = None if self.weight is None else self.weight.to(logits.dtype)
            if soft:  # -sum_c target_c log softmax(logits)_c, averaged over the rows
                total = total + F.cross_entropy(logits / self.temperature,
                                                target.to(logits.dtype), weight=weight)
                continue
            total = total + F.cross_entropy(
                logits / self.temperature, target, weight=weight, ignore_index=self.ignore_index
            )
        return total
