"""DATA.<split>.DEVICE_AUGMENTATION: the photometric tail of a split's TRANSFORMS runs batched on
the training device instead of in the loader workers.

The split of the list: its longest tail of transforms that have a device counterpart
(data/device_ops.py: colour jitter and distortion, grayscale, Gaussian blurs, solarization,
ToTensor, Normalize, RandomErasing; with DATA.<split>.DEVICE_CROPS also RandomResizedCrop,
RandomHorizontalFlip and ImgPilToMultiCrop, for data sets whose images share one size) goes to
the device;
everything before it (decoding, the views, other geometry) stays in the workers, which ship
each view as a uint8 [C, H, W] tensor (a quarter of the bytes of floats) with its drawn
parameters. The draws are made in the worker inside the sample's seeded generators
(data/seeding.py), right after the worker's own transforms, so the augmentation of sample i
in epoch e is still a function of (SEED_VALUE, e, i), whatever the workers, the batch or a
resume.
With DATA.<split>.BATCHED_READS the loader instead draws every view of a batch at once
(``draw_batch``, data/batched_reads.py).

The training process then calls ``on_device(batch, move)``: the batch goes to the device,
its uint8 views become floats in [0, 1] (what ToTensor gives) and every op runs on the whole
batch with each view's own parameters.

Multi-crop on the device: an ImgPilToMultiCrop in the device tail starts it (the transforms
before it stay in the workers). The workers ship each sample's image once as uint8 (not
``total_num_crops`` copies), with every view's drawn box (by the view's resolution group) and
the meta of every view's row; on the device each group's crop cuts its rows' boxes out of the
one tensor of images (roi_align's box index), the rows go through the ops after the
multi-crop, and "input" becomes one tensor per output size, as multicrop_collator makes from
views cropped in the workers.
"""
from typing import Callable, List, Optional, Tuple

import torch
from PIL import Image
from torchvision.transforms.functional import pil_to_tensor

from ssl_engine.data.collators.common import num_views, view_major_meta
from ssl_engine.data.collators.multicrop import resolution_groups
from ssl_engine.data.device_ops import FlipOp, MultiCropOp, ResizedCropOp, device_ops
from ssl_engine.data.transforms.chain import TransformChain, build_transforms
from ssl_engine.utils.device import to_device

PARAMS_KEY = "device_params"  # per view in a sample, per row (group) in a batch
# collators whose rows are view-major by runs of same-size views, the order
# ``rows_of_params`` reproduces (moco_collator's "input" and "input_momentum" are views 0 and 1)
ROW_ORDER_COLLATORS = ("simclr_collator", "multicrop_collator", "moco_collator")


def split_for_device(chain: TransformChain, key: str, crops: bool = False
                     ) -> Tuple[TransformChain, list]:
    """(the chain the workers run, the device ops of its longest device-capable tail; with
    ``crops``, RandomResizedCrop and RandomHorizontalFlip can be in it). Transforms that only
    map labels stay with the workers and do not end the tail."""
    transforms = chain.transforms
    start = len(transforms)
    while start > 0:
        previous = transforms[start - 1]
        if not getattr(previous, "maps_label", False):
            ops = device_ops(previous, crops)
            if ops is None:
                break
            if any(isinstance(op, MultiCropOp) for op in ops):  # it makes the views: a start
                start -= 1
                break
        start -= 1
    tail = [t for t in transforms[start:] if not getattr(t, "maps_label", False)]
    ops = [op for transform in tail for op in device_ops(transform, crops)]
    if not tail:
        raise ValueError(
            f"{key}.DEVICE_AUGMENTATION=true but the last transform of {key}.TRANSFORMS "
            f"({type(transforms[-1]).__name__ if transforms else 'none'}) has no device "
            "counterpart; the device runs a tail of ColorJitter, ImgPilColorDistortion, "
            "ImgPilRandomColorJitter, RandomGrayscale, GaussianBlur, ImgPilGaussianBlur, "
            "ImgPilRandomSolarize, ToTensor, Normalize, RandomErasing")
    if crops and not any(isinstance(op, (ResizedCropOp, FlipOp, MultiCropOp)) for op in ops):
        raise ValueError(
            f"{key}.DEVICE_CROPS=true but no RandomResizedCrop, RandomHorizontalFlip or "
            f"ImgPilToMultiCrop is in the "
            f"tail of {key}.TRANSFORMS that runs on the device (it starts after "
            f"{type(transforms[start - 1]).__name__ if start else 'nothing'})")
    kept = transforms[:start] + [t for t in transforms[start:] if getattr(t, "maps_label", False)]
    return TransformChain(kept), ops


