"""mae_loss against a plain computation on lightly's patchify; ibot_loss against lightly's
DINOLoss (class tokens) and IBOTPatchLoss (masked patches): values, gradients, centers and the
temperature warm-ups over epochs."""
import pytest
import torch

from ssl_engine.config import load_config
from ssl_engine.losses import IBOTLoss, MAELoss, StepContext

G, B, L, K, K2 = 2, 3, 9, 12, 10


def randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def random_masks(rows, seed, count=None):
    generator = torch.Generator().manual_seed(seed)
    if count is None:  # any number per image, one image without
        mask = torch.rand(rows, L, generator=generator) < 0.4
        mask[0] = False
        return mask.view(rows, 3, 3)
    order = torch.stack([torch.randperm(L, generator=generator) for _ in range(rows)])
    return torch.zeros(rows, L, dtype=torch.bool).scatter(1, order[:, :count], True).view(
        rows, 3, 3)


@pytest.mark.parametrize("norm_pix_loss", [True, False])
def test_mae_loss_is_the_mean_squared_error_of_the_masked_patches(norm_pix_loss):
    from lightly.models.utils import patchify

    images = randn(4, 3, 12, 12, seed=1)
    mask = random_masks(4, seed=2, count=6)
    prediction = randn(4, L, 4 * 4 * 3, seed=3).requires_grad_(True)
    loss = MAELoss(norm_pix_loss=norm_pix_loss, patch_size=4)(
        [prediction], {"global_views": images, "mask": mask})
    # written out: per-patch targets (optionally standardised with the unbiased variance),
    # the squared error averaged per patch, then over the 4 x 6 masked patches
    target = patchify(images, 4)
    if norm_pix_loss:
        target = (target - target.mean(-1, keepdim=True)) / (target.var(-1, keepdim=True)
                                                              + 1e-6).sqrt()
    errors = [((prediction[i, j] - target[i, j]) ** 2).mean()
              for i in range(4) for j in range(L) if mask.flatten(1)[i, j]]
    assert len(errors) == 24
    assert loss.item() == pytest.approx(torch.stack(errors).mean().item(), rel=1e-6)
    loss.backward()
    assert (prediction.grad.flatten(0, 1)[~mask.flatten()] == 0).all()


def test_ibot_loss_matches_lightly_over_epochs_with_its_centers():
    from lightly.loss import DINOLoss as LightlyDINOLoss
    from lightly.loss import IBOTPatchLoss

    local, warmup = 2, 3
    crops = G + local
    ours = IBOTLoss(warmup_teacher_temp=0.04, teacher_temp=0.07,
                    warmup_teacher_patch_temp=0.05, teacher_patch_temp=0.08,
                    warmup_teacher_temp_epochs=warmup, student_temp=0.2, center_momentum=0.8,
                    center_momentum2=0.7, lambda1=1.0, lambda2=0.5, num_global_crops=G,
                    num_local_crops=local, out_dim=K, patch_out_dim=K2, num_epochs=6)
    cls_oracle = LightlyDINOLoss(output_dim=K, warmup_teacher_temp=0.04, teacher_temp=0.07,
                                 warmup_teacher_temp_epochs=warmup, student_temp=0.2,
                                 center_momentum=0.8)
    patch_oracle = IBOTPatchLoss(output_dim=K2, student_temp=0.2)
    for epoch in range(warmup + 1):  # 2 updates per epoch: iteration 2 * epoch
        ours.begin_step(StepContext(iteration=2 * epoch, total_iterations=12))
        student_cls = randn(crops * B, K, seed=10 + epoch).requires_grad_(True)
        student_patch = randn(G * B, L, K2, seed=20 + epoch).requires_grad_(True)
        teacher_cls = randn(G * B, K, seed=30 + epoch) * 2
        teacher_patch = randn(G * B, L, K2, seed=40 + epoch) * 2 + 0.5
        mask = random_masks(G * B, seed=50 + epoch)
        center2 = ours.center2.clone()
        ours.target_output = [teacher_cls, teacher_patch]
        loss = ours([student_cls, student_patch], mask)

        cls_student = student_cls.detach().clone().requires_grad_(True)
        patch_student = student_patch.detach().clone().requires_grad_(True)
        expected_cls = cls_oracle(list(teacher_cls.chunk(G)), list(cls_student.chunk(crops)),
                                  epoch=epoch)
        # lightly's patch loss on the masked tokens, with our patch center and temperature
        patch_oracle.center.value.copy_(center2.view_as(patch_oracle.center.value))
        patch_temp = 0.05 + (0.08 - 0.05) * min(epoch, warmup - 1) / (warmup - 1)
        expected_patch = patch_oracle(teacher_patch[mask.flatten(1)],
                                      patch_student[mask.flatten(1)], mask,
                                      teacher_temp=patch_temp)
        expected = expected_cls + 0.5 * expected_patch
        assert ours.loss_terms["cls"].item() == pytest.approx(expected_cls.item(), rel=1e-5)
        assert ours.loss_terms["patch"].item() == pytest.approx(0.5 * expected_patch.item(),
                                                                rel=1e-5)
        loss.backward()
        expected.backward()
        torch.testing.assert_close(student_cls.grad, cls_student.grad, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(student_patch.grad, patch_student.grad, rtol=1e-5, atol=1e-7)
        # the class center as lightly's; the patch center over every patch of the teacher
        torch.testing.assert_close(ours.center, cls_oracle.center.view(1, K), rtol=1e-5,
                                   atol=1e-7)
        mean = teacher_patch.mean(dim=(0, 1)).view(1, 1, K2)
        torch.testing.assert_close(ours.center2, 0.7 * center2 + 0.3 * mean)


def test_ibot_patch_temperature_warms_up_from_the_mim_start_epoch():
    loss = IBOTLoss(warmup_teacher_patch_temp=0.04, teacher_patch_temp=0.07,
                    warmup_teacher_temp_epochs=4, mim_start_epoch=2, num_epochs=10)
    temps = []
    for epoch in range(8):
        loss.begin_step(StepContext(iteration=5 * epoch, total_iterations=50))
        temps.append(loss.temperatures()[1])
    assert temps == pytest.approx([0.04, 0.04, 0.04, 0.05, 0.06, 0.07, 0.07, 0.07])


def test_ibot_loss_keys_are_filled_in_from_the_head_transforms_and_optimizer():
    _, cfg = load_config(["config=test/quick_ibot_synthetic"])
    settings = cfg.LOSS.ibot_loss
    assert (settings.num_global_crops, settings.num_local_crops) == (2, 2)
    assert (settings.out_dim, settings.patch_out_dim, settings.num_epochs) == (32, 16, 2)
    assert cfg.DATA.TRAIN.COLLATE_FUNCTION_PARAMS.target_keys == ["mask"]
    _, cfg = load_config(["config=test/quick_mae_synthetic"])
    assert cfg.LOSS.mae_loss.patch_size == 4
