import torchvision.transforms as T

from ssl_engine.data.registry import register_transform


@register_transform("ImgPilRandomSolarize")
class ImgPilRandomSolarize(T.RandomSolarize):
    """With probability ``prob``, invert every pixel value >= 128."""

    random_augmentation = True  # dropped from extraction pipelines (data/extraction_view.py)

    def __init__(self, prob: float = 0.2):
        super().__init__(threshold=128, p=prob)
