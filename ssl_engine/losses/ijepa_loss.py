"""I-JEPA (Assran et al. 2023): predict, in latent space, the target encoder's representation of
a few target blocks of the image from one context block.

The context encoder is the model's ViT trunk run on the context patches only
(``context_index``); ``ijepa_predictor`` (the model's last head) predicts, for each target
block, the representation of its patches. The target encoder, an EMA of the trunk (the
loss's ``target_network``, without the predictor and without stochastic depth), sees the
whole image; its last-block patch tokens are layer-normalised (no affine parameters) and
those of each block are the targets:

    loss = smooth_l1(prediction, layer_norm(target tokens)), averaged over every value

The EMA momentum rises linearly from ``momentum`` to ``momentum_end`` over the run (I-JEPA's
0.996 -> 1.0), driven by the momentum target hook. The inputs are the ijepa_collator's
(``images``, ``context_index``, ``target_index``) with MultiBlockMasking's masks.
"""
from typing import Dict, Optional

import torch
import torch.nn.functional as F

from ssl_engine.losses.momentum_target import MomentumTargetLoss
from ssl_engine.losses.outputs import as_output_list, total_of
from ssl_engine.losses.teacher_student import without_stochastic_depth
from ssl_engine.models.trunks.vision_transformer import NAMED_SIZES
from ssl_engine.utils.classy import register_loss

IMAGES, TARGETS = "images", "target_index"  # the ijepa_collator's names


def vit_patch_size(cfg) -> int:
    """The patch size of the config's ViT (its named size's, else PATCH_SIZE)."""
    vit = cfg.MODEL.TRUNK.VISION_TRANSFORMERS
    named = NAMED_SIZES.get(vit.get("name") or "")
    return named[0] if named else int(vit.PATCH_SIZE)


@register_loss("ijepa_loss")
class IJEPALoss(MomentumTargetLoss):
    """The model outputs ``ijepa_predictor``'s [B, M, Kt, D]; the target network's tokens are
    gathered at the batch's ``target_index`` [B, M, Kt]. ``patch_size`` is the trunk's, filled
    in before launch. The target network is the loss's state, hence in every checkpoint."""

    online_only_heads = 1  # the predictor
    batch_coupling = ("the ijepa_collator cuts every context and target block to the smallest "
                      "of the (micro-)batch")
    monitor_embedding = False  # the output is a block of token predictions

    @classmethod
    def derive_config(cls, cfg) -> None:
        """patch_size: the ViT's (MODEL.TRUNK.VISION_TRANSFORMERS)."""
        super().derive_config(cfg)
        cfg.LOSS[cfg.LOSS.name].patch_size = vit_patch_size(cfg)

    @classmethod
    def check_model_config(cls, model_cfg) -> None:
        heads = model_cfg.HEAD.PARAMS or []
        last = heads[-1] if heads else None
        if not (isinstance(last, (list, tuple)) and last and last[0] == "ijepa_predictor"):
            raise ValueError("ijepa_loss needs ijepa_predictor as the last head of "
                             f"config.MODEL.HEAD.PARAMS, got {[h[0] for h in heads]}")

    def __init__(self, momentum: float = 0.996, momentum_end: float = 1.0,
                 patch_size: int = 16):
        super().__init__(momentum, "constant")
        if not 0.0 <= momentum_end <= 1.0:
            raise ValueError(f"ijepa_loss: momentum_end must be in [0, 1], got {momentum_end}")
        self.momentum_end, self.patch_size = float(momentum_end), int(patch_size)
        self._last_statistics: Dict[str, torch.Tensor] = {}

    def momentum_at(self, step: int, total: int) -> float:
        """``momentum`` rising linearly to ``momentum_end`` at the end of the run."""
        if total <= 0:
            return self.momentum
        return self.momentum + (self.momentum_end - self.momentum) * min(step, total) / total

    # ------------------------------------------------------------------ the target
    def bind_model(self, model) -> None:
        """The target encoder: a frozen copy of the trunk (the heads before the predictor too,
        though I-JEPA has none), without stochastic depth."""
        self.target_network = model.target_copy(len(model.heads) - self.online_only_heads)
        without_stochastic_depth(self.target_network)

    def target_input(self, batch):
        inputs = batch["input"]
        if not isinstance(inputs, dict) or not {IMAGES, TARGETS} <= set(inputs):
            raise ValueError("ijepa_loss needs the ijepa_collator's named inputs (images, "
                             "context_index, target_index) and MODEL.MULTI_INPUT_HEAD_MAPPING")
        return inputs

    def run_target(self, inputs, task) -> torch.Tensor:
        """The layer-normalised last-block tokens of the whole images at the target blocks'
        positions: [B, M, Kt, D]."""
        images, index = inputs[IMAGES], inputs[TARGETS]
        (tokens,) = self.target_network.trunk(images, ["lastBLK"])
        patches = (images.shape[-2] // self.patch_size) * (images.shape[-1] // self.patch_size)
        tokens = F.layer_norm(tokens[:, tokens.shape[1] - patches:], (tokens.shape[-1],))
        rows, blocks, count = index.shape
        flat = index.long().flatten(1).unsqueeze(-1).expand(-1, -1, tokens.shape[-1])
        return tokens.gather(1, flat).view(rows, blocks, count, -1)

    # ------------------------------------------------------------------ the loss
    def forward(self, output, target: Optional[torch.Tensor] = None) -> torch.Tensor:
        prediction = as_output_list(output)[-1]
        targets = self.get_target_output().detach()
        if prediction.shape != targets.shape:
            raise ValueError(f"ijepa_loss: the predictor gave {tuple(prediction.shape)}, the "
                             f"target blocks are {tuple(targets.shape)} (check patch_size="
                             f"{self.patch_size} and the predictor's in_dim)")
        with torch.no_grad():  # collapse: every image's tokens alike (spread over the batch)
            self._last_statistics = {
                "target_std": targets.flatten(1, 2).std(dim=0).mean(),
                "prediction_std": prediction.detach().flatten(1, 2).std(dim=0).mean()}
        return total_of(self, {"smooth_l1": F.smooth_l1_loss(prediction, targets)})

    def collapse_statistics(self) -> Dict[str, torch.Tensor]:
        """The spread over the batch of the target tokens and of the predictions (per token
        and channel, averaged): near 0 when every image gets the same representation."""
        return self._last_statistics
