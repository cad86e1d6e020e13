"""Binary cross entropy with logits of every model output against one multi-label target."""
import torch
import torch.nn.functional as F

from ssl_engine.losses.base import SSLLoss
from ssl_engine.losses.outputs import as_output_list
from ssl_engine.utils.classy import register_loss
from ssl_engine.utils.distributed import all_reduce_sum, get_world_size


@register_loss("bce_logits_multiple_output_single_target")
class BCELogitsMultipleOutputSingleTargetLoss(SSLLoss):
    """``sum_i sum_c mean_n BCE(output_i[n, c], target[n, c])``: per output, each class's binary
    cross entropy with logits averaged over the samples of the global batch whose label for
    that class is 0 or 1 (a label of -1 is unknown and contributes nothing), summed over the
    classes and outputs.  (VISSL averaged over each process's own samples: the same with one
    process, or when every process has as many labelled samples of each class.)
    ``normalize_output`` l2-normalises each row of logits first.  The target is ``[N, C]``
    (multi-label, e.g. a disk_filelist of label vectors)."""

    def __init__(self, reduction: str = "none", normalize_output: bool = False):
        super().__init__()
        if reduction != "none":
            raise ValueError("bce_logits_multiple_output_single_target: only reduction 'none' "
                             "(each class averaged over its labelled samples, summed over the "
                             f"classes) is defined, got {reduction!r}")
        self.normalize_output = bool(normalize_output)

    def forward(self, output, target: torch.Tensor) -> torch.Tensor:
        if target.ndim != 2:
            raise ValueError("bce_logits_multiple_output_single_target expects a [N, classes] "
                             f"target of 0, 1 and -1 (unknown), got {tuple(target.shape)}")
        unknown = target == -1
        # each class's labelled samples over every process; the local sums are scaled by the
        # process count, so that data-parallel training (which averages the gradients over
        # the processes) gets the gradient of the loss of the global batch
        labelled_per_class = all_reduce_sum((~unknown).sum(dim=0)).clamp(min=1) \
            / get_world_size()
        total = 0.0
        for logits in as_output_list(output):
            if logits.shape != target.shape:
                raise ValueError(f"bce_logits_multiple_output_single_target: logits "
                                 f"{tuple(logits.shape)} for a target {tuple(target.shape)}")
            if self.normalize_output:
                logits = F.normalize(logits, dim=1)
            per_entry = F.binary_cross_entropy_with_logits(
                logits, target.clamp(min=0).to(logits.dtype), reduction="none")
            total = total + (per_entry.masked_fill(unknown, 0) / labelled_per_class).sum()
        return total
