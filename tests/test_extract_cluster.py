"""The extract_cluster engine (VISSL's): every image's highest-scoring prototype of each
prototype set of a swav_head, with targets and indices in dataset order; against the model
run directly."""
import copy

import numpy as np
import pytest
import torch

from engine_utils import run_engine
from ssl_engine.config import load_config
from ssl_engine.data import build_dataset
from ssl_engine.engines.prelaunch import check_before_launch
from ssl_engine.models import build_model

CONFIG = "config=feature_extraction/extract_resnet_digits"
# 21 synthetic images of 4 classes, batch 8, a SwAV head with two prototype sets (5 and 3)
TINY = [
    "engine_name=extract_cluster",
    "config.DATA.TEST.DATA_SOURCES=[synthetic]",
    "config.DATA.TEST.SYNTHETIC.NUM_SAMPLES=21",
    "config.DATA.TEST.SYNTHETIC.IMAGE_SIZE=16",
    "config.DATA.TEST.SYNTHETIC.NUM_CLASSES=4",
    "config.DATA.TEST.BATCHSIZE_PER_REPLICA=8",
    "config.EXTRACT_FEATURES.SPLITS=[TEST]",
    "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.125",
    "config.MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=false",
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
    weights = tmp_path / "weights.torch"
    torch.save({"classy_state_dict": {"base_model": model.get_classy_state()}}, weights)
    out = tmp_path / "clusters"
    run_engine(tmp_path / "ckpt", [*TINY, f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={weights}",
                                   f"config.EXTRACT_FEATURES.OUTPUT_DIR={out}"], config=CONFIG)
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
    for key, value, message in [
        ("HEAD.PARAMS", [["mlp", {"dims": [64, 5]}]], "prototypes of a swav_head"),
        ("FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY", True,
         "EXTRACT_TRUNK_FEATURES_ONLY=false"),
    ]:
        cfg = copy.deepcopy(base)
        section, name = key.rsplit(".", 1)
        cfg.MODEL[section][name] = value
        with pytest.raises(ValueError, match=message):
            check_before_launch("extract_cluster", cfg)
