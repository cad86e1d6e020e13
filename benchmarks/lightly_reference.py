"""A reference training loop built from lightly's components, beside the engine's recipe.

For SimCLR and BYOL on Fashion-MNIST: lightly's view transforms, projection and prediction heads,
losses and momentum update, in a plain PyTorch loop written for this comparison. What must be the
same as the engine's run is read from the engine's recipe (configs/config/benchmark/
fashion_mnist/<method>.yaml), not written twice: the trunk (built by the engine's registry with
the recipe's settings), the batch, the epochs, the optimizer and its lr schedule (linear warm-up,
then cosine, per step), the head sizes, the temperature, the BYOL momentum, the bfloat16 autocast
and channels_last, the data-loading workers, and the views' crop size and scale, jitter
strengths and blur sigmas (set in lightly's transforms). Features are the trunk's res5avg
(global average of the last stage), as the engine extracts them.

    python benchmarks/lightly_reference.py simclr --out /tmp/ref_simclr
"""
import argparse
import copy
import gzip
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

DATA_ROOT = "/usr/share/datasets/fashion-mnist"
MEAN, STD = [0.286] * 3, [0.353] * 3


def read_idx(path: str) -> np.ndarray:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        dims = [int.from_bytes(f.read(4), "big") for _ in range(f.read(4)[3])]
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(dims)


def fashion_mnist(root: str, split: str):
    """(grey images [N, 28, 28] uint8, labels) of ``split`` ("train" or "t10k")."""
    def path(kind):
        plain = os.path.join(root, f"{split}-{kind}")
        return plain if os.path.exists(plain) else plain + ".gz"
    return read_idx(path("images-idx3-ubyte")), read_idx(path("labels-idx1-ubyte")).astype(np.int64)


class TwoViews(torch.utils.data.Dataset):
    def __init__(self, images, transform):
        self.images, self.transform = images, transform

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        return self.transform(Image.fromarray(self.images[index]).convert("RGB"))


class Res5Avg(torch.nn.Module):
    """The trunk's res5avg output (the global average of its last stage) as one tensor."""

    def __init__(self, trunk):
        super().__init__()
        self.trunk = trunk

    def forward(self, x):
        return self.trunk(x, out_feat_keys=["res5avg"])[0].flatten(1)


def recipe(method: str, overrides=()):
    """The engine's recipe for ``method`` (with ``overrides``, ``config.X=v`` strings), composed
    and derived as the engine runs it."""
    import ssl_engine.losses  # noqa: F401  (derived settings)
    import ssl_engine.models  # noqa: F401
    from ssl_engine.config import load_config

    return load_config([f"config=benchmark/fashion_mnist/{method}", *overrides])[1]


def lr_at(step: int, total: int, peak: float, warmup: float) -> float:
    """Linear warm-up from 0 over the first ``warmup`` of the steps, then cosine to 0."""
    warm = max(1, int(round(warmup * total)))
    if step < warm:
        return peak * step / warm
    progress = (step - warm) / max(1, total - warm)
    return 0.5 * peak * (1 + np.cos(np.pi * progress))


def lightly_parts(method: str, cfg):
    """(view transform, heads, loss function) from lightly for ``method``."""
    from lightly.loss import NegativeCosineSimilarity, NTXentLoss
    from lightly.models.modules import (BYOLPredictionHead, BYOLProjectionHead,
                                        SimCLRProjectionHead)
    from lightly.transforms import BYOLTransform, SimCLRTransform
    from lightly.transforms.byol_transform import BYOLView1Transform, BYOLView2Transform

    heads = cfg.MODEL.HEAD.PARAMS
    ops = {entry["name"]: entry for entry in cfg.DATA.TRAIN.TRANSFORMS}
    crop, jitter, blur = ops["RandomResizedCrop"], ops["ColorJitter"], ops["GaussianBlur"]
    grey = dict(input_size=int(crop["size"]), cj_prob=1.0, cj_strength=1.0,
                cj_bright=float(jitter["brightness"]), cj_contrast=float(jitter["contrast"]),
                cj_sat=0.0, cj_hue=0.0, min_scale=float(crop["scale"][0]),
                random_gray_scale=0.0, sigmas=tuple(float(s) for s in blur["sigma"]),
                hf_prob=0.5, normalize={"mean": MEAN, "std": STD})
    if method == "simclr":
        dims = heads[0][1]["dims"]
        transform = SimCLRTransform(gaussian_blur=1.0, **grey)
        projection = SimCLRProjectionHead(dims[0], dims[1], dims[2])
        loss = NTXentLoss(temperature=cfg.LOSS.simclr_info_nce_loss.temperature)
        return transform, torch.nn.ModuleList([projection]), loss
    project, predict = heads[0][1]["dims"], heads[1][1]["dims"]
    transform = BYOLTransform(BYOLView1Transform(gaussian_blur=1.0, **grey),
                              BYOLView2Transform(gaussian_blur=0.1, **grey))
    parts = torch.nn.ModuleList([BYOLProjectionHead(*project), BYOLPredictionHead(*predict)])
    return transform, parts, NegativeCosineSimilarity()


