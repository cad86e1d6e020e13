"""Distillation from a frozen teacher: distillation_loss, dino_distillation_loss and
swav_distillation_loss against plain computations and lightly's DINO loss and Sinkhorn-Knopp;
the teacher built from a weights file; a SwAV distillation run that resumes exactly and trains
alike in 1 and 2 processes."""

import pytest
import torch
import torch.nn.functional as F
from lightly.loss.dino_loss import DINOLoss as LightlyDINOLoss
from lightly.loss.swav_loss import sinkhorn

from engine_utils import (assert_trains_like_one_process, final_weights, run_engine,
                          step_losses, stopped_after)
from ssl_engine.checkpoint import load_checkpoint
from ssl_engine.config import AttrDict, ConfigError, load_config
from ssl_engine.config.teacher import teacher_model_config
from ssl_engine.hooks.distillation_hook import DistillationHook, build_teacher
from ssl_engine.losses import build_loss
from ssl_engine.losses.base import StepContext
from ssl_engine.losses.distillation import first_crops
from ssl_engine.models.base_ssl_model import build_model


def randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def loss_named(name, **settings):
    return build_loss(AttrDict({"name": name, name: settings}))


@pytest.mark.parametrize("loss_type", ["kl_divergence", "cross_entropy", "mse"])
def test_distillation_loss_by_hand(loss_type):
    student = randn(6, 5, seed=0).requires_grad_(True)
    teacher, labels = randn(6, 5, seed=1), torch.tensor([0, 1, 2, 3, 4, 0])
    loss_fn = loss_named("distillation_loss", soft_target_alpha=0.3, temperature=4.0,
                         loss_type=loss_type)
    loss_fn.set_teacher_output([teacher], teacher=None)
    loss = loss_fn([student], labels.unsqueeze(1))
    p_t = torch.exp(teacher / 4) / torch.exp(teacher / 4).sum(1, keepdim=True)
    log_p_s = student / 4 - torch.log(torch.exp(student / 4).sum(1, keepdim=True))
    if loss_type == "kl_divergence":
        soft = 16 * (p_t * (torch.log(p_t) - log_p_s)).sum() / 6
    elif loss_type == "cross_entropy":
        soft = -16 * (p_t * log_p_s).sum() / 6
    else:
        soft = ((student - teacher) ** 2).mean()
    log_probs = student - torch.log(torch.exp(student).sum(1, keepdim=True))
    hard = -log_probs[torch.arange(6), labels].mean()
    torch.testing.assert_close(loss, 0.3 * soft + 0.7 * hard)
    assert set(loss_fn.loss_terms) == {"soft", "hard"}
    loss.backward()
    assert student.grad.abs().sum() > 0
    with pytest.raises(RuntimeError, match="distillation hook"):  # the output is used once
        loss_fn([student], labels)


def test_dino_distillation_with_swapped_assignment_is_lightly_dino_without_center():
    student_crops, teacher_crops, batch, k = 5, 2, 4, 7
    student = randn(student_crops * batch, k, seed=2)
    teacher = randn(teacher_crops * batch, k, seed=3)
    loss_fn = loss_named("dino_distillation_loss", teacher_num_crops=2, student_num_crops=5,
                         teacher_temperature=0.05, student_temperature=0.1,
                         swapped_assignment=True)
    loss_fn.set_teacher_output([teacher], teacher=None)
    ours = loss_fn([student], None)
    # lightly's centre is 0 before its first update: DINO's loss without centering
    theirs = LightlyDINOLoss(output_dim=k, warmup_teacher_temp=0.05, teacher_temp=0.05,
                             student_temp=0.1)(list(teacher.chunk(2)), list(student.chunk(5)),
                                               epoch=0)
    torch.testing.assert_close(ours, theirs)


