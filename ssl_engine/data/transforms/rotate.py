import torch
import torchvision.transforms.functional as F

from ssl_engine.data.registry import register_transform


@register_transform("ImgRotatePil")
class ImgRotatePil:
    """Rotates by one of ``num_angles`` angles evenly spaced in [0, 360), drawn uniformly; the
    label of the view becomes the angle's index (RotNet: the model predicts the rotation)."""

    random_augmentation = True  # dropped from extraction pipelines (extraction/one_view.py)

    sets_label = True

    def __init__(self, num_angles: int = 4, num_rotations_per_img: int = 1):
        if num_angles < 1:
            raise ValueError(f"num_angles must be >= 1, got {num_angles}")
        if num_rotations_per_img != 1:
            raise ValueError(f"num_rotations_per_img must be 1, got {num_rotations_per_img}")
        self.num_angles = int(num_angles)
        self.angles = [360.0 * i / self.num_angles for i in range(self.num_angles)]

    def __call__(self, image):
        label = int(torch.randint(self.num_angles, ()).item())
        return F.rotate(image, self.angles[label]), label

    def __repr__(self) -> str:
        return f"ImgRotatePil(num_angles={self.num_angles})"
