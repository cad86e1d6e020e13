"""HOOKS.ONLINE_LINEAR_PROBE: the probe trains on the training forward's features without
touching the trunk's gradients, is checkpointed and resumes exactly, and is the same on every
process."""
import copy
import pickle
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine_utils import QUICK, crash_hooks_at, final_weights, metrics, run_engine
from ssl_engine.checkpoint import load_checkpoint
from ssl_engine.config import ConfigError, load_config
from ssl_engine.hooks import SSLHook
from ssl_engine.hooks.online_probe_hook import OnlineLinearProbeHook
from ssl_engine.trainer.default_hooks import default_hook_generator
from ssl_engine.trainer.task import SelfSupervisionTask

PROBE = [
    "config.DATA.TEST.DATA_SOURCES=[synthetic]", "config.DATA.TEST.DATA_PATHS=['']",
    "config.DATA.TEST.BATCHSIZE_PER_REPLICA=12",
    "config.DATA.TEST.SYNTHETIC={NUM_SAMPLES: 20, IMAGE_SIZE: 24, NUM_CLASSES: 4}",
    "config.DATA.TEST.TRANSFORMS=[{name: Resize, size: 16}, {name: ToTensor}]",
    "config.HOOKS.ONLINE_LINEAR_PROBE.ENABLED=true", "config.HOOKS.ONLINE_LINEAR_PROBE.LR=0.5",
    "config.HOOKS.ONLINE_LINEAR_PROBE.WEIGHT_DECAY=0.001",
]
# GroupNorm: one process with batch 8 and two with batch 4 compute the same (see
# test_distributed_training.py); 3 iterations per epoch, 2 epochs
ENGINE = PROBE + ["config.MODEL.TRUNK.RESNETS.NORM=GroupNorm", "config.LOG_FREQUENCY=1",
                  "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=24",
                  "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=2"]
NAME = OnlineLinearProbeHook.name()


def prepared_task(overrides, checkpoint=None):
    _, cfg = load_config([QUICK, *PROBE, *overrides])
    task = SelfSupervisionTask.from_config(cfg)
    hook = OnlineLinearProbeHook(cfg)
    task.set_hooks([hook])
    task.prepare(checkpoint=checkpoint)
    return task, hook


@pytest.mark.parametrize("layer", ["", "res4"])
def test_probe_step_leaves_trunk_gradients_bit_identical(layer):
    task, hook = prepared_task([f"config.HOOKS.ONLINE_LINEAR_PROBE.LAYER={layer}"])
    reference = copy.deepcopy(task.base_model)  # before the probe's forward hooks
    hook.on_start(task)
    assert hook.num_classes == 4  # from the synthetic labels
    torch.manual_seed(0)
    x, targets = torch.randn(16, 3, 16, 16), torch.arange(16) % 4
    task.last_batch = {"input": x, "target": targets}
    hook.on_phase_start(task)
    for model, probe_on in ((task.base_model, True), (reference, False)):
        output = model(x)[0]
        if probe_on:
            hook.on_forward(task)
        (output ** 2).sum().backward()
    with torch.no_grad():
        assert torch.equal(task.base_model(x)[0], reference(x)[0])  # the model's output
    for (name, param), ref in zip(task.base_model.named_parameters(), reference.parameters()):
        assert torch.equal(param.grad, ref.grad), name

    # the probe took one SGD step on the detached (pooled) features of the whole batch
    with torch.no_grad():
        stage = reference.trunk(x, out_feat_keys=[hook.layer])[0]
        features = stage if stage.dim() == 2 else stage.mean(dim=(2, 3))
    expected = nn.Sequential(nn.BatchNorm1d(features.shape[1], affine=False),
                             nn.Linear(features.shape[1], 4))
    nn.init.zeros_(expected[1].weight), nn.init.zeros_(expected[1].bias)
    optimizer = torch.optim.SGD(expected.parameters(), lr=0.5, momentum=0.9, weight_decay=0.001)
    F.cross_entropy(expected(features), targets).backward()
    optimizer.step()
    for name, value in expected.state_dict().items():
        torch.testing.assert_close(hook.probe.state_dict()[name], value, msg=name)
    assert hook.probe[1].weight.abs().sum() > 0
    trained = {id(p) for group in task.optimizer.param_groups for p in group["params"]}
    assert not trained & {id(p) for p in hook.probe.parameters()}


