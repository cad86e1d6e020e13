"""MSN: the loss against lightly's MSNLoss (values and gradients, with and without
Sinkhorn-Knopp and the mean-entropy term), msn_head, the trunk's patch drop (what it keeps, its
seeding, replay after a resume, off in evaluation and in the target network), the target's
input and network, and the settings taken from the config."""
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from gloo_utils import spawn_ranks
from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.losses import MSNLoss, StepContext
from ssl_engine.models.heads.msn_head import MSNHead
from ssl_engine.models.trunks.msn_patch_drop import PatchDrop, msn_patch_drop

K, DIM = 12, 8
REPO = Path(__file__).resolve().parents[1]


def randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def cosines(embeddings: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
    return F.normalize(embeddings, dim=1) @ F.normalize(prototypes, dim=1).t()


# ---------------------------------------------------------------- the loss against lightly
@pytest.mark.parametrize("sinkhorn, me_max", [(0, 0.0), (0, 1.0), (3, 1.0), (5, 0.5)])
def test_loss_and_gradients_match_lightly(sinkhorn, me_max):
    from lightly.loss import MSNLoss as LightlyMSNLoss

    batch, crops = 6, 4  # crop 0: the target's view; crops 1..3: the anchors
    ours = MSNLoss(output_dim=K, num_crops=crops, temperature=0.2,
                   target_sharpen_temperature=0.3, me_max_weight=me_max,
                   sinkhorn_iterations=sinkhorn)
    theirs = LightlyMSNLoss(temperature=0.2, sinkhorn_iterations=sinkhorn,
                            regularization_weight=me_max)
    student = randn(crops * batch, DIM, seed=1)
    target = randn(batch, DIM, seed=2) * 2
    prototypes = randn(K, DIM, seed=3)
    mine = [t.clone().requires_grad_(True) for t in (student, prototypes)]
    reference = [t.clone().requires_grad_(True) for t in (student, prototypes)]

    ours.begin_step(StepContext(iteration=0))
    ours.target_output = cosines(target, mine[1]).detach()
    loss = ours([cosines(*mine)])
    expected = theirs(reference[0][batch:], target, reference[1],
                      target_sharpen_temperature=0.3)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    loss.backward()
    expected.backward()
    for got, want in zip(mine, reference):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-6)
    assert mine[0].grad[:batch].abs().sum() == 0  # the student's view of crop 0 is no anchor
    assert set(ours.loss_terms) == ({"cross_entropy", "me_max"} if me_max else {"cross_entropy"})
    assert sum(ours.loss_terms.values()).item() == pytest.approx(loss.item(), rel=1e-6)


def test_settings_and_outputs_are_checked():
    with pytest.raises(ValueError, match="num_crops >= 2"):
        MSNLoss(num_crops=1)
    with pytest.raises(ValueError, match="target_sharpen_temperature"):
        MSNLoss(target_sharpen_temperature=0.0)
    loss_fn = MSNLoss(output_dim=K, num_crops=3)
    loss_fn.target_output = torch.zeros(4, K)
    with pytest.raises(ValueError, match=r"scores of shape \[N, 12\]"):
        loss_fn([torch.zeros(12, K + 1)])
    loss_fn.target_output = torch.zeros(4, K)
    with pytest.raises(ValueError, match="not num_crops=3 times as many"):
        loss_fn([torch.zeros(8, K)])


def test_num_crops_output_dim_and_drop_seed_come_from_the_config():
    from ssl_engine.config import load_config

    _, cfg = load_config(["config=test/quick_msn_synthetic", "config.LOSS.msn_loss.num_crops=9",
                          "config.LOSS.msn_loss.output_dim=7", "config.SEED_VALUE=5"])
    assert (cfg.LOSS.msn_loss.num_crops, cfg.LOSS.msn_loss.output_dim) == (4, 16)
    masking = cfg.MODEL.TRUNK.VISION_TRANSFORMERS.MASKED_IMAGE_MODELING
    assert dict(masking.PARAMS) == {"drop_ratio": 0.5, "seed": 5}


# ---------------------------------------------------------------- the head
def test_head_gives_cosines_with_the_prototypes_and_refuses_vissl_settings_it_lacks():
    torch.manual_seed(0)
    head = MSNHead(in_dim=10, num_prototypes=K, use_bn=True, hidden_dim=16, output_dim=DIM)
    assert [name for name, _ in head.fc.named_children()] == [
        "fc1", "bn1", "gelu1", "fc2", "bn2", "gelu2", "fc3"]
    x = randn(5, 10, seed=4)
    scores = head(x)
    expected = cosines(head.fc(x), head.prototypes)
    torch.testing.assert_close(scores, expected)
    assert scores.shape == (5, K) and scores.abs().max() <= 1 + 1e-6
    head.return_query = True
    torch.testing.assert_close(head(x).norm(dim=1), torch.ones(5))
    assert not MSNHead(10, K, freeze_prototypes=True).prototypes.requires_grad
    torch.manual_seed(0)
    warm = MSNHead(in_dim=10, num_prototypes=K, use_bn=True, hidden_dim=16, output_dim=DIM,
                   temperature=0.025)  # VISSL's teacher heads: the cosines / temperature
    torch.testing.assert_close(warm.eval()(x), cosines(warm.fc(x), warm.prototypes) / 0.025)
    model_cfg = AttrDict({"HEAD": {"PARAMS": [["msn_head", {"in_dim": 10, "temperature": 0.1}]]}})
    with pytest.raises(ValueError, match="LOSS.msn_loss.temperature"):
        MSNLoss.check_model_config(model_cfg)
    with pytest.raises(ValueError, match="label_smoothing=0.1 is not implemented"):
        MSNHead(10, K, label_smoothing=0.1)


