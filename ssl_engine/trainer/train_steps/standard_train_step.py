"""The default step: forward, loss and meters, backward, gradient clipping, optimizer and
scheduler update.

Its stages are functions of their own so that a custom step can reuse the ones it does not
change (see docs/examples/my_train_step.py).
"""
import math
import time

import torch

from ssl_engine.hooks.base import SSLClassyHookFunctions as Event
from ssl_engine.losses.base import StepContext
from ssl_engine.trainer.accumulation import average_gradients_over_ranks, gradient_sync_skipped
from ssl_engine.trainer.train_steps.registry import register_train_step
from ssl_engine.utils.device import float32_outputs
from ssl_engine.utils.loss_watch import NonFiniteLossError, non_finite_message

__all__ = ["NonFiniteLossError", "check_loss_is_finite", "watch_loss", "fetch_batch",
           "forward_loss_and_meters", "backward", "clip_gradients", "update",
           "accumulate_gradients", "standard_train_step"]


def check_loss_is_finite(task, loss: torch.Tensor) -> None:
    """Stop on a NaN or infinite loss unless HOOKS.CHECK_NAN is off (a task without a config
    always checks). Reads the loss back now: custom steps and hand-made tasks use it; the
    standard step watches the loss on the device instead (``watch_loss``)."""
    config = getattr(task, "config", None)
    if config is not None and not config.HOOKS.get("CHECK_NAN", True):
        return
    value = loss.item()
    if not math.isfinite(value):
        raise NonFiniteLossError(non_finite_message(
            value, (task.iteration, task.phase_idx, task.iteration_num_in_phase)))


def watch_loss(task, loss: torch.Tensor) -> None:
    """HOOKS.CHECK_NAN without a wait for the device: the loss goes to the task's
    ``loss_watch`` (utils/loss_watch.py), read back where the log line or a checkpoint is
    written, which stop the run there naming the first non-finite loss. A task without a
    config or a loss watch checks at once (``check_loss_is_finite``)."""
    config, watch = getattr(task, "config", None), getattr(task, "loss_watch", None)
    if config is None or watch is None:
        check_loss_is_finite(task, loss)
    elif config.HOOKS.get("CHECK_NAN", True):
        watch.observe(loss, (task.iteration, task.phase_idx, task.iteration_num_in_phase))


def fetch_batch(task):
    """The next batch on the task's device (StopIteration at the end of the phase); sets
    ``task.last_batch``, ``task.last_host_batch`` (the loader's, still on the host: the log
    counts its images there without waiting for the device) and ``task.data_time``."""
    start = time.perf_counter()
    host_batch = next(task.data_iterator)
    batch = task.to_device(host_batch)
    task.data_time = time.perf_counter() - start
    task.last_batch, task.last_host_batch = batch, host_batch
    return batch


def loss_terms(loss_module) -> dict:
    """The named parts of the last loss (``loss_module.loss_terms``, set by losses with several
    terms, e.g. VICReg's invariance, variance and covariance), detached."""
    terms = loss_module.loss_terms
    return {name: value.detach() for name, value in terms.items()}


def forward_loss_and_meters(task, batch) -> torch.Tensor:
    """Forward pass, loss (watched: a non-finite one stops the run, ``watch_loss``) and meter
    updates, with their hooks; the loss and its named terms go to the metrics store (series
    "loss" and "loss_terms")."""
    with torch.set_grad_enabled(task.train):
        with task.amp.autocast():  # MODEL.AMP_PARAMS; a no-op when off
            output = task.model(batch["input"])
            task.last_model_output = float32_outputs(output)  # the loss runs in float32
            task.run_hook(Event.on_forward)
        task.loss.begin_step(StepContext.of_task(task))
        loss = task.loss(task.last_model_output, batch["target"])
    watch_loss(task, loss)
    task.last_loss = loss.detach()
    task.metrics.put("loss", task.last_loss)
    task.metrics.put("loss_terms", loss_terms(task.loss))
    with torch.no_grad():
        # METERS.model_output_mask: the meters may read only some classes of the output
        meter_output = task.meter_output(task.last_model_output) if task.meters else None
        for meter in task.meters:
            meter.update(meter_output, batch["target"])
    task.run_hook(Event.on_loss_and_meter)
    return loss


def backward(task, loss: torch.Tensor) -> None:
    """Gradients of ``loss`` (scaled when float16 AMP needs it), then the backward hooks."""
    task.amp.backward(loss)
    task.run_hook(Event.on_backward)


def clip_gradients(task) -> None:
    """MODEL.GRAD_CLIP: the total norm of the model's gradients clipped (float16 gradients
    unscaled first); a no-op when it is off."""
    grad_clip = getattr(task, "grad_clip", None)
    if grad_clip is None:
        return
    task.amp.unscale(task.optimizer)
    grad_clip(task.base_model.parameters())


def update(task) -> None:
    """Optimizer step at the current schedule position, then count the update."""
    task.amp.step(task.optimizer, where=task.where)
    task.run_hook(Event.on_update)
    task.iteration += 1


def accumulate_gradients(task) -> None:
    """Forward and backward of up to OPTIMIZER.gradient_accumulation_steps micro-batches, each
    loss divided by that count, so that the gradients are those of their mean loss.  When the
    phase's data ends inside the group, the update uses the micro-batches done, the gradients
    rescaled to their mean; StopIteration only when there was none."""
    steps = getattr(task, "accumulation_steps", 1)
    done = 0
    task.optimizer.zero_grad()
    for micro in range(steps):
        try:
            batch = fetch_batch(task)
        except StopIteration:
            if done == 0:
                raise
            break
        with gradient_sync_skipped(task.model, skip=micro < steps - 1):
            loss = forward_loss_and_meters(task, batch)
            backward(task, loss / steps if steps > 1 else loss)
        done += 1
        task.iteration_num_in_phase += 1
    if done < steps:
        if hasattr(task.model, "no_sync"):  # DDP skipped the all-reduce of the last one
            average_gradients_over_ranks(task.base_model.parameters())
        for param in task.base_model.parameters():
            if param.grad is not None:
                param.grad.mul_(steps / done)


@register_train_step("standard_train_step")
def standard_train_step(task):
    """One update (OPTIMIZER.gradient_accumulation_steps batches, 1 by default) in training,
    one batch in a test phase; raises StopIteration when the phase's data is exhausted."""
    start = time.perf_counter()
    if task.train:
        accumulate_gradients(task)
        clip_gradients(task)
        update(task)
    else:
        forward_loss_and_meters(task, fetch_batch(task))
        task.iteration_num_in_phase += 1
    task.step_time = time.perf_counter() - start
    return task