def train(method: str, data_root: str = DATA_ROOT, limit: int = 0, epochs: int = 0,
          overrides=()):
    """Train ``method`` as the recipe says (``epochs``: instead of its epochs; ``overrides``:
    ``config.X=v`` changes to the recipe); returns (trunk, seconds)."""
    from lightly.utils.scheduler import cosine_schedule

    from ssl_engine.models import build_model
    from ssl_engine.utils.cpu_budget import auto_workers

    cfg = recipe(method, overrides)
    torch.manual_seed(int(cfg.SEED_VALUE))
    images, _ = fashion_mnist(data_root, "train")
    images = images[:limit] if limit else images
    transform, heads, criterion = lightly_parts(method, cfg)
    trunk = Res5Avg(build_model(cfg.MODEL).trunk)  # the engine's trunk; lightly's heads
    channels_last = bool(cfg.MODEL.CHANNELS_LAST)
    if channels_last:
        trunk = trunk.to(memory_format=torch.channels_last)
    batch = int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA)
    workers = auto_workers(os.cpu_count() or 1, "cpu") \
        if cfg.DATA.NUM_DATALOADER_WORKERS == "auto" else \
        int(cfg.DATA.NUM_DATALOADER_WORKERS)
    loader = torch.utils.data.DataLoader(TwoViews(images, transform), batch_size=batch,
                                         shuffle=True, drop_last=True, num_workers=workers,
                                         persistent_workers=workers > 0)
    opt = cfg.OPTIMIZER
    schedule = opt.param_schedulers.lr
    peak, warmup = schedule.schedulers[0]["end_value"], schedule.lengths[0]
    groups = [{"params": list(trunk.parameters()) + list(heads[0].parameters()), "scale": 1.0}]
    if method == "byol":
        scale = dict(opt.get("lr_multipliers") or []).get("heads.1", 1.0)
        groups.append({"params": list(heads[1].parameters()), "scale": float(scale)})
        teacher = copy.deepcopy(torch.nn.ModuleList([trunk, heads[0]]))
        for parameter in teacher.parameters():
            parameter.requires_grad = False
    optimizer = torch.optim.SGD(groups, lr=peak, momentum=opt.momentum,
                                weight_decay=opt.weight_decay)
    epochs = epochs or int(opt.num_epochs)
    total, step = epochs * len(loader), 0
    autocast = bool(cfg.MODEL.AMP_PARAMS.USE_AMP)
    start = time.perf_counter()
    for epoch in range(epochs):
        trunk.train(), heads.train()
        for views in loader:
            lr = lr_at(step, total, peak, warmup)
            for group in optimizer.param_groups:
                group["lr"] = lr * group["scale"]
            if channels_last:
                views = [v.contiguous(memory_format=torch.channels_last) for v in views]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                if method == "simclr":
                    z = [heads[0](trunk(v)) for v in views]
                    loss = criterion(z[0].float(), z[1].float())
                else:
                    momentum = cosine_schedule(step, total, cfg.LOSS.byol_loss.momentum, 1.0)
                    for online, target in zip([trunk, heads[0]], teacher):
                        for p, q in zip(online.parameters(), target.parameters()):
                            q.data.mul_(momentum).add_(p.data, alpha=1 - momentum)
                    p = [heads[1](heads[0](trunk(v))) for v in views]
                    with torch.no_grad():
                        z = [teacher[1](teacher[0](v)) for v in views]
                    loss = 0.5 * (criterion(p[0].float(), z[1].float())
                                  + criterion(p[1].float(), z[0].float()))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
        print(f"  reference {method} epoch {epoch + 1}/{epochs}: loss {loss.item():.4f}, "
              f"{time.perf_counter() - start:.0f} s", flush=True)
    return trunk, time.perf_counter() - start


@torch.no_grad()
def features(trunk, images: np.ndarray, batch: int = 512) -> np.ndarray:
    """res5avg features of grey ``images`` normalised as the recipe's TEST transforms do."""
    trunk.eval()
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    out = []
    for start in range(0, len(images), batch):
        x = torch.from_numpy(images[start:start + batch]).float().div(255)
        x = (x.unsqueeze(1).expand(-1, 3, -1, -1) - mean) / std
        out.append(trunk(x).float().numpy())
    return np.concatenate(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("method", choices=["simclr", "byol"])
    parser.add_argument("--data-root", default=DATA_ROOT)
    parser.add_argument("--out", required=True, help="folder for train/test features (.npy)")
    parser.add_argument("--limit", type=int, default=0, help="train on the first N images")
    parser.add_argument("--epochs", type=int, default=0, help="instead of the recipe's")
    parser.add_argument("--override", nargs="*", default=[],
                        help="config.X=v changes to the recipe (the engine's syntax)")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, (os.cpu_count() or 2)))
    trunk, seconds = train(args.method, args.data_root, args.limit, args.epochs,
                           args.override)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "t10k"):
        images, labels = fashion_mnist(args.data_root, split)
        np.save(out / f"{split}_features.npy", features(trunk, images))
        np.save(out / f"{split}_labels.npy", labels)
    (out / "train_seconds.txt").write_text(f"{seconds:.1f}\n")
    print(f"reference {args.method}: trained in {seconds:.0f} s; features in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
