"""data2vec 2.0 (Baevski et al. 2022, "Efficient Self-supervised Learning with Contextualized
Target Representations for Vision, Speech and Language"): the student regresses, at its masked
patches, the teacher's contextualised representation of the whole image.

- Teacher: an EMA of the student's trunk (``MomentumTargetLoss``, no stochastic depth) on the
  unmasked image.  Its momentum rises linearly from ``momentum`` to ``momentum_end`` over
  ``momentum_anneal_iters`` updates, then stays (the released ViT-B setting: 0.9998 ->
  0.99999 over 100k updates).
- Targets: for each of the teacher's top ``top_k_layers`` blocks, the output of its
  feed-forward network before the block's last residual connection (``end_of_block_targets``:
  the block's output instead), each normalised per image and channel over the patches
  (instance norm, ``instance_norm_target_layer``), averaged over the K blocks, then normalised
  per patch over the channels (layer norm, ``layer_norm_targets``); both norms without affine
  parameters, eps 1e-5.  Class tokens are not targets.
- Student: ``num_copies`` (M) differently masked copies of each image (the data pipeline's
  ``ImgReplicatePil`` after the augmentations, then a mask per copy) through the encoder,
  which sees only the visible patches, and ``data2vec_decoder``; the teacher runs once per
  image, on the first copy unmasked, and its targets serve all M.
- Loss: over the masked patches of every copy, ``scale * ||prediction - target||^2`` (summed
  over the channels), averaged over those patches; ``scale`` = ``loss_scale``, or
  1/sqrt(channels) when null.  The paper says "L2 loss"; the 1/sqrt(D) scale and the mean over
  masked patches are the released code's setting as far as it could be read (not checked line
  by line).

Not built: the released recipe's class-token term (weight 0.01, the class token regressed
onto the mean target) and its stop on a collapsed target variance.
The batch is ``ibot_multicrop_masking_collator``'s: ``global_views`` [M*B, C, H, W] (copy-major)
and ``mask`` [M*B, h, w] as input and target.
"""
import math
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

from ssl_engine.losses.momentum_target import MomentumTargetLoss
from ssl_engine.losses.outputs import as_output_list, global_views, total_of
from ssl_engine.losses.teacher_student import first_crops, without_stochastic_depth
from ssl_engine.utils.classy import register_loss


def data2vec_targets(layers: List[torch.Tensor], instance_norm: bool = True,
                     layer_norm: bool = True) -> torch.Tensor:
    """The average of ``layers`` (each [B, L, D]: one block's output on the patches), each
    first instance-normalised (per image and channel, over the L patches), the average then
    layer-normalised (per patch, over the D channels)."""
    normalised = [F.instance_norm(layer.float().transpose(1, 2)).transpose(1, 2)
                  if instance_norm else layer.float() for layer in layers]
    target = sum(normalised) / len(normalised)
    return F.layer_norm(target, target.shape[-1:]) if layer_norm else target


