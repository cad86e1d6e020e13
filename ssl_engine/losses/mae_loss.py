"""MAE (He et al. 2022): mean squared error between the decoder's pixel predictions and the
image's pixels, on the masked patches only."""
import torch

from ssl_engine.losses.base import SSLLoss
from ssl_engine.losses.outputs import as_output_list, total_of
from ssl_engine.models.trunks.vision_transformer import NAMED_SIZES
from ssl_engine.utils.classy import register_loss


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """[N, C, H, W] -> [N, (H/p)(W/p), p*p*C]: the patches in row-major grid order, each
    flattened row by row with the channels last (MAE's layout)."""
    rows, channels, height, width = images.shape
    if height % patch_size or width % patch_size:
        raise ValueError(f"mae_loss: images of {height}x{width} pixels are not a whole number "
                         f"of {patch_size}x{patch_size} patches")
    h, w = height // patch_size, width // patch_size
    patches = images.reshape(rows, channels, h, patch_size, w, patch_size)
    return patches.permute(0, 2, 4, 3, 5, 1).reshape(rows, h * w, patch_size ** 2 * channels)


@register_loss("mae_loss")
class MAELoss(SSLLoss):
    """The model outputs ``mae_decoder``'s predictions [N, L, p*p*C]; the target is the
    masking collator's dict with the images (``global_views``) and the masks (``mask``,
    TARGET_KEY_NAMES: [global_views, mask]).  Per patch, the mean over its values of the
    squared error; averaged over the masked patches of the batch.  ``norm_pix_loss``: each
    target patch is first normalised by its own mean and variance (``(x - mean) /
    sqrt(var + 1e-6)``), MAE's better setting.  ``patch_size`` is the trunk's, filled in
    before launch."""

    monitor_embedding = False  # the output is pixels, not an embedding

    @classmethod
    def derive_config(cls, cfg) -> None:
        """patch_size: the ViT's (MODEL.TRUNK.VISION_TRANSFORMERS: its named size's, else
        PATCH_SIZE)."""
        super().derive_config(cfg)
        vit = cfg.MODEL.TRUNK.VISION_TRANSFORMERS
        named = NAMED_SIZES.get(vit.get("name") or "")
        cfg.LOSS[cfg.LOSS.name].patch_size = named[0] if named else int(vit.PATCH_SIZE)

    def __init__(self, norm_pix_loss: bool = True, patch_size: int = 16):
        super().__init__()
        self.norm_pix_loss, self.patch_size = bool(norm_pix_loss), int(patch_size)

    def forward(self, output, target=None) -> torch.Tensor:
        prediction = as_output_list(output)[-1]
        if not isinstance(target, dict) or not {"global_views", "mask"} <= set(target):
            raise ValueError("mae_loss needs the images and the masks as the target: the "
                             "ibot_multicrop_masking_collator with DATA.TRAIN.TARGET_KEY_NAMES: "
                             "[global_views, mask]")
        pixels = patchify(target["global_views"].float(), self.patch_size)
        if self.norm_pix_loss:
            mean, var = pixels.mean(dim=-1, keepdim=True), pixels.var(dim=-1, keepdim=True)
            pixels = (pixels - mean) / (var + 1.0e-6) ** 0.5
        if prediction.shape != pixels.shape:
            raise ValueError(f"mae_loss: the predictions {tuple(prediction.shape)} do not match "
                             f"the patches {tuple(pixels.shape)} (patch_size={self.patch_size})")
        mask = target["mask"].flatten(1).to(prediction.dtype)
        per_patch = ((prediction - pixels) ** 2).mean(dim=-1)
        return total_of(self, {"masked_mse": (per_patch * mask).sum() / mask.sum().clamp(min=1.0)})