# ---------------------------------------------------------------- the patch drop
def test_patch_drop_keeps_the_class_token_and_one_seeded_subset_per_call():
    drop = PatchDrop(0.7, num_prefix_tokens=1, seed=3).train()
    tokens = torch.arange(2 * 17, dtype=torch.float).view(2, 17, 1).expand(2, 17, 4)
    first, second = drop(tokens), drop(tokens)
    assert first.shape == (2, 1 + int(16 * 0.3), 4)  # floor(16 * 0.3) = 4 patches kept
    assert torch.equal(first[:, 0], tokens[:, 0])  # the class token
    kept = first[0, 1:, 0].long() - 1
    assert torch.equal(kept, drop.kept_positions(16, 0))
    assert torch.equal(first[1, 1:, 0].long() - 18, kept)  # every sample the same positions
    assert kept.unique().numel() == 4
    assert not torch.equal(second, first) and int(drop.calls) == 2
    # the same seed and call count (a restored checkpoint) replay the drops
    replay = PatchDrop(0.7, num_prefix_tokens=1, seed=3).train()
    replay.load_state_dict({"calls": torch.tensor(1)})
    assert torch.equal(replay(tokens), second)
    assert not torch.equal(PatchDrop(0.7, 1, seed=4).train()(tokens), first)
    # evaluation, and a disabled drop (the target network), keep every token and do not count
    assert torch.equal(drop.eval()(tokens), tokens) and int(drop.calls) == 2
    drop.train().enabled = False
    assert torch.equal(drop(tokens), tokens)
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['ratio'\]"):
        msn_patch_drop({"ratio": 0.5}, 1)
    with pytest.raises(ValueError, match=r"drop_ratio must be in \[0, 1\)"):
        msn_patch_drop({"drop_ratio": 1.0}, 1)


def test_patch_drop_with_global_view_tokens_drops_only_the_global_views():
    # VISSL's global_view_tokens: views with that many patch tokens drop, smaller views keep all
    drop = msn_patch_drop({"drop_ratio": 0.5, "global_view_tokens": 16, "seed": 3}, 1).train()
    global_view = torch.randn(2, 17, 4)
    local_view = torch.randn(2, 5, 4)
    dropped = drop(global_view)
    assert dropped.shape == (2, 1 + 8, 4)
    assert torch.equal(dropped[:, 1:], global_view[:, 1 + drop.kept_positions(16, 0)])
    assert torch.equal(drop(local_view), local_view)
    assert int(drop.calls) == 2  # every training forward counts
    assert torch.equal(drop(global_view)[:, 1:], global_view[:, 1 + drop.kept_positions(16, 2)])


def msn_model():
    from ssl_engine.config import compose_config
    from ssl_engine.models import build_model

    _, cfg = compose_config(["config=test/quick_msn_synthetic"])
    torch.manual_seed(0)
    return build_model(cfg.MODEL)