def masked_regression(prediction: torch.Tensor, target: torch.Tensor, mask: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """``scale * sum_d (prediction - target)^2`` averaged over the patches where ``mask``
    ([N, L], 1: masked) is set."""
    mask = mask.to(prediction.dtype)
    per_patch = ((prediction - target) ** 2).sum(dim=-1)
    return scale * (per_patch * mask).sum() / mask.sum().clamp(min=1.0)


@register_loss("data2vec_loss")
class Data2VecLoss(MomentumTargetLoss):
    """The model: the ViT trunk with MASKED_IMAGE_MODELING.NAME=mae and one head,
    ``data2vec_decoder`` (the student's alone: the teacher is the trunk).  ``num_copies`` is
    filled in from the transforms' ``ImgReplicatePil`` before launch.  The teacher is the
    loss's, so it is in every checkpoint."""

    online_only_heads = 1  # the decoder
    crops_key = "num_copies"
    monitor_embedding = False  # the output is per-patch predictions, not an embedding

    def __init__(self, momentum: float = 0.9998, momentum_end: float = 0.99999,
                 momentum_anneal_iters: int = 100000, top_k_layers: int = 10,
                 instance_norm_target_layer: bool = True, layer_norm_targets: bool = True,
                 end_of_block_targets: bool = False, num_copies: int = 16,
                 loss_scale: Optional[float] = None):
        super().__init__(momentum, "constant")
        if not 0.0 <= momentum_end <= 1.0 or momentum_anneal_iters < 0:
            raise ValueError(f"data2vec_loss: momentum_end must be in [0, 1] and "
                             f"momentum_anneal_iters >= 0, got {momentum_end}, "
                             f"{momentum_anneal_iters}")
        if top_k_layers < 1 or num_copies < 1:
            raise ValueError(f"data2vec_loss: top_k_layers and num_copies must be >= 1, got "
                             f"{top_k_layers} and {num_copies}")
        if loss_scale is not None and loss_scale <= 0:
            raise ValueError(f"data2vec_loss: loss_scale must be > 0 or null, got {loss_scale}")
        self.momentum_end = float(momentum_end)
        self.momentum_anneal_iters = int(momentum_anneal_iters)
        self.top_k_layers = int(top_k_layers)
        self.instance_norm_target_layer = bool(instance_norm_target_layer)
        self.layer_norm_targets = bool(layer_norm_targets)
        self.end_of_block_targets = bool(end_of_block_targets)
        self.num_copies = int(num_copies)
        self.loss_scale = None if loss_scale is None else float(loss_scale)
        self._captured: List[torch.Tensor] = []
        self._last_statistics: Dict[str, torch.Tensor] = {}

    @classmethod
    def _check_num_heads(cls, heads: int) -> None:
        if heads != 1:
            raise ValueError(f"data2vec_loss needs one head, data2vec_decoder, in "
                             f"config.MODEL.HEAD.PARAMS, got {heads} head(s)")

    @classmethod
    def check_model_config(cls, model_cfg) -> None:
        super().check_model_config(model_cfg)
        vit = model_cfg.TRUNK.get("VISION_TRANSFORMERS") or {}
        masking = (vit.get("MASKED_IMAGE_MODELING") or {}).get("NAME")
        if model_cfg.TRUNK.NAME != "vision_transformer" or masking != "mae":
            raise ValueError("data2vec_loss needs config.MODEL.TRUNK.NAME=vision_transformer with "
                             "VISION_TRANSFORMERS.MASKED_IMAGE_MODELING.NAME=mae (the student "
                             "encodes the visible patches only)")

    # ------------------------------------------------------------------ the teacher
    def momentum_at(self, step: int, total: int) -> float:
        """``momentum`` rising linearly to ``momentum_end`` at ``momentum_anneal_iters``."""
        if step >= self.momentum_anneal_iters:
            return self.momentum_end
        return self.momentum + (self.momentum_end - self.momentum) * (
            step / self.momentum_anneal_iters)

    def bind_model(self, model) -> None:
        """The teacher: the trunk (no heads) without stochastic depth; hooks on its top K
        blocks keep their outputs for the targets."""
        super().bind_model(model)
        without_stochastic_depth(self.target_network)
        blocks = list(self.target_network.trunk.vit.blocks)
        if self.top_k_layers > len(blocks):
            raise ValueError(f"data2vec_loss: top_k_layers={self.top_k_layers} but the trunk has "
                             f"{len(blocks)} blocks")
        for block in blocks[-self.top_k_layers:]:
            module = block if self.end_of_block_targets else block.mlp
            module.register_forward_hook(self._capture)

    def _capture(self, module, inputs, output) -> None:
        self._captured.append(output)

    def target_input(self, batch):
        """The first copy of every image, unmasked."""
        views = global_views(batch["input"], "data2vec_loss")
        return {"global_views": first_crops(views, self.num_copies, 1,
                                            "LOSS.data2vec_loss.num_copies", single=True)}

    def run_target(self, inputs, task) -> torch.Tensor:
        """The targets [B, L, D] (see ``data2vec_targets``) of the teacher's top K blocks."""
        self._captured = []
        self.target_network(inputs)
        layers, self._captured = self._captured, []
        prefix = self.target_network.trunk.vit.num_prefix_tokens
        return data2vec_targets([layer[:, prefix:] for layer in layers],
                                self.instance_norm_target_layer, self.layer_norm_targets)

    # ------------------------------------------------------------------ the loss
    def forward(self, output, target=None) -> torch.Tensor:
        prediction = as_output_list(output)[-1]
        if target is None or not torch.is_tensor(target):
            raise ValueError("data2vec_loss needs the patch masks as the target: "
                             "DATA.TRAIN.TARGET_KEY_NAMES: [mask]")
        teacher = self.get_target_output().detach()
        mask = target.flatten(1)
        targets = teacher.repeat(self.num_copies, 1, 1)  # copy-major, as the student's rows
        if prediction.shape != targets.shape or mask.shape != prediction.shape[:2]:
            raise ValueError(f"data2vec_loss: predictions {tuple(prediction.shape)}, targets "
                             f"{tuple(teacher.shape)} x num_copies={self.num_copies} and masks "
                             f"{tuple(target.shape)} disagree")
        scale = self.loss_scale or 1.0 / math.sqrt(prediction.shape[-1])
        with torch.no_grad():  # data2vec's collapse signs: the spread of targets and predictions
            self._last_statistics = {"target_std": teacher.std(dim=0).mean(),
                                     "prediction_std": prediction.detach().std(dim=0).mean()}
        return total_of(self, {"regression": masked_regression(prediction, targets, mask, scale)})

    def collapse_statistics(self) -> Dict[str, torch.Tensor]:
        return self._last_statistics
