"""Train steps: plain functions ``fn(task) -> task`` registered by name.

A step takes one batch from ``task.data_iterator`` (letting ``StopIteration`` end the phase),
and calls the task's hooks between its stages. Register your own with::

    from ssl_engine.trainer.train_steps import register_train_step

    @register_train_step("my_step")
    def my_step(task):
        ...

and select it with ``config.TRAINER.TRAIN_STEP_NAME=my_step``.
"""
from ssl_engine.trainer.train_steps.registry import (  # noqa: F401  (the public names)
    TRAIN_STEP_REGISTRY, get_train_step, register_train_step)
from ssl_engine.trainer.train_steps import standard_train_step  # noqa: F401  (registers)
