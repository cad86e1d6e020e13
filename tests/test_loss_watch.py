"""HOOKS.CHECK_NAN without a read-back per step: the loss watch names the first non-finite
loss when it is checked (the log line, a checkpoint), and the standard step feeds it."""
from types import SimpleNamespace

import pytest
import torch

from ssl_engine.hooks.checkpoint_hook import check_losses
from ssl_engine.hooks.log_hooks import check_window_loss
from ssl_engine.utils.host_waits import HostWaitCounter
from ssl_engine.utils.loss_watch import LossWatch, NonFiniteLossError


def test_the_first_non_finite_loss_is_named_at_the_check():
    watch = LossWatch()
    with HostWaitCounter() as counter:
        watch.observe(torch.tensor(1.0), (10, 0, 10))
        watch.observe(torch.tensor(float("inf")), (11, 0, 11))
        watch.observe(torch.tensor(float("nan")), (12, 0, 12))
    assert counter.total == 0  # observing reads nothing back
    with pytest.raises(NonFiniteLossError, match=r"loss is inf at iteration 11 \(phase 0, "
                                                 r"iteration 11 of the phase\)"):
        watch.check()


def test_finite_losses_pass_and_are_forgotten():
    watch = LossWatch()
    watch.observe(torch.tensor(2.0), (1, 0, 1))
    watch.check()
    watch.observe(torch.tensor(3.0), (2, 0, 2))
    watch.all_finite()
    assert watch._positions == []


def task_with(watch, check_nan=True):
    hooks = SimpleNamespace(get=lambda key, default=None: check_nan)
    return SimpleNamespace(loss_watch=watch, config=SimpleNamespace(HOOKS=hooks), iteration=5,
                           phase_idx=1, iteration_num_in_phase=2)


def test_the_log_and_the_checkpoint_stop_on_a_nan_loss():
    watch = LossWatch()
    watch.observe(torch.tensor(float("nan")), (4, 1, 1))
    with pytest.raises(NonFiniteLossError, match="at iteration 4"):
        check_window_loss(task_with(watch), {"loss": float("nan")})
    with pytest.raises(NonFiniteLossError, match="at iteration 4"):
        check_losses(task_with(watch))
    # another rank's NaN: this rank's losses were finite, the mean over the ranks is not
    with pytest.raises(NonFiniteLossError, match="mean loss over the ranks"):
        check_window_loss(task_with(LossWatch()), {"loss": float("nan")})
    check_window_loss(task_with(LossWatch(), check_nan=False), {"loss": float("nan")})
