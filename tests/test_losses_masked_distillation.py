"""ibot_distillation_loss, msn_distillation_loss and ibot_distillation_head against plain
computations and lightly's DINO loss; an iBOT distillation from a frozen ViT teacher (fed by
MULTI_INPUT_HEAD_MAPPING) that resumes exactly and trains alike in 1 and 2 processes."""

import pytest
import torch
import torch.nn.functional as F
from lightly.loss.dino_loss import DINOLoss as LightlyDINOLoss

from engine_utils import (assert_trains_like_one_process, final_weights, run_engine,
                          step_losses, stopped_after)
from ssl_engine.config import AttrDict, load_config
from ssl_engine.config.teacher import teacher_model_config
from ssl_engine.hooks.distillation_hook import build_teacher
from ssl_engine.losses import build_loss
from ssl_engine.models import MODEL_HEADS
from ssl_engine.models.base_ssl_model import build_model
from ssl_engine.models.heads.dino_head import WeightNormLinear


def randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def loss_named(name, **settings):
    return build_loss(AttrDict({"name": name, name: settings}))


def plain_ibot_distillation(s_cls, s_patch, t_cls, t_patch, mask, globals_, crops, pairs,
                            s_temp, t_temp, tp_temp, lambda1, lambda2):
    """iBOT's two terms written out sample by sample."""
    batch = t_cls.shape[0] // globals_
    cls = 0.0
    for q, v in pairs:
        for b in range(batch):
            p = F.softmax(t_cls[q * batch + b] / t_temp, dim=0)
            log_s = F.log_softmax(s_cls[v * batch + b] / s_temp, dim=0)
            cls = cls - (p * log_s).sum() / batch
    cls = cls / len(pairs)
    patch, images = 0.0, t_patch.shape[0]
    for i in range(images):
        masked = [j for j in range(t_patch.shape[1]) if mask[i].flatten()[j]]
        total = sum(-(F.softmax(t_patch[i, j] / tp_temp, dim=0)
                      * F.log_softmax(s_patch[i, j] / s_temp, dim=0)).sum() for j in masked)
        patch = patch + total / max(1, len(masked)) / images
    return lambda1 * cls + lambda2 * patch


@pytest.mark.parametrize("swapped", [False, True])
def test_ibot_distillation_by_hand(swapped):
    globals_, crops, batch, k, patches = 2, 4, 3, 6, 4
    s_cls = randn(crops * batch, k, seed=0).requires_grad_(True)
    s_patch = randn(globals_ * batch, patches, k, seed=1).requires_grad_(True)
    t_cls, t_patch = randn(globals_ * batch, k, seed=2), randn(globals_ * batch, patches, k, seed=3)
    mask = randn(globals_ * batch, 2, 2, seed=4) > 0
    mask[0] = False  # an image without masked patches counts 0
    loss_fn = loss_named("ibot_distillation_loss", swapped_assignment=swapped,
                         num_global_crops=globals_, student_num_crops=crops, student_temp=0.1,
                         teacher_temp=0.05, teacher_patch_temp=0.07, lambda1=0.7, lambda2=1.3)
    loss_fn.set_teacher_output([t_cls, t_patch], teacher=None)
    loss = loss_fn([s_cls, s_patch], mask)
    pairs = ([(q, v) for q in range(2) for v in range(4) if v != q] if swapped
             else [(0, 0), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)])
    expected = plain_ibot_distillation(s_cls, s_patch, t_cls, t_patch, mask, globals_, crops,
                                       pairs, 0.1, 0.05, 0.07, 0.7, 1.3)
    torch.testing.assert_close(loss, expected)
    assert set(loss_fn.loss_terms) == {"cls", "patch"}
    loss.backward()
    assert s_cls.grad.abs().sum() > 0 and s_patch.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="disagree with num_global_crops=2"):
        loss_fn.set_teacher_output([t_cls[:4], t_patch], teacher=None)
        loss_fn([s_cls, s_patch], mask)


def test_ibot_distillation_with_the_teachers_prototypes():
    globals_, crops, batch, dim, k = 2, 3, 2, 5, 7
    head = torch.nn.Module()  # a frozen teacher head's prototype layers
    head.prototypes0, head.prototypes1 = WeightNormLinear(dim, k), WeightNormLinear(dim, k)
    teacher = torch.nn.Module()
    teacher.heads = torch.nn.ModuleList([head])
    s_cls, s_patch = randn(crops * batch, dim, seed=5), randn(globals_ * batch, 4, dim, seed=6)
    t_cls, t_patch = randn(globals_ * batch, k, seed=7), randn(globals_ * batch, 4, k, seed=8)
    mask = torch.ones(globals_ * batch, 4, dtype=torch.bool)
    loss_fn = loss_named("ibot_distillation_loss", use_teacher_prototypes=True,
                         num_global_crops=globals_, student_num_crops=crops)
    loss_fn.set_teacher_output([t_cls, t_patch], teacher=teacher)
    loss = loss_fn([s_cls, s_patch], mask)
    with torch.no_grad():
        scored_cls, scored_patch = head.prototypes0(s_cls), head.prototypes1(s_patch)
    plain = loss_named("ibot_distillation_loss", num_global_crops=globals_, student_num_crops=crops)
    plain.set_teacher_output([t_cls, t_patch], teacher=None)
    torch.testing.assert_close(loss, plain([scored_cls, scored_patch], mask))


