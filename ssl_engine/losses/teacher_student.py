"""The parts a loss with a teacher shares with the others: DINO, iBOT, MSN, DINOv2's terms and
the distillation losses.

- crop selection: ``first_crops`` (the rows of the first crops the teacher sees) and
  ``crop_pairs`` (which teacher crop each student crop predicts);
- the teacher's temperature: ``linear_warmup``;
- centering: ``centered_targets`` with its running center ``ema_towards_global_mean_``, or
  ``sinkhorn_knopp_targets`` (DINOv2) in its place;
- DINO's cross-entropy of every teacher crop with every other student crop
  (``cross_crop_entropy``, iBOT's class term too);
- the collapse monitor of a teacher's prototype distributions (``TeacherCollapseMonitor``);
- the teacher without stochastic depth (``without_stochastic_depth``).
"""
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F

from ssl_engine.losses.sinkhorn import distributed_sinkhorn
from ssl_engine.losses.statistics import COLLAPSED_ENTROPY, entropy_fraction
from ssl_engine.utils.distributed import all_reduce_sum

Inputs = Union[torch.Tensor, Sequence[torch.Tensor]]
CENTERINGS = ("centering", "sinkhorn_knopp")


# ---------------------------------------------------------------------- the teacher's crops
def first_crops(inputs: Inputs, num_crops: int, keep: int,
                setting: str = "the loss's num_crops", single: bool = False):
    """The rows of the first ``keep`` of the ``num_crops`` crop-major crops of ``inputs`` (one
    tensor, or multicrop_collator's tensors of one resolution each, in crop order): whole
    tensors where a tensor holds only those crops, else those crops' rows of it.  A list; with
    ``single``, one tensor where the crops lie in one tensor.  ``setting`` names the key of
    ``num_crops`` in the error of a batch that does not split into ``num_crops`` crops."""
    groups = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
    rows = sum(group.shape[0] for group in groups)
    if rows % num_crops:
        raise ValueError(f"the loss got {rows} input rows, not a multiple of num_crops="
                         f"{num_crops} ({setting})")
    wanted, kept = keep * rows // num_crops, []
    for group in groups:
        if wanted <= 0:
            break
        kept.append(group if group.shape[0] <= wanted else group[:wanted])
        wanted -= kept[-1].shape[0]
    return kept[0] if single and len(kept) == 1 else kept


def crop_pairs(teacher_crops: int, student_crops: int, swapped_assignment: bool):
    """The (teacher crop q, student crop v) pairs a crop-to-crop distillation averages over:
    with ``swapped_assignment`` every v != q; otherwise every v but the other teacher-seen
    crops (each teacher crop is matched with the student's view of the same crop and with
    every crop the teacher does not see)."""
    for q in range(teacher_crops):
        for v in range(student_crops):
            skip = v == q if swapped_assignment else (v < teacher_crops and v != q)
            if not skip:
                yield q, v


# ---------------------------------------------------------------------- the temperature
def linear_warmup(start: float, end: float, steps: int, step: int,
                  slope_first: bool = False) -> float:
    """``start`` to ``end`` linearly over steps 0 .. steps - 1, then ``end`` (``start`` before
    step 0).  DINO counts iterations and multiplies the slope by the step (``slope_first``);
    iBOT counts epochs and divides ``(end - start) * step``: the two round differently in the
    last bit, so each keeps its own."""
    if step < 0:
        return start
    if step >= steps:
        return end
    if steps == 1:
        return start
    if slope_first:
        return start + (end - start) / (steps - 1) * step
    return start + (end - start) * step / (steps - 1)


# ---------------------------------------------------------------------- centering
def centered_targets(teacher_scores: torch.Tensor, center: torch.Tensor,
                     temperature: float) -> torch.Tensor:
    """DINO's targets: the softmax of the centred teacher scores at ``temperature`` (over the
    last dimension, the prototypes)."""
    return F.softmax((teacher_scores - center) / temperature, dim=-1)