def test_dino_distillation_pairs_each_global_crop_with_its_own_teacher_view():
    student, teacher = randn(4 * 3, 6, seed=4), randn(2 * 3, 6, seed=5)
    loss_fn = loss_named("dino_distillation_loss", teacher_num_crops=2, student_num_crops=4,
                         teacher_temperature=0.07, student_temperature=0.1)
    assert list(loss_fn.pairs()) == [(0, 0), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
    loss_fn.set_teacher_output([teacher], teacher=None)
    q = F.softmax(teacher / 0.07, dim=1).chunk(2)
    s = F.log_softmax(student / 0.1, dim=1).chunk(4)
    expected = sum(-(q[a] * s[b]).sum(1).mean() for a, b in loss_fn.pairs()) / 6
    torch.testing.assert_close(loss_fn([student], None), expected)


def test_first_crops_takes_the_leading_views_of_multicrop_groups():
    # 3 samples, 2 global crops (one tensor) then 3 local ones
    inputs = [torch.arange(6.).view(6, 1), torch.arange(6., 15.).view(9, 1)]
    assert [t.flatten().tolist() for t in first_crops(inputs, 5, 2)] == [[0, 1, 2, 3, 4, 5]]
    assert [t.flatten().tolist() for t in first_crops(inputs, 5, 1)] == [[0, 1, 2]]
    assert [t.flatten().tolist() for t in first_crops(inputs, 5, 3)] == [
        [0, 1, 2, 3, 4, 5], [6, 7, 8]]


def swav_scores(rows, k, seed):
    return F.normalize(randn(rows, 8, seed=seed), dim=1) @ F.normalize(
        randn(k, 8, seed=seed + 1), dim=1).t()


@pytest.mark.parametrize("swapped", [False, True])
def test_swav_distillation_by_hand_with_sinkhorn_of_lightly(swapped):
    batch, crops, k = 4, 4, 6
    student = swav_scores(crops * batch, k, seed=6)
    teacher = swav_scores(2 * batch, k, seed=8)
    loss_fn = loss_named("swav_distillation_loss", num_crops=crops, num_prototypes=[k],
                         epsilon=0.05, num_iters=3, temperature=0.1,
                         swapped_assignment=swapped)
    loss_fn.set_teacher_output([randn(2 * batch, 8, seed=0), teacher], teacher=None)
    ours = loss_fn([randn(crops * batch, 8, seed=1), student], None)
    expected = 0
    for crop in range(2):
        q = sinkhorn(teacher[crop * batch:(crop + 1) * batch], iterations=3, epsilon=0.05)
        predicting = ([p for p in range(crops) if p != crop] if swapped
                      else [crop, 2, 3])
        expected += sum(-(q * F.log_softmax(student[p * batch:(p + 1) * batch] / 0.1, dim=1))
                        .sum(1).mean() for p in predicting) / len(predicting)
    torch.testing.assert_close(ours, expected / 2)


def test_swav_distillation_with_teacher_prototypes_softmax_assignments_and_a_queue():
    batch, crops, k, dim = 3, 3, 5, 4
    features = randn(crops * batch, dim, seed=10)
    prototypes = F.normalize(randn(k, dim, seed=11), dim=1)
    teacher_scores = randn(batch, k, seed=12)

    class Teacher(torch.nn.Module):  # what the loss reads of the teacher: its prototypes
        def __init__(self):
            super().__init__()
            self.heads = torch.nn.ModuleList([torch.nn.Module()])
            self.heads[0].prototypes0 = torch.nn.Linear(dim, k, bias=False)
            self.heads[0].prototypes0.weight.data.copy_(prototypes)

    loss_fn = loss_named("swav_distillation_loss", num_crops=crops, num_prototypes=[k],
                         num_iters=0, epsilon=0.5, temperature=0.2, use_teacher_prototypes=True,
                         use_two_crops_for_teacher=False, normalize_student_feats=True)
    loss_fn.set_teacher_output([teacher_scores], Teacher())
    q = F.softmax(teacher_scores / 0.5, dim=1)
    scores = F.normalize(features, dim=1) @ prototypes.t()
    expected = sum(-(q * F.log_softmax(scores[p * batch:(p + 1) * batch] / 0.2, dim=1))
                   .sum(1).mean() for p in range(crops)) / crops
    torch.testing.assert_close(loss_fn([features], None), expected)

    # a queue of the teacher's past scores joins the Sinkhorn problem once it holds rows
    queued = loss_named("swav_distillation_loss", num_crops=2, num_prototypes=[k],
                        num_iters=3, epsilon=0.05, local_queue_length=4,
                        use_two_crops_for_teacher=False)
    queued.begin_step(StepContext(iteration=0, train=True))
    first = randn(2, k, seed=13)
    queued.set_teacher_output([first], None)
    queued([randn(4, k, seed=14)], None)
    assert int(queued.queue_filled) == 2 and torch.equal(queued.queue[:2], first)
    second, student = randn(2, k, seed=15), randn(4, k, seed=16)
    queued.set_teacher_output([second], None)
    q = sinkhorn(torch.cat([second, first]), iterations=3, epsilon=0.05)[:2]
    expected = sum(-(q * F.log_softmax(student[p * 2:(p + 1) * 2] / 0.1, dim=1)).sum(1).mean()
                   for p in range(2)) / 2
    torch.testing.assert_close(queued([student], None), expected)
    assert torch.equal(queued.queue, torch.cat([second, first]))


def write_teacher(cfg, path):
    """A teacher's weights file as a training run would leave them: random weights of the
    teacher's model (seeded), as a plain state dict."""
    torch.manual_seed(5)
    teacher = build_model(teacher_model_config(cfg))
    torch.save(teacher.state_dict(), path)
    return teacher.state_dict()


CONFIG = "config=test/quick_swav_distillation_synthetic"


def test_teacher_is_built_from_its_file_frozen_and_refused_without_one(tmp_path):
    _, cfg = load_config([CONFIG])
    saved = write_teacher(cfg, tmp_path / "teacher.torch")
    cfg.DISTILLATION.TEACHER_MODEL.WEIGHTS_INIT.PARAMS_FILE = str(tmp_path / "teacher.torch")
    teacher = build_teacher(cfg, torch.device("cpu"))
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    for name, value in teacher.state_dict().items():
        assert torch.equal(value, saved[name]), name
    cfg.DISTILLATION.TEACHER_MODEL.WEIGHTS_INIT.PARAMS_FILE = "please specify teacher model weights"
    with pytest.raises(ValueError, match="WEIGHTS_INIT.PARAMS_FILE to the teacher's checkpoint"):
        build_teacher(cfg, torch.device("cpu"))
    assert isinstance(build_loss(cfg.LOSS).build_hooks()[0], DistillationHook)
    # the student's crops are those the transforms make (4), whatever the loss's key says
    _, other = load_config([CONFIG, "config.LOSS.swav_distillation_loss.num_crops=6"])
    assert other.LOSS.swav_distillation_loss.num_crops == 4
    with pytest.raises(ConfigError, match="the teacher is not sharded"):
        load_config([CONFIG, "config.DISTILLATION.TEACHER_MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=true"])


def test_swav_distillation_trains_resumes_exactly_and_scales_to_two_processes(tmp_path):
    _, cfg = load_config([CONFIG])
    write_teacher(cfg, tmp_path / "teacher.torch")
    common = [f"config.DISTILLATION.TEACHER_MODEL.WEIGHTS_INIT.PARAMS_FILE={tmp_path}/teacher.torch",
              "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=16", "config.LOG_FREQUENCY=1",
              "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=1",
              # batch norm over the global batch (the student head), so 2 x 4 is 1 x 8
              "config.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=true"]
    one = ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8", *common]
    run_engine(tmp_path / "straight", one, config=CONFIG)
    losses = step_losses(tmp_path / "straight")
    assert sorted(losses) == [1, 2] and all(0 < loss < 10 for loss in losses.values())
    state = load_checkpoint(tmp_path / "straight" / "checkpoint.torch")["classy_state_dict"]
    assert int(state["loss"]["queue_filled"][0]) == 16  # the teacher's scores of both steps
    assert not any("teacher" in key for key in state)  # the teacher is rebuilt, not saved

    # the run as if stopped after its first iteration (its folder up to that checkpoint),
    # resumed: the queue, the teacher rebuilt from its file
    stopped = stopped_after(tmp_path / "straight", tmp_path / "stopped", "model_iteration1.torch")
    run_engine(stopped, one + ["config.CHECKPOINT.AUTO_RESUME=true"], config=CONFIG)
    assert (stopped / "checkpoint.torch").resolve().name != "model_iteration1.torch"
    straight, resumed = final_weights(tmp_path / "straight"), final_weights(stopped)
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    assert step_losses(stopped)[2] == losses[2]

    run_engine(tmp_path / "two", ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
                                  "config.DISTRIBUTED.NUM_PROC_PER_NODE=2", *common],
               config=CONFIG)
    assert_trains_like_one_process(tmp_path / "two", losses, straight)
