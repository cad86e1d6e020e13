"""AIM (El-Nouby et al. 2024): autoregressive image models. A ViT with prefix-causal attention
(MASKED_IMAGE_MODELING {NAME: aim}) reads the patches in raster order; the prediction head's
output at patch ``k`` predicts the pixels of patch ``k + 1``:

    loss = mean over the predicted patches of mean((prediction_k - pixels_{k+1})^2)

The predicted patches are those after each image's prefix (RandomPrefixMasking's mask: True),
the first patch never; the prefix, attended bidirectionally, would see its own targets.
``norm_pix_loss`` normalises each target patch by its own mean and variance first (AIM's
normalised pixel targets, MAE's formula). The target is the masking collator's dict
(TARGET_KEY_NAMES: [global_views, mask]).
"""
import torch

from ssl_engine.losses.mae_loss import MAELoss, patchify
from ssl_engine.losses.outputs import as_output_list, total_of
from ssl_engine.utils.classy import register_loss


@register_loss("aim_loss")
class AIMLoss(MAELoss):
    """MAE's settings (``norm_pix_loss``, ``patch_size`` filled in from the ViT) on AIM's
    next-patch targets."""

    def forward(self, output, target=None) -> torch.Tensor:
        prediction = as_output_list(output)[-1]
        if not isinstance(target, dict) or not {"global_views", "mask"} <= set(target):
            raise ValueError("aim_loss needs the images and the prefix masks as the target: the "
                             "ibot_multicrop_masking_collator with DATA.TRAIN.TARGET_KEY_NAMES: "
                             "[global_views, mask] and RandomPrefixMasking")
        pixels = patchify(target["global_views"].float(), self.patch_size)
        if self.norm_pix_loss:
            mean, var = pixels.mean(dim=-1, keepdim=True), pixels.var(dim=-1, keepdim=True)
            pixels = (pixels - mean) / (var + 1.0e-6) ** 0.5
        if prediction.shape != pixels.shape:
            raise ValueError(f"aim_loss: the predictions {tuple(prediction.shape)} do not match "
                             f"the patches {tuple(pixels.shape)} (patch_size={self.patch_size})")
        predicted = target["mask"].flatten(1)[:, 1:].to(prediction.dtype)  # next patches
        per_patch = ((prediction[:, :-1] - pixels[:, 1:]) ** 2).mean(dim=-1)
        loss = (per_patch * predicted).sum() / predicted.sum().clamp(min=1.0)
        return total_of(self, {"next_patch_mse": loss})
