"""The extract_label_predictions engine: top-k classes and softmax scores of every head output,
with targets and indices, ordered by dataset index; against the model run directly."""
import copy

import numpy as np
import pytest
import torch

from engine_utils import TINY_TEST_SPLIT, assert_model_settings_refused, extract_with_weights
from ssl_engine.config import load_config
from ssl_engine.data import build_dataset
from ssl_engine.engines.prelaunch import check_before_launch
from ssl_engine.models import build_model

CONFIG = "config=feature_extraction/extract_resnet_digits"
# 21 synthetic test images of 4 classes, batch 8; one head per evaluated stage, 5 classes
TINY = [
    "engine_name=extract_label_predictions", *TINY_TEST_SPLIT,
    "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[32,5]}],[mlp,{dims:[64,5]}]]",
    "config.METERS.names=[accuracy_list_meter]",
    "config.METERS.accuracy_list_meter.num_meters=2",
    "config.METERS.accuracy_list_meter.topk_values=[1,3]",
]


def test_saved_predictions_are_the_model_outputs(tmp_path):
    _, cfg = load_config([CONFIG, *TINY])
    torch.manual_seed(7)
    model = build_model(cfg.MODEL).eval()
    out = extract_with_weights(tmp_path, model, TINY, CONFIG, "predictions")
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"test_{output}_{kind}.npy" for output in ("res4", "res5avg")
        for kind in ("predictions", "conf_scores", "targets", "inds"))

    dataset = build_dataset(cfg, "TEST")
    images = torch.stack([dataset[i]["data"][0] for i in range(len(dataset))])
    with torch.no_grad():
        logits = model(images)  # one [21, 5] output per head
    for output, logit in zip(("res4", "res5avg"), logits):
        probabilities = torch.exp(logit - logit.logsumexp(dim=1, keepdim=True)).numpy()
        best3 = np.argsort(-probabilities, axis=1, kind="stable")[:, :3]
        predictions = np.load(out / f"test_{output}_predictions.npy")
        assert predictions.dtype == np.int64 and predictions.shape == (21, 3)
        assert np.array_equal(predictions, best3)
        scores = np.load(out / f"test_{output}_conf_scores.npy")
        assert scores.dtype == np.float32
        np.testing.assert_allclose(scores, probabilities, rtol=1e-4, atol=1e-6)
        assert np.array_equal(np.load(out / f"test_{output}_inds.npy"), np.arange(21))
        assert np.array_equal(np.load(out / f"test_{output}_targets.npy"), np.arange(21) % 4)
    assert "test res5avg: accuracy {'top_1'" in (tmp_path / "ckpt" / "log.txt").read_text()


def test_refused_before_launch(tmp_path):
    _, base = load_config([CONFIG, *TINY, f"config.CHECKPOINT.DIR={tmp_path}"])
    assert_model_settings_refused(base, "extract_label_predictions", [
        ("HEAD.PARAMS", [], "config.MODEL.HEAD.PARAMS is empty"),
        ("FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY", True,
         "EXTRACT_TRUNK_FEATURES_ONLY=false"),
    ])
    cfg = copy.deepcopy(base)
    cfg.METERS.names = ["mean_ap_list_meter"]
    with pytest.raises(ValueError, match=r"set config.METERS.names=\[accuracy_list_meter\]"):
        check_before_launch("extract_label_predictions", cfg)
