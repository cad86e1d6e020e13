from typing import Sequence, Union

from PIL import Image

from ssl_engine.data.registry import register_transform


@register_transform("ImgPilResizeLargerSide")
class ImgPilResizeLargerSide:
    """Bilinear resize keeping the aspect ratio so that the longer side is ``size`` pixels."""

    def __init__(self, size: int = 1024):
        self.size = int(size)

    def __call__(self, image):
        width, height = image.size
        ratio = self.size / max(width, height)
        return image.resize((round(width * ratio), round(height * ratio)), Image.BILINEAR)

    def __repr__(self) -> str:
        return f"ImgPilResizeLargerSide(size={self.size})"


@register_transform("ImgPil2RGB")
class ImgPil2RGB:
    """An RGB image (of ``size`` [width, height], or the input's size when empty) with the
    input pasted at ``box`` (its top-left corner); e.g. MNIST's 28x28 gray digits."""

    def __init__(self, size: Union[int, Sequence[int]] = (), box: Sequence[int] = (0, 0)):
        size = [size, size] if isinstance(size, int) else list(size)
        if size and len(size) != 2 or len(box) != 2:
            raise ValueError(f"size needs 2 values (or none) and box 2, got {size} and {box}")
        self.size, self.box = size, tuple(box)

    def __call__(self, image):
        canvas = Image.new("RGB", tuple(self.size) if self.size else image.size)
        canvas.paste(image.convert("RGB"), box=self.box if self.size else (0, 0))
        return canvas

    def __repr__(self) -> str:
        return f"ImgPil2RGB(size={self.size}, box={self.box})"


register_transform("MNISTImgPil2RGB")(ImgPil2RGB)  # VISSL's older name of the same transform
