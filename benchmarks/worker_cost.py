"""What a loader worker spends per image on the ImageNet SimCLR recipe, with and without
DATA.TRAIN.DEVICE_AUGMENTATION, the device half's cost on this CPU, and the JPEG decoders.

Used by benchmarks/transforms_speed.py (``--recipe``). The image is a natural photograph
(scikit-learn's sample "china.jpg") resized to 500x375 and saved as a JPEG of quality 90,
the size of a typical ImageNet training image.
"""
import io
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from PIL import Image
from torchvision.transforms.functional import to_tensor

from ssl_engine.data.device_augmentation import DeviceAugmentation, split_for_device
from ssl_engine.data.seeding import sample_seed, seeded_rngs
from ssl_engine.data.transforms import build_transforms

RECIPE = Path(__file__).resolve().parents[1] / "configs/config/pretrain/simclr/simclr_resnet50.yaml"


def recipe_transforms():
    """The TRANSFORMS list of the ImageNet SimCLR recipe, read from its config file."""
    return yaml.safe_load(RECIPE.read_text())["config"]["DATA"]["TRAIN"]["TRANSFORMS"]


def sample_jpeg(size=(500, 375), quality=90) -> bytes:
    """A natural photograph of ``size`` as JPEG bytes."""
    from sklearn.datasets import load_sample_image
    image = Image.fromarray(load_sample_image("china.jpg")).resize(size, Image.BICUBIC)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def pil_decode(data: bytes) -> Image.Image:
    """What the engine's image reader does (data/datasources/image_io.py)."""
    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


def timed(fn, items, rounds):
    """Median over ``rounds`` of the microseconds per item of ``fn``."""
    runs = []
    for _ in range(rounds):
        start = time.perf_counter()
        for item in items:
            fn(item)
        runs.append((time.perf_counter() - start) / len(items) * 1e6)
    return statistics.median(runs)


def worker_costs(images: int, rounds: int) -> dict:
    """Microseconds per image (2 views of 224): the workers today, the workers with the
    option, and the device half on this CPU (one thread, a batch of 2 x ``images`` views)."""
    data = sample_jpeg()
    chain = build_transforms(recipe_transforms())
    kept, ops = split_for_device(build_transforms(recipe_transforms()), "config.DATA.TRAIN")
    device = DeviceAugmentation(ops)

    def today(index):
        with seeded_rngs(sample_seed(0, 0, index)):
            views, _ = chain.apply(pil_decode(data))
        return [view if isinstance(view, torch.Tensor) else to_tensor(view) for view in views]

    def with_option(index):
        with seeded_rngs(sample_seed(0, 0, index)):
            views, _ = kept.apply(pil_decode(data))
            return device.draw(views)

    indices = list(range(images))
    costs = {"today": [], "option": []}
    for _ in range(rounds):  # interleaved, so that a busy machine slows both alike
        costs["today"].append(timed(today, indices, 1))
        costs["option"].append(timed(with_option, indices, 1))
    drawn = [with_option(index) for index in indices]
    batch = torch.stack([view for views, _ in drawn for view in views])
    params = torch.stack([row for _, rows in drawn for row in rows])
    device_cost = timed(lambda _: device(batch, params), [0], rounds) / images
    return {"today": statistics.median(costs["today"]),
            "option": statistics.median(costs["option"]), "device": device_cost}


def decoders():
    """name -> a function decoding JPEG bytes to the RGB PIL image the workers' crops take,
    for the decoders installed here."""
    import torchvision.io as tvio

    def torchvision_decode(data):
        pixels = tvio.decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8),
                                  mode=tvio.ImageReadMode.RGB)
        return Image.fromarray(pixels.permute(1, 2, 0).numpy())

    found = {"PIL (the engine's reader)": pil_decode,
             "torchvision.io.decode_jpeg": torchvision_decode}
    try:
        import simplejpeg
        found["simplejpeg (exact DCT and upsampling)"] = lambda data: Image.fromarray(
            simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=False, fastupsample=False))
        found["simplejpeg (fast DCT and upsampling)"] = lambda data: Image.fromarray(
            simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True, fastupsample=True))
    except ImportError:
        pass
    try:
        import turbojpeg
        jpeg = turbojpeg.TurboJPEG()
        found["PyTurboJPEG"] = lambda data: Image.fromarray(
            jpeg.decode(data, pixel_format=turbojpeg.TJPF_RGB))
    except (ImportError, RuntimeError):  # RuntimeError: no libturbojpeg on the system
        pass
    return found


def draft_decode(data: bytes, scale: int) -> Image.Image:
    """PIL's draft mode: libjpeg's DCT scaling by 1/``scale``."""
    with Image.open(io.BytesIO(data)) as image:
        image.draft("RGB", (image.width // scale, image.height // scale))
        return image.convert("RGB")


def decoder_costs(rounds: int, repeats: int = 40):
    """(name, microseconds per 500x375 JPEG decoded to a PIL image, largest pixel difference
    from PIL or None for another size, the size) for each decoder and PIL's draft mode at 1/2
    and 1/4."""
    data = sample_jpeg()
    reference = np.asarray(pil_decode(data)).astype(np.int16)
    cases = dict(decoders())
    cases["PIL draft mode 1/2 (DCT scaling)"] = lambda data: draft_decode(data, 2)
    cases["PIL draft mode 1/4"] = lambda data: draft_decode(data, 4)
    rows = []
    for name, decode in cases.items():
        out = np.asarray(decode(data))
        diff = int(np.abs(out.astype(np.int16) - reference).max()) \
            if out.shape == reference.shape else None
        rows.append((name, timed(decode, [data] * repeats, rounds), diff, out.shape))
    return rows
