"""An example of a user train step: gradient accumulation with gradient-norm clipping.

The batch of every step is split into ``ACCUMULATE`` micro-batches whose gradients add up
before one clipped optimizer update (for supervised configs: one view per sample). The
stages it does not change come from the standard step; in train phases it updates no meters.
Use it with::

    SSL_ENGINE_PLUGINS=my_train_step PYTHONPATH=docs/examples \\
    python tools/run_distributed_engines.py config=supervised/digits_resnet \\
        config.TRAINER.TRAIN_STEP_NAME=accumulate_and_clip_step
"""
import time

import torch

from ssl_engine.hooks import SSLClassyHookFunctions as Event
from ssl_engine.losses import StepContext
from ssl_engine.trainer import register_train_step
from ssl_engine.trainer.train_steps.standard_train_step import (
    check_loss_is_finite, fetch_batch, forward_loss_and_meters, update,
)

ACCUMULATE = 2
MAX_GRAD_NORM = 1.0


def micro_batches(batch, parts: int):
    """Split a supervised batch (one view per sample) into ``parts`` along the batch."""
    inputs, targets = batch["input"].chunk(parts), batch["target"].chunk(parts)
    return list(zip(inputs, targets))


@register_train_step("accumulate_and_clip_step")
def accumulate_and_clip_step(task):
    start = time.perf_counter()
    batch = fetch_batch(task)  # StopIteration ends the phase
    if not task.train:
        forward_loss_and_meters(task, batch)
    else:
        task.optimizer.zero_grad()
        total = 0.0
        parts = micro_batches(batch, ACCUMULATE)
        task.loss.begin_step(StepContext.of_task(task))  # the loss's view of the step
        for inputs, targets in parts:
            loss = task.loss(task.model(inputs), targets) / len(parts)
            check_loss_is_finite(task, loss)
            loss.backward()
            total += loss.detach()
        task.last_loss = total
        task.metrics.put("loss", total)
        task.run_hook(Event.on_backward)
        torch.nn.utils.clip_grad_norm_(task.base_model.parameters(), MAX_GRAD_NORM)
        update(task)
    task.iteration_num_in_phase += 1
    task.step_time = time.perf_counter() - start
    return task
