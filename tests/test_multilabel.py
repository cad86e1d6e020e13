"""Multi-label targets from label files to meters: [N, C] label rows (VOC's 1 / 0 / -1),
OneHotEncode over class lists (ImageNet-ReaL), the collators' [B, C] targets, extraction and
the SVM tool from images, and the top-k meters on such targets."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score
from sklearn.svm import LinearSVC

from ssl_engine.data import build_collator, build_dataloader, build_dataset
from ssl_engine.data.labels import MixedLabelShapes
from ssl_engine.data.transforms import build_transforms
from ssl_engine.meters import AccuracyListMeter, PrecisionAtKListMeter, RecallAtKListMeter
from test_data_sources import make_cfg, noise, write_png

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def image_list(folder, count, size=6):
    paths = [str(folder / f"img{i}.png") for i in range(count)]
    for i, path in enumerate(paths):
        write_png(path, noise(100 + i, size))
    np.save(folder / "files.npy", np.array(paths))
    return str(folder / "files.npy")


def filelist_cfg(files, labels, transforms=({"name": "ToTensor"},), **extra):
    return make_cfg(DATA_SOURCES=["disk_filelist"], LABEL_SOURCES=["disk_filelist"],
                    DATA_PATHS=[files], LABEL_PATHS=[labels], TRANSFORMS=list(transforms),
                    **extra)


def collate(dataset, name="default"):
    return build_collator(name)([dataset[i] for i in range(len(dataset))])


@pytest.mark.parametrize("mmap", [False, True])
def test_label_rows_give_a_long_batch_target_and_class_indices_stay_as_before(tmp_path, mmap):
    files = image_list(tmp_path, 5)
    rows = np.array([[1, 0, -1], [0, 0, 1], [1, 1, 0], [-1, 0, 0], [0, 1, 1]], dtype=np.int8)
    np.save(tmp_path / "rows.npy", rows)
    batch = collate(build_dataset(filelist_cfg(files, str(tmp_path / "rows.npy"),
                                               MMAP_MODE=mmap), "TRAIN"))
    assert batch["target"].dtype == torch.long and batch["target"].shape == (5, 3)
    assert np.array_equal(batch["target"].numpy(), rows)

    np.save(tmp_path / "classes.npy", np.array([4, 0, 2, 2, 1], dtype=np.int32))
    batch = collate(build_dataset(filelist_cfg(files, str(tmp_path / "classes.npy"),
                                               MMAP_MODE=mmap), "TRAIN"))
    assert batch["target"].dtype == torch.long and batch["target"].tolist() == [4, 0, 2, 2, 1]

    # two views of one image each keep the row (view-major target [2B, C])
    two_views = [{"name": "ImgReplicatePil", "num_times": 2}, {"name": "ToTensor"}]
    dataset = build_dataset(filelist_cfg(files, str(tmp_path / "rows.npy"), two_views), "TRAIN")
    assert np.array_equal(collate(dataset, "simclr_collator")["target"].numpy(),
                          np.concatenate([rows, rows]))


def test_labels_of_different_shapes_in_a_batch_are_refused_naming_the_label_file(tmp_path):
    samples = [{"data": [torch.zeros(1, 2, 2)], "label": [label], "data_idx": i,
                "data_valid": True}
               for i, label in enumerate([torch.tensor([1, 0, 1]), 3, torch.tensor([0, 1])])]
    with pytest.raises(MixedLabelShapes, match="sample 0 has a vector of 3 int64, sample 1 has "
                                               "one class index"):
        build_collator("default")(samples[:2])
    with pytest.raises(MixedLabelShapes, match="sample 2 has a vector of 2 int64"):
        build_collator("default")([samples[0], samples[2]])

    class Listed(torch.utils.data.Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, index):
            return samples[index]

        def set_epoch(self, epoch):
            pass

    cfg = make_cfg(LABEL_PATHS=["/data/voc/labels.npy"], BATCHSIZE_PER_REPLICA=3)
    loader = build_dataloader(Listed(), cfg.DATA.TRAIN, 0, False, epoch=0, shuffle=False)
    with pytest.raises(MixedLabelShapes, match=r"LABEL_PATHS\): /data/voc/labels.npy") as alone:
        next(iter(loader))
    # from a data-loader worker: the same one message, not torch's report with its traceback
    with_workers = build_dataloader(Listed(), cfg.DATA.TRAIN, 2, False, epoch=0, shuffle=False)
    with pytest.raises(MixedLabelShapes) as in_worker:
        next(iter(with_workers))
    assert str(in_worker.value) == str(alone.value)
    with pytest.raises(ValueError, match="cutmixup_collator mixes one class per image"):
        build_collator("cutmixup_collator", {"num_classes": 3})([samples[0], samples[0]])


def test_one_hot_encode_of_classes_lists_from_json_and_padded_rows(tmp_path):
    files = image_list(tmp_path, 4)
    classes = [[2, 0], [], [4], [1, 2, 3]]  # ImageNet-ReaL: a list per image, maybe empty
    (tmp_path / "real.json").write_text(json.dumps(classes))
    padded = np.full((4, 3), -1)
    for i, row in enumerate(classes):
        padded[i, :len(row)] = row
    np.save(tmp_path / "padded.npy", padded)
    expected = np.array([[int(c in row) for c in range(5)] for row in classes])
    one_hot = [{"name": "OneHotEncode", "num_classes": 5}, {"name": "ToTensor"}]
    plain = build_dataset(filelist_cfg(files, str(tmp_path / "padded.npy")), "TRAIN")
    for labels in ("real.json", "padded.npy"):
        dataset = build_dataset(filelist_cfg(files, str(tmp_path / labels), one_hot), "TRAIN")
        batch = collate(dataset)
        assert batch["target"].dtype == torch.long
        assert np.array_equal(batch["target"].numpy(), expected), labels
        assert torch.equal(batch["input"], collate(plain)["input"])  # images untouched

    encode = build_transforms([{"name": "OneHotEncode", "num_classes": 4}])
    assert encode.map_label(2).tolist() == [0, 0, 1, 0]  # one class (ImageNet-R)
    assert encode.map_label(-1).tolist() == [0, 0, 0, 0]  # no label
    with pytest.raises(ValueError, match="class 4 is not below num_classes=4"):
        encode.map_label([1, 4])


def test_label_files_that_need_pickles_or_have_bad_shapes_are_refused(tmp_path):
    files = image_list(tmp_path, 2)
    ragged = np.empty(2, dtype=object)
    ragged[0], ragged[1] = [1, 2], [3]
    np.save(tmp_path / "ragged.npy", ragged, allow_pickle=True)
    with pytest.raises(ValueError, match=r"LABEL_PATHS\[0\]: .*ragged.npy holds Python objects.*"
                                         r"padded with -1.*\.json"):
        build_dataset(filelist_cfg(files, str(tmp_path / "ragged.npy")), "TRAIN")
    np.save(tmp_path / "cube.npy", np.zeros((2, 2, 2), dtype=np.int64))
    with pytest.raises(ValueError, match=r"cube.npy holds an array of shape \(2, 2, 2\)"):
        build_dataset(filelist_cfg(files, str(tmp_path / "cube.npy")), "TRAIN")
    (tmp_path / "bad.json").write_text(json.dumps([[1], ["cat"]]))
    with pytest.raises(ValueError, match=r"bad.json: entry 1 is \['cat'\]"):
        build_dataset(filelist_cfg(files, str(tmp_path / "bad.json")), "TRAIN")
    np.save(tmp_path / "rows.npy", np.array([[1, 0], [0, 1]]))
    balanced = filelist_cfg(files, str(tmp_path / "rows.npy"), DATA_LIMIT=2,
                            DATA_LIMIT_SAMPLING={"SEED": 0, "IS_BALANCED": True,
                                                 "SKIP_NUM_SAMPLES": 0})
    with pytest.raises(ValueError, match="IS_BALANCED=true balances one class per image"):
        build_dataset(balanced, "TRAIN")


def test_top_k_meters_on_label_rows_count_unknown_as_absent():
    rng = np.random.RandomState(0)
    scores = rng.randn(30, 6).astype(np.float32)
    labels = rng.choice([-1, 0, 0, 1], size=(30, 6))
    present = labels == 1
    top = np.argsort(-scores, axis=1)
    for meter_cls in (AccuracyListMeter, PrecisionAtKListMeter, RecallAtKListMeter):
        meter = meter_cls(num_meters=1, topk_values=[1, 3])
        for part in (slice(0, 16), slice(16, 30)):
            meter.update(torch.from_numpy(scores[part]), torch.from_numpy(labels[part]))
        for k in (1, 3):
            hits = np.take_along_axis(present, top[:, :k], axis=1)
            expected = {AccuracyListMeter: hits.any(axis=1).mean(),
                        PrecisionAtKListMeter: hits.sum() / (k * 30),
                        RecallAtKListMeter: hits.sum() / present.sum()}[meter_cls]
            assert meter.value[f"top_{k}"]["0"] == pytest.approx(100.0 * expected)


def voc_like(folder, split, count, seed):
    """Images whose class c is present when quadrant c is bright; labels 1 / 0 / -1 (some
    present objects marked difficult, as VOC's)."""
    rng = np.random.default_rng(seed)
    present = rng.random((count, 3)) < 0.45
    present[:3] = [[1, 1, 0], [0, 0, 1], [1, 1, 1]]  # every class present and known
    paths = []
    for i in range(count):
        pixels = rng.integers(0, 80, size=(8, 8, 3))
        for c in np.flatnonzero(present[i]):
            pixels[(c // 2) * 4:(c // 2) * 4 + 4, (c % 2) * 4:(c % 2) * 4 + 4] += 150
        paths.append(str(folder / f"{split}{i}.png"))
        write_png(paths[-1], pixels.astype(np.uint8))
    labels = present.astype(np.int64)
    difficult = rng.random((count, 3)) < 0.15
    difficult[:3], difficult[3, 0] = False, True
    labels[difficult] = -1
    np.save(folder / f"{split}_files.npy", np.array(paths))
    np.save(folder / f"{split}_labels.npy", labels)
    return labels


def test_svm_tool_from_images_with_label_rows_matches_scikit_learn(tmp_path):
    labels = {split: voc_like(tmp_path, split, n, seed)
              for split, n, seed in (("train", 21, 1), ("test", 12, 2))}
    out = tmp_path / "out"
    argv = ["config=feature_extraction/extract_resnet_digits",
            f"config.CHECKPOINT.DIR={out}", "config.SVM.costs.costs_list=[0.5]",
            "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.125",
            "config.NEAREST_NEIGHBOR.FEATURES_LAYER=res4"]
    for split in ("TRAIN", "TEST"):
        argv += [f"config.DATA.{split}.DATA_SOURCES=[disk_filelist]",
                 f"config.DATA.{split}.LABEL_SOURCES=[disk_filelist]",
                 f"config.DATA.{split}.DATA_PATHS=[{tmp_path / f'{split.lower()}_files.npy'}]",
                 f"config.DATA.{split}.LABEL_PATHS=[{tmp_path / f'{split.lower()}_labels.npy'}]",
                 f"config.DATA.{split}.BATCHSIZE_PER_REPLICA=5",
                 f"config.DATA.{split}.TRANSFORMS=[{{name: ToTensor}}]"]
    spec = importlib.util.spec_from_file_location("train_svm", TOOLS / "train_svm.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main(argv) == 0

    features = {}
    for split in ("train", "test"):  # [N, C] targets in dataset order, as the label file
        assert np.array_equal(np.load(out / f"{split}_res4_targets.npy"), labels[split])
        inds = np.load(out / f"{split}_res4_inds.npy")
        assert np.array_equal(inds, np.arange(len(labels[split])))
        rows = np.load(out / f"{split}_res4_features.npy").astype(np.float64)
        features[split] = rows / (np.linalg.norm(rows, axis=1, keepdims=True) + 1e-5)
    expected = []
    for c in range(3):  # difficult: a negative in training, left out of the test AP
        svm = LinearSVC(C=0.5, class_weight={1: 2.0, -1: 1.0}, tol=1e-4, max_iter=2000,
                        random_state=0)
        svm.fit(features["train"], np.where(labels["train"][:, c] == 1, 1, -1))
        known = labels["test"][:, c] != -1
        expected.append(average_precision_score(labels["test"][known, c] == 1,
                                                svm.decision_function(features["test"])[known]))
    result = json.loads((out / "svm" / "results.json").read_text())["svm"]["layers"]["res4"]
    assert result["test_ap"] == pytest.approx(expected, abs=1e-6)
    assert result["mAP"] == pytest.approx(100.0 * np.mean(expected), abs=1e-4)
