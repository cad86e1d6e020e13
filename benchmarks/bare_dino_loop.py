#!/usr/bin/env python
"""The plain-PyTorch reference of benchmarks/train_speed.py's DINO workloads: DINO multi-crop
with timm's VisionTransformer (ViT-S/16 or ViT-B/16), the settings of
configs/config/pretrain/dino/dino_vit_s16.yaml on the engine's synthetic images: per image 2
global crops of 224 (scale 0.4-1) and 10 local crops of 96 (scale 0.05-0.4), each flipped,
colour-distorted (strength 0.5) and blurred (p 0.5); the student (stochastic depth 0.1) runs
on the global crops together, then on the local crops together; a DINO head (3 layers, hidden
2048, bottleneck 256, weight-normalised last layer of 65536 outputs, frozen as in the
recipe's first epoch); the teacher, a copy without stochastic depth updated by EMA (momentum
0.996 on the cosine to 1), on the global crops; DINO's loss with a running center; AdamW
without weight decay on biases and norms, gradients clipped to a total norm of 3.  The
schedules (lr, weight decay, teacher temperature) stay at their first values: their cost is
a few scalar writes.  Eager; float32 by default, ``--bf16``: the forward passes under
bfloat16 autocast (the loss in float32); ``--device gpu``: on the GPU.  Prints one line per
iteration: ``iter <i> <ms>``.

    python benchmarks/bare_dino_loop.py [--iters 25] [--batch 8] [--workers 0] [--vit s16|b16]
        [--bf16] [--device cpu|gpu] [--local-crops 10] [--sizes 224 96] [--out-dim 65536]

(``--vit tiny`` and the size options are for the tests.)
"""
import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision.transforms as T
from PIL import ImageFilter
from timm.models.vision_transformer import VisionTransformer

from bare_loop import SyntheticImages, parse_arguments, timed_loop

SIZES = {"s16": (384, 12, 6), "b16": (768, 12, 12), "tiny": (32, 2, 2)}  # width, blocks, heads
PATCH, DROP_PATH, MOMENTUM, CLIP = 16, 0.1, 0.996, 3.0
STUDENT_TEMP, TEACHER_TEMP, CENTER_MOMENTUM = 0.1, 0.04, 0.9


class Blur:
    """With probability 0.5, PIL's Gaussian blur of a radius uniform in [0.1, 2]."""

    def __call__(self, image):
        if torch.rand(()) < 0.5:
            radius = 0.1 + 1.9 * float(torch.rand(()))
            image = image.filter(ImageFilter.GaussianBlur(radius))
        return image


class MultiCrop:
    """2 global crops then ``local`` local crops of one image, each augmented."""

    def __init__(self, sizes, local: int):
        jitter = T.ColorJitter(0.4, 0.4, 0.4, 0.1)  # SimCLR's jitter at strength 0.5
        after = [T.RandomHorizontalFlip(), T.RandomApply([jitter], p=0.8),
                 T.RandomGrayscale(p=0.2), Blur(), T.ToTensor(),
                 T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]
        self.crops = (
            [T.Compose([T.RandomResizedCrop(sizes[0], scale=(0.4, 1.0)), *after])] * 2
            + [T.Compose([T.RandomResizedCrop(sizes[1], scale=(0.05, 0.4)), *after])] * local)

    def __call__(self, image):
        return [crop(image) for crop in self.crops]


class Head(nn.Module):
    """Linear-GELU-linear-GELU-linear to 256, L2-normalised, then a linear layer without bias
    whose rows are ``g * v / |v|``."""

    def __init__(self, width: int, out_dim: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(width, 2048), nn.GELU(), nn.Linear(2048, 2048),
                                 nn.GELU(), nn.Linear(2048, 256))
        self.v = nn.Parameter(torch.empty(out_dim, 256))
        nn.init.kaiming_uniform_(self.v, a=math.sqrt(5))
        self.g = nn.Parameter(torch.ones(out_dim, 1))

    def forward(self, x):
        x = F.normalize(self.mlp(x), dim=1)
        return F.linear(x, self.v * (self.g / self.v.norm(dim=1, keepdim=True)))