def test_msn_distillation_is_dino_against_the_teachers_own_scores():
    teacher_crops, student_crops, batch, k = 2, 5, 4, 8
    student, teacher = randn(student_crops * batch, k, seed=9), randn(2 * batch, k, seed=10)
    swapped = loss_named("msn_distillation_loss", swapped_assignment=True, student_temperature=0.1,
                         teacher_num_crops=teacher_crops, student_num_crops=student_crops)
    swapped.set_teacher_output([teacher], teacher=None)
    # lightly's DINO loss before its first centre update, at teacher temperature 1
    theirs = LightlyDINOLoss(output_dim=k, warmup_teacher_temp=1.0, teacher_temp=1.0,
                             student_temp=0.1)(list(teacher.chunk(2)),
                                               list(student.chunk(student_crops)), epoch=0)
    torch.testing.assert_close(swapped([student], None), theirs)
    paired = loss_named("msn_distillation_loss", student_temperature=0.2,
                        teacher_num_crops=teacher_crops, student_num_crops=student_crops)
    paired.set_teacher_output([randn(3, 3, seed=0), teacher], teacher=None)  # its last output
    q = F.softmax(teacher, dim=1).chunk(2)
    s = F.log_softmax(student / 0.2, dim=1).chunk(student_crops)
    pairs = [(0, 0), (0, 2), (0, 3), (0, 4), (1, 1), (1, 2), (1, 3), (1, 4)]
    expected = sum(-(q[a] * s[b]).sum(1).mean() for a, b in pairs) / len(pairs)
    torch.testing.assert_close(paired([student], None), expected)


def test_ibot_distillation_head_scores_class_tokens_local_views_and_patches():
    torch.manual_seed(0)
    head = MODEL_HEADS.get("ibot_distillation_head")(in_dim=6, out_dim=5, hidden_dim=8)
    tokens, local = randn(3, 1 + 4, 6, seed=11), randn(2, 6, seed=12)
    classes, patches = head([tokens, local])
    linear = [m for m in head.mlp.modules() if isinstance(m, torch.nn.Linear)]
    assert [tuple(m.weight.shape) for m in linear] == [(8, 6), (5, 8)]

    def mlp(x):
        return linear[1](linear[0](x))  # the mlp head: no ReLU or batch norm by default

    torch.testing.assert_close(classes, mlp(torch.cat([tokens[:, 0], local])))
    torch.testing.assert_close(patches, mlp(tokens[:, 1:]))
    (alone,) = head(local)
    torch.testing.assert_close(alone, mlp(local))
    own = MODEL_HEADS.get("ibot_distillation_head")(in_dim=6, out_dim=5, patch_out_dim=3,
                                                    shared_head=False, hidden_dim=8)
    assert own([tokens])[1].shape == (3, 4, 3) and own.patch_mlp is not own.mlp
    with pytest.raises(ValueError, match="patch_out_dim=3 must equal out_dim=5"):
        MODEL_HEADS.get("ibot_distillation_head")(in_dim=6, out_dim=5, patch_out_dim=3)


CONFIG = "config=test/quick_ibot_distillation_synthetic"


def write_teacher(cfg, path):
    torch.manual_seed(5)
    teacher = build_model(teacher_model_config(cfg))
    torch.save(teacher.state_dict(), path)
    return teacher.state_dict()


def test_ibot_distillation_trains_resumes_exactly_and_scales_to_two_processes(tmp_path):
    _, cfg = load_config([CONFIG])
    saved = write_teacher(cfg, tmp_path / "teacher.torch")
    cfg.DISTILLATION.TEACHER_MODEL.WEIGHTS_INIT.PARAMS_FILE = str(tmp_path / "teacher.torch")
    teacher = build_teacher(cfg, torch.device("cpu"))  # the multi-input teacher loads whole
    for name, value in teacher.state_dict().items():
        assert torch.equal(value, saved[name]), name
    common = [f"config.DISTILLATION.TEACHER_MODEL.WEIGHTS_INIT.PARAMS_FILE={tmp_path}/teacher.torch",
              "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=16", "config.LOG_FREQUENCY=1",
              "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=1"]
    one = ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8", *common]
    run_engine(tmp_path / "straight", one, config=CONFIG)
    losses = step_losses(tmp_path / "straight")
    assert sorted(losses) == [1, 2] and all(0 < loss < 20 for loss in losses.values())

    # stopped after its first iteration, then resumed
    stopped = stopped_after(tmp_path / "straight", tmp_path / "stopped", "model_iteration1.torch")
    run_engine(stopped, one + ["config.CHECKPOINT.AUTO_RESUME=true"], config=CONFIG)
    straight, resumed = final_weights(tmp_path / "straight"), final_weights(stopped)
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    assert step_losses(stopped)[2] == losses[2]

    run_engine(tmp_path / "two", ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
                                  "config.DISTRIBUTED.NUM_PROC_PER_NODE=2", *common],
               config=CONFIG)
    assert_trains_like_one_process(tmp_path / "two", losses, straight)