def uint8_view(view) -> torch.Tensor:
    """A view as the workers ship it: a uint8 [C, H, W] tensor."""
    if isinstance(view, Image.Image):
        return pil_to_tensor(view)
    if isinstance(view, torch.Tensor) and view.dtype == torch.uint8:
        return view
    raise TypeError(f"DEVICE_AUGMENTATION: the workers' transforms must end with PIL images or "
                    f"uint8 tensors, got {type(view).__name__}"
                    f"{'' if not isinstance(view, torch.Tensor) else ' of ' + str(view.dtype)}")


class DeviceAugmentation:
    """The device half of a split's transforms: ``ops`` in order (data/device_ops.py). When
    they start with a MultiCropOp, ``groups`` holds one DeviceAugmentation per resolution
    group (its crop, then ``ops[1:]``), ``views`` the views it makes of one image and
    ``view_chains`` the group of each view, in view order."""

    def __init__(self, ops: list):
        self.ops = ops
        self.size = sum(op.size for op in ops)
        self.crops = any(isinstance(op, (ResizedCropOp, MultiCropOp)) for op in ops)
        self.multicrop = ops[0] if ops and isinstance(ops[0], MultiCropOp) else None
        if any(isinstance(op, MultiCropOp) for op in ops[1:]):
            raise ValueError("on the device ImgPilToMultiCrop makes the views: it comes first "
                             "in the device tail, once")
        self.groups, self.views, self.view_chains = None, 1, None
        if self.multicrop is not None:
            self.groups = [DeviceAugmentation([crop, *ops[1:]]) for crop in self.multicrop.crops]
            self.views = self.multicrop.views
            self.view_chains = [group for group, count in zip(self.groups, self.multicrop.counts)
                                for _ in range(count)]

    def draw(self, views) -> Tuple[list, List[torch.Tensor]]:
        """(the views as uint8 tensors, each view's parameters: a float32 vector). Called in
        the sample's seeded generators, after the worker's transforms; a multi-crop makes its
        views here, each the workers' one image (the same tensor: the collator ships it once)."""
        views = [uint8_view(view) for view in (views if isinstance(views, list) else [views])]
        if self.groups is None:
            return views, [torch.tensor(self.draw_view(view), dtype=torch.float32)
                           for view in views]
        if len(views) != 1:
            raise ValueError(f"on the device ImgPilToMultiCrop makes the views of one image, "
                             f"but the workers' transforms made {len(views)} views")
        views = views * self.views
        return views, [torch.tensor(chain.draw_view(view), dtype=torch.float32)
                       for chain, view in zip(self.view_chains, views)]

    def draw_view(self, view: torch.Tensor) -> List[float]:
        """One view's parameters, op after op; an op after a crop sees a stand-in of the
        cropped size (the draws read only the shape)."""
        values = []
        for op in self.ops:
            values += op.draw(view)
            if getattr(op, "out_shape", None):
                view = torch.empty(()).expand(op.out_shape(view.shape))
        return values

    def draw_batch(self, draws, shape, view: int = 0) -> torch.Tensor:
        """The parameters of ``len(draws)`` views of ``shape`` ([C, H, W]) drawn at once, op
        after op (data/batch_draws.py; DATA.<split>.BATCHED_READS): float32 [rows, size].
        ``view``: the views' place in their samples (a multi-crop draws by its group)."""
        if self.groups is not None:
            return self.view_chains[view].draw_batch(draws, shape)
        columns = []
        for op in self.ops:
            columns.append(op.draw_batch(draws, shape))
            if getattr(op, "out_shape", None):
                shape = op.out_shape(shape)
        return torch.cat(columns, dim=1).float()

    def slices(self, params: torch.Tensor) -> List[torch.Tensor]:
        """``params`` [N, size] cut into each op's columns."""
        return list(params.split([op.size for op in self.ops], dim=1))

    def plan(self, params: torch.Tensor, images: Optional[int] = None) -> list:
        """Each op's rows to change (CPU indices), made where reading values costs nothing:
        in the loader's collator. ``images``: a multi-crop group's rows crop the ``images``
        shipped images, row r image ``r % images`` (ResizedCropOp.plan)."""
        if self.groups is not None:
            raise TypeError("a multi-crop's rows are planned by resolution group (row_groups)")
        return [op.plan(part, images) if isinstance(op, ResizedCropOp) else op.plan(part)
                for op, part in zip(self.ops, self.slices(params))]

    def row_groups(self, stacks: List[torch.Tensor], samples: int) -> list:
        """(params, plan) per run of rows the device augments as one tensor: ``stacks`` (one
        [rows, size] tensor per run of same-size views, from ``rows_of_params``) as they are,
        or for a multi-crop, its one stack cut by resolution group (view-major rows:
        ``count * samples`` rows a group)."""
        if self.groups is None:
            return [(params, self.plan(params)) for params in stacks]
        [params] = stacks  # the views reaching a device crop share one size
        parts = params.split([count * samples for count in self.multicrop.counts])
        return [(part, group.plan(part, images=samples))
                for part, group in zip(parts, self.groups)]

    def __call__(self, images: torch.Tensor, params: torch.Tensor, plan=None,
                 channels_last: bool = False) -> torch.Tensor:
        """uint8 [N, C, H, W] ``images`` (on any device) -> the augmented float32 batch;
        ``params``: [N, size] on the CPU, row n drawn for image n; ``plan`` from ``plan``.
        ``channels_last``: the ops work on (and return) channels-last images, the memory
        format the trunk takes (its convolutions and kornia's run faster on it on a CPU)."""
        if self.groups is not None:
            raise TypeError("a multi-crop's batch is augmented group by group (on_device)")
        layout = torch.channels_last if channels_last else torch.contiguous_format
        return self.augment(as_floats(images, layout), params, plan, layout)

    def augment(self, images: torch.Tensor, params: torch.Tensor, plan, layout
                ) -> torch.Tensor:
        """``__call__`` on images already floats in [0, 1] in the memory format ``layout``
        (a multi-crop's groups share one conversion of the shipped images)."""
        plan = self.plan(params) if plan is None else plan
        for op, part, rows in zip(self.ops, self.slices(params), plan):
            images = op.apply(images, part, rows)
            if getattr(op, "out_shape", None):  # a crop makes a new, contiguous tensor
                images = images.contiguous(memory_format=layout)
        return images

    def on_device(self, batch: dict, move: Callable, channels_last: bool = False) -> dict:
        """``batch`` (from a loader of this split) moved by ``move`` and augmented (in the
        ``channels_last`` format or not); its parameters stay on the CPU (indices of rows are
        chosen there, so nothing waits)."""
        groups = batch[PARAMS_KEY]  # (params, plan) per run of same-size views
        # the loader's batch stays as it is: the log counts its views by these parameters
        batch = move({key: value for key, value in batch.items() if key != PARAMS_KEY})
        inputs = batch["input"]
        if self.groups is not None:  # a multi-crop: every view is cut from the one image
            batch["input"] = self.multicrop_on_device(inputs, groups, move, channels_last)
        elif "input_momentum" in batch:  # moco_collator: view 0's rows, then view 1's
            both = torch.cat([inputs, batch["input_momentum"]])
            out = move(self(both, *groups[0], channels_last=channels_last))
            batch["input"], batch["input_momentum"] = out.split(inputs.shape[0])
        elif isinstance(inputs, torch.Tensor):
            batch["input"] = move(self(inputs, *groups[0], channels_last=channels_last))
        else:
            batch["input"] = [move(self(group, *rows, channels_last=channels_last))
                              for group, rows in zip(inputs, groups)]
        return batch

    def multicrop_on_device(self, inputs, groups: list, move: Callable,
                            channels_last: bool) -> List[torch.Tensor]:
        """The shipped images (a list of one tensor, one image a sample) cropped by every
        resolution group's rows, view-major (each row's box reads image ``row % samples``),
        and augmented by the group's chain; groups of one output size next to each other are
        joined, as multicrop_collator joins such views."""
        [images] = inputs
        layout = torch.channels_last if channels_last else torch.contiguous_format
        images = as_floats(images, layout)  # once: each group's crop reads it, none changes it
        outputs = []
        for chain, (params, plan) in zip(self.groups, groups):
            out = move(chain.augment(images, params, plan, layout))
            if outputs and outputs[-1].shape[1:] == out.shape[1:]:
                out = torch.cat([outputs.pop(), out])
            outputs.append(out)
        return outputs

    def __repr__(self) -> str:
        inner = "".join(f"\n  {op!r}" for op in self.ops)
        return f"DeviceAugmentation({inner}\n)"


