"""DINO: the loss against lightly's DINOLoss (values, gradients, center, teacher temperature
warm-up), the teacher's input and network, the dino_head, its frozen last layer, and 2 gloo
processes against 1 process on the same global batch."""
import copy
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from gloo_utils import spawn_ranks
from ssl_engine.hooks.frozen_params_hook import FrozenParamsHook
from ssl_engine.losses import DINOLoss, StepContext
from ssl_engine.models.heads.dino_head import DINOHead

K = 16


def randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def loss_step(loss_fn: DINOLoss, student: torch.Tensor, teacher: torch.Tensor, iteration: int,
              train: bool = True):
    """One loss computation as the engine runs it: the step's context, the target's output."""
    loss_fn.begin_step(StepContext(iteration=iteration, train=train))
    loss_fn.target_output = teacher
    return loss_fn([student])


# ---------------------------------------------------------------- the loss against lightly
def test_loss_gradients_center_and_temperature_match_lightly_over_iterations():
    # imported here: the processes of the 2-process test do not need lightly's seconds
    from lightly.loss import DINOLoss as LightlyDINOLoss

    batch, crops, warmup = 5, 5, 3  # 2 global crops (the teacher's) + 3 local ones
    ours = DINOLoss(output_dim=K, num_crops=crops, crops_for_teacher=[0, 1],
                    student_temp=0.2, teacher_temp_min=0.04, teacher_temp_max=0.07,
                    teacher_temp_warmup_iters=warmup, ema_center=0.8)
    # lightly's epoch-indexed warm-up (linspace over warmup_teacher_temp_epochs) read per
    # iteration; its center_momentum is ema_center
    theirs = LightlyDINOLoss(output_dim=K, warmup_teacher_temp=0.04, teacher_temp=0.07,
                             warmup_teacher_temp_epochs=warmup, student_temp=0.2,
                             center_momentum=0.8)
    for iteration in range(warmup + 2):  # warm-up, then constant; the center moves each time
        student = randn(crops * batch, K, seed=10 + iteration)
        teacher = randn(2 * batch, K, seed=20 + iteration) * 3 + 1
        mine, reference = (student.clone().requires_grad_(True) for _ in range(2))
        loss = loss_step(ours, mine, teacher, iteration)
        expected = theirs(list(teacher.chunk(2)), list(reference.chunk(crops)), epoch=iteration)
        assert loss.item() == pytest.approx(expected.item(), rel=1e-5), iteration
        loss.backward()
        expected.backward()
        torch.testing.assert_close(mine.grad, reference.grad, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(ours.center, theirs.center.view(1, K), rtol=1e-5, atol=1e-7)
        # one named term per teacher crop; they add up to the loss
        assert set(ours.loss_terms) == {"teacher_crop0", "teacher_crop1"}
        assert sum(ours.loss_terms.values()).item() == pytest.approx(loss.item(), rel=1e-6)
    assert ours.center.abs().sum() > 0


def test_teacher_temperature_warms_up_linearly_then_stays():
    loss_fn = DINOLoss(output_dim=K, teacher_temp_min=0.04, teacher_temp_max=0.07,
                       teacher_temp_warmup_iters=4)
    temperatures = [loss_fn.teacher_temp_at(i) for i in range(6)]
    assert temperatures == pytest.approx([0.04, 0.05, 0.06, 0.07, 0.07, 0.07])
    assert DINOLoss(output_dim=K, teacher_temp_warmup_iters=0).teacher_temp_at(0) == 0.07
    one = DINOLoss(output_dim=K, teacher_temp_warmup_iters=1)
    assert (one.teacher_temp_at(0), one.teacher_temp_at(1)) == (0.04, 0.07)


def test_evaluation_steps_leave_the_center_alone_and_the_task_gives_the_position():
    loss_fn = DINOLoss(output_dim=K)
    task = SimpleNamespace(loss=loss_fn, schedule_iteration=7, phase_idx=1, train=False,
                           schedule_length=9)
    loss_fn.begin_step(StepContext.of_task(task))
    assert loss_fn.step_context == StepContext(iteration=7, phase_idx=1, train=False,
                                               total_iterations=9)
    loss_step(loss_fn, randn(4 * 2, K, seed=1), randn(4 * 2, K, seed=2), 7, train=False)
    assert torch.equal(loss_fn.center, torch.zeros(1, K))


def test_settings_and_outputs_are_checked():
    with pytest.raises(ValueError, match=r"crops_for_teacher must be the first crops"):
        DINOLoss(crops_for_teacher=[1, 2], num_crops=4)
    with pytest.raises(ValueError, match="names more crops than num_crops=2"):
        DINOLoss(crops_for_teacher=[0, 1, 2], num_crops=2)
    with pytest.raises(ValueError, match="temperatures must be > 0"):
        DINOLoss(student_temp=0)
    loss_fn = DINOLoss(output_dim=K, num_crops=3)
    with pytest.raises(ValueError, match=r"scores of shape \[N, 16\]"):
        loss_step(loss_fn, torch.zeros(6, 8), torch.zeros(4, K), 0)
    with pytest.raises(ValueError, match="num_crops=3"):
        loss_step(loss_fn, torch.zeros(8, K), torch.zeros(4, K), 0)


def test_num_crops_and_output_dim_come_from_the_transforms_and_the_head():
    from ssl_engine.config import load_config

    head = "[[dino_head,{in_dim: 64, num_clusters: [24]}]]"
    _, cfg = load_config(["config=test/quick_dino_synthetic", f"config.MODEL.HEAD.PARAMS={head}",
                          "config.LOSS.dino_loss.num_crops=9",
                          "config.LOSS.dino_loss.output_dim=7"])
    assert (cfg.LOSS.dino_loss.num_crops, cfg.LOSS.dino_loss.output_dim) == (4, 24)


# ---------------------------------------------------------------- the teacher
def test_teacher_sees_only_the_global_crops():
    batch = 3
    global_crops, local_crops = torch.randn(2 * batch, 3, 16, 16), torch.randn(3 * batch, 3, 8, 8)
    loss_fn = DINOLoss(output_dim=K, num_crops=5, crops_for_teacher=[0, 1])
    # multicrop_collator's input: the first resolution group is the global crops
    assert loss_fn.target_input({"input": [global_crops, local_crops]}) is global_crops
    # the teacher's crops are part of a group: only their rows
    three = torch.randn(3 * batch, 3, 16, 16)
    assert torch.equal(DINOLoss(num_crops=6).target_input({"input": [three, local_crops]}),
                       three[:2 * batch])
    # one tensor of 2 views (simclr_collator) and a teacher on the first view
    views = torch.randn(2 * batch, 3, 16, 16)
    assert torch.equal(DINOLoss(num_crops=2, crops_for_teacher=[0]).target_input(
        {"input": views}), views[:batch])
    with pytest.raises(ValueError, match="not a multiple of num_crops=4"):
        DINOLoss(num_crops=4).target_input({"input": [global_crops, local_crops]})


def tiny_vit_model(drop_path: float = 0.5):
    from ssl_engine.config import compose_config
    from ssl_engine.models import build_model

    vit = ("{IMAGE_SIZE: 16, PATCH_SIZE: 4, NUM_LAYERS: 2, NUM_HEADS: 2, HIDDEN_DIM: 16, "
           f"MLP_DIM: 32, DROP_PATH_RATE: {drop_path}}}")
    _, cfg = compose_config([
        "config=test/quick_dino_synthetic", "config.MODEL.TRUNK.NAME=vision_transformer",
        f"config.MODEL.TRUNK.VISION_TRANSFORMERS={vit}",
        f"config.MODEL.HEAD.PARAMS=[[dino_head,{{in_dim: 16, num_clusters: [{K}], "
        "hidden_dim: 32, bottleneck_dim: 8}]]"])
    torch.manual_seed(0)
    return build_model(cfg.MODEL)


def test_teacher_is_the_student_without_stochastic_depth_and_is_checkpointed():
    model = tiny_vit_model()
    loss_fn = DINOLoss(output_dim=K, num_crops=2)
    loss_fn.bind_model(model)
    teacher = loss_fn.target_network
    # the last block drops its attention and MLP branches with probability 0.5
    assert [m.drop_prob for m in model.modules() if hasattr(m, "drop_prob")] == [0.5, 0.5]
    assert all(m.drop_prob == 0 for m in teacher.modules() if hasattr(m, "drop_prob"))
    images = torch.randn(4, 3, 16, 16)
    teacher.train()
    torch.testing.assert_close(teacher(images)[0], teacher(images)[0])  # no random depth
    model.eval()
    torch.testing.assert_close(teacher(images)[0], model(images)[0])  # the same weights
    # the center and the teacher are the loss's state: a fresh loss takes them back
    loss_fn.center.fill_(0.5)
    state = loss_fn.get_classy_state()
    assert "center" in state and any(k.startswith("target_network.heads.0.prototypes0")
                                     for k in state)
    fresh = DINOLoss(output_dim=K, num_crops=2)
    fresh.bind_model(tiny_vit_model())
    fresh.set_classy_state(state)
    assert torch.equal(fresh.center, loss_fn.center)
    torch.testing.assert_close(fresh.target_network(images)[0], teacher(images)[0])
    with pytest.raises(ValueError, match="output_dim=8 but the model's head has num_clusters"):
        DINOLoss(output_dim=8).bind_model(model)


# ---------------------------------------------------------------- the head
def test_head_shapes_normalised_bottleneck_and_fixed_weight_g():
    torch.manual_seed(0)
    head = DINOHead(in_dim=6, num_clusters=[K], hidden_dim=12, bottleneck_dim=4)
    assert [type(m).__name__ for m in head.mlp] == ["Linear", "GELU", "Linear", "GELU", "Linear"]
    x = torch.randn(10, 6)
    scores = head(x)
    assert scores.shape == (10, K)
    bottleneck = head.bottleneck(x)
    torch.testing.assert_close(bottleneck.norm(dim=1), torch.ones(10))
    # weight_g is 1: the scores are cosines of the bottleneck with the prototypes
    assert torch.equal(head.prototypes0.weight_g, torch.ones(K, 1))
    torch.testing.assert_close(scores, bottleneck @ F.normalize(head.prototypes0.weight_v).t())
    assert not head.prototypes0.weight_g.requires_grad
    optimizer = torch.optim.SGD([p for p in head.parameters() if p.requires_grad], lr=1.0)
    head(x).pow(2).sum().backward()
    optimizer.step()
    assert torch.equal(head.prototypes0.weight_g, torch.ones(K, 1))
    free = DINOHead(in_dim=6, num_clusters=[K], normalize_last_layer=False, num_layers=1,
                    use_bn=True, bottleneck_dim=4)
    assert [type(m).__name__ for m in free.mlp] == ["Linear"]
    free(x).pow(2).sum().backward()
    assert free.prototypes0.weight_g.grad.abs().sum() > 0
    with_bn = DINOHead(in_dim=6, num_clusters=[K], use_bn=True, hidden_dim=12, bottleneck_dim=4)
    assert [type(m).__name__ for m in with_bn.mlp].count("BatchNorm1d") == 2
    with pytest.raises(ValueError, match="one set of clusters"):
        DINOHead(in_dim=6, num_clusters=[K, K])


def test_last_layer_is_torch_weight_norm_with_vissl_names_and_can_be_copied():
    torch.manual_seed(0)
    head = DINOHead(in_dim=6, num_clusters=[K], normalize_last_layer=False, bottleneck_dim=4)
    names = [name for name, _ in head.named_parameters()]
    assert names[-2:] == ["prototypes0.weight_v", "prototypes0.weight_g"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the deprecated weight_norm
        reference = torch.nn.utils.weight_norm(torch.nn.Linear(4, K, bias=False))
    with torch.no_grad():
        reference.weight_g.uniform_(0.5, 2.0)
    # the same state dict keys and shapes: DINO's and VISSL's checkpoints load
    head.prototypes0.load_state_dict(reference.state_dict())
    z = torch.randn(7, 4)
    mine, theirs = head.prototypes0(z), reference(z)
    torch.testing.assert_close(mine, theirs)
    mine.sum().backward()
    theirs.sum().backward()
    for name in ("weight_g", "weight_v"):
        torch.testing.assert_close(getattr(head.prototypes0, name).grad,
                                   getattr(reference, name).grad)
    copied = copy.deepcopy(head)  # the teacher is a deep copy (torch's weight_norm refuses)
    torch.testing.assert_close(copied(torch.ones(2, 6)), head(torch.ones(2, 6)))


def test_vissl_frozen_params_entries_freeze_the_last_layer_for_their_iterations():
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.heads = torch.nn.ModuleList([DINOHead(in_dim=6, num_clusters=[K],
                                                normalize_last_layer=False, bottleneck_dim=4)])
    hook = FrozenParamsHook([["module.heads.0.prototypes0.weight_v", 2],
                             ["module.heads.0.prototypes0.weight_g", 2]])
    task = SimpleNamespace(base_model=model, iteration=0)
    hook.on_start(task)  # the names exist
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1)
    last = model.heads[0].prototypes0
    history = []
    for iteration in range(3):
        task.iteration = iteration
        history.append([p.clone() for p in (last.weight_v, last.weight_g,
                                            model.heads[0].mlp[0].weight)])
        optimizer.zero_grad()
        model.heads[0](torch.randn(4, 6)).pow(2).sum().backward()
        hook.on_backward(task)
        optimizer.step()
    history.append([p.clone() for p in (last.weight_v, last.weight_g,
                                        model.heads[0].mlp[0].weight)])
    for index in (0, 1):  # weight_v and weight_g: frozen during updates 0 and 1, then trained
        assert torch.equal(history[0][index], history[2][index])
        assert not torch.equal(history[2][index], history[3][index])
    assert all(not torch.equal(a[2], b[2]) for a, b in zip(history, history[1:]))


# ---------------------------------------------------------------- two processes vs one
WORLD_SIZE, LOCAL, CROPS, TEACHER_CROPS = 2, 4, 4, 2


def rank_rows(rank: int, crops: int) -> torch.Tensor:
    """The rows of a global crop-major batch (``crops`` crops of WORLD_SIZE * LOCAL samples)
    that ``rank`` holds, crop-major."""
    total = WORLD_SIZE * LOCAL
    return torch.tensor([c * total + rank * LOCAL + s for c in range(crops)
                         for s in range(LOCAL)])


def global_inputs():
    student = randn(CROPS * WORLD_SIZE * LOCAL, K, seed=60)
    teacher = randn(TEACHER_CROPS * WORLD_SIZE * LOCAL, K, seed=61) * 2
    center = randn(1, K, seed=62) * 0.1
    return student, teacher, center


def dino_loss_and_grad(student, teacher, center):
    """Loss in the middle of the temperature warm-up, the student's gradient, the new center."""
    loss_fn = DINOLoss(output_dim=K, num_crops=CROPS, teacher_temp_warmup_iters=4,
                       ema_center=0.7)
    loss_fn.center.copy_(center)
    student = student.clone().requires_grad_(True)
    loss = loss_step(loss_fn, student, teacher, iteration=2)
    loss.backward()
    return loss.detach(), student.grad, loss_fn.center


def run_rank(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=WORLD_SIZE)
    try:
        student, teacher, center = global_inputs()
        loss, grad, new_center = dino_loss_and_grad(student[rank_rows(rank, CROPS)],
                                                    teacher[rank_rows(rank, TEACHER_CROPS)],
                                                    center)
        torch.save({"loss": loss, "grad": grad / WORLD_SIZE,  # DDP averages over ranks
                    "center": new_center}, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_processes_match_one_process(tmp_path):
    spawn_ranks(run_rank, WORLD_SIZE, tmp_path, lambda init: (init, str(tmp_path)))
    per_rank = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD_SIZE)]
    full_loss, full_grad, full_center = dino_loss_and_grad(*global_inputs())
    assert sum(r["loss"] for r in per_rank).item() / WORLD_SIZE == pytest.approx(
        full_loss.item(), rel=1e-5)
    for rank, results in enumerate(per_rank):
        torch.testing.assert_close(results["grad"], full_grad[rank_rows(rank, CROPS)],
                                   rtol=1e-5, atol=1e-8)
        # the center moved towards the mean teacher output of the global batch on every rank
        torch.testing.assert_close(results["center"], full_center, rtol=1e-5, atol=1e-7)
