"""A class-per-folder image tree: ``root/<class>/**/<image>``."""
from torchvision.datasets import ImageFolder

from ssl_engine.data.datasources.image_io import load_rgb_image
from ssl_engine.data.registry import register_datasource


@register_datasource("disk_folder")
class DiskFolderSource:
    """Classes are the sorted sub-folder names (label = position); images are the files with an
    image extension (jpg, jpeg, png, ppm, bmp, pgm, tif, tiff, webp) below each class folder."""

    needs_path = True

    def __init__(self, cfg, split: str, path: str, source_index: int):
        self.folder = ImageFolder(path, loader=load_rgb_image, allow_empty=True)
        if len(self.folder) == 0:
            raise ValueError(f"config.DATA.{split}.DATA_PATHS[{source_index}]: no images in {path}")
        self.classes = self.folder.classes

    def __len__(self) -> int:
        return len(self.folder)

    def labels(self):
        return self.folder.targets

    def __getitem__(self, index: int):
        return self.folder[index]
