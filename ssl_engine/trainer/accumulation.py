"""Gradient accumulation (OPTIMIZER.gradient_accumulation_steps): several micro-batches, one
optimizer update.  The micro-batch loop itself is a stage of the standard train step."""
import contextlib
import logging

import torch.distributed as dist

logger = logging.getLogger(__name__)


def gradient_sync_skipped(model, skip: bool):
    """A context in which DDP does not all-reduce the gradients of the backward pass (``skip``
    on a micro-batch that is not the last of its update); a no-op without DDP."""
    no_sync = getattr(model, "no_sync", None)
    return no_sync() if skip and no_sync is not None else contextlib.nullcontext()


def average_gradients_over_ranks(parameters) -> None:
    """All-reduce and average gradients by hand, for an update whose last micro-batch ran
    without DDP's synchronisation (the phase's data ended inside the group)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    for param in parameters:
        if param.grad is not None:
            dist.all_reduce(param.grad)
            param.grad.div_(dist.get_world_size())


def warn_if_accumulation_changes_the_loss(loss, steps: int) -> None:
    """Accumulated micro-batches give the update of one larger batch only when the loss is a
    mean of per-sample terms.  A loss that couples the samples of its batch says how in its
    ``batch_coupling`` attribute, and gets a warning here."""
    coupling = loss.batch_coupling
    if coupling:
        logger.warning(
            "OPTIMIZER.gradient_accumulation_steps=%d with %s: %s, so %d accumulated "
            "micro-batches do not give the update of one %dx larger batch (docs/scaling.md)",
            steps, type(loss).__name__, coupling, steps, steps,
        )
