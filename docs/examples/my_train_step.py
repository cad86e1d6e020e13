"""An example of a user train step: the standard step with gradient-norm clipping.

Use it with::

    SSL_ENGINE_PLUGINS=my_train_step PYTHONPATH=docs/examples \\
    python tools/run_distributed_engines.py config=quickstart/simclr_digits \\
        config.TRAINER.TRAIN_STEP_NAME=clipped_train_step
"""
import time

import torch

from ssl_engine.hooks import SSLClassyHookFunctions as Event
from ssl_engine.trainer import register_train_step
from ssl_engine.trainer.train_steps.standard_train_step import check_loss_is_finite

MAX_GRAD_NORM = 1.0


@register_train_step("clipped_train_step")
def clipped_train_step(task):
    start = time.perf_counter()
    batch = task.to_device(next(task.data_iterator))  # StopIteration ends the phase
    task.data_time = time.perf_counter() - start
    task.last_batch = batch

    with torch.set_grad_enabled(task.train):
        task.last_model_output = task.model(batch["input"])
        task.run_hook(Event.on_forward)
        loss = task.loss(task.last_model_output, batch["target"])
    check_loss_is_finite(task, loss)
    task.last_loss = loss.detach()
    task.losses.append(task.last_loss)
    task.run_hook(Event.on_loss_and_meter)

    if task.train:
        task.optimizer.zero_grad()
        loss.backward()
        task.run_hook(Event.on_backward)
        torch.nn.utils.clip_grad_norm_(task.base_model.parameters(), MAX_GRAD_NORM)
        task.optimizer.step(where=task.where)
        task.run_hook(Event.on_update)
        task.iteration += 1
    task.iteration_num_in_phase += 1
    task.step_time = time.perf_counter() - start
    return task