def test_student_trunk_drops_patches_while_training_and_the_target_sees_whole_images():
    model = msn_model()
    assert isinstance(model.trunk.vit.patch_drop, PatchDrop)
    images = randn(3, 3, 16, 16, seed=5)
    model.eval()
    whole = model.trunk(images, ["lastPOOL"])[0]
    model.train()
    for module in model.modules():  # stochastic depth off, to see the drop alone
        if hasattr(module, "drop_prob"):
            module.drop_prob = 0.0
    dropped = model.trunk(images, ["lastPOOL"])[0]
    assert not torch.allclose(dropped, whole, atol=1e-4)
    # the same network on the kept patches only: timm's blocks on the class token and them
    vit = model.trunk.vit
    tokens = vit._pos_embed(vit.patch_embed(images))
    kept = vit.patch_drop.kept_positions(16, 0) + 1
    manual = vit.norm(vit.blocks(vit.norm_pre(tokens[:, torch.cat([torch.tensor([0]), kept])])))
    torch.testing.assert_close(dropped, manual[:, 1:].mean(dim=1), rtol=1e-5, atol=1e-6)

    loss_fn = MSNLoss(output_dim=16, num_crops=4)
    loss_fn.bind_model(model)
    target = loss_fn.target_network.train()
    torch.testing.assert_close(target.trunk(images, ["lastPOOL"])[0], whole)
    # the target's head gives its query; its scores use the student's prototypes
    task = SimpleNamespace(base_model=model, train=True,
                           last_batch={"input": [torch.cat([images] * 2), randn(6, 3, 8, 8,
                                                                                seed=6)]})
    loss_fn.compute_target(task)
    # the heads read the class token (lastCLS, the trunk's default output)
    query = F.normalize(target.heads[0].fc(target.trunk(images, ["lastCLS"])[0]), dim=1)
    torch.testing.assert_close(loss_fn.target_output, query @ F.normalize(
        model.heads[0].prototypes, dim=1).t(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="num_prototypes=16"):
        MSNLoss(output_dim=8).bind_model(model)


def test_the_last_head_must_be_msn_head_before_launch(tmp_path, capsys):
    from ssl_engine.engines.launcher import main

    code = main(["config=test/quick_msn_synthetic", f"config.CHECKPOINT.DIR={tmp_path}",
                 "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[32,16]}]]"])
    assert code == 2
    assert "msn_loss needs msn_head as the last head" in capsys.readouterr().err


VISSL_RECIPE = REPO.parent / "shared/vissl/configs/config/pretrain/msn/msn_deits16.yaml"


@pytest.mark.skipif(not VISSL_RECIPE.is_file(), reason="VISSL's configs are not beside the repo")
def test_vissl_msn_recipe_validates_as_written(tmp_path, monkeypatch):
    from ssl_engine.config import load_config

    configs = tmp_path / "configs" / "config"
    (configs / "pretrain/msn").mkdir(parents=True)
    (configs / "defaults.yaml").write_text((REPO / "configs/config/defaults.yaml").read_text())
    (configs / "pretrain/msn/msn_deits16.yaml").write_text(VISSL_RECIPE.read_text())
    monkeypatch.setenv("SSL_ENGINE_CONFIG_DIR", str(tmp_path / "configs"))
    _, cfg = load_config(["config=pretrain/msn/msn_deits16", "config.MACHINE.DEVICE=cpu",
                          f"config.DATA.TRAIN.DATA_PATHS=[{tmp_path}]"])
    assert (cfg.LOSS.msn_loss.num_crops, cfg.LOSS.msn_loss.output_dim) == (10, 1024)
    assert dict(cfg.MODEL.TRUNK.VISION_TRANSFORMERS.MASKED_IMAGE_MODELING.PARAMS) == {
        "drop_ratio": 0.7, "seed": 0}


# ---------------------------------------------------------------- 2 processes against 1
WORLD_SIZE, LOCAL, CROPS = 2, 3, 3


def rank_rows(rank: int, crops: int) -> torch.Tensor:
    """The rows of a global crop-major batch that ``rank`` holds (its LOCAL samples of every
    crop), crop-major."""
    total = WORLD_SIZE * LOCAL
    return torch.tensor([c * total + rank * LOCAL + s for c in range(crops)
                         for s in range(LOCAL)])


def msn_loss_and_grad(student, teacher):
    """MSN's loss with Sinkhorn-Knopp and the mean-entropy term, and the student's gradient."""
    loss_fn = MSNLoss(output_dim=K, num_crops=CROPS, me_max_weight=2.0, sinkhorn_iterations=3)
    student = student.clone().requires_grad_(True)
    loss_fn.target_output = teacher
    loss = loss_fn([student])
    loss.backward()
    return loss.detach(), student.grad


def run_rank(rank: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=WORLD_SIZE)
    try:
        student = randn(CROPS * WORLD_SIZE * LOCAL, K, seed=60)
        teacher = randn(WORLD_SIZE * LOCAL, K, seed=61)
        loss, grad = msn_loss_and_grad(student[rank_rows(rank, CROPS)],
                                       teacher[rank_rows(rank, 1)])
        torch.save({"loss": loss, "grad": grad / WORLD_SIZE},  # DDP averages over ranks
                   f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_processes_match_one_process(tmp_path):
    """Sinkhorn-Knopp and the mean-entropy term run over the global batch, the latter with a
    gradient that reaches every rank: the averaged gradients are one process's."""
    spawn_ranks(run_rank, WORLD_SIZE, tmp_path, lambda init: (init, str(tmp_path)))
    per_rank = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD_SIZE)]
    full_loss, full_grad = msn_loss_and_grad(randn(CROPS * WORLD_SIZE * LOCAL, K, seed=60),
                                             randn(WORLD_SIZE * LOCAL, K, seed=61))
    assert sum(r["loss"] for r in per_rank).item() / WORLD_SIZE == pytest.approx(
        full_loss.item(), rel=1e-5)
    for rank, results in enumerate(per_rank):
        torch.testing.assert_close(results["grad"], full_grad[rank_rows(rank, CROPS)],
                                   rtol=1e-5, atol=1e-8)
