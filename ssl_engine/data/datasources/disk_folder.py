"""A class-per-folder image tree: ``root/<class>/**/<image>``."""
import os
from typing import Optional

from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS

from ssl_engine.data.datasources.image_io import load_rgb_image
from ssl_engine.data.registry import register_datasource


def _class_folders(root: str):
    return sorted(entry.path for entry in os.scandir(root) if entry.is_dir())


def _first_file(folder: str, wanted) -> Optional[str]:
    """The first file below ``folder`` (sub-folders included) for which ``wanted(name)``
    holds, None if there is none; stops at the first found."""
    for current, _, files in os.walk(folder, followlinks=True):
        for name in sorted(files):
            if wanted(name):
                return os.path.join(current, name)
    return None


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


def folder_problem(root: str) -> Optional[str]:
    """Why ``root`` holds no image that disk_folder reads (a sentence), or None when at least
    one of its class folders holds an image. Looks no further than the first image of each
    class folder, so this costs little even for large trees."""
    if not os.path.isdir(root):
        return "it is a file, not a folder"
    classes = _class_folders(root)
    if any(_first_file(folder, _is_image) for folder in classes):
        return None
    if classes:
        return f"its {len(classes)} class folder(s) hold no image files{_example(classes)}"
    loose = _first_file(root, _is_image)
    if loose:
        return f"the images must be in sub-folders, one per class, and it has none (found {loose})"
    return f"it has no class folders{_example([root])}" if _example([root]) else "it is empty"


def _example(folders) -> str:
    """" (found other files, e.g. <path>)" for the first file below ``folders``, "" if none."""
    other = next(filter(None, (_first_file(folder, lambda name: True) for folder in folders)),
                 None)
    return f" (found other files, e.g. {other})" if other else ""


@register_datasource("disk_folder")
class DiskFolderSource:
    """Classes are the sorted sub-folder names (label = position); images are the files with an
    image extension (jpg, jpeg, png, ppm, bmp, pgm, tif, tiff, webp, in any case) below each
    class folder. A class folder without images is a class without samples."""

    needs_path = True

    @staticmethod
    def check_path(cfg, split: str, path: str, source_index: int) -> None:
        """Refuse a folder without any image disk_folder reads (ValueError)."""
        problem = folder_problem(path)
        if problem is not None:
            raise ValueError(
                f"config.DATA.{split}.DATA_PATHS[{source_index}]={path} has no images disk_folder "
                f"can read: {problem}. disk_folder reads <folder>/<class>/**/<image>, the images "
                f"being files ending in {', '.join(IMG_EXTENSIONS)} (in any case)")

    def __init__(self, cfg, split: str, path: str, source_index: int):
        self.folder = ImageFolder(path, loader=load_rgb_image, allow_empty=True)
        self.classes = self.folder.classes

    def __len__(self) -> int:
        return len(self.folder)

    def labels(self):
        return self.folder.targets

    def __getitem__(self, index: int):
        return self.folder[index]
