"""What ``vissl_config_coverage.py --run`` puts in place of the data and files a VISSL config
names and this offline machine cannot have (vissl_config_run.py runs the configs): synthetic
images (for DeepCluster v2 as many as its clusters), a seeded stand-in of jigsaw's published
permutation files, a distillation teacher with random weights, and tiny instance-retrieval
datasets."""
import os
import re
from pathlib import Path

IMAGE_SIZE = 224  # the synthetic images' side, unless the config's transforms ask for more


def _largest_size(transforms) -> int:
    sizes = [IMAGE_SIZE]
    for transform in transforms or []:
        for key in ("size", "crop_size", "size_crops"):
            value = transform.get(key) if isinstance(transform, dict) else None
            values = value if isinstance(value, list) else [value]
            sizes += [int(v) for v in values if isinstance(v, (int, float))]
    return max(sizes)


def synthetic_data(cfg: dict, batch: int, checkpoint_dir: str) -> None:
    """Edit the composed ``config`` section in place: synthetic data, ``batch`` images per
    step, one CPU process, outputs in ``checkpoint_dir``, random initial weights."""
    data = cfg.setdefault("DATA", {})
    data["NUM_DATALOADER_WORKERS"] = 0
    for split in ("TRAIN", "TEST"):
        part = data.setdefault(split, {})
        if not (part.get("DATA_SOURCES") or part.get("DATASET_NAMES")):
            continue
        part.update(DATA_SOURCES=["synthetic"], DATA_PATHS=[""], DATASET_NAMES=[],
                    LABEL_SOURCES=[], LABEL_PATHS=[], BATCHSIZE_PER_REPLICA=batch)
        part["SYNTHETIC"] = {"NUM_SAMPLES": 2 * batch, "NUM_CLASSES": 2,  # any head has 2
                             "IMAGE_SIZE": _largest_size(part.get("TRANSFORMS"))}
        if (part.get("DATA_LIMIT") or -1) > 0:  # a subset of 2 batches, of 2 classes
            part["DATA_LIMIT"] = 2 * batch
            part["SYNTHETIC"].update(NUM_SAMPLES=4 * batch, NUM_CLASSES=2)
    cfg.setdefault("MACHINE", {})["DEVICE"] = "cpu"
    dist = cfg.setdefault("DISTRIBUTED", {})
    dist.update(NUM_NODES=1, NUM_PROC_PER_NODE=1, RUN_ID="auto")
    if dist.get("INIT_METHOD") not in (None, "tcp", "file"):
        dist["INIT_METHOD"] = "tcp"
    cfg.setdefault("SLURM", {})["USE_SLURM"] = False
    cfg.setdefault("CHECKPOINT", {}).update(DIR=checkpoint_dir, AUTO_RESUME=False)
    init = cfg.setdefault("MODEL", {}).setdefault("WEIGHTS_INIT", {})
    init["PARAMS_FILE"] = ""
    cfg.setdefault("HOOKS", {}).setdefault("RUN_REPORT", {})["ENABLED"] = False