def as_floats(images: torch.Tensor, layout) -> torch.Tensor:
    """uint8 images as floats in [0, 1] (what ToTensor gives) in the memory format ``layout``."""
    return images.float().div_(255).contiguous(memory_format=layout)


def rows_of_params(samples: List[dict]) -> List[torch.Tensor]:
    """The samples' per-view parameters stacked in the collated rows' order: one [rows, P]
    tensor per run of same-size views, view-major within it."""
    return [torch.stack([sample[PARAMS_KEY][v] for v in group for sample in samples])
            for group in resolution_groups(samples[0])]


def check_one_size(samples: List[dict]) -> None:
    """Refuse views of different sizes before a device crop, which takes them as one tensor."""
    shapes = {tuple(view.shape) for sample in samples for view in sample["data"]}
    if len(shapes) > 1:
        raise ValueError(f"DEVICE_CROPS: the views reaching the device crop must share one "
                         f"size, got {sorted(shapes)}; resize them in the workers (a Resize "
                         f"before the crop) or set DEVICE_CROPS false")


class DeviceParamsCollator:
    """``collate``'s batch plus, per run of same-size views, the parameters of its rows and
    ``augmentation``'s plan for them (picklable, for loader workers)."""

    def __init__(self, collate: Callable, augmentation: DeviceAugmentation):
        self.collate, self.augmentation = collate, augmentation

    def __call__(self, samples):
        if self.augmentation.crops:
            check_one_size(samples)
        if self.augmentation.multicrop is None:
            batch = self.collate(samples)
        else:  # the views are one image's copies: ship it once, with every view's rows' meta
            batch = self.collate([{**sample, "data": sample["data"][:1]} for sample in samples])
            batch.update(view_major_meta(samples, list(range(num_views(samples)))))
        batch[PARAMS_KEY] = self.augmentation.row_groups(rows_of_params(samples), len(samples))
        return batch


