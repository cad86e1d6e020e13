#!/usr/bin/env python
"""The plain-PyTorch reference of benchmarks/train_speed.py's MAE workloads: MAE with timm's
VisionTransformer (ViT-S/16 or ViT-B/16) on the same synthetic images and augmentations as
configs/config/benchmark/mae_vit_synthetic.yaml: 75% of the patches masked per image, the
encoder on the visible ones, a decoder of timm Blocks (width 512, 8 blocks, 16 heads), the
mean squared error of the normalised pixels of the masked patches, AdamW (0.9, 0.95).  Eager;
float32 by default, ``--bf16``: the forward pass under bfloat16 autocast; ``--device gpu``:
on the GPU.  Prints one line per
iteration: ``iter <i> <ms>``.

    python benchmarks/bare_mae_loop.py [--iters 25] [--batch 8] [--workers 0] [--vit s16|b16|tiny]
        [--bf16] [--device cpu|gpu] [--image-size 224]
"""
import torch
import torch.nn as nn
import torchvision.transforms as T
from timm.models.vision_transformer import Block, VisionTransformer

from bare_loop import SyntheticImages, parse_arguments, timed_loop

SIZES = {"s16": (384, 12, 6), "b16": (768, 12, 12), "tiny": (32, 2, 2)}  # width, blocks, heads
PATCH, RATIO, DECODER = 16, 0.75, (512, 8, 16)
TINY_DECODER = (32, 1, 2)  # --vit tiny: the tests' decoder


def augment(size: int):
    return T.Compose([
        T.RandomResizedCrop(size, scale=(0.2, 1.0)), T.RandomHorizontalFlip(), T.ToTensor(),
        T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])


class MAE(nn.Module):
    def __init__(self, vit: str, image_size: int = 224):
        super().__init__()
        width, depth, heads = SIZES[vit]
        self.encoder = VisionTransformer(img_size=image_size, patch_size=PATCH, embed_dim=width,
                                         depth=depth, num_heads=heads, num_classes=0,
                                         qkv_bias=True)
        dim, blocks, decoder_heads = TINY_DECODER if vit == "tiny" else DECODER
        self.embed = nn.Linear(width, dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        tokens = (image_size // PATCH) ** 2 + 1
        self.decoder_pos = nn.Parameter(torch.zeros(1, tokens, dim), requires_grad=False)
        self.blocks = nn.Sequential(*[Block(dim, decoder_heads, qkv_bias=True)
                                      for _ in range(blocks)])
        self.norm = nn.LayerNorm(dim)
        self.predict = nn.Linear(dim, PATCH * PATCH * 3)

    def forward(self, images):
        n = images.shape[0]
        enc = self.encoder
        tokens = enc.patch_embed(images) + enc.pos_embed[:, 1:]
        keep = int(tokens.shape[1] * (1 - RATIO))
        order = torch.rand(n, tokens.shape[1], device=images.device).argsort(dim=1)
        restore = order.argsort(dim=1)
        visible = tokens.gather(1, order[:, :keep, None].expand(-1, -1, tokens.shape[2]))
        cls = (enc.cls_token + enc.pos_embed[:, :1]).expand(n, -1, -1)
        x = enc.norm(enc.blocks(torch.cat([cls, visible], dim=1)))
        x = self.embed(x)
        masked = self.mask_token.expand(n, tokens.shape[1] - keep, -1)
        patches = torch.cat([x[:, 1:], masked], dim=1)
        patches = patches.gather(1, restore[:, :, None].expand(-1, -1, patches.shape[2]))
        x = self.blocks(torch.cat([x[:, :1], patches], dim=1) + self.decoder_pos)
        mask = torch.ones(n, tokens.shape[1], device=images.device).scatter(
            1, order[:, :keep], 0.0)
        return self.predict(self.norm(x))[:, 1:], mask


def patch_pixels(images):
    n, c, h, w = images.shape
    x = images.reshape(n, c, h // PATCH, PATCH, w // PATCH, PATCH)
    x = x.permute(0, 2, 4, 3, 5, 1).reshape(n, (h // PATCH) * (w // PATCH), -1)
    return (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True) + 1e-6).sqrt()


def main(argv=None) -> None:
    def add(parser):
        parser.add_argument("--vit", choices=list(SIZES), default="b16")
        parser.add_argument("--image-size", type=int, default=224, help="crops (tests: 32)")

    args = parse_arguments(__doc__, argv, add)
    torch.manual_seed(0)
    model = MAE(args.vit, args.image_size).to(args.device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=1.5e-4, betas=(0.9, 0.95), weight_decay=0.05)
    model.train()

    def step(images):
        with torch.autocast(args.device.type, dtype=torch.bfloat16, enabled=args.bf16):
            prediction, mask = model(images)
        error = ((prediction.float() - patch_pixels(images)) ** 2).mean(-1)
        loss = (error * mask).sum() / mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    timed_loop(args, SyntheticImages(args.batch * args.iters, max(256, args.image_size),
                                     augment(args.image_size)), step)


if __name__ == "__main__":
    main()
