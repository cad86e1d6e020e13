"""The instance-retrieval datasets on disk (IMG_RETRIEVAL.DATASET_PATH/<name>), read without
downloads, and their scores (``retrieval.py`` computes them).

- Revisited Oxford / Paris (``roxford5k``, ``rparis6k`` and any folder laid out the same way):
  ``<name>/gnd_<name>.pkl`` (``imlist``: database image names, ``qimlist``: query names,
  ``gnd``: per query ``easy``, ``hard``, ``junk`` database indices and ``bbx``, its region of
  interest x1, y1, x2, y2) and the images ``<name>/jpg/<image name>.jpg``. The pickle is read
  by a restricted unpickler: plain Python containers, numbers, strings and numpy arrays only.
- Copydays (``copydays`` and any folder laid out the same way, as VISSL reads it):
  ``<name>/queries/<split>_<number>.jpg`` (split: original, strong, jpegqual_<q>, crops_<p>)
  and ``<name>/database/<number>.jpg`` (``database_and_distractors/`` with
  IMG_RETRIEVAL.USE_DISTRACTORS; a name holding ``distractor`` matches no query). A query
  matches the database images of its group: the same number // 100 (200000.jpg is the
  original of 200001.jpg ...). Scored per query split.
- Any other folder: its images (jpg, jpeg, png; sorted, subfolders included) are database
  images without queries: a train dataset for the whitening only.
"""
import io
import pickle
import re
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence

import numpy as np

from ssl_engine.evaluation.retrieval import mean_average_precision, revisited_scores

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
_ALLOWED = {
    ("builtins", name) for name in ("set", "frozenset", "list", "dict", "tuple", "bytearray")
} | {(module, name) for module in ("numpy.core.multiarray", "numpy._core.multiarray")
     for name in ("_reconstruct", "scalar")} | {
    (module, "_frombuffer") for module in ("numpy.core.numeric", "numpy._core.numeric")
} | {("numpy", "ndarray"), ("numpy", "dtype")}


class _GroundTruthUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"it refers to {module}.{name}; a ground-truth file holds only lists, dicts, "
            "strings, numbers and numpy arrays, so it is not loaded")


def load_ground_truth(path) -> dict:
    """The dict of a gnd_<name>.pkl, read by the restricted unpickler."""
    try:
        with open(path, "rb") as f:
            data = _GroundTruthUnpickler(io.BytesIO(f.read()), encoding="latin1").load()
    except pickle.UnpicklingError as err:
        raise ValueError(f"{path}: {err}") from None
    missing = [k for k in ("imlist", "qimlist", "gnd") if not isinstance(data, dict) or k not in data]
    if missing:
        raise ValueError(f"{path}: a Revisited Oxford/Paris ground truth needs the keys "
                         f"imlist, qimlist and gnd; missing: {', '.join(missing)}")
    return data


class RetrievalDataset(NamedTuple):
    """Images of one dataset and what scores a ranking of its database for its queries."""
    name: str
    kind: str  # revisited | copydays | folder
    database: List[Path]
    queries: List[Path]
    query_boxes: List[Optional[tuple]]  # regions of interest of the queries (revisited)
    truth: Optional[list] = None  # revisited: gnd entries; copydays: per query split name

    def score(self, ranks: np.ndarray, ks: Sequence[int] = (1, 5, 10)) -> Dict[str, dict]:
        if self.kind == "revisited":
            return revisited_scores(ranks, self.truth, ks)
        if self.kind == "copydays":
            return copydays_scores(ranks, self.queries, self.database, ks)
        raise ValueError(f"dataset {self.name} has no queries to score")


def _images(folder: Path) -> List[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)


def _limit(items: list, count: int) -> list:
    return items if count is None or count < 0 else items[:count]


