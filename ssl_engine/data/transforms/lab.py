"""RGB PIL image -> LAB tensor [3, H, W], the input of the colorization models.

The values are those of VISSL's ``ImgPil2LabTensor``, which converts with OpenCV's 8-bit
``BGR -> Lab`` and then recentres: sRGB gamma removed, linear RGB -> XYZ (D65), CIE L*a*b*,
each channel rounded to OpenCV's 8-bit encoding (``L * 255 / 100``, ``a + 128``, ``b + 128``,
clipped to 0..255), then ``L = L8 * 100 / 255 - 50`` (in [-50, 50]), ``a = a8 - 128``,
``b = b8 - 128``. Computed here in float64 with OpenCV's constants; OpenCV's fixed-point 8-bit
path can land one step off on a pixel that falls near a rounding boundary.
"""
import numpy as np
import torch

from ssl_engine.data.registry import register_transform

# linear sRGB -> XYZ and the D65 white point, with the constants OpenCV's conversion uses
RGB_TO_XYZ = np.array([[0.412453, 0.357580, 0.180423],
                       [0.212671, 0.715160, 0.072169],
                       [0.019334, 0.119193, 0.950227]])
WHITE_XYZ = np.array([0.950456, 1.0, 1.088754])
EPSILON = 0.008856  # (6/29)^3: below it the cube root is replaced by a line
KAPPA = 903.3  # L of the linear part: 116 * 7.787


def srgb_to_lab(rgb: np.ndarray) -> np.ndarray:
    """CIE L*a*b* (L in [0, 100]) of uint8 sRGB pixels ``[..., 3]``, in float64."""
    c = rgb.astype(np.float64) / 255.0
    linear = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    xyz = (linear @ RGB_TO_XYZ.T) / WHITE_XYZ
    f = np.where(xyz > EPSILON, np.cbrt(xyz), 7.787 * xyz + 16.0 / 116.0)
    y = xyz[..., 1]
    lightness = np.where(y > EPSILON, 116.0 * f[..., 1] - 16.0, KAPPA * y)
    return np.stack([lightness, 500.0 * (f[..., 0] - f[..., 1]),
                     200.0 * (f[..., 1] - f[..., 2])], axis=-1)


@register_transform("ImgPil2LabTensor")
class ImgPil2LabTensor:
    """An RGB PIL image (other modes are converted to RGB first) -> float32 LAB tensor
    [3, H, W]: L in [-50, 50], a and b in [-128, 127], on the 8-bit grid (see the module).
    Put it last, after the PIL transforms (crops, flips); the alexnet_colorization trunk
    (MODEL.INPUT_TYPE lab) reads channel 0, L. ``indices`` is accepted as in VISSL, which
    does not use it either."""

    def __init__(self, indices=()):
        self.indices = list(indices or [])

    def __call__(self, image):
        if isinstance(image, (torch.Tensor, np.ndarray)):
            raise TypeError("ImgPil2LabTensor takes a PIL image, got a "
                            f"{type(image).__name__}: put it before any transform that makes "
                            "tensors (ToTensor, ImgToTensor, Normalize)")
        if image.mode != "RGB":
            image = image.convert("RGB")
        lab = srgb_to_lab(np.asarray(image))
        encoded = np.clip(np.rint(lab * [255.0 / 100.0, 1.0, 1.0] + [0.0, 128.0, 128.0]), 0, 255)
        centred = encoded * [100.0 / 255.0, 1.0, 1.0] - [50.0, 128.0, 128.0]
        return torch.from_numpy(np.ascontiguousarray(np.moveaxis(centred, -1, 0))).float()

    def __repr__(self) -> str:
        return "ImgPil2LabTensor()"
