"""The loss contract (losses/base.py): every loss derives from SSLLoss and is built from its
settings by name; a plain ClassyLoss, registered by a user or by classy_vision, gets the
contract's defaults and still trains; the train step gives the loss its step context."""
from types import SimpleNamespace

import pytest
import torch

from engine_utils import FunctionLoss, final_weights, metrics, run_engine
from ssl_engine import losses
from ssl_engine.checkpoint import load_checkpoint
from ssl_engine.config import load_defaults
from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.hooks import SSLHook
from ssl_engine.losses import (LOSS_REGISTRY, SimclrInfoNCELoss, SSLLoss, StepContext, SwAVLoss,
                               build_loss, loss_class)
from ssl_engine.trainer.amp import MixedPrecision
from ssl_engine.trainer.train_steps.standard_train_step import forward_loss_and_meters
from ssl_engine.utils.classy import ClassyLoss, register_loss
from ssl_engine.utils.metrics_store import MetricsStore

OURS = [getattr(losses, name) for name in losses.__all__
        if isinstance(getattr(losses, name), type) and issubclass(getattr(losses, name), SSLLoss)
        and getattr(losses, name) is not SSLLoss]


def settings(loss: torch.nn.Module) -> dict:
    """What a loss was built with: its plain attributes and its state."""
    plain = {k: v for k, v in vars(loss).items()
             if not k.startswith("_") and isinstance(v, (int, float, str, bool, list, tuple))}
    return {**plain, **{k: v.tolist() for k, v in loss.state_dict().items()}}


def test_every_loss_derives_from_the_contract_and_its_shipped_defaults_are_its_own():
    assert len(OURS) == 34
    defaults = AttrDict(load_defaults()["config"]["LOSS"])
    for cls in OURS:
        name = next(n for n, c in LOSS_REGISTRY.items() if c is cls)
        assert loss_class(name) is cls
        # defaults.yaml's section builds what __init__'s defaults build (keys the loss does
        # not read, e.g. swav_loss.output_dir, are left alone); a memory bank's size is the
        # training set's, which the task fills in
        size = {"num_train_samples": 4} if "num_train_samples" in defaults[name] else {}
        assert settings(cls.from_config({**defaults[name], **size})) == settings(cls(**size)), \
            name


def test_from_config_reads_the_keys_named_as_the_parameters():
    loss = SwAVLoss.from_config({"temperature": 0.5, "num_prototypes": [7], "output_dir": ".",
                                 "queue": {"queue_length": 16, "start_iter": 3}})
    assert (loss.temperature, loss.num_prototypes, loss.queue_start_iter) == (0.5, [7], 3)
    assert loss.queue.shape[1] == 16 and loss.epsilon == 0.05
    assert SwAVLoss.from_config({"queue": None}).queue.shape[1] == 0
    # SimCLR's embedding size is VISSL's buffer_params.embedding_dim, not a key of its own
    assert SimclrInfoNCELoss.from_config({"buffer_params": {"embedding_dim": 5}}).embedding_dim == 5
    assert SimclrInfoNCELoss.from_config({"embedding_dim": 5}).embedding_dim == 128


def test_classy_visions_own_loss_gets_the_contracts_defaults():
    loss = build_loss({"name": "soft_target_cross_entropy",
                       "soft_target_cross_entropy": {"ignore_index": -1, "reduction": "mean"}})
    assert isinstance(loss, LOSS_REGISTRY["soft_target_cross_entropy"])
    assert isinstance(loss, SSLLoss)
    assert type(loss).__name__ == "SoftTargetCrossEntropyLoss"
    assert loss_class("soft_target_cross_entropy").build_hooks() == []
    loss_class("soft_target_cross_entropy").check_model_config(None)
    loss.bind_model(None)
    assert (dict(loss.loss_terms), loss.batch_coupling, loss.monitor_embedding) == ({}, None, True)
    assert loss.collapse_statistics() == {} and loss.collapse_warning({}) is None
    target = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    expected = torch.nn.functional.cross_entropy(torch.eye(2), target)
    assert loss(torch.eye(2), target).item() == pytest.approx(expected.item(), rel=1e-6)


class StepCounter(SSLHook):
    def __init__(self):
        super().__init__()
        self.seen = []

    def on_update(self, task) -> None:
        self.seen.append((type(task.loss), task.loss.step_context.iteration))


COUNTER = StepCounter()


@register_loss("plain_l2_test_loss")
class PlainL2Loss(ClassyLoss):
    """A user's loss written against classy_vision only, with one member of the contract."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    @classmethod
    def from_config(cls, config):
        return cls(config.get("scale", 1.0))

    @classmethod
    def build_hooks(cls):
        return [COUNTER]

    def forward(self, output, target):
        self.calls += 1
        return self.scale * output[0].pow(2).mean()


def test_a_plain_classy_loss_registered_by_a_user_still_trains(tmp_path):
    run_engine(tmp_path, ["config.LOSS.name=plain_l2_test_loss",
                          "+config.LOSS.plain_l2_test_loss.scale=0.5",
                          "config.OPTIMIZER.num_epochs=1", "config.LOG_FREQUENCY=1"])
    steps = [r for r in metrics(tmp_path) if r.get("phase") == "train"]
    assert [r["iteration"] for r in steps] == [1, 2, 3, 4] and all(r["loss"] > 0 for r in steps)
    assert all(torch.isfinite(w).all() for w in final_weights(tmp_path).values())
    # its own build_hooks is used; the task's loss is the user's class with the context
    assert [(issubclass(cls, PlainL2Loss), it) for cls, it in COUNTER.seen] == [
        (True, 0), (True, 1), (True, 2), (True, 3)]
    state = load_checkpoint(tmp_path / "checkpoint.torch")["classy_state_dict"]["loss"]
    assert list(state) == ["calls"] and int(state["calls"]) == 4


def test_the_train_step_gives_the_loss_its_step_context():
    contexts = []

    class Recording(FunctionLoss):
        def begin_step(self, context):
            contexts.append(context)
            super().begin_step(context)

    model = torch.nn.Linear(2, 1)
    task = SimpleNamespace(model=model, train=True, loss=Recording(lambda out, t: out.sum()),
                           meters=[], metrics=MetricsStore(), run_hook=lambda event: None,
                           iteration=5, phase_idx=2, schedule_iteration=5, schedule_length=12,
                           amp=MixedPrecision(None, "cpu"))
    batch = {"input": torch.ones(3, 2), "target": torch.zeros(3)}
    forward_loss_and_meters(task, batch)
    task.train, task.phase_idx = False, 3
    forward_loss_and_meters(task, batch)
    assert contexts == [StepContext(5, 2, True, 12), StepContext(5, 3, False, 12)]
    assert task.loss.step_context == contexts[-1]
