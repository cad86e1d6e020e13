import torchvision.transforms as T

from ssl_engine.data.registry import register_transform


@register_transform("ImgPilColorDistortion")
class ImgPilColorDistortion:
    """SimCLR colour distortion: with p=0.8 ColorJitter(0.8s, 0.8s, 0.8s, 0.2s), then grayscale
    with p=0.2, where s is ``strength``."""

    random_augmentation = True  # dropped from extraction pipelines (data/extraction_view.py)

    def __init__(self, strength: float = 1.0):
        self.strength = strength
        jitter = T.ColorJitter(0.8 * strength, 0.8 * strength, 0.8 * strength, 0.2 * strength)
        self.transform = T.Compose([T.RandomApply([jitter], p=0.8), T.RandomGrayscale(p=0.2)])

    def __call__(self, image):
        return self.transform(image)

    def __repr__(self) -> str:
        return f"ImgPilColorDistortion(strength={self.strength})"
