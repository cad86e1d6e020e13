"""Reading one image file as an RGB PIL image, with errors that name the file."""
from PIL import Image


class ImageLoadError(OSError):
    """An image file that exists but cannot be decoded."""


def load_rgb_image(path: str) -> Image.Image:
    """The decoded RGB image at ``path``; a corrupt or truncated file raises ImageLoadError."""
    try:
        with Image.open(path) as img:
            return img.convert("RGB")
    except FileNotFoundError:
        raise
    except Exception as err:  # PIL raises several types for bad files
        raise ImageLoadError(f"cannot read image {path}: {err}") from err
