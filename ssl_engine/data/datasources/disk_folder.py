"""A class-per-folder image tree: ``root/<class>/**/<image>``.

Symbolic links are followed, but a folder is listed once: a link to a folder already listed
(an ancestor such as ``.`` or ``..``, another class folder, a folder also reached without a
link) or a link that cannot be resolved (a link to itself) is skipped, and the listing says in
one log line how many it skipped. Folders reached without links come first, so an image is
labelled by the class folder it really is in."""
import logging
import os
from typing import Dict, List, Optional, Set, Tuple

from torchvision.datasets.folder import IMG_EXTENSIONS

from ssl_engine.data.datasources.image_io import load_rgb_image
from ssl_engine.data.datasources.sample_table import SampleTable
from ssl_engine.data.registry import register_datasource

logger = logging.getLogger(__name__)

FolderKey = Tuple[int, int]  # (device, inode): the same folder whatever the path to it


def _key(path: str) -> Optional[FolderKey]:
    """The (device, inode) of the folder ``path`` leads to, None if it cannot be resolved."""
    try:
        stat = os.stat(path)
    except OSError:  # a link to itself (ELOOP), a dangling link
        return None
    return stat.st_dev, stat.st_ino


def _scan(folder: str) -> Tuple[List[str], List[str], List[str], List[str]]:
    """(sorted file names, real sub-folders, linked sub-folders, links that do not resolve) of
    ``folder``; a folder that cannot be read holds nothing (as os.walk treats it)."""
    files, real, linked, unresolvable = [], [], [], []
    try:
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except OSError:
        return files, real, linked, unresolvable
    for entry in entries:
        try:
            is_dir = entry.is_dir()  # follows links
        except OSError:  # a link to itself or a chain too long (ELOOP)
            unresolvable.append(entry.path)
            continue
        if not is_dir:
            files.append(entry.name)
        elif entry.is_symlink():
            linked.append(entry.path)
        else:
            real.append(entry.path)
    return files, real, linked, unresolvable


class _Walk:
    """Folders listed once each, by (device, inode), counting the links skipped."""

    def __init__(self, root: str):
        self.visited: Set[FolderKey] = {_key(root)}
        self.skipped_links: List[str] = []
        self.scans: Dict[str, Tuple[List[str], List[str], List[str], List[str]]] = {}

    def enter(self, path: str, is_link: bool) -> bool:
        """Whether ``path`` is a folder not listed yet (then it counts as listed)."""
        key = _key(path)
        if key is None or key in self.visited:
            if is_link:
                self.skipped_links.append(path)
            return False
        self.visited.add(key)
        return True

    def real_tree(self, top: str) -> List[str]:
        """``top`` and the folders below it reached without links, scanned."""
        folders, pending = [], [top]
        while pending:
            folder = pending.pop()
            folders.append(folder)
            files, real, linked, unresolvable = self.scans[folder] = _scan(folder)
            self.skipped_links.extend(unresolvable)
            pending.extend(path for path in reversed(real) if self.enter(path, is_link=False))
        return folders

    def follow_links(self, folders: List[str]) -> List[str]:
        """``folders`` and the folders their links lead to that are not listed yet."""
        result, pending = [], list(reversed(folders))
        while pending:
            folder = pending.pop()
            result.append(folder)
            for link in self.scans[folder][2]:
                if self.enter(link, is_link=True):
                    pending.extend(reversed(self.real_tree(link)))
        return result


def list_images(root: str) -> Tuple[List[str], List[Tuple[str, int]], List[str]]:
    """(classes, (image path, class index) samples, links skipped) of the tree at ``root``:
    the classes are the sorted sub-folders of ``root``; the samples of a class are its images
    ordered by folder path, then name, as torchvision's ImageFolder orders them."""
    walk = _Walk(root)
    _, real, linked, unresolvable = _scan(root)
    walk.skipped_links.extend(unresolvable)
    classes = sorted(os.path.basename(path) for path in real + linked)
    class_trees = {}
    for path in real + linked:  # first the folders reached without a link, in every class
        class_trees[path] = walk.real_tree(path) if walk.enter(path, path in linked) else []
    samples = []
    for index, name in enumerate(classes):
        folders = class_trees[os.path.join(root, name)]
        for folder in sorted(walk.follow_links(folders)):
            samples.extend((os.path.join(folder, name), index)
                           for name in walk.scans[folder][0] if _is_image(name))
    return classes, samples, walk.skipped_links


def _first_file(folder: str, wanted, root: Optional[str] = None) -> Optional[str]:
    """The first file below ``folder`` (sub-folders included, each once, ``root`` not
    entered) for which ``wanted(name)`` holds, None if there is none; stops at the first
    found."""
    listed: Set[Optional[FolderKey]] = {_key(folder), None, _key(root) if root else None}
    pending = [folder]
    while pending:  # depth first, top-down, as os.walk
        current = pending.pop()
        files, real, linked, _ = _scan(current)
        for name in files:
            if wanted(name):
                return os.path.join(current, name)
        for path in reversed(sorted(real + linked)):
            key = _key(path)
            if key not in listed:
                listed.add(key)
                pending.append(path)
    return None


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


def folder_problem(root: str) -> Optional[str]:
    """Why ``root`` holds no image that disk_folder reads (a sentence), or None when at least
    one of its class folders holds an image. Looks no further than the first image of each
    class folder, so this costs little even for large trees."""
    if not os.path.isdir(root):
        return "it is a file, not a folder"
    _, real, linked, _ = _scan(root)
    classes = sorted(real + linked)
    if any(_first_file(folder, _is_image, root) for folder in classes):
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
        self.classes, samples, skipped = list_images(path)
        self.samples = SampleTable(samples)  # shared by forked workers, not copied (its doc)
        del samples
        if skipped:
            logger.warning(
                "disk_folder %s: skipped %d symbolic link(s) to folders already listed or "
                "that do not resolve (e.g. %s); each folder is read once", path, len(skipped),
                skipped[0])

    def __len__(self) -> int:
        return len(self.samples)

    def labels(self):
        return self.samples.labels.tolist()

    def __getitem__(self, index: int):
        path, label = self.samples[index]
        return load_rgb_image(path), label
