"""Linear evaluation on the digits: the frozen trunk stays bit-identical, the heads learn, and
linear classifiers on a random frozen trunk reach a clear accuracy."""
import copy

import torch

from engine_utils import final_weights, metrics, run_engine
from ssl_engine.hooks import SSLHook
from ssl_engine.trainer.default_hooks import default_hook_generator

LINEAR_DIGITS = "config=benchmark/linear_image_classification/digits/eval_resnet_linear"
# the tiny SimCLR run with the trunk of the digits linear evaluation (ResNet-18, width 0.5)
PRETRAIN_OVERRIDES = [
    "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.5",
    "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[256,64,16],use_relu:true}]]",
    "config.OPTIMIZER.num_epochs=1",
]


class StateAtStart(SSLHook):
    """Keeps a copy of the model state as training starts (after weights init)."""

    state = None

    def on_start(self, task) -> None:
        self.state = copy.deepcopy(task.base_model.state_dict())


def test_frozen_trunk_is_unchanged_and_heads_learn(tmp_path):
    run_engine(tmp_path / "pretrain", PRETRAIN_OVERRIDES)
    pretrained = final_weights(tmp_path / "pretrain")
    at_start = StateAtStart()
    run_engine(
        tmp_path / "linear",
        [f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={tmp_path / 'pretrain' / 'checkpoint.torch'}",
         "config.OPTIMIZER.num_epochs=1", "config.TEST_MODEL=false",
         "config.DATA.TRAIN.DATA_LIMIT=256"],
        hook_generator=lambda cfg: default_hook_generator(cfg) + [at_start],
        config=LINEAR_DIGITS,
    )
    final = final_weights(tmp_path / "linear")

    trunk_keys = [k for k in final if k.startswith("trunk.")]
    assert any(k.endswith("running_mean") for k in trunk_keys)
    for key in trunk_keys:
        if key.endswith("num_batches_tracked"):  # not loaded (SKIP_LAYERS), never counted up
            assert torch.equal(final[key], at_start.state[key]), key
        else:  # weights and batch-norm statistics are exactly the pretrained ones
            assert torch.equal(final[key], pretrained[key]), key
    for key in ("heads.0.mlp.clf.0.weight", "heads.1.mlp.clf.0.weight",
                "heads.0.channel_bn.running_mean", "heads.1.channel_bn.running_var"):
        assert not torch.equal(final[key], at_start.state[key]), key


def test_linear_eval_on_a_random_frozen_trunk_beats_chance(tmp_path):
    run_engine(tmp_path, ["config.OPTIMIZER.num_epochs=2", "config.TEST_EVERY_NUM_EPOCH=2"],
               config=LINEAR_DIGITS)
    (test_end,) = [m for m in metrics(tmp_path) if m.get("phase_end") == "test"]
    top1 = test_end["meters"]["accuracy_list_meter"]["top_1"]
    # 10 classes (chance: 10%); measured 92.2% (res4) and 83.5% (res5avg)
    assert set(top1) == {"res4", "res5avg"}
    assert top1["res5avg"] >= 70.0
    assert top1["res4"] >= 70.0


def test_a_linear_evaluation_left_with_nothing_to_train_is_refused_before_launch(tmp_path):
    """EVAL_MODE_ON with EXTRACT_TRUNK_FEATURES_ONLY builds a trunk feature extractor (no
    head): with the trunk frozen, training it is refused before any process starts."""
    import pytest

    from ssl_engine.config import load_config
    from ssl_engine.engines.prelaunch import check_before_launch

    engine_name, cfg = load_config([
        LINEAR_DIGITS, f"config.CHECKPOINT.DIR={tmp_path}",
        "config.MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=true"])
    with pytest.raises(ValueError, match=r"^nothing to train: no parameter of the model requires "
                                         r"gradients \(config.MODEL.FEATURE_EVAL_SETTINGS."
                                         r"FREEZE_TRUNK_ONLY=true freezes the trunk, and "
                                         r"EVAL_MODE_ON=true with EXTRACT_TRUNK_FEATURES_ONLY="
                                         r"true builds no head"):
        check_before_launch(engine_name, cfg)
    assert not list(tmp_path.iterdir())
