"""The trainer, the task and the train steps."""
from ssl_engine.trainer.default_hooks import default_hook_generator
from ssl_engine.trainer.fsdp_task import SelfSupervisionFSDPTask
from ssl_engine.trainer.task import SelfSupervisionTask
from ssl_engine.trainer.train_steps import get_train_step, register_train_step
from ssl_engine.trainer.trainer import SelfSupervisionTrainer

__all__ = ["default_hook_generator", "SelfSupervisionFSDPTask", "SelfSupervisionTask", "SelfSupervisionTrainer", "get_train_step",
           "register_train_step"]
