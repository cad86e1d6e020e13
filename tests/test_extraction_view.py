"""Extraction from a pretraining config: one deterministic view per image
(config.EXTRACT_FEATURES.ONE_DETERMINISTIC_VIEW), or a refusal before launch."""
import logging

import numpy as np
import pytest
import torch

from engine_utils import run_engine
from ssl_engine.config import load_config
from ssl_engine.data import build_dataset
from ssl_engine.engines.prelaunch import check_before_launch
from ssl_engine.extraction.extractor import FeatureExtractor
from ssl_engine.extraction.files import load_extracted
from ssl_engine.extraction.one_view import check_extraction_splits, extraction_config, one_view
from ssl_engine.models import build_model

# the tiny SimCLR pretraining config (two views per image, simclr_collator), read as an
# extraction of its trunk's res5avg features
TRUNK_FEATURES = [
    "engine_name=extract_features",
    "config.MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON=true",
    "config.MODEL.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_AND_HEAD=true",
    "config.MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=true",
    "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP=[[res5avg,[Identity,[]]]]",
    "config.EXTRACT_FEATURES.SPLITS=[TRAIN]",
]
ONE_VIEW_TRANSFORMS = [
    {"name": "Resize", "size": 16}, {"name": "CenterCrop", "size": 16}, {"name": "ToTensor"},
    {"name": "Normalize", "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]},
]


def pretrain_config(tmp_path, *overrides):
    _, cfg = load_config(["config=test/quick_simclr_synthetic", *TRUNK_FEATURES,
                          f"config.CHECKPOINT.DIR={tmp_path}", *overrides])
    return cfg


def test_rule_keeps_deterministic_steps_and_turns_random_crops_into_centre_crops():
    specs = [{"name": "ImgReplicatePil", "num_times": 2},
             {"name": "RandomResizedCrop", "size": 16, "scale": [0.3, 1.0]},
             {"name": "RandomHorizontalFlip"}, {"name": "ImgPilColorDistortion", "strength": 0.5},
             {"name": "ToTensor"},
             {"name": "Normalize", "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}]
    view = one_view(specs, "simclr_collator", "config.DATA.TRAIN")
    assert view.transforms == ONE_VIEW_TRANSFORMS and view.collator == "default"
    assert view.changes == ["dropped ImgReplicatePil", "RandomResizedCrop -> Resize + CenterCrop",
                            "dropped RandomHorizontalFlip", "dropped ImgPilColorDistortion",
                            "collator simclr_collator -> default"]
    again = one_view(view.transforms, view.collator, "config.DATA.TRAIN")
    assert again.transforms == view.transforms and again.changes == []
    multicrop = [{"name": "ImgPilToMultiCrop", "total_num_crops": 3, "num_crops": [1, 2],
                  "size_crops": [24, 8], "crop_scales": [[0.5, 1], [0.1, 0.5]]},
                 {"name": "RandomCrop", "size": 20}]
    view = one_view(multicrop, "multicrop_collator", "config.DATA.TRAIN")
    assert view.transforms == [{"name": "Resize", "size": 24}, {"name": "CenterCrop", "size": 24},
                               {"name": "CenterCrop", "size": 20}]


def test_pretraining_config_extracts_one_row_per_image_equal_to_a_direct_forward(tmp_path):
    cfg = run_engine(tmp_path, TRUNK_FEATURES + ["config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=10"])
    train = load_extracted(tmp_path, "train", "res5avg")
    assert train.features.shape == (10, 64) and np.array_equal(train.inds, np.arange(10))
    log = (tmp_path / "log.txt").read_text()
    assert ("train: one deterministic view per image "
            "(config.EXTRACT_FEATURES.ONE_DETERMINISTIC_VIEW=true): dropped ImgReplicatePil" in log)
    # independently: the model seeded as extraction seeds it, one image at a time through the
    # deterministic pipeline written out here
    cfg.DATA.TRAIN.TRANSFORMS = ONE_VIEW_TRANSFORMS
    torch.manual_seed(cfg.SEED_VALUE)
    model = build_model(cfg.MODEL).eval()
    dataset = build_dataset(cfg, "TRAIN")
    with torch.no_grad():
        expected = np.stack([model.trunk(dataset[i]["data"][0][None], ["res5avg"])[0]
                             .flatten().numpy() for i in range(len(dataset))])
    np.testing.assert_allclose(train.features, expected, rtol=1e-4, atol=1e-5)


def test_without_one_view_a_multi_view_split_is_refused_before_launch_naming_the_key(tmp_path):
    cfg = pretrain_config(tmp_path, "config.EXTRACT_FEATURES.ONE_DETERMINISTIC_VIEW=false")
    with pytest.raises(ValueError, match=r"config.DATA.TRAIN.TRANSFORMS\[0\] \(ImgReplicatePil\) "
                                         r"makes several views.*ONE_DETERMINISTIC_VIEW=true"):
        check_before_launch("extract_features", cfg)
    cfg.DATA.TRAIN.TRANSFORMS = cfg.DATA.TRAIN.TRANSFORMS[1:]
    with pytest.raises(ValueError, match="config.DATA.TRAIN.COLLATE_FUNCTION=simclr_collator"):
        check_before_launch("extract_features", cfg)
    cfg.DATA.TRAIN.COLLATE_FUNCTION = "default"
    assert check_extraction_splits(cfg, ["TRAIN"]) == {
        "TRAIN": ["RandomResizedCrop", "RandomHorizontalFlip", "ImgPilColorDistortion"]}


def test_random_augmentations_left_are_warned_about(tmp_path, caplog):
    cfg = pretrain_config(tmp_path, "config.EXTRACT_FEATURES.ONE_DETERMINISTIC_VIEW=false",
                          "config.DATA.TRAIN.COLLATE_FUNCTION=default",
                          "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=4")
    cfg.DATA.TRAIN.TRANSFORMS = cfg.DATA.TRAIN.TRANSFORMS[1:]
    extractor = FeatureExtractor.__new__(FeatureExtractor)
    extractor.cfg, extractor.device = cfg, torch.device("cpu")
    with caplog.at_level(logging.WARNING):
        extractor.extract()
    assert ("train: random augmentations RandomResizedCrop, RandomHorizontalFlip, "
            "ImgPilColorDistortion are left in the extraction pipeline" in caplog.text)


def test_a_users_collator_after_dropped_views_is_refused(tmp_path):
    cfg = pretrain_config(tmp_path, "config.DATA.TRAIN.COLLATE_FUNCTION=my_views_collator")
    with pytest.raises(ValueError, match="config.DATA.TRAIN.COLLATE_FUNCTION=my_views_collator: "
                                         "extraction reads one view per image"):
        extraction_config(cfg, ["TRAIN"])
