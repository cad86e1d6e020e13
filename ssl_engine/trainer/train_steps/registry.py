"""The registry of train steps (``config.TRAINER.TRAIN_STEP_NAME``)."""
from ssl_engine.utils.registry import Registry

TRAIN_STEP_REGISTRY = Registry("train step")


def register_train_step(name: str):
    return TRAIN_STEP_REGISTRY.register(name)


def get_train_step(name: str):
    return TRAIN_STEP_REGISTRY.get(name)