class Network(nn.Module):
    def __init__(self, vit: str, out_dim: int, image_size: int, drop_path: float):
        super().__init__()
        width, depth, heads = SIZES[vit]
        self.trunk = VisionTransformer(
            img_size=image_size, patch_size=PATCH, embed_dim=width, depth=depth,
            num_heads=heads, mlp_ratio=4.0, qkv_bias=True, num_classes=0,
            drop_path_rate=drop_path, dynamic_img_size=True)
        self.head = Head(width, out_dim)

    def forward(self, groups):
        """The head's scores of every crop, crop-major, one trunk pass per crop size."""
        return torch.cat([self.head(self.trunk(torch.cat(group))) for group in groups])


def dino_loss(student, teacher, center, teachers: int, crops: int):
    """The mean over the (teacher crop t, student crop s != t) pairs and the samples of
    ``-sum_k softmax((teacher_t - center) / 0.04)_k * log_softmax(student_s / 0.1)_k``."""
    batch = teacher.shape[0] // teachers
    targets = F.softmax((teacher - center) / TEACHER_TEMP, dim=1).chunk(teachers)
    log_probs = F.log_softmax(student / STUDENT_TEMP, dim=1).chunk(crops)
    total = sum(-(targets[t] * log_probs[s]).sum() for t in range(teachers)
                for s in range(crops) if s != t)
    return total / (teachers * (crops - 1) * batch)


def main(argv=None) -> None:
    def add(parser):
        parser.add_argument("--vit", choices=list(SIZES), default="s16")
        parser.add_argument("--local-crops", type=int, default=10)
        parser.add_argument("--sizes", type=int, nargs=2, default=[224, 96])
        parser.add_argument("--out-dim", type=int, default=65536)

    args = parse_arguments(__doc__, argv, add)
    torch.manual_seed(0)
    student = Network(args.vit, args.out_dim, args.sizes[0], DROP_PATH).to(args.device)
    teacher = copy.deepcopy(student)
    for module in teacher.modules():  # no stochastic depth in the teacher
        if hasattr(module, "drop_prob"):
            module.drop_prob = 0.0
    teacher.requires_grad_(False)
    decay = [p for p in student.parameters() if p.ndim > 1]
    no_decay = [p for p in student.parameters() if p.ndim <= 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.04},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=5e-4 * args.batch / 256)
    frozen = (student.head.v, student.head.g)  # the recipe's first epoch
    center = torch.zeros(1, args.out_dim, device=args.device)
    crops, total_steps = 2 + args.local_crops, args.iters
    student.train()
    teacher.train()
    state = {"step": 0}

    def step(views):
        groups = [views[:2], views[2:]] if args.local_crops else [views]
        with torch.autocast(args.device.type, dtype=torch.bfloat16, enabled=args.bf16):
            student_out = student(groups)
            with torch.no_grad():
                teacher_out = teacher([groups[0]])
        teacher_out = teacher_out.float()
        loss = dino_loss(student_out.float(), teacher_out, center, 2, crops)
        optimizer.zero_grad()
        loss.backward()
        for param in frozen:
            param.grad = None
        torch.nn.utils.clip_grad_norm_(student.parameters(), CLIP)
        optimizer.step()
        with torch.no_grad():
            center.mul_(CENTER_MOMENTUM).add_(teacher_out.mean(0, keepdim=True),
                                              alpha=1 - CENTER_MOMENTUM)
            momentum = 1 - (1 - MOMENTUM) * (math.cos(math.pi * state["step"] / total_steps)
                                             + 1) / 2
            torch._foreach_lerp_(list(teacher.parameters()), list(student.parameters()),
                                 1 - momentum)
        state["step"] += 1

    timed_loop(args, SyntheticImages(args.batch * args.iters, 256,
                                     MultiCrop(args.sizes, args.local_crops)), step)


if __name__ == "__main__":
    main()
