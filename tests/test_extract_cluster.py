"""The extract_cluster engine (VISSL's): every image's highest-scoring prototype of each
prototype set of a swav_head, with targets and indices in dataset order; against the model
run directly."""

import numpy as np
import torch

from engine_utils import TINY_TEST_SPLIT, assert_model_settings_refused, extract_with_weights
from ssl_engine.config import load_config
from ssl_engine.data import build_dataset
from ssl_engine.models import build_model

CONFIG = "config=feature_extraction/extract_resnet_digits"
# 21 synthetic images of 4 classes, batch 8, a SwAV head with two prototype sets (5 and 3)
TINY = [
    "engine_name=extract_cluster", *TINY_TEST_SPLIT,
    "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP=[]",
    "config.MODEL.FEATURE_EVAL_SETTINGS.EVAL_TRUNK_AND_HEAD=true",
    "config.MODEL.HEAD.PARAMS=[[swav_head,{dims:[64,32,8],use_bn:true,num_clusters:[5,3]}]]",
]


def test_saved_assignments_are_the_argmax_of_the_prototype_scores(tmp_path):
    _, cfg = load_config([CONFIG, *TINY])
    torch.manual_seed(3)
    model = build_model(cfg.MODEL).eval()
    dataset = build_dataset(cfg, "TEST")
    images = torch.stack([dataset[i]["data"][0] for i in range(len(dataset))])
    with torch.no_grad():  # the first 5 prototypes: the embeddings of images 0 to 4
        model.heads[0].prototypes0.weight.copy_(model(images)[0][:5])
    out = extract_with_weights(tmp_path, model, TINY, CONFIG, "clusters")
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"test_{name}_{kind}.npy" for name in ("prototypes0", "prototypes1")
        for kind in ("assignments", "targets", "inds"))
    with torch.no_grad():
        embedding, scores5, scores3 = model(images)
    for name, scores in (("prototypes0", scores5), ("prototypes1", scores3)):
        assignments = np.load(out / f"test_{name}_assignments.npy")
        assert assignments.dtype == np.int64 and assignments.shape == (21, 1)
        assert np.array_equal(assignments[:, 0], scores.argmax(dim=1).numpy())
        assert np.array_equal(np.load(out / f"test_{name}_inds.npy"), np.arange(21))
        assert np.array_equal(np.load(out / f"test_{name}_targets.npy"), np.arange(21) % 4)
    assert np.load(out / "test_prototypes0_assignments.npy")[:5, 0].tolist() == [0, 1, 2, 3, 4]
    assert "test prototypes0: 21 images in" in (tmp_path / "ckpt" / "log.txt").read_text()


def test_refused_before_launch(tmp_path):
    _, base = load_config([CONFIG, *TINY, f"config.CHECKPOINT.DIR={tmp_path}"])
    assert_model_settings_refused(base, "extract_cluster", [
        ("HEAD.PARAMS", [["mlp", {"dims": [64, 5]}]], "prototypes of a swav_head"),
        ("FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY", True,
         "EXTRACT_TRUNK_FEATURES_ONLY=false"),
    ])
