"""No training step makes the host wait for the device (docs/performance.md, "No waits in a
step"): one iteration of every quickstart recipe and of the ImageNet recipes at a tiny size,
its hooks included, counted with ssl_engine/utils/host_waits.py. The iteration that writes the
log line may read back once (the metrics store's values, in one batch)."""
from pathlib import Path

import pytest
import torch

import ssl_engine.losses  # noqa: F401  (registers the losses the recipes name)
import ssl_engine.models  # noqa: F401
from host_wait_utils import count_host_waits
from ssl_engine.losses.simclr_info_nce_loss import SimclrInfoNCELoss
from ssl_engine.utils import cpu_budget
from ssl_engine.utils.host_waits import HostWaitCounter

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "config"
QUICKSTARTS = sorted(f"quickstart/{path.stem}" for path in (CONFIGS / "quickstart").glob("*.yaml"))

# the ImageNet recipes on synthetic images, shrunk (host_wait_utils.shrink): 2 images of 32
# pixels per step, crops of 32 and 16, narrow ResNets, 2-block ViTs of width 48 in patches of
# 8, heads narrowed to them; their components, losses and hooks as written
SYNTHETIC = ["config.DATA.TRAIN.DATA_SOURCES=[synthetic]", "config.DATA.TRAIN.DATA_PATHS=[]",
             "config.DATA.TRAIN.SYNTHETIC.IMAGE_SIZE=32", "config.DATA.TRAIN.DATA_LIMIT=4",
             "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=2", "config.DISTRIBUTED.NUM_NODES=1",
             f"config.DISTRIBUTED.BACKEND={'nccl' if torch.cuda.is_available() else 'gloo'}",
             # the recipes' learning rates on 2 tiny images may give a NaN loss after the first
             # update (SwAV's was seen to, after other runs in the same process); the waits
             # are the same either way, and the NaN check is counted in the quickstarts
             "config.HOOKS.CHECK_NAN=false"]
SMALL_RESNET = ["config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.125"]
SMALL_VIT = ["config.MODEL.TRUNK.VISION_TRANSFORMERS.name=null",
             "config.MODEL.TRUNK.VISION_TRANSFORMERS.NUM_LAYERS=2",
             "config.MODEL.TRUNK.VISION_TRANSFORMERS.HIDDEN_DIM=48",
             "config.MODEL.TRUNK.VISION_TRANSFORMERS.NUM_HEADS=2",
             "config.MODEL.TRUNK.VISION_TRANSFORMERS.MLP_DIM=96"]
# recipe -> (overrides, the narrowed trunk's output width: the first head's input)
IMAGENET = {
    "pretrain/simclr/simclr_resnet50": (SMALL_RESNET, 256),
    "pretrain/swav/swav_resnet50": (SMALL_RESNET, 256),
    "pretrain/moco_v2/moco_v2_resnet50": (SMALL_RESNET, 256),
    "pretrain/barlow_twins/barlow_twins_resnet50": (SMALL_RESNET, 256),
    "pretrain/dino/dino_vit_s16": (SMALL_VIT, 48),
    "pretrain/msn/msn_deits16": (SMALL_VIT, 48),
    "pretrain/mae/mae_vit_b16": (SMALL_VIT, 48),
}


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """One torch thread per run: the steps are tiny, and on a busy machine a second thread's
    barrier at every operation costs many times the work (the thread count is given back)."""
    threads = torch.get_num_threads()
    monkeypatch.setattr(cpu_budget, "compute_threads", lambda *args: 1)
    yield
    torch.set_num_threads(threads)


def assert_no_waits(hook) -> None:
    """0 waits on the iterations without a log line, at most 1 on those with one."""
    assert hook.per_iteration, "no training iteration was counted"
    for iteration, count in hook.per_iteration.items():
        allowed = 1 if hook.logged[iteration] else 0
        assert count <= allowed, (iteration, hook.where[iteration])
        syncs = hook.cuda_syncs.get(iteration, [])  # on a GPU
        assert len(syncs) <= allowed, (iteration, syncs)
    assert any(not logged for logged in hook.logged.values())  # a step without the log line


@pytest.mark.parametrize("config", QUICKSTARTS)
def test_quickstart_steps_do_not_wait_for_the_device(config, tmp_path):
    assert_no_waits(count_host_waits(tmp_path, config))


@pytest.mark.parametrize("config", sorted(IMAGENET))
def test_imagenet_recipe_steps_do_not_wait_for_the_device(config, tmp_path):
    overrides, head_input = IMAGENET[config]
    assert_no_waits(count_host_waits(tmp_path, config, SYNTHETIC + overrides, head_input))


def test_an_item_in_a_loss_is_counted(tmp_path, monkeypatch):
    """The counter sees a value read back in a loss: the test above would fail on it."""
    forward = SimclrInfoNCELoss.forward

    def reads_back(self, *args, **kwargs):
        loss = forward(self, *args, **kwargs)
        loss.item()
        return loss

    monkeypatch.setattr(SimclrInfoNCELoss, "forward", reads_back)
    hook = count_host_waits(tmp_path, "quickstart/simclr_digits")
    first = min(hook.per_iteration)
    assert hook.per_iteration[first] == 1 and not hook.logged[first]
    assert "item" in hook.where[first][0]
    with pytest.raises(AssertionError):
        assert_no_waits(hook)


def test_the_counter_sees_each_kind_of_wait():
    """Value reads, data-dependent shapes and boolean masks count; index gathers do not."""
    x = torch.arange(6.0)
    mask = x > 2
    with HostWaitCounter() as counter:
        x.sum().item()
        bool(x.any())
        x.nonzero()
        x[mask]
        x.masked_select(mask)
        torch.unique(x)
        x.index_select(0, torch.tensor([0, 2]))
        torch.where(mask, x, 0.0)
    assert counter.counts == {"item": 2, "nonzero": 1, "boolean mask": 1, "masked_select": 1,
                              "unique": 1}
