"""Reading one image file as an RGB PIL image, with errors that name the file and say what is
wrong with it."""
import os

import numpy as np
from PIL import Image, UnidentifiedImageError

from ssl_engine.data.worker_errors import OneMessageError

# Pillow's modes of 16-bit grey images (a 16-bit grey PNG opens as I;16); "I" holds 32-bit
# integers, which 16-bit images also come as
SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")
FLOAT_MODE = "F"  # 32-bit float grey, e.g. a float32 TIFF


class ImageLoadError(OneMessageError, OSError):
    """An image file that cannot be read: missing, not a file, unreadable or not decodable.
    Built from its message alone, so that it is the same error in the main process when a
    data-loader worker raised it (ssl_engine.data.worker_errors)."""


def load_rgb_image(path: str) -> Image.Image:
    """The decoded RGB image at ``path`` (16-bit grey images scaled to 8 bits, float ones from
    0..1 or 0..255); a missing, corrupt or truncated file, or float values outside those
    ranges, raise ImageLoadError naming the file and what is wrong."""
    try:
        with Image.open(path) as img:
            if img.mode in SIXTEEN_BIT_MODES:
                return eight_bit_grey(img).convert("RGB")
            if img.mode == FLOAT_MODE:
                return eight_bit_from_float(img).convert("RGB")
            return img.convert("RGB")
    except Exception as err:  # PIL raises several types for bad files
        raise ImageLoadError(f"cannot read image {path}: {what_is_wrong(path, err)}") from err


def eight_bit_grey(img: Image.Image) -> Image.Image:
    """A 16-bit grey image as an 8-bit one ("L"): the high byte of each value, as Pillow
    reduces 16-bit colour images (values of a 32-bit image are first clipped to 0..65535)."""
    values = np.clip(np.asarray(img, dtype=np.int64), 0, 65535)
    return Image.fromarray((values >> 8).astype(np.uint8))


def eight_bit_from_float(img: Image.Image) -> Image.Image:
    """A 32-bit float grey image ("F", e.g. a float32 TIFF) as an 8-bit one ("L"): values in
    0..1 are scaled by 255, values in 0..255 kept, each rounded; other values (NaN, infinite,
    negative, above 255) raise ValueError, as there is no one way to read them."""
    values = np.asarray(img, dtype=np.float64)
    if not np.isfinite(values).all():
        raise ValueError("a float image with NaN or infinite values")
    low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    if low < 0 or high > 255:
        raise ValueError(f"a float image with values from {low:g} to {high:g}; float images are "
                         "read with values in 0..1 or 0..255")
    scale = 255.0 if high <= 1 else 1.0
    return Image.fromarray(np.rint(values * scale).astype(np.uint8))


def what_is_wrong(path: str, err: Exception) -> str:
    """What the failure ``err`` of reading ``path`` says about the file, in a few words."""
    if isinstance(err, FileNotFoundError):
        return "no such file"
    if isinstance(err, IsADirectoryError):
        return "it is a folder, not an image file"
    if isinstance(err, PermissionError):
        return "permission denied"
    if isinstance(err, OSError) and err.strerror:  # a failure of the file system
        return err.strerror
    try:
        if os.path.getsize(path) == 0:
            return "the file is empty (0 bytes)"
    except OSError:
        pass
    if isinstance(err, UnidentifiedImageError):
        return "not an image file Pillow can decode (cannot identify image file)"
    return str(err).replace(f" {path!r}", "") or type(err).__name__
