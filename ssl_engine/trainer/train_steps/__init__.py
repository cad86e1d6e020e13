"""Train steps: plain functions ``fn(task) -> task`` registered by name.

A step takes one batch from ``task.data_iterator`` (letting ``StopIteration`` end the phase),
and calls the task's hooks between its stages. Register your own with::

    from ssl_engine.trainer.train_steps import register_train_step

    @register_train_step("my_step")
    def my_step(task):
        ...

and select it with ``config.TRAINER.TRAIN_STEP_NAME=my_step``.
"""
from ssl_engine.utils.registry import Registry

TRAIN_STEP_REGISTRY = Registry("train step")


def register_train_step(name: str):
    return TRAIN_STEP_REGISTRY.register(name)


def get_train_step(name: str):
    return TRAIN_STEP_REGISTRY.get(name)


from ssl_engine.trainer.train_steps import standard_train_step  # noqa: E402,F401  (registers)