def check_collator(split_cfg, key: str) -> None:
    """Refuse a collator whose row order the parameters cannot follow."""
    if split_cfg.COLLATE_FUNCTION not in ROW_ORDER_COLLATORS:
        raise ValueError(f"{key}.DEVICE_AUGMENTATION=true works with the collators "
                         f"{list(ROW_ORDER_COLLATORS)}, not {split_cfg.COLLATE_FUNCTION}")


def build_device_augmentation(chain: TransformChain, split_cfg, key: str
                              ) -> Tuple[TransformChain, Optional[DeviceAugmentation]]:
    """(the workers' chain, the device half or None) for ``split_cfg`` (cfg.DATA.<split>)."""
    if not split_cfg.get("DEVICE_AUGMENTATION", False):
        if split_cfg.get("DEVICE_CROPS", False):
            raise ValueError(f"{key}.DEVICE_CROPS=true needs {key}.DEVICE_AUGMENTATION=true")
        return chain, None
    check_collator(split_cfg, key)
    kept, ops = split_for_device(chain, key, split_cfg.get("DEVICE_CROPS", False))
    augmentation = DeviceAugmentation(ops)
    if augmentation.multicrop is not None and split_cfg.COLLATE_FUNCTION != "multicrop_collator":
        raise ValueError(f"{key}.DEVICE_CROPS=true with ImgPilToMultiCrop works with "
                         f"{key}.COLLATE_FUNCTION=multicrop_collator, not "
                         f"{split_cfg.COLLATE_FUNCTION}")
    return kept, augmentation


def batch_to_device(obj, dataset, device: torch.device, channels_last: bool = False):
    """``obj`` (a batch of ``dataset``'s loader, or any tensors) on ``device`` (non-blocking
    copies to CUDA); a batch with drawn parameters is augmented there by ``dataset``'s
    device half."""
    def move(item):
        return to_device(item, device, non_blocking=device.type == "cuda",
                         channels_last=channels_last)

    augmentation = getattr(dataset, "device_augmentation", None)
    if augmentation is None or not isinstance(obj, dict) or PARAMS_KEY not in obj:
        return move(obj)
    return augmentation.on_device(obj, move, channels_last)


def check_device_augmentation(cfg, split: str) -> None:
    """Refuse, before launch, DATA.<split>.DEVICE_AUGMENTATION with a collator or a list of
    transforms it cannot serve (the same checks as building the dataset)."""
    split_cfg, key = cfg.DATA[split], f"config.DATA.{split}"
    if split_cfg.get("DEVICE_AUGMENTATION", False) or split_cfg.get("DEVICE_CROPS", False):
        build_device_augmentation(build_transforms(split_cfg.TRANSFORMS, f"{key}.TRANSFORMS"),
                                  split_cfg, key)
