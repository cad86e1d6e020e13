#!/usr/bin/env python
"""The plain-PyTorch reference of benchmarks/train_speed.py: SimCLR with torchvision's
ResNet-50 (or -18) on the same synthetic images and augmentations as
configs/config/benchmark/simclr_resnet50_synthetic.yaml, eager, nothing but torch,
torchvision, numpy and PIL imported.  float32 by default; ``--bf16 --channels-last`` is the
reference of the engine's fast settings: the model's forward pass under bfloat16 autocast (the
loss in float32) and the weights and images in the channels_last memory format; ``--device
gpu``: on the GPU.  Prints one line per iteration: ``iter <i> <ms>``.

    python benchmarks/bare_simclr_loop.py [--iters 25] [--batch 8] [--workers 0] [--depth 50|18]
        [--bf16] [--channels-last] [--device cpu|gpu] [--size 224]
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
import torchvision.transforms as T

from bare_loop import SyntheticImages, parse_arguments, timed_loop


class TwoViews:
    """The SimCLR augmentation (crops of ``size``), applied twice to each image."""

    def __init__(self, size: int = 224):
        self.augment = T.Compose([
            T.RandomResizedCrop(size), T.RandomHorizontalFlip(),
            T.RandomApply([T.ColorJitter(0.8, 0.8, 0.8, 0.2)], p=0.8), T.RandomGrayscale(p=0.2),
            T.ToTensor(), T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ])

    def __call__(self, image):
        return self.augment(image), self.augment(image)


def info_nce(z: torch.Tensor, temperature: float = 0.1) -> torch.Tensor:
    z = F.normalize(z, dim=1)
    n = z.shape[0] // 2
    logits = z @ z.t() / temperature
    logits.fill_diagonal_(float("-inf"))
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
    return F.cross_entropy(logits, targets)


def main(argv=None) -> None:
    def add(parser):
        parser.add_argument("--depth", type=int, choices=[18, 50], default=50)
        parser.add_argument("--channels-last", action="store_true")
        parser.add_argument("--size", type=int, default=224, help="crop size (tests: small)")

    args = parse_arguments(__doc__, argv, add)
    torch.manual_seed(0)
    model = getattr(torchvision.models, f"resnet{args.depth}")()
    width = model.fc.in_features
    model.fc = nn.Sequential(nn.Linear(width, 2048), nn.ReLU(inplace=True), nn.Linear(2048, 128))
    layout = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(args.device, memory_format=layout)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9, weight_decay=1e-6)
    model.train()

    def step(views):
        images = torch.cat(views).contiguous(memory_format=layout)
        with torch.autocast(args.device.type, dtype=torch.bfloat16, enabled=args.bf16):
            embeddings = model(images)
        loss = info_nce(embeddings.float())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    timed_loop(args, SyntheticImages(args.batch * args.iters, max(256, args.size),
                                     TwoViews(args.size)), step)


if __name__ == "__main__":
    main()
