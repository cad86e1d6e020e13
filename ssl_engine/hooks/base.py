"""The events a hook can act on, and a hook base class with a no-op for each."""
from enum import Enum, auto

from ssl_engine.utils.classy import ClassyHook


class SSLClassyHookFunctions(Enum):
    """Hook events, in the order a train step meets them."""

    on_start = auto()
    on_phase_start = auto()
    on_forward = auto()
    on_loss_and_meter = auto()
    on_backward = auto()
    on_update = auto()
    on_step = auto()
    on_phase_end = auto()
    on_end = auto()
    on_exception = auto()


class SSLHook(ClassyHook):
    """A classy_vision hook that also receives the train-step events; override what you need."""

    def on_start(self, task) -> None:
        pass

    def on_phase_start(self, task) -> None:
        pass

    def on_forward(self, task) -> None:
        pass

    def on_loss_and_meter(self, task) -> None:
        pass

    def on_backward(self, task) -> None:
        pass

    def on_update(self, task) -> None:
        pass

    def on_step(self, task) -> None:
        pass

    def on_phase_end(self, task) -> None:
        pass

    def on_end(self, task) -> None:
        pass

    def on_exception(self, task) -> None:
        pass