def test_probe_state_in_the_checkpoint_and_old_checkpoints_load():
    task, hook = prepared_task([])
    assert "hooks" not in task.get_classy_state()  # nothing built yet: nothing saved
    hook.on_start(task)
    hook.on_phase_start(task)
    task.last_batch = {"target": torch.arange(16) % 4}
    task.base_model(torch.randn(16, 3, 16, 16))
    hook.on_forward(task)
    state = task.get_classy_state()
    saved = state["hooks"][NAME]
    assert saved["optimizer"]["state"]  # the momentum buffers

    resumed_task, resumed = prepared_task([], checkpoint={"classy_state_dict": state})
    resumed.on_start(resumed_task)
    for name, value in hook.probe.state_dict().items():
        assert torch.equal(resumed.probe.state_dict()[name], value), name
    assert resumed.optimizer.state_dict()["state"].keys() == saved["optimizer"]["state"].keys()

    del state["hooks"]  # a checkpoint written without the probe: it starts afresh
    old_task, fresh = prepared_task([], checkpoint={"classy_state_dict": state})
    fresh.on_start(old_task)
    assert fresh.probe[1].weight.abs().sum() == 0


def test_bad_settings_are_refused_with_the_key():
    for override, match in [("LR=0", "ONLINE_LINEAR_PROBE.LR must be > 0"),
                            ("LAYER=res9", "ONLINE_LINEAR_PROBE.LAYER=res9"),
                            ("NUM_CLASSES=-1", "NUM_CLASSES must be >= 0")]:
        _, cfg = load_config([QUICK, *PROBE, f"config.HOOKS.ONLINE_LINEAR_PROBE.{override}"])
        with pytest.raises(ConfigError, match=match):
            default_hook_generator(cfg)
    _, cfg = load_config([QUICK, "config.HOOKS.ONLINE_LINEAR_PROBE.ENABLED=true"])
    with pytest.raises(ConfigError, match="config.DATA.TEST.DATA_SOURCES"):
        default_hook_generator(cfg)


class DumpProbe(SSLHook):
    """Writes this rank's probe state at the end of the run."""

    def on_end(self, task):
        (probe,) = [hook for hook in task.hooks if isinstance(hook, OnlineLinearProbeHook)]
        folder = Path(task.checkpoint_folder)
        with open(folder / f"probe_rank{torch.distributed.get_rank()}.pkl", "wb") as handle:
            pickle.dump(probe.get_classy_state()["probe"], handle)


def dump_probe_hooks(cfg):
    return default_hook_generator(cfg) + [DumpProbe()]


def probe_state(folder):
    return load_checkpoint(folder / "checkpoint.torch")["classy_state_dict"]["hooks"][NAME]


def probe_rows(folder):
    """The test accuracy per epoch (the last row of each) and the training top-1 per step."""
    rows = metrics(folder)
    test = {m["online_probe"]["train_phase_idx"]: m["online_probe"] for m in rows
            if "online_probe" in m}
    train = {m["iteration"]: m["metrics"]["online_probe_train_top1"] for m in rows
             if m.get("phase") == "train"}
    return test, train


def test_resume_is_exact_and_two_processes_hold_the_probe_of_one(tmp_path):
    straight, crashed, two = tmp_path / "straight", tmp_path / "crashed", tmp_path / "two"
    run_engine(straight, ENGINE + ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8"])
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_engine(crashed, ENGINE + ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8"],
                   hook_generator=crash_hooks_at(4))
    assert load_checkpoint(crashed / "checkpoint.torch")["type"] == "iteration"
    run_engine(crashed, ENGINE + ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8"])

    reference = probe_state(straight)
    for name, value in reference["probe"].items():
        assert torch.equal(probe_state(crashed)["probe"][name], value), name
    momentum = reference["optimizer"]["state"][0]["momentum_buffer"]
    assert torch.equal(probe_state(crashed)["optimizer"]["state"][0]["momentum_buffer"], momentum)
    test, train = probe_rows(straight)
    assert sorted(test) == [0, 1] and sorted(train) == [1, 2, 3, 4, 5, 6]
    assert probe_rows(crashed) == (test, train)
    for record in test.values():
        assert record["layer"] == "res5avg" and 0 <= record["top1"] <= record["top5"] <= 100
    assert "online linear probe top-1" in (straight / "log.txt").read_text()
    straight_weights, crashed_weights = final_weights(straight), final_weights(crashed)
    for name in straight_weights:
        assert torch.equal(straight_weights[name], crashed_weights[name]), name

    run_engine(two, ENGINE + ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
                              "config.DISTRIBUTED.NUM_PROC_PER_NODE=2"],
               hook_generator=dump_probe_hooks)
    ranks = [pickle.loads((two / f"probe_rank{rank}.pkl").read_bytes()) for rank in (0, 1)]
    assert probe_rows(two) == (test, train)
    for name, value in reference["probe"].items():
        assert torch.equal(ranks[0][name], ranks[1][name]), name  # one classifier
        # that of one process: the trunks differ by float rounding (their losses by 1e-6),
        # which six steps at lr 0.5 turn into about 1e-3 of the probe's weights
        torch.testing.assert_close(ranks[0][name], value, rtol=1e-2, atol=3e-3, msg=name)