def clustering_data(cfg: dict, batch: int) -> int:
    """A ``deepclusterv2_loss`` run: as many synthetic training images as its largest
    ``num_clusters`` (rounded up to whole batches), since k-means needs a sample per centroid and
    the loss, as VISSL's, fills its memory with a pass over the whole training set before the
    first epoch and clusters it at the epoch's start. Returns the number of training iterations
    after which the run stops (2), or 0 for any other loss (its run ends with its first epoch)."""
    loss = cfg.get("LOSS") or {}
    if loss.get("name") != "deepclusterv2_loss":
        return 0
    clusters = max([int(c) for c in (loss.get("deepclusterv2_loss") or {}).get(
        "num_clusters") or [0]] or [0])
    synthetic = ((cfg.get("DATA") or {}).get("TRAIN") or {}).get("SYNTHETIC")
    if synthetic is None or clusters <= synthetic["NUM_SAMPLES"]:
        return 0
    synthetic["NUM_SAMPLES"] = -(-clusters // batch) * batch
    return 2


def offline_permutations(cfg: dict, folder: str) -> None:
    """Jigsaw's ``perm_file`` given as a URL (VISSL's published permutation sets), with no copy
    in the torch hub cache (this machine is offline): a stand-in .npy in ``folder`` of the same
    shape, distinct random permutations (seeded) instead of the published maximal-Hamming set;
    the count and patch number from the file's name (``..._perms_2000_patches_9_...``)."""
    import numpy as np
    import torch

    for split in ("TRAIN", "TEST"):
        for transform in ((cfg.get("DATA") or {}).get(split) or {}).get("TRANSFORMS") or []:
            url = str(transform.get("perm_file", "")) if isinstance(transform, dict) else ""
            sizes = re.search(r"perms_(\d+)_patches_(\d+)", url)
            cached = Path(torch.hub.get_dir()) / "ssl_engine_permutations" / Path(url).name
            if not url.startswith(("http://", "https://")) or not sizes or cached.is_file():
                continue
            count, patches = int(sizes.group(1)), int(sizes.group(2))
            rng, perms = np.random.default_rng(0), set()
            while len(perms) < count:
                perms.add(tuple(rng.permutation(patches).tolist()))
            local = os.path.join(folder, Path(url).name)
            np.save(local, np.array(sorted(perms), dtype=np.int64))
            transform["perm_file"] = local


def random_teacher(cfg, folder: str) -> None:
    """A distillation's teacher checkpoint (DISTILLATION.TEACHER_MODEL.WEIGHTS_INIT.PARAMS_FILE:
    VISSL's files leave a placeholder or name their authors' storage): the teacher model with
    its random initial weights, saved in ``folder``, as the student starts from random weights."""
    import torch

    from ssl_engine.config.teacher import teacher_model_config
    from ssl_engine.models import build_model

    weights = cfg.DISTILLATION.TEACHER_MODEL.WEIGHTS_INIT
    if not str(cfg.LOSS.name).endswith("distillation_loss") or \
            Path(str(weights.get("PARAMS_FILE") or "")).is_file():
        return
    model = build_model(teacher_model_config(cfg))
    parts = {part: {k[len(part) + 1:]: v for k, v in model.state_dict().items()
                    if k.startswith(part + ".")} for part in ("trunk", "heads")}
    key = str(weights.get("STATE_DICT_KEY_NAME") or "")
    state = {"base_model": {"model": parts}}
    path = os.path.join(folder, "random_teacher.torch")
    torch.save({key: state} if key and "." not in key else state, path)
    weights["PARAMS_FILE"] = path


def tiny_retrieval_data(cfg, folder: str) -> None:
    """Point IMG_RETRIEVAL at tiny datasets in ``folder`` (random 48 x 64 images, RESIZE_IMG 64,
    N_PCA <= 8): the evaluated one in Copydays' layout (a name holding "copydays") or Revisited
    Oxford/Paris' (a gnd pickle), 2 queries, 8 database images; the train one 8 images."""
    import pickle
    import numpy as np
    from PIL import Image

    r = cfg.IMG_RETRIEVAL
    root = Path(folder) / "retrieval"
    rng = np.random.default_rng(0)

    def images(where: Path, names) -> None:
        where.mkdir(parents=True, exist_ok=True)
        for name in names:
            Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(
                where / f"{name}.jpg")

    evaluated = root / r.EVAL_DATASET_NAME
    if "copydays" in r.EVAL_DATASET_NAME.lower():
        groups = [f"20{i:02d}00" for i in range(8)]
        images(evaluated / "database", groups)
        images(evaluated / "database_and_distractors", groups + ["distractor_0"])
        images(evaluated / "queries", ["original_200000", "strong_200101"])
    else:
        images(evaluated / "jpg", [f"db{i}" for i in range(8)] + ["q0", "q1"])
        gnd = [{"easy": [0], "hard": [1], "junk": [2], "bbx": [0.0, 0.0, 32.0, 24.0]},
               {"easy": [3, 4], "hard": [], "junk": [], "bbx": [0.0, 0.0, 64.0, 48.0]}]
        (evaluated / f"gnd_{evaluated.name}.pkl").write_bytes(pickle.dumps(
            {"imlist": [f"db{i}" for i in range(8)], "qimlist": ["q0", "q1"], "gnd": gnd}))
    if not (root / r.TRAIN_DATASET_NAME).exists():
        images(root / r.TRAIN_DATASET_NAME, [f"train{i}" for i in range(8)])
    r.DATASET_PATH, r.RESIZE_IMG, r.N_PCA = str(root), 64, min(r.N_PCA, 8)
