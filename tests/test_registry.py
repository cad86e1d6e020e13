"""Registries: registration, look-up, and the error for an unknown name."""
import pytest

from ssl_engine.engines import get_engine
from ssl_engine.trainer.train_steps import get_train_step, register_train_step
from ssl_engine.utils.classy import TASK_REGISTRY
from ssl_engine.utils.registry import Registry, UnknownNameError, lookup


def test_register_and_get():
    reg = Registry("widget")

    @reg.register("blue")
    class Blue:
        pass

    assert reg.get("blue") is Blue
    assert "blue" in reg and reg.names() == ["blue"]


def test_duplicate_registration_refused():
    reg = Registry("widget")
    reg.register("a")(int)
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        reg.register("a")(float)


def test_unknown_name_suggests_closest_and_lists_known():
    reg = Registry("widget")
    reg.register("simclr")(int)
    reg.register("swav")(float)
    with pytest.raises(UnknownNameError) as err:
        reg.get("simclrr")
    text = str(err.value)
    assert "unknown widget 'simclrr': did you mean 'simclr'?" in text
    assert "Known widget names: simclr, swav" in text


def test_builtin_names_registered():
    assert get_engine("train").__name__ == "train_main"
    assert get_train_step("standard_train_step").__name__ == "standard_train_step"
    assert "self_supervision_task" in TASK_REGISTRY
    with pytest.raises(UnknownNameError, match="did you mean 'standard_train_step'"):
        get_train_step("standard_trainstep")
    with pytest.raises(UnknownNameError, match="unknown task 'self_supervison_task'"):
        lookup(TASK_REGISTRY, "self_supervison_task", "task")


def test_user_train_step_registers_without_engine_changes():
    @register_train_step("test_registry_user_step")
    def my_step(task):
        return task

    assert get_train_step("test_registry_user_step") is my_step
