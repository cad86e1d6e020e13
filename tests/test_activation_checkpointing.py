"""MODEL.ACTIVATION_CHECKPOINTING: the same gradients and batch-norm statistics as without,
fewer tensors kept for the backward pass (ResNet, RegNet and ViT), and nothing changes outside
training."""
import copy
from pathlib import Path

import pytest
import torch
import yaml

from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.models import build_model
from ssl_engine.models.activation_checkpointing import split_evenly

with open(Path(__file__).resolve().parents[1] / "configs/config/defaults.yaml") as f:
    DEFAULT_MODEL_CFG = AttrDict(yaml.safe_load(f)["config"]["MODEL"])
RESNET = {"TRUNK.RESNETS.DEPTH": 18, "TRUNK.RESNETS.WIDTH_MULTIPLIER": 0.25,
          "TRUNK.RESNETS.SMALL_IMAGE_STEM": True}
VIT = {"TRUNK.NAME": "vision_transformer", "TRUNK.VISION_TRANSFORMERS.IMAGE_SIZE": 16,
       "TRUNK.VISION_TRANSFORMERS.PATCH_SIZE": 4, "TRUNK.VISION_TRANSFORMERS.HIDDEN_DIM": 32,
       "TRUNK.VISION_TRANSFORMERS.NUM_LAYERS": 4, "TRUNK.VISION_TRANSFORMERS.NUM_HEADS": 2,
       "TRUNK.VISION_TRANSFORMERS.MLP_DIM": 64, "TRUNK.VISION_TRANSFORMERS.DROP_PATH_RATE": 0.1}
REGNET = {"TRUNK.NAME": "regnet", "TRUNK.REGNET.depth": 6, "TRUNK.REGNET.w_0": 8,
          "TRUNK.REGNET.w_a": 8.0, "TRUNK.REGNET.w_m": 2.0, "TRUNK.REGNET.group_width": 8,
          "TRUNK.REGNET.stem_width": 8}


def model_pair(settings, splits):
    """The same model (same weights) built without and with checkpointing."""
    models = []
    for use in (False, True):
        cfg = copy.deepcopy(DEFAULT_MODEL_CFG)
        for path, value in settings.items():
            node = cfg
            *parents, last = path.split(".")
            for part in parents:
                node = node[part]
            node[last] = value
        cfg.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING = use
        cfg.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS = splits
        torch.manual_seed(0)
        models.append(build_model(cfg).train())
    return models


def saved_for_backward(model, x):
    """Loss of a forward, and the number of tensors autograd keeps for its backward."""
    count = [0]

    def pack(tensor):
        count[0] += 1
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(x)[0].square().mean()
    return loss, count[0]


@pytest.mark.parametrize("settings, splits", [(RESNET, 2), (RESNET, 1), (VIT, 2), (REGNET, 2)],
                         ids=["resnet-2", "resnet-1", "vit", "regnet"])
def test_same_gradients_and_statistics_with_fewer_saved_tensors(settings, splits):
    plain, checkpointed = model_pair(settings, splits)
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    results = []
    for model in (plain, checkpointed):
        torch.manual_seed(2)  # the ViT's stochastic depth draws the same paths
        loss, saved = saved_for_backward(model, x)
        loss.backward()
        results.append((loss, saved))
    (plain_loss, plain_saved), (loss, saved) = results
    torch.testing.assert_close(loss, plain_loss, rtol=0, atol=0)
    assert saved < plain_saved / 3, (saved, plain_saved)
    for (name, a), b in zip(plain.named_parameters(), checkpointed.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-7, msg=name)
    for (name, a), b in zip(plain.named_buffers(), checkpointed.buffers()):  # one update each
        assert torch.equal(a, b), name

    # evaluation and no-grad forwards keep every activation as they are
    checkpointed.eval()
    with torch.no_grad():
        torch.testing.assert_close(checkpointed(x)[0], plain.eval()(x)[0], rtol=0, atol=0)


def test_splits_are_contiguous_and_even():
    assert split_evenly(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
    assert split_evenly(list(range(3)), 8) == [[0], [1], [2]]
    assert split_evenly(list(range(4)), 1) == [[0, 1, 2, 3]]
    cfg = copy.deepcopy(DEFAULT_MODEL_CFG)
    cfg.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING = True
    cfg.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS = 0
    with pytest.raises(ValueError, match="NUM_ACTIVATION_CHECKPOINTING_SPLITS must be an integer"):
        build_model(cfg)


def test_regnet_block_groups_of_vissl_are_checkpointed_as_given():
    """REGNET.stage_checkpoints / stage_checkpointing (VISSL's FSDP RegNet): the groups of a
    stage, checkpointed as flagged, give the same gradients with fewer saved tensors."""
    from ssl_engine.models.trunks.regnet import stage_groups

    cfg = AttrDict({"stage_checkpoints": [[], [1], [1, 2], []],
                    "stage_checkpointing": [[], [False], [True, True], []]})
    assert stage_groups(cfg, [1, 1, 3, 1], with_checkpointing=True) == [
        [(0, 1, False)], [(0, 1, False)], [(0, 1, True), (1, 2, True), (2, 3, True)],
        [(0, 1, False)]]
    cfg.stage_checkpointing = []  # flags default to USE_ACTIVATION_CHECKPOINTING
    assert stage_groups(cfg, [1, 1, 3, 1], with_checkpointing=False)[2] == [
        (0, 1, False), (1, 2, False), (2, 3, False)]
    plain, grouped = model_pair({**REGNET, "TRUNK.REGNET.stage_checkpoints": [[], [], [1], []]}, 2)
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    (plain_loss, plain_saved), (loss, saved) = [saved_for_backward(m, x) for m in (plain, grouped)]
    plain_loss.backward()
    loss.backward()
    torch.testing.assert_close(loss, plain_loss, rtol=0, atol=0)
    assert saved < plain_saved, (saved, plain_saved)
    for (name, a), b in zip(plain.named_parameters(), grouped.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-7, msg=name)