def open_dataset(root, name: str, use_distractors: bool = False, num_queries: int = -1,
                 num_database: int = -1) -> RetrievalDataset:
    """The dataset ``name`` under ``root`` (its kind found from its files), its database
    and queries cut to the first ``num_database`` / ``num_queries`` (-1: all)."""
    folder = Path(root).expanduser() / name
    if not folder.is_dir():
        raise FileNotFoundError(
            f"config.IMG_RETRIEVAL.DATASET_PATH={root}: no folder {folder} for dataset {name} "
            "(Revisited Oxford/Paris: gnd_<name>.pkl and jpg/; Copydays: queries/ and "
            "database/; else a folder of images)")
    gnd_file = folder / f"gnd_{folder.name}.pkl"
    if gnd_file.is_file():
        gnd = load_ground_truth(gnd_file)
        database = _limit([folder / "jpg" / f"{n}.jpg" for n in gnd["imlist"]], num_database)
        entries = _limit(list(gnd["gnd"]), num_queries)
        queries = [folder / "jpg" / f"{n}.jpg" for n in gnd["qimlist"][:len(entries)]]
        keep = len(database)
        truth = [{k: [int(i) for i in np.ravel(e.get(k, [])) if int(i) < keep]
                  for k in ("easy", "hard", "junk")} for e in entries]
        boxes = [tuple(float(v) for v in np.ravel(e["bbx"])) if e.get("bbx") is not None
                 else None for e in entries]
        return RetrievalDataset(name, "revisited", database, queries, boxes, truth)
    if (folder / "queries").is_dir():
        db_folder = folder / ("database_and_distractors" if use_distractors else "database")
        if not db_folder.is_dir():
            raise FileNotFoundError(f"Copydays layout: no folder {db_folder}")
        queries = _limit(_images(folder / "queries"), num_queries)
        return RetrievalDataset(name, "copydays", _limit(_images(db_folder), num_database),
                                queries, [None] * len(queries))
    return RetrievalDataset(name, "folder", _limit(_images(folder), num_database), [], [])


def _number(path: Path) -> int:
    match = re.search(r"(\d+)$", path.stem)
    if match is None:
        raise ValueError(f"Copydays: the image name {path.name} does not end with its number")
    return int(match.group(1))


def copydays_split(path: Path) -> str:
    """The query split of a Copydays query file: its name without ``_<number>``."""
    return re.sub(r"_?\d+$", "", path.stem) or "original"


def copydays_scores(ranks: np.ndarray, queries: Sequence[Path], database: Sequence[Path],
                    ks: Sequence[int] = (1, 5, 10)) -> Dict[str, dict]:
    """mAP and mP@k per query split: a query's positives are the database images of its
    group (number // 100), distractors excluded."""
    groups = np.array([-1 if "distractor" in p.name else _number(p) // 100 for p in database])
    splits: Dict[str, list] = {}
    for i, query in enumerate(queries[:len(ranks)]):
        splits.setdefault(copydays_split(query), []).append(i)
    results = {}
    for split, rows in splits.items():
        truth = [{"ok": np.flatnonzero(groups == _number(queries[i]) // 100).tolist()}
                 for i in rows]
        if any(t["ok"] for t in truth):
            results[split] = mean_average_precision(ranks[rows], truth, ks)
    return results


IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def load_image(path: Path, size: int, scale: float = 1.0, center_crop: bool = False,
               box: Optional[tuple] = None):
    """The image as a normalised [1, 3, H, W] tensor: cut to ``box`` (x1, y1, x2, y2) when
    given, then its longer side resized to ``size * scale`` (aspect kept), or with
    ``center_crop`` its shorter side resized to that and the centred square kept; ImageNet's
    mean and standard deviation."""
    import torchvision.transforms.functional as TF
    from PIL import Image

    if not Path(path).is_file():
        raise FileNotFoundError(f"instance retrieval: no image {path}")
    with Image.open(path) as image:
        image = image.convert("RGB")
    if box is not None:
        image = image.crop(tuple(int(round(v)) for v in box))
    target = max(1, int(round(size * scale)))
    if center_crop:
        image = TF.center_crop(TF.resize(image, target), [target, target])
    else:
        width, height = image.size
        ratio = target / max(width, height)
        image = image.resize((max(1, round(width * ratio)), max(1, round(height * ratio))),
                             Image.BILINEAR)
    tensor = TF.normalize(TF.to_tensor(image), IMAGENET_MEAN, IMAGENET_STD)
    return tensor[None]