@torch.no_grad()
def sinkhorn_knopp_targets(teacher_scores: torch.Tensor, temperature: float,
                           iterations: int) -> torch.Tensor:
    """DINOv2's targets in place of the center: the teacher's [rows, K] scores as
    ``exp(scores / temperature)`` rescaled so that every prototype gets the same mass over the
    global batch and every row sums to 1."""
    return distributed_sinkhorn(teacher_scores, epsilon=temperature, num_iters=iterations)


@torch.no_grad()
def ema_towards_global_mean_(center: torch.Tensor, rows: torch.Tensor, momentum: float) -> None:
    """``center = momentum * center + (1 - momentum) * mean``, the mean of ``rows`` [R, K] over
    every rank's rows (a center of DINO or iBOT)."""
    sums = torch.cat([rows.sum(dim=0), rows.new_full((1,), rows.shape[0])])
    sums = all_reduce_sum(sums)
    mean = (sums[:-1] / sums[-1]).view_as(center)
    center.mul_(momentum).add_(mean, alpha=1.0 - momentum)


# ---------------------------------------------------------------------- the crops' loss
def cross_crop_entropy(targets: torch.Tensor, log_probs: torch.Tensor, teachers: int,
                       crops: int) -> torch.Tensor:
    """DINO's loss per teacher crop [teachers]: the cross-entropy of the teacher's
    distributions ``targets`` ([teachers * B, K], crop-major; crop t is the student's crop t)
    with the student's ``log_probs`` ([crops * B, K]) of every other crop, averaged over the
    samples and over all ``teachers * (crops - 1)`` pairs (the terms add up to the mean)."""
    batch = targets.shape[0] // teachers
    # [teacher crop, student crop]: cross-entropies summed over the samples
    cross = -torch.einsum("tbk,sbk->ts", targets.view(teachers, batch, -1),
                          log_probs.view(crops, batch, -1))
    other_crop = 1 - torch.eye(teachers, crops, dtype=cross.dtype, device=cross.device)
    return (cross * other_crop).sum(dim=1) / (teachers * (crops - 1) * batch)


# ---------------------------------------------------------------------- the teacher
def without_stochastic_depth(network: torch.nn.Module) -> None:
    """Turn off the stochastic depth (timm's ``DropPath``) of every block of ``network``."""
    for module in network.modules():
        if hasattr(module, "drop_prob"):
            module.drop_prob = 0.0


class TeacherCollapseMonitor:
    """The collapse monitor of a loss with a teacher's prototype distributions (DINO, iBOT,
    MSN): the model's outputs are prototype scores, not an embedding, so the monitor reads the
    teacher's distributions, which the loss hands to ``_statistics`` at every step."""

    monitor_embedding = False

    @torch.no_grad()
    def _statistics(self, targets: torch.Tensor) -> None:
        """As fractions of log K: the mean entropy of the teacher's distributions (1: uniform,
        DINO's collapse onto the center) and the entropy of their batch mean (0: every sample
        on the same prototype, the other collapse)."""
        self._last_statistics = {
            "teacher_entropy": entropy_fraction(targets),
            "teacher_mean_entropy": entropy_fraction(targets.mean(dim=0, keepdim=True)),
        }

    def collapse_statistics(self):
        return self._last_statistics

    @staticmethod
    def collapse_warning(statistics) -> Optional[str]:
        uniform = statistics.get("teacher_entropy")
        if uniform is not None and float(uniform) > COLLAPSED_ENTROPY:
            return (f"the teacher's distributions are uniform (entropy {float(uniform):.3f} of "
                    "log K): the loss sits at log K and the features carry nothing")
        one = statistics.get("teacher_mean_entropy")
        if one is not None and float(one) < 1.0 - COLLAPSED_ENTROPY:
            return (f"the teacher puts every sample on the same prototypes (entropy of the "
                    f"batch mean {float(one):.3f} of log K)")
        return None
